package dockerapi_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/reconciler"
)

// dockerIn runs docker with stdin as its input.
func (e *env) dockerIn(t *testing.T, config, stdin string, args ...string) (string, string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "docker", args...)
	cmd.Env = append(cleanEnv(), "DOCKER_HOST=unix://"+e.sock, "DOCKER_CONFIG="+config)
	cmd.Stdin = strings.NewReader(stdin)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return out.String(), errb.String(), ee.ExitCode()
	} else if err != nil {
		t.Fatalf("docker %v: %v", args, err)
	}
	return out.String(), errb.String(), 0
}

// TestRunInteractive: echo hello | docker run -i --rm IMAGE cat prints
// hello, exits 0 and leaves nothing behind.
func TestRunInteractive(t *testing.T) {
	e := setup(t)
	out, errs, code := e.dockerIn(t, e.config, "hello\nworld\n", "run", "-i", "--rm", helloImage, "cat")
	if code != 0 || out != "hello\nworld\n" {
		t.Fatalf("docker run -i --rm cat: exit %d, stdout %q, stderr %q; want exit 0 and the input", code, out, errs)
	}
	if out := e.must(t, "ps", "-a", "-q"); strings.TrimSpace(out) != "" {
		t.Errorf("docker ps -a after run -i --rm lists %q, want nothing", out)
	}
}

// TestRunTTY: docker run -t gives the program a terminal, without a
// terminal on the client's side.
func TestRunTTY(t *testing.T) {
	e := setup(t)
	out, errs, code := e.docker(t, "run", "-t", "--rm", helloImage, "tty")
	if code != 0 || strings.TrimSpace(out) != "tty true" {
		t.Fatalf("docker run -t tty: exit %d, stdout %q, stderr %q; want exit 0 and tty true", code, out, errs)
	}
	out, errs, code = e.docker(t, "run", "--rm", helloImage, "tty")
	if code != 0 || strings.TrimSpace(out) != "tty false" {
		t.Errorf("docker run tty: exit %d, stdout %q, stderr %q; want tty false", code, out, errs)
	}
}

// TestRunInteractiveTerminal: docker run -it on a terminal (script gives
// the CLI one, of 33 rows and 101 columns): the program sees a terminal
// of the client's size and reads what is typed; Ctrl-D ends it.
func TestRunInteractiveTerminal(t *testing.T) {
	if _, err := exec.LookPath("script"); err != nil {
		t.Skip("script (util-linux) is not installed")
	}
	e := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "script", "-qfec", "stty rows 33 cols 101; exec docker run -it --rm --name term "+helloImage+" size", "/dev/null")
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
				t.Fatalf("docker run -it ended (%v) before printing %q; output %q", err, what, out.String())
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
	// The CLI sent its size once the container started; each line typed
	// makes the program print its terminal's size, which is the client's
	// once that resize has reached it.
	waitFor("size 33x101", func() { _, _ = io.WriteString(in, "\r") })
	_, _ = io.WriteString(in, "\x04")
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("docker run -it: %v; output %q", err, out.String())
		}
	case <-ctx.Done():
		t.Fatalf("docker run -it did not end after Ctrl-D; output %q", out.String())
	}
	in.Close()
	e.waitPhase(t, "term", reconciler.Deleted)
}

// TestAttachAndStartAttached: docker start -ai runs a created container
// with the client's input, and docker attach reaches a running one; a
// reader may not attach, and another namespace's token sees no container.
func TestAttachAndStartAttached(t *testing.T) {
	e := setup(t)
	e.must(t, "create", "-i", "--name", "created", helloImage, "cat")
	out, errs, code := e.dockerIn(t, e.config, "hi\n", "start", "-ai", "created")
	if code != 0 || out != "hi\n" {
		t.Fatalf("docker start -ai: exit %d, stdout %q, stderr %q", code, out, errs)
	}
	e.must(t, "rm", "created")

	e.must(t, "run", "-d", "-i", "--name", "running", helloImage, "cat")
	e.waitPhase(t, "running", reconciler.Running)
	if _, errs, code := e.dockerIn(t, e.dockerConfig(t, e.reader), "x\n", "attach", "running"); code == 0 || !strings.Contains(errs, "403") {
		t.Errorf("a reader attached: exit %d, %s", code, errs)
	}
	other := e.dockerConfig(t, e.newToken(t, "others", "operator", "others"))
	if _, errs, code := e.dockerIn(t, other, "x\n", "attach", "running"); code == 0 || !strings.Contains(errs, "No such container") {
		t.Errorf("another namespace attached: exit %d, %s", code, errs)
	}
	out, errs, code = e.dockerIn(t, e.config, "hey\n", "attach", "running")
	if code != 0 || out != "hey\n" {
		t.Fatalf("docker attach: exit %d, stdout %q, stderr %q", code, out, errs)
	}
	e.waitPhase(t, "running", reconciler.Exited)
	e.must(t, "rm", "running")
}
