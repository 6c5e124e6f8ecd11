package dockerapi_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/moby/moby/client"

	"github.com/berth-dev/berth/dockerapi"
	"github.com/berth-dev/berth/reconciler"
)

// TestCopyTopEventsSince: docker cp of a file in and out and of a
// directory, checked from inside the container too; a missing path, a
// reader and another namespace refused; docker top with and without ps
// options; docker events --since shows the create and start of a
// container that happened before the call, then goes on live, and
// --until ends it.
func TestCopyTopEventsSince(t *testing.T) {
	e := setup(t)
	before := time.Now()
	e.must(t, "run", "-d", "--name", "box", helloImage)
	e.waitPhase(t, "box", reconciler.Running)
	ran := time.Now()
	dir := t.TempDir()

	// A file in, then out again.
	content := bytes.Repeat([]byte("berth cp\n"), 20000)
	in := filepath.Join(dir, "in.txt")
	if err := os.WriteFile(in, content, 0o640); err != nil {
		t.Fatal(err)
	}
	e.must(t, "cp", in, "box:/in.txt")
	if out := e.must(t, "exec", "box", "/hello", "probe", "read=/in.txt"); out != "/in.txt: exists\n" {
		t.Errorf("after docker cp into the container, the probe says %q", out)
	}
	// The description docker cp asks for first (HEAD, X-Docker-Container-Path-Stat).
	cli, err := client.New(client.WithHost("unix://"+e.sock), client.WithAPIVersion(dockerapi.Version),
		client.WithHTTPHeaders(map[string]string{"Authorization": "Bearer " + e.token}))
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	if st, err := cli.ContainerStatPath(context.Background(), "box", client.ContainerStatPathOptions{Path: "/in.txt"}); err != nil ||
		st.Stat.Name != "in.txt" || st.Stat.Size != int64(len(content)) || !st.Stat.Mode.IsRegular() {
		t.Errorf("the endpoint's stat of /in.txt: %+v, %v; want in.txt, %d bytes, a regular file", st.Stat, err, len(content))
	}
	back := filepath.Join(dir, "back.txt")
	e.must(t, "cp", "box:/in.txt", back)
	if got, err := os.ReadFile(back); err != nil || !bytes.Equal(got, content) {
		t.Errorf("docker cp out of the container: %d bytes (%v), want the %d copied in", len(got), err, len(content))
	}

	// A directory with a file below, in and out.
	tree := filepath.Join(dir, "tree")
	if err := os.MkdirAll(filepath.Join(tree, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(tree, "sub", "leaf"), []byte("leaf\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	e.must(t, "cp", tree, "box:/tree")
	if out := e.must(t, "exec", "box", "/hello", "probe", "read=/tree/sub/leaf"); out != "/tree/sub/leaf: exists\n" {
		t.Errorf("after docker cp of a directory, the probe says %q", out)
	}
	e.must(t, "cp", "box:/tree", filepath.Join(dir, "out"))
	if got, err := os.ReadFile(filepath.Join(dir, "out", "sub", "leaf")); err != nil || string(got) != "leaf\n" {
		t.Errorf("docker cp of a directory out of the container: %q, %v", got, err)
	}

	if _, errs, code := e.docker(t, "cp", "box:/no-such-file", filepath.Join(dir, "x")); code == 0 || !strings.Contains(errs, "no-such-file") {
		t.Errorf("docker cp of a missing path: exit %d, %s", code, errs)
	}
	if _, errs, code := e.dockerWith(t, e.dockerConfig(t, e.reader), "cp", "box:/in.txt", filepath.Join(dir, "r")); code == 0 || !strings.Contains(errs, "operate permission") {
		t.Errorf("a reader ran docker cp: exit %d, %s", code, errs)
	}
	other := e.dockerConfig(t, e.newToken(t, "others", "operator", "others"))
	for _, args := range [][]string{{"cp", in, "box:/other.txt"}, {"cp", "box:/in.txt", filepath.Join(dir, "o")}} {
		if _, errs, code := e.dockerWith(t, other, args...); code == 0 || !strings.Contains(errs, "No such container") {
			t.Errorf("another namespace ran docker %v: exit %d, %s", args, code, errs)
		}
	}
	if out := e.must(t, "exec", "box", "/hello", "probe", "read=/other.txt"); out != "/other.txt: missing\n" {
		t.Errorf("after another namespace's docker cp, the probe says %q", out)
	}

	// top: the container's one process, the columns ps's options name.
	if out := e.must(t, "top", "box"); !strings.Contains(out, "PID") || !strings.Contains(out, "/hello") {
		t.Errorf("docker top:\n%s", out)
	}
	if out := e.must(t, "top", "box", "-o", "pid,comm"); !strings.HasPrefix(strings.TrimSpace(out), "PID") || !strings.Contains(out, "hello") {
		t.Errorf("docker top -o pid,comm:\n%s", out)
	}

	// events --since from before the run, --until now: the create and
	// start replayed, then the stream ends.
	since := fmt.Sprintf("%d.%09d", before.Unix(), before.Nanosecond())
	until := fmt.Sprintf("%d", time.Now().Unix()+1)
	out := e.must(t, "events", "--since", since, "--until", until, "--format", "{{.Action}} {{.Actor.Attributes.name}} {{.TimeNano}}", "--filter", "type=container")
	var got []string
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		f := strings.Fields(l)
		if len(f) != 3 {
			t.Fatalf("docker events --since: line %q", l)
		}
		// Each event carries the time its change was made, not the replay's.
		if ns, _ := strconv.ParseInt(f[2], 10, 64); ns < before.UnixNano() || ns > ran.UnixNano() {
			t.Errorf("docker events --since: %s %s at %s, want between the run's start and its end", f[0], f[1], time.Unix(0, ns))
		}
		got = append(got, f[0]+" "+f[1])
	}
	if !slices.Equal(got, []string{"create box", "start box"}) {
		t.Errorf("docker events --since before the run:\n%s\nwant create box, start box", out)
	}
	// Without --until the replay goes on live.
	evCmd, evOut := e.start(t, "events", "--since", since, "--format", "{{.Action}} {{.Actor.Attributes.name}}", "--filter", "type=container")
	e.must(t, "run", "-d", "--name", "box2", helloImage)
	deadline := time.Now().Add(time.Minute)
	for !strings.Contains(evOut.String(), "start box2") && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	_ = evCmd.Process.Signal(os.Interrupt)
	_ = evCmd.Wait()
	if got := strings.Split(strings.TrimSpace(evOut.String()), "\n"); !slices.Equal(got, []string{"create box", "start box", "create box2", "start box2"}) {
		t.Errorf("docker events --since before the run, then a second run:\n%s\nwant box's create and start, then box2's", evOut.String())
	}
	later := time.Now().Add(time.Second)
	out = e.must(t, "events", "--since", fmt.Sprintf("%d", later.Unix()+1), "--until", fmt.Sprintf("%d", later.Unix()+2), "--filter", "type=container")
	if strings.TrimSpace(out) != "" {
		t.Errorf("docker events --since after the run shows:\n%s", out)
	}
	e.must(t, "rm", "-f", "box", "box2")
}
