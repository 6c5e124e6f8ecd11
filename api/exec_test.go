package api_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/api"
	"github.com/berth-dev/berth/api/apitest"
	"github.com/berth-dev/berth/api/client"
	"github.com/berth-dev/berth/auth"
	"github.com/berth-dev/berth/control"
	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/drivers/local"
	"github.com/berth-dev/berth/provider"
	"github.com/berth-dev/berth/reconciler"
	"github.com/berth-dev/berth/scheduler"
	"github.com/berth-dev/berth/store/memory"
)

// startLocal serves the API over the local back-end (real processes).
func startLocal(t *testing.T, opts api.Options) *apitest.Env {
	t.Helper()
	return apitest.StartWith(t, memory.New(memory.Options{}), nil, opts, func(c *control.Config) {
		opts := local.DefaultOptions()
		opts.DataDir = t.TempDir()
		opts.NodeName = "host"
		opts.StopGrace = time.Second
		opts.PollInterval = 20 * time.Millisecond
		opts.CgroupRoot = ""
		opts.AllowRoot = true // the tests run as root
		d, err := local.Open(context.Background(), opts, driver.Env{Provider: "local"})
		if err != nil {
			t.Fatal(err)
		}
		p, err := provider.New(d, provider.Config{Name: "local"})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = p.Close(context.Background()) })
		c.Providers = []*provider.Provider{p}
	})
}

// TestExecStream runs commands in a process's instance over the exec
// stream: exit code, input, output apart, environment; on a terminal, its
// size at the start and a resize. The audit log has the exec, not the
// environment's values.
func TestExecStream(t *testing.T) {
	var audit lockedBuffer
	e := startLocal(t, api.Options{AuditLog: slog.New(slog.NewTextHandler(&audit, nil))})
	ctx := context.Background()
	c := e.Client(t, "")
	ans, err := c.Submit(ctx, scheduler.Request{Spec: driver.Spec{Kind: driver.KindProcess, Entrypoint: []string{"/bin/sh", "-c", "exec sleep 60"}}})
	if err != nil {
		t.Fatal(err)
	}
	id := ans.Instances[0].Instance.ID
	waitPhase(t, c, id, reconciler.Running)

	var out, errOut bytes.Buffer
	code, err := c.Exec(ctx, id, client.ExecOptions{
		Cmd: []string{"/bin/sh", "-c", `cat; echo "$X"; pwd; echo oops >&2; exit 5`}, Env: []string{"X=from exec"}, WorkDir: "/proc",
		Stdin: strings.NewReader("input\n"), Stdout: &out, Stderr: &errOut,
	})
	if err != nil || code != 5 || out.String() != "input\nfrom exec\n/proc\n" || errOut.String() != "oops\n" {
		t.Fatalf("exec: %d, %v, stdout %q, stderr %q; want 5, the input, X, /proc and oops apart", code, err, out.String(), errOut.String())
	}

	// On a terminal: each line read prints the terminal's size.
	sizes := make(chan driver.TTYSize, 1)
	pr, pw := io.Pipe()
	defer pw.Close()
	var sized lockedBuffer
	type result struct {
		code int
		err  error
	}
	done := make(chan result, 1)
	go func() {
		code, err := c.Exec(ctx, id, client.ExecOptions{
			Cmd: []string{"/bin/sh", "-c", `test -t 0 && echo on a terminal; while read line; do stty size; done`},
			TTY: true, Size: driver.TTYSize{Rows: 33, Cols: 101}, Resize: sizes, Stdin: pr, Stdout: &sized,
		})
		done <- result{code, err}
	}()
	for _, want := range []string{"33 101", "40 120"} {
		if want == "40 120" {
			sizes <- driver.TTYSize{Rows: 40, Cols: 120}
		}
		for !strings.Contains(sized.String(), want) {
			if _, err := io.WriteString(pw, "\r"); err != nil {
				t.Fatal(err)
			}
			select {
			case r := <-done:
				t.Fatalf("exec on a terminal ended (%d, %v) before %q: %q", r.code, r.err, want, sized.String())
			case <-time.After(20 * time.Millisecond):
			}
		}
	}
	if _, err := io.WriteString(pw, "\x04"); err != nil {
		t.Fatal(err)
	}
	if r := <-done; r.err != nil || r.code != 0 || !strings.Contains(sized.String(), "on a terminal") {
		t.Errorf("exec on a terminal: %d, %v, output %q", r.code, r.err, sized.String())
	}
	if log := audit.String(); !strings.Contains(log, "/v1/instances/"+id+"/exec") || strings.Contains(log, "from exec") {
		t.Errorf("audit log %q: want the exec, without the environment's values", log)
	}
}

