package integration_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/berth-dev/berth/control"
	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/drivers/local"
	"github.com/berth-dev/berth/provider"
	"github.com/berth-dev/berth/reconciler"
	"github.com/berth-dev/berth/scheduler"
)

// TestPlacementByCapability: with a local and a docker provider, a process
// lands on local and a container on docker, whatever the scores say; a
// process asking for a restart policy (which local lacks) is refused at
// submit naming restart_policy; with local alone, a container request is
// refused naming kind.
func TestPlacementByCapability(t *testing.T) {
	ctx := context.Background()
	loc := openLocal(t)
	e := setup(t, func(c *control.Config) { c.Providers = append(c.Providers, loc) })

	proc := scheduler.Request{ID: "proc", Count: 3, Spec: driver.Spec{Kind: driver.KindProcess, Command: []string{"sleep", "300"},
		Resources: driver.Resources{CPU: 10, Memory: 8 * driver.MiB}}}
	ctr := e.named(scheduler.Request{ID: "ctr", Count: 3, Spec: helloSpec()})
	for _, r := range []scheduler.Request{proc, ctr} {
		if _, err := e.plane.Submit(ctx, r, "it"); err != nil {
			t.Fatalf("%s: %v", r.ID, err)
		}
	}
	for _, in := range e.allIn(t, reconciler.Running, 6) {
		want := provName
		if in.Request == "proc" {
			want = "local"
		}
		if in.Provider != want {
			t.Errorf("%s (%s) placed on %s, want %s", in.ID, in.Spec.KindOrDefault(), in.Provider, want)
		}
	}
	restart := proc
	restart.ID, restart.RestartPolicy = "proc-restart", driver.RestartPolicy{Name: "always"}
	_, err := e.plane.Submit(ctx, restart, "it")
	var fe *driver.FieldError
	if !errors.Is(err, driver.ErrUnsupported) || !errors.As(err, &fe) || fe.Path != "restart_policy" {
		t.Errorf("a process with a restart policy: %v, want unsupported naming restart_policy", err)
	}
	e.deleteAll(t)

	// local alone: a container can run nowhere.
	only, err := control.New(ctx, control.Config{Store: e.store, Providers: []*provider.Provider{loc}, Cluster: e.cluster, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	_, err = only.Submit(ctx, scheduler.Request{ID: "ctr2", Spec: helloSpec()}, "it")
	if !errors.Is(err, driver.ErrUnsupported) || !errors.As(err, &fe) || fe.Path != "kind" {
		t.Errorf("a container with local alone: %v, want unsupported naming kind", err)
	}
}

// openLocal opens a local provider (processes on this host) for a test.
func openLocal(t *testing.T) *provider.Provider {
	t.Helper()
	opts := local.DefaultOptions()
	opts.DataDir = t.TempDir()
	opts.NodeName = "host"
	opts.StopGrace = time.Second
	opts.PollInterval = 20 * time.Millisecond
	opts.CgroupRoot = ""
	opts.AllowRoot = true // the tests run as root
	d, err := local.Open(context.Background(), opts, driver.Env{Provider: "local", Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	p, err := provider.New(d, provider.Config{Name: "local", Logger: quiet, StateTTL: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close(context.Background()) })
	return p
}
