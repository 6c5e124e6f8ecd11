package integration_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berth-dev/berth/api"
	apiclient "github.com/berth-dev/berth/api/client"
	"github.com/berth-dev/berth/auth"
	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/reconciler"
	"github.com/berth-dev/berth/scheduler"
)

// serveAt puts the REST API in front of e's plane and returns its address
// and an operator's token of the namespace "it".
func (e *env) serveAt(t *testing.T) (addr, token string) {
	t.Helper()
	tokens := auth.NewTokens(e.store, nil)
	secret, _, err := tokens.Create(context.Background(), auth.Spec{Name: "it-op", Role: auth.RoleOperator, Namespaces: []string{"it"}})
	if err != nil {
		t.Fatal(err)
	}
	s := api.New(e.plane, api.Options{Tokens: tokens, Logger: quiet, AuditLog: slog.New(slog.DiscardHandler)})
	hs := httptest.NewServer(s)
	t.Cleanup(func() {
		s.CloseStreams()
		hs.Close()
	})
	return hs.URL, secret
}

// buildBerth builds the berth binary for the test.
func buildBerth(t *testing.T) string {
	t.Helper()
	goBin, err := exec.LookPath("go")
	if err != nil {
		goBin = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	bin := filepath.Join(t.TempDir(), "berth")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if out, err := exec.CommandContext(ctx, goBin, "build", "-o", bin, "github.com/berth-dev/berth/cmd/berth").CombinedOutput(); err != nil {
		t.Fatalf("go build berth: %v\n%s", err, out)
	}
	return bin
}

// TestBerthRunInteractive: echo hello | berth run -i --rm IMAGE -- cat
// sends its input through the REST API's attach stream to a container on
// the engine and prints what the container wrote back; berth run -t gives
// the program a terminal.
func TestBerthRunInteractive(t *testing.T) {
	e := setup(t, nil)
	addr, token := e.serveAt(t)
	bin := buildBerth(t)
	berth := func(stdin string, args ...string) (string, string, int) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, bin, append([]string{"--addr", addr, "--namespace", "it"}, args...)...)
		cmd.Env = append(os.Environ(), "BERTH_TOKEN="+token)
		cmd.Stdin = strings.NewReader(stdin)
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		err := cmd.Run()
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return out.String(), errb.String(), ee.ExitCode()
		} else if err != nil {
			t.Fatalf("berth %v: %v", args, err)
		}
		return out.String(), errb.String(), 0
	}
	out, errs, code := berth("hello\nworld\n", "run", "-i", "--rm", "--name", e.cluster+"-cat", "--memory", "32Mi", helloImage, "--", "cat")
	if code != 0 || out != "hello\nworld\n" {
		t.Fatalf("berth run -i --rm cat: exit %d, stdout %q, stderr %q; want exit 0 and the input", code, out, errs)
	}
	out, errs, code = berth("", "run", "-t", "--rm", "--name", e.cluster+"-tty", "--memory", "32Mi", helloImage, "--", "tty")
	if code != 0 || strings.TrimSpace(out) != "tty true" {
		t.Fatalf("berth run -t tty: exit %d, stdout %q, stderr %q; want tty true", code, out, errs)
	}
	waitFor(t, "the instances to go", func() bool {
		for _, in := range e.instances(t) {
			if in.Phase != reconciler.Deleted {
				return false
			}
		}
		return true
	})
}

// TestAttachThroughTheAPI: the client's Attach reaches a running
// container made with stdin and a terminal: input, output, the
// terminal's size, and the end of the input ending the program.
func TestAttachThroughTheAPI(t *testing.T) {
	e := setup(t, nil)
	addr, token := e.serveAt(t)
	c, err := apiclient.New(addr, apiclient.WithToken(token), apiclient.WithNamespace("it"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	spec := driver.Spec{Image: helloImage, Command: []string{"size"}, Stdin: true, TTY: true, Resources: driver.Resources{Memory: 32 * driver.MiB}}
	ans, err := c.Submit(ctx, e.named(scheduler.Request{ID: "term", Spec: spec}))
	if err != nil {
		t.Fatal(err)
	}
	id := ans.Instances[0].Instance.ID
	sizes := make(chan driver.TTYSize, 1)
	sizes <- driver.TTYSize{Rows: 33, Cols: 101}
	pr, pw := io.Pipe()
	var out syncBuffer
	done := make(chan error, 1)
	go func() {
		done <- c.Attach(ctx, id, apiclient.AttachOptions{Stdin: pr, Stdout: &out, Resize: sizes, Logs: true})
	}()
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for !strings.Contains(out.String(), "size 33x101") {
		select {
		case err := <-done:
			t.Fatalf("attach ended (%v); output %q", err, out.String())
		case <-ctx.Done():
			t.Fatalf("no size 33x101 in %q", out.String())
		case <-tick.C:
			if strings.Contains(out.String(), "tty true") {
				_, _ = io.WriteString(pw, "\r")
			}
		}
	}
	_, _ = io.WriteString(pw, "\x04")
	if err := <-done; err != nil {
		t.Fatalf("attach: %v; output %q", err, out.String())
	}
	pw.Close()
	e.allIn(t, reconciler.Exited, 1)
	e.deleteAll(t)
}

// syncBuffer is a buffer written and read from two goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