// TestExecRefusals: the route wants an upgrade and the operate
// permission, hides other namespaces' instances, bounds the command and
// names a provider that cannot exec, with its driver.
func TestExecRefusals(t *testing.T) {
	e := apitest.Start(t, memory.New(memory.Options{}), nil, api.Options{})
	ctx := context.Background()
	team := e.Client(t, e.NewToken(t, "team-op", auth.RoleOperator, "team"), client.WithNamespace("team"))
	ans, err := team.Submit(ctx, scheduler.Request{Spec: driver.Spec{Image: "x"}})
	if err != nil {
		t.Fatal(err)
	}
	id := ans.Instances[0].Instance.ID
	waitPhase(t, team, id, reconciler.Running)

	req, _ := http.NewRequest(http.MethodPost, e.HTTP.URL+"/v1/instances/"+id+"/exec", strings.NewReader(`{"cmd": ["ls"]}`))
	req.Header.Set("Authorization", "Bearer "+e.Token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUpgradeRequired {
		t.Errorf("exec without an upgrade: %s, want 426", resp.Status)
	}

	var out bytes.Buffer
	ls := client.ExecOptions{Cmd: []string{"ls"}, Stdout: &out}
	var ae *api.Error
	reader := e.Client(t, e.NewToken(t, "viewer", auth.RoleReader, auth.AllNamespaces))
	if _, err := reader.Exec(ctx, id, ls); !errors.As(err, &ae) || ae.Status != http.StatusForbidden {
		t.Errorf("a reader ran exec: %v", err)
	}
	others := e.Client(t, e.NewToken(t, "other-op", auth.RoleOperator, "others"), client.WithNamespace("others"))
	if _, err := others.Exec(ctx, id, ls); !errors.Is(err, driver.ErrNotFound) {
		t.Errorf("exec in another namespace's instance: %v, want not found", err)
	}
	var fe *driver.FieldError
	for field, opts := range map[string]client.ExecOptions{
		"cmd":    {},
		"env":    {Cmd: []string{"ls"}, Env: make([]string, control.MaxExecEnv+1)},
		"env[0]": {Cmd: []string{"ls"}, Env: []string{"NOVALUE"}},
		"user":   {Cmd: []string{"ls"}, User: strings.Repeat("u", control.MaxExecUser+1)},
	} {
		if field == "env" {
			for i := range opts.Env {
				opts.Env[i] = "A=1"
			}
		}
		if _, err := team.Exec(ctx, id, opts); !errors.As(err, &fe) || fe.Path != field || !errors.As(err, &ae) || ae.Status != http.StatusBadRequest {
			t.Errorf("exec with a bad %s: %v, want 400 naming it", field, err)
		}
	}
	if _, err := team.Exec(ctx, id, ls); !errors.Is(err, driver.ErrUnsupported) || !errors.As(err, &ae) || ae.Status != http.StatusUnprocessableEntity ||
		!strings.Contains(err.Error(), `provider "sim" (driver "sim") cannot exec`) {
		t.Errorf("exec on a provider that cannot: %v, want 422 naming it and its driver", err)
	}
}
