package dockerapi_test

import (
	"bytes"
	"context"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/berth-dev/berth/api"
	"github.com/berth-dev/berth/control"
	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/reconciler"
)

var (
	berthOnce sync.Once
	berthBin  string
	berthErr  error
)

// buildBerth builds the berth binary once per test run.
func buildBerth(t *testing.T) string {
	t.Helper()
	berthOnce.Do(func() {
		dir, err := os.MkdirTemp("", "berth-bin")
		if err != nil {
			berthErr = err
			return
		}
		berthBin = filepath.Join(dir, "berth")
		out, err := exec.Command("go", "build", "-o", berthBin, "github.com/berth-dev/berth/cmd/berth").CombinedOutput()
		if err != nil {
			berthErr = &buildError{string(out)}
		}
	})
	if berthErr != nil {
		t.Fatal(berthErr)
	}
	return berthBin
}

type buildError struct{ out string }

func (e *buildError) Error() string { return "go build ./cmd/berth: " + e.out }

// TestCompose: a Compose file of three services (replicas, a port, a
// dependency) comes up as one group; berth compose ps and docker ps show
// it; down removes all of it.
func TestCompose(t *testing.T) {
	e := setup(t)
	bin := buildBerth(t)
	srv := httptest.NewServer(api.New(e.plane, api.Options{Logger: quiet, Tokens: e.tokens}))
	defer srv.Close()
	dir := t.TempDir()
	file := filepath.Join(dir, "compose.yaml")
	yaml := `name: ` + e.cluster + `
services:
  db:
    image: ` + helloImage + `
    environment:
      HELLO_FILES: ""
  api:
    image: ` + helloImage + `
    depends_on: [db]
    deploy:
      replicas: 2
      resources:
        limits:
          cpus: "0.25"
          memory: 32M
  web:
    image: ` + helloImage + `
    environment:
      HELLO_LISTEN: ":8080"
    ports: ["18082:8080"]
    depends_on: [api]
`
	if err := os.WriteFile(file, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	berth := func(args ...string) string {
		t.Helper()
		cmd := exec.Command(bin, append([]string{"--addr", srv.URL, "--token", e.token}, args...)...)
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		if err := cmd.Run(); err != nil {
			t.Fatalf("berth %v: %v\n%s%s", args, err, out.String(), errb.String())
		}
		return out.String()
	}
	berth("compose", "up", "-d", "-f", file)
	ctx := context.Background()
	list := e.waitRunning(t, 4)
	group := list[0].Group
	for _, in := range list {
		if in.Group != group || group == "" {
			t.Errorf("instance %s in group %q, want one group", in.ID, in.Group)
		}
	}

	var ps []control.Instance
	if err := driver.UnmarshalOutput([]byte(berth("compose", "ps", "-f", file, "--json")), &ps); err != nil {
		t.Fatal(err)
	}
	if len(ps) != 4 {
		t.Errorf("berth compose ps lists %d instances, want 4", len(ps))
	}
	table := berth("compose", "ps", "-f", file)
	if !strings.Contains(table, ":18082->8080/tcp") || strings.Count(table, " api ") != 2 {
		t.Errorf("berth compose ps:\n%s", table)
	}
	dps := e.must(t, "ps", "--format", "{{.Label \"com.docker.compose.service\"}}")
	got := strings.Fields(dps)
	slices.Sort(got)
	if !slices.Equal(got, []string{"api", "api", "db", "web"}) {
		t.Errorf("docker ps shows services %v", got)
	}
	groups := berth("group", "ls")
	if !strings.Contains(groups, group) || !strings.Contains(groups, e.cluster) {
		t.Errorf("berth group ls:\n%s", groups)
	}
	berth("compose", "down", "-f", file)
	left, err := e.plane.Instances(ctx, control.Filter{})
	if err != nil || len(left) != 0 {
		t.Errorf("after compose down Berth lists %d instances (%v)", len(left), err)
	}
	if out := e.must(t, "ps", "-a", "-q"); strings.TrimSpace(out) != "" {
		t.Errorf("docker ps -a after compose down: %q", out)
	}
	n, err := removeByLabel(ctx, "com.docker.compose.project", e.cluster)
	if err != nil || n != 0 {
		t.Errorf("%d containers of the project are left on the engine (%v)", n, err)
	}
}

// waitRunning waits until n instances run.
func (e *env) waitRunning(t *testing.T, n int) []control.Instance {
	t.Helper()
	for i := 0; ; i++ {
		list, err := e.plane.Instances(context.Background(), control.Filter{Phases: []reconciler.Phase{reconciler.Running}})
		if err != nil {
			t.Fatal(err)
		}
		if len(list) >= n {
			return list
		}
		if i > 1200 {
			all, _ := e.plane.Instances(context.Background(), control.Filter{})
			t.Fatalf("%d of %d instances run: %+v", len(list), n, all)
		}
		sleep()
	}
}
