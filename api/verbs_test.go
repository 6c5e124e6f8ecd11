package api_test

import (
	"context"
	"errors"
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
	"github.com/berth-dev/berth/reconciler"
	"github.com/berth-dev/berth/scheduler"
	"github.com/berth-dev/berth/store/memory"
)

// running submits one instance with id through c and waits until it runs.
func running(t *testing.T, c *client.Client, id string) *control.Instance {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := c.Submit(ctx, scheduler.Request{ID: id, Spec: driver.Spec{Image: "x", Resources: driver.Resources{CPU: driver.CPUs(1), Memory: 64 * driver.MiB}}}); err != nil {
		t.Fatal(err)
	}
	for {
		in, err := c.Instance(ctx, id)
		if err == nil && in.Phase == reconciler.Running {
			return in
		}
		select {
		case <-ctx.Done():
			t.Fatalf("instance %s never ran (last %+v, %v)", id, in, err)
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// TestSuspendResumeHoldAndStats drives the verbs through the client: each
// change answers the instance as it is then, and the errors keep their
// class across the wire.
func TestSuspendResumeHoldAndStats(t *testing.T) {
	e := newEnv(t, map[string]any{"nodes": 1}, 0)
	ctx := context.Background()
	running(t, e.client, "web")

	in, err := e.client.Suspend(ctx, "web")
	if err != nil || in.Phase != reconciler.Suspended {
		t.Fatalf("suspend: %+v, %v; want it suspended", in, err)
	}
	in, err = e.client.Resume(ctx, "web")
	if err != nil || in.Phase != reconciler.Running {
		t.Fatalf("resume: %+v, %v; want it running", in, err)
	}
	// Resumed already: nothing to do.
	if in, err = e.client.Resume(ctx, "web"); err != nil || in.Phase != reconciler.Running {
		t.Errorf("resume of a running instance: %+v, %v; want it running, nothing done", in, err)
	}
	// Stopped: not suspended, and a resume does not start it.
	if _, err := e.client.Stop(ctx, "web", 0); err != nil {
		t.Fatal(err)
	}
	var ae *api.Error
	_, err = e.client.Resume(ctx, "web")
	if !errors.Is(err, driver.ErrNotSuspended) || !errors.As(err, &ae) || ae.Status != http.StatusConflict {
		t.Errorf("resume of a stopped instance: %v, want 409 not suspended", err)
	}
	if _, err := e.client.Start(ctx, "web"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.client.Suspend(ctx, "nope"); !errors.Is(err, driver.ErrNotFound) {
		t.Errorf("suspend of an unknown instance: %v, want not found", err)
	}

	st, err := e.client.Stats(ctx, "web")
	if err != nil {
		t.Fatal(err)
	}
	if st.ID != "web" || st.Phase != reconciler.Running || st.Time.IsZero() || st.CPULimit != driver.CPUs(1) || st.MemoryLimitBytes != int64(64*driver.MiB) {
		t.Errorf("one sample: %+v", st)
	}
	// The wire form: snake_case keys, bytes as integers, an RFC 3339 time.
	status, _, raw := do(t, e.h, "GET", "/v1/instances/web/stats?stream=false", "")
	if status != http.StatusOK || !strings.Contains(raw, `"memory_limit_bytes":67108864`) || !strings.Contains(raw, `"time":"20`) {
		t.Errorf("stats?stream=false: %d %s", status, raw)
	}
	// A stream: two samples, then the client leaves.
	sctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	var samples []api.Stats
	err = e.client.StreamStats(sctx, "web", func(s api.Stats) error {
		samples = append(samples, s)
		if len(samples) == 2 {
			cancel()
		}
		return nil
	})
	if !errors.Is(err, context.Canceled) || len(samples) != 2 || samples[1].ID != "web" || samples[1].Time.Before(samples[0].Time) {
		t.Errorf("stream: %v, samples %+v; want two in order, then canceled", err, samples)
	}

	in, err = e.client.Hold(ctx, "web", 2*time.Hour)
	if err != nil || in.Phase != reconciler.Held || in.Deadline.Before(time.Now().Add(time.Hour)) {
		t.Fatalf("hold for 2h: %+v, %v; want it held about two hours", in, err)
	}
	if _, err := e.client.Suspend(ctx, "web"); !errors.Is(err, driver.ErrInvalid) {
		t.Errorf("suspend of a held instance: %v, want invalid", err)
	}
	var fe *driver.FieldError
	if _, err := e.client.Hold(ctx, "web", 31*24*time.Hour); !errors.As(err, &fe) || fe.Path != "for" {
		t.Errorf("hold for 31 days: %v, want invalid naming for", err)
	}
}

// TestVerbsOfOtherNamespacesAndRoles: what lies in another namespace
// answers 404 as what does not exist, and a reader may measure but not
// suspend, resume or hold.
func TestVerbsOfOtherNamespacesAndRoles(t *testing.T) {
	e := apitest.Start(t, memory.New(memory.Options{}), map[string]any{"nodes": 1}, api.Options{})
	ctx := context.Background()
	bob := e.Client(t, e.NewToken(t, "bob", auth.RoleOperator, "bob"))
	alice := e.Client(t, e.NewToken(t, "alice", auth.RoleOperator, "alice"))
	reader := e.Client(t, e.NewToken(t, "auditor", auth.RoleReader, "bob"))
	running(t, bob, "bobs")

	for name, verb := range map[string]func() error{
		"suspend": func() error { _, err := alice.Suspend(ctx, "bobs"); return err },
		"resume":  func() error { _, err := alice.Resume(ctx, "bobs"); return err },
		"hold":    func() error { _, err := alice.Hold(ctx, "bobs", time.Hour); return err },
		"stats":   func() error { _, err := alice.Stats(ctx, "bobs"); return err },
		"stream": func() error {
			return alice.StreamStats(ctx, "bobs", func(api.Stats) error { return errors.New("a sample of another namespace") })
		},
	} {
		if err := verb(); !isStatus(err, http.StatusNotFound) || err.Error() != `not found: instance "bobs"` {
			t.Errorf("alice: %s of bob's instance: %v, want 404 as for an unknown instance", name, err)
		}
	}
	if in, err := e.Plane.Instance(ctx, "bobs"); err != nil || in.Phase != reconciler.Running {
		t.Fatalf("bob's instance after alice's attempts: %s, %v; want running", in.Phase, err)
	}

	if _, err := reader.Stats(ctx, "bobs"); err != nil {
		t.Errorf("a reader's stats: %v", err)
	}
	for name, verb := range map[string]func() error{
		"suspend": func() error { _, err := reader.Suspend(ctx, "bobs"); return err },
		"resume":  func() error { _, err := reader.Resume(ctx, "bobs"); return err },
		"hold":    func() error { _, err := reader.Hold(ctx, "bobs", time.Hour); return err },
	} {
		if err := verb(); !isStatus(err, http.StatusForbidden) {
			t.Errorf("a reader's %s: %v, want 403", name, err)
		}
	}
}

// TestVerbsOnABackEndThatCannot: suspend and stats on a provider whose
// driver lacks the capability are refused (422 unsupported) naming the
// provider, never answered as done.
func TestVerbsOnABackEndThatCannot(t *testing.T) {
	e := apitest.StartBare(t, memory.New(memory.Options{}), map[string]any{"nodes": 1}, api.Options{})
	ctx := context.Background()
	c := e.Client(t, "")
	running(t, c, "web")
	for name, verb := range map[string]func() error{
		"suspend": func() error { _, err := c.Suspend(ctx, "web"); return err },
		"stats":   func() error { _, err := c.Stats(ctx, "web"); return err },
		"stream": func() error {
			return c.StreamStats(ctx, "web", func(api.Stats) error { return errors.New("a sample") })
		},
	} {
		err := verb()
		if !errors.Is(err, driver.ErrUnsupported) || !isStatus(err, http.StatusUnprocessableEntity) || !strings.Contains(err.Error(), `"plain"`) {
			t.Errorf("%s on a back-end that cannot: %v, want 422 unsupported naming the provider", name, err)
		}
	}
	if in, err := c.Instance(ctx, "web"); err != nil || in.Phase != reconciler.Running {
		t.Errorf("after the refusals: %+v, %v; want it running", in, err)
	}
}
