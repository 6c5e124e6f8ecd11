package provider_test

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/drivers/sim"
	"github.com/berth-dev/berth/provider"
)

// openSim opens the real sim back-end through the registry and closes it
// when the test ends.
func openSim(t *testing.T, raw map[string]any) *sim.Sim {
	t.Helper()
	def, err := driver.Lookup("sim")
	if err != nil {
		t.Fatal(err)
	}
	d, err := def.Open(context.Background(), raw, driver.Env{Logger: discard})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close(context.Background()) })
	return d.(*sim.Sim)
}

func simSpec() *driver.Spec {
	return &driver.Spec{Image: "sim/hello:1", Resources: driver.Resources{CPU: driver.CPUs(0.1), Memory: 64 * driver.MiB}}
}

func firstNode(t *testing.T, ctx context.Context, p *provider.Provider) string {
	t.Helper()
	st, err := p.State(ctx)
	if err != nil || len(st.Nodes) == 0 {
		t.Fatalf("State = %v, %v", st, err)
	}
	return st.Nodes[0].Name
}

func TestSimInjectedFailuresOpenBreaker(t *testing.T) {
	ctx := testCtx(t)
	s := openSim(t, map[string]any{"nodes": 2, "fail_retryable": 1.0})
	p := newProvider(t, s, provider.Config{Name: "sim", BreakerFailures: 3, BreakerOpenFor: time.Hour})
	node := firstNode(t, ctx, p)
	var ops []driver.Operation
	for range 3 {
		op, err := p.Create(ctx, node, simSpec())
		if err != nil {
			t.Fatal(err)
		}
		ops = append(ops, op)
	}
	for _, op := range ops {
		if _, err := driver.Drive(ctx, op); !errors.Is(err, driver.ErrRetryable) {
			t.Fatalf("create: err = %v, want ErrRetryable", err)
		}
	}
	if h := p.Health(); h.Breaker != "open" || h.ConsecutiveFailures != 3 {
		t.Fatalf("health = %+v", h)
	}
	n := s.CallCount()
	if _, err := p.Create(ctx, node, simSpec()); !errors.Is(err, driver.ErrRetryable) || !strings.Contains(err.Error(), "circuit breaker is open") {
		t.Fatalf("create with the breaker open: %v", err)
	}
	if s.CallCount() != n {
		t.Fatal("the sim was called while the breaker was open")
	}
}

func TestSimQuotaDoesNotTripBreaker(t *testing.T) {
	ctx := testCtx(t)
	s := openSim(t, map[string]any{"nodes": 2, "fail_quota": 1.0})
	p := newProvider(t, s, provider.Config{Name: "sim", BreakerFailures: 2, BreakerOpenFor: time.Hour})
	node := firstNode(t, ctx, p)
	for range 5 {
		op, err := p.Create(ctx, node, simSpec())
		if err != nil {
			t.Fatal(err)
		}
		if _, err := driver.Drive(ctx, op); !errors.Is(err, driver.ErrQuotaExceeded) {
			t.Fatalf("create: err = %v, want ErrQuotaExceeded", err)
		}
	}
	if h := p.Health(); h.Breaker != "closed" || h.ConsecutiveFailures != 0 {
		t.Fatalf("health = %+v", h)
	}
}

func TestSimOfflineNodeAndRecovery(t *testing.T) {
	ctx := testCtx(t)
	s := openSim(t, map[string]any{"nodes": 2})
	rec := &recorder{}
	p := newProvider(t, s, provider.Config{Name: "sim", BreakerFailures: 2, BreakerOpenFor: 10 * time.Millisecond, Observer: rec})
	node := firstNode(t, ctx, p)
	op, err := p.Create(ctx, node, simSpec())
	if err != nil {
		t.Fatal(err)
	}
	in, err := driver.Drive(ctx, op)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.SetNodeStatus(node, driver.NodeOffline, "test"); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := p.Stop(ctx, in.ID, 0); !errors.Is(err, driver.ErrRetryable) {
			t.Fatalf("stop on an offline node: %v", err)
		}
	}
	if h := p.Health(); h.Breaker != "open" {
		t.Fatalf("health = %+v", h)
	}
	if err := s.SetNodeStatus(node, driver.NodeOnline, ""); err != nil {
		t.Fatal(err)
	}
	waitBreaker(t, ctx, p, "half-open")
	if err := p.Restart(ctx, in.ID, 0); err != nil {
		t.Fatalf("restart after recovery: %v", err)
	}
	if h := p.Health(); h.Breaker != "closed" {
		t.Fatalf("health = %+v", h)
	}
	_, transitions := rec.snapshot()
	if got := strings.Join(transitions, " "); got != "sim:closed->open sim:open->half-open sim:half-open->closed" {
		t.Fatalf("transitions = %s", got)
	}
}

func TestSimLifecycleThroughProvider(t *testing.T) {
	ctx := testCtx(t)
	s := openSim(t, map[string]any{"nodes": 3, "create_latency": "5ms"})
	p := newProvider(t, s, provider.Config{Name: "sim", ReadRate: 1000, ReadBurst: 10, WriteRate: 1000, WriteBurst: 10})
	node := firstNode(t, ctx, p)
	spec := simSpec()
	spec.Name = "web"
	spec.Env = map[string]string{sim.EnvStdout: "hello"}
	op, err := p.Create(ctx, node, spec)
	if err != nil {
		t.Fatal(err)
	}
	in, err := driver.Drive(ctx, op)
	if err != nil || in.State != driver.StateRunning {
		t.Fatalf("create = %+v, %v", in, err)
	}
	if got, err := p.Find(ctx, "web"); err != nil || got.ID != in.ID {
		t.Fatalf("Find = %+v, %v", got, err)
	}
	var out, errb bytes.Buffer
	if err := p.Logs(ctx, in.ID, driver.LogOptions{Stdout: true}, &out, &errb); err != nil || !strings.Contains(out.String(), "hello") {
		t.Fatalf("Logs = %q, %v", out.String(), err)
	}
	if err := p.Kill(ctx, in.ID, "KILL"); err != nil {
		t.Fatal(err)
	}
	if got, err := p.Get(ctx, in.ID); err != nil || got.State == driver.StateRunning {
		t.Fatalf("after KILL: %+v, %v", got, err)
	}
	for i, want := range []error{nil, driver.ErrNotFound} {
		op, err := p.Delete(ctx, in.ID)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := driver.Drive(ctx, op); !errors.Is(err, want) {
			t.Fatalf("delete %d: %v, want %v", i, err, want)
		}
	}
	if h := p.Health(); h.Breaker != "closed" || h.ConsecutiveFailures != 0 {
		t.Fatalf("health = %+v", h)
	}
}
