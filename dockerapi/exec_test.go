package dockerapi_test

import (
	"context"
	"io"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/reconciler"
)

// TestExec: docker exec in a running container through the endpoint: the
// exit code, stdout and stderr apart, -e and -w, -i with the client's
// input, -t, -d; a reader may not exec, another namespace sees no
// container, and a container that is not running refuses.
func TestExec(t *testing.T) {
	e := setup(t)
	e.must(t, "run", "-d", "--name", "box", helloImage)
	e.waitPhase(t, "box", reconciler.Running)

	out, errs, code := e.docker(t, "exec", "box", "/hello", "probe", "out=to stdout", "err=to stderr", "exit=3")
	if code != 3 || out != "to stdout\n" || errs != "to stderr\n" {
		t.Errorf("docker exec out, err, exit 3: exit %d, stdout %q, stderr %q", code, out, errs)
	}
	if out := e.must(t, "exec", "-e", "WHO=exec", "-w", "/proc", "box", "/hello", "probe", "env=WHO", "pwd"); out != "WHO=exec\n/proc\n" {
		t.Errorf("docker exec -e -w: stdout %q", out)
	}
	out, errs, code = e.dockerIn(t, e.config, "one\ntwo\n", "exec", "-i", "box", "/hello", "probe", "cat", "out=end")
	if code != 0 || out != "one\ntwo\nend\n" {
		t.Errorf("docker exec -i cat: exit %d, stdout %q, stderr %q", code, out, errs)
	}
	if out := e.must(t, "exec", "-t", "box", "/hello", "probe", "tty"); strings.TrimSpace(out) != "tty true" {
		t.Errorf("docker exec -t tty: stdout %q, want tty true", out)
	}
	if out := e.must(t, "exec", "box", "/hello", "probe", "tty"); out != "tty false\n" {
		t.Errorf("docker exec tty: stdout %q, want tty false", out)
	}
	if _, errs, code := e.docker(t, "exec", "box", "/no-such-program"); code != 126 && code != 127 {
		t.Errorf("docker exec of a missing program: exit %d, stderr %q; want 126 or 127", code, errs)
	}

	// -d answers at once; the command runs on.
	if out := e.must(t, "exec", "-d", "box", "/hello", "probe", "touch=/detached"); out != "" {
		t.Errorf("docker exec -d printed %q", out)
	}
	deadline := time.Now().Add(time.Minute)
	for e.must(t, "exec", "box", "/hello", "probe", "read=/detached") != "/detached: exists\n" {
		if time.Now().After(deadline) {
			t.Fatal("docker exec -d: the command never ran")
		}
		time.Sleep(50 * time.Millisecond)
	}

	if _, errs, code := e.dockerWith(t, e.dockerConfig(t, e.reader), "exec", "box", "/hello", "probe"); code == 0 || !strings.Contains(errs, "operate permission") {
		t.Errorf("a reader ran docker exec: exit %d, %s", code, errs)
	}
	other := e.dockerConfig(t, e.newToken(t, "others", "operator", "others"))
	if _, errs, code := e.dockerWith(t, other, "exec", "box", "/hello", "probe"); code == 0 || !strings.Contains(errs, "No such container") {
		t.Errorf("another namespace ran docker exec: exit %d, %s", code, errs)
	}
	// The namespace's run-as policy binds an exec's user: an operator may
	// not exec as root (non-root only, the default).
	boxIn, err := e.plane.Instance(context.Background(), "box")
	if err != nil {
		t.Fatal(err)
	}
	op := e.dockerConfig(t, e.newToken(t, "op-box", "operator", boxIn.Owner))
	for _, u := range []string{"root", "0:0"} {
		if _, errs, code := e.dockerWith(t, op, "exec", "-u", u, "box", "/hello", "probe"); code == 0 || !strings.Contains(errs, "root") {
			t.Errorf("an operator's docker exec -u %s: exit %d, %s", u, code, errs)
		}
	}
	e.must(t, "stop", "box")
	if _, errs, code := e.docker(t, "exec", "box", "/hello", "probe"); code == 0 || !strings.Contains(errs, "not running") {
		t.Errorf("docker exec in a stopped container: exit %d, %s", code, errs)
	}
	e.must(t, "rm", "box")
}

// TestExecInteractiveTerminal: docker exec -it on a terminal (script gives
// the CLI one, of 33 rows and 101 columns): the command sees a terminal of
// the client's size and reads what is typed; Ctrl-D ends it.
func TestExecInteractiveTerminal(t *testing.T) {
	if _, err := exec.LookPath("script"); err != nil {
		t.Skip("script (util-linux) is not installed")
	}
	e := setup(t)
	e.must(t, "run", "-d", "--name", "termbox", helloImage)
	e.waitPhase(t, "termbox", reconciler.Running)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "script", "-qfec", "stty rows 33 cols 101; exec docker exec -it termbox /hello probe tty sizes", "/dev/null")
	cmd.Env = append(cleanEnv(), "DOCKER_HOST=unix://"+e.sock, "DOCKER_CONFIG="+e.config)
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out := &syncBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	waitFor := func(what string, poke func()) {
		t.Helper()
		tick := time.NewTicker(200 * time.Millisecond)
		defer tick.Stop()
		for !strings.Contains(out.String(), what) {
			select {
			case err := <-done:
				t.Fatalf("docker exec -it ended (%v) before printing %q; output %q", err, what, out.String())
			case <-ctx.Done():
				t.Fatalf("no %q in %q", what, out.String())
			case <-tick.C:
				if poke != nil {
					poke()
				}
			}
		}
	}
	waitFor("tty true", nil)
	waitFor("size 33x101", func() { _, _ = io.WriteString(in, "\r") })
	_, _ = io.WriteString(in, "\x04")
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("docker exec -it: %v; output %q", err, out.String())
		}
	case <-ctx.Done():
		t.Fatalf("docker exec -it did not end after Ctrl-D; output %q", out.String())
	}
	in.Close()
}
