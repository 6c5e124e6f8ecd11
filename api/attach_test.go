package api_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berth-dev/berth/api"
	"github.com/berth-dev/berth/api/apitest"
	"github.com/berth-dev/berth/api/client"
	"github.com/berth-dev/berth/auth"
	"github.com/berth-dev/berth/control"
	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/provider"
	"github.com/berth-dev/berth/reconciler"
	"github.com/berth-dev/berth/scheduler"
	"github.com/berth-dev/berth/store/memory"
)

// echoing is the sim with an Attacher: it answers each input with the
// same in upper case, says its terminal's size on "?", and its output ends
// with its input.
type echoing struct {
	driver.Driver
	mu   sync.Mutex
	size driver.TTYSize
}

func (e *echoing) Attach(ctx context.Context, id string, opts driver.AttachOptions, stdin io.Reader, stdout, stderr io.Writer) error {
	if opts.Replay {
		_, _ = io.WriteString(stderr, "replayed\n")
	}
	if stdin == nil {
		<-ctx.Done()
		return ctx.Err()
	}
	buf := make([]byte, 1024)
	for {
		n, err := stdin.Read(buf)
		if n > 0 {
			s := string(buf[:n])
			if s == "?" {
				e.mu.Lock()
				s = strings.Repeat("#", int(e.size.Rows)) + "\n"
				e.mu.Unlock()
			}
			if _, werr := io.WriteString(stdout, strings.ToUpper(s)); werr != nil {
				return werr
			}
		}
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return ctx.Err()
		}
	}
}

func (e *echoing) ResizeTTY(ctx context.Context, id string, size driver.TTYSize) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.size = size
	return nil
}

// TestAttachStream: input goes through the two-way stream and its end
// ends the instance's, output and replay come back, terminal sizes reach
// the back-end.
func TestAttachStream(t *testing.T) {
	e := apitest.StartWith(t, memory.New(memory.Options{}), nil, api.Options{}, func(c *control.Config) {
		p, err := provider.New(&echoing{Driver: c.Providers[0].Driver()}, provider.Config{Name: "echo"})
		if err != nil {
			t.Fatal(err)
		}
		c.Providers = []*provider.Provider{p}
	})
	ctx := context.Background()
	c := e.Client(t, "")
	ans, err := c.Submit(ctx, scheduler.Request{Spec: driver.Spec{Image: "x", Stdin: true, TTY: true}})
	if err != nil {
		t.Fatal(err)
	}
	id := ans.Instances[0].Instance.ID
	var out, errOut bytes.Buffer
	if err := c.Attach(ctx, id, client.AttachOptions{Stdin: strings.NewReader("hello\n"), Stdout: &out, Stderr: &errOut, Logs: true}); err != nil {
		t.Fatal(err)
	}
	if out.String() != "HELLO\n" || errOut.String() != "replayed\n" {
		t.Errorf("attach: stdout %q, stderr %q", out.String(), errOut.String())
	}

	// The terminal's size reaches the back-end: asked with "?" until it
	// has.
	sizes := make(chan driver.TTYSize, 1)
	sizes <- driver.TTYSize{Rows: 3, Cols: 80}
	pr, pw := io.Pipe()
	var sized lockedBuffer
	done := make(chan error, 1)
	go func() { done <- c.Attach(ctx, id, client.AttachOptions{Stdin: pr, Stdout: &sized, Resize: sizes}) }()
	for !strings.Contains(sized.String(), "###\n") {
		if _, err := io.WriteString(pw, "?"); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-done:
			t.Fatalf("attach ended: %v", err)
		case <-time.After(20 * time.Millisecond):
		}
	}
	pw.Close()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// TestAttachRefusals: the route wants an upgrade and the operate
// permission, hides other namespaces' instances, sends input only to an
// instance made with stdin, and names a provider that cannot attach.
func TestAttachRefusals(t *testing.T) {
	e := apitest.Start(t, memory.New(memory.Options{}), nil, api.Options{})
	ctx := context.Background()
	team := e.Client(t, e.NewToken(t, "team-op", auth.RoleOperator, "team"), client.WithNamespace("team"))
	ans, err := team.Submit(ctx, scheduler.Request{Spec: driver.Spec{Image: "x"}})
	if err != nil {
		t.Fatal(err)
	}
	id := ans.Instances[0].Instance.ID
	waitPhase(t, team, id, reconciler.Running)

	req, _ := http.NewRequest(http.MethodPost, e.HTTP.URL+"/v1/instances/"+id+"/attach", nil)
	req.Header.Set("Authorization", "Bearer "+e.Token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUpgradeRequired {
		t.Errorf("attach without an upgrade: %s, want 426", resp.Status)
	}

	var out bytes.Buffer
	reader := e.Client(t, e.NewToken(t, "viewer", auth.RoleReader, auth.AllNamespaces))
	var ae *api.Error
	if err := reader.Attach(ctx, id, client.AttachOptions{Stdout: &out}); !errors.As(err, &ae) || ae.Status != http.StatusForbidden {
		t.Errorf("a reader attached: %v", err)
	}
	others := e.Client(t, e.NewToken(t, "other-op", auth.RoleOperator, "others"), client.WithNamespace("others"))
	if err := others.Attach(ctx, id, client.AttachOptions{Stdout: &out}); !errors.Is(err, driver.ErrNotFound) {
		t.Errorf("another namespace's instance: %v, want not found", err)
	}
	var fe *driver.FieldError
	if err := team.Attach(ctx, id, client.AttachOptions{Stdin: strings.NewReader("x"), Stdout: &out}); !errors.Is(err, driver.ErrInvalid) || !errors.As(err, &fe) || fe.Path != "stdin" {
		t.Errorf("input to an instance made without stdin: %v", err)
	}
	if err := team.Attach(ctx, id, client.AttachOptions{Stdout: &out}); !errors.Is(err, driver.ErrUnsupported) || !strings.Contains(err.Error(), `"sim"`) {
		t.Errorf("attach on a provider that cannot: %v, want unsupported naming it", err)
	}
	if _, err := team.Submit(ctx, scheduler.Request{Spec: driver.Spec{Image: "x", Stdin: true}}); !errors.Is(err, driver.ErrUnsupported) || !errors.As(err, &fe) || fe.Path != "stdin" {
		t.Errorf("a request with stdin on a provider that cannot attach: %v, want unsupported naming stdin", err)
	}
}

// lockedBuffer is a buffer written and read from two goroutines.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
