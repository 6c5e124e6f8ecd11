package vm_test

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/berth-dev/berth/control"
	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/drivers/vm"
	"github.com/berth-dev/berth/provider"
	"github.com/berth-dev/berth/reconciler"
	"github.com/berth-dev/berth/scheduler"
	"github.com/berth-dev/berth/store/memory"
)

// TestServerStoppedMidCreateResumes: a control plane starts a VM and is
// stopped while the VM boots, its driver closed with it, as a server that
// dies would leave it. A new plane and driver on the same store take the
// launch over by its tags: the instance runs with exactly one domain, and
// once deleted nothing of it is left.
func TestServerStoppedMidCreateResumes(t *testing.T) {
	t.Parallel()
	o := options(t)
	st := memory.New(memory.Options{})
	cluster := uniq("vmplane")
	ctx := context.Background()

	// plane runs a plane over a fresh driver until the returned stop.
	plane := func() (*control.Plane, *vm.Driver, func()) {
		d, err := vm.New(ctx, o, nil)
		if err != nil {
			t.Fatal(err)
		}
		prov, err := provider.New(d, provider.Config{Name: "vm", Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		p, err := control.New(ctx, control.Config{Store: st, Providers: []*provider.Provider{prov}, Cluster: cluster,
			Logger: slog.New(slog.DiscardHandler), SyncInterval: 200 * time.Millisecond, RetryBackoff: 100 * time.Millisecond,
			LaunchTimeout: 5 * time.Minute, Workers: 2})
		if err != nil {
			t.Fatal(err)
		}
		runCtx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- p.Run(runCtx) }()
		stopped := false
		stop := func() {
			if stopped {
				return
			}
			stopped = true
			cancel()
			if err := <-done; !errors.Is(err, context.Canceled) {
				t.Errorf("Run: %v", err)
			}
			if err := prov.Close(ctx); err != nil {
				t.Errorf("close the provider: %v", err)
			}
		}
		t.Cleanup(stop)
		return p, d, stop
	}
	domains := func(d *vm.Driver, id string) []*driver.Instance {
		t.Helper()
		// This run's alone: a domain an earlier run left behind may carry
		// the same instance id.
		got, err := d.List(ctx, map[string]string{driver.TagInstance: id, driver.TagClusterName: cluster})
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	wait := func(what string, cond func() bool) {
		t.Helper()
		// A liveness bound, above the boot timeout: guests beside
		// each other on a loaded machine boot slowly.
		deadline := time.Now().Add(5 * time.Minute)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s", what)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}

	p1, d1, stop1 := plane()
	spec := helloSpec()
	spec.Name = uniq("vm-resume")
	ans, err := p1.Submit(ctx, scheduler.Request{ID: "boot", Spec: *spec}, "")
	if err != nil {
		t.Fatal(err)
	}
	if ans.Instances[0].Node == nil {
		t.Fatalf("not placed: %s", ans.Instances[0].Instance.Message)
	}
	wait("the domain defined", func() bool { return len(domains(d1, "boot")) > 0 })
	in, _ := p1.Instance(ctx, "boot")
	stop1()
	t.Logf("stopped with the instance %s", in.Phase)

	p2, d2, _ := plane()
	wait("the instance running on the second plane", func() bool {
		in, err := p2.Instance(ctx, "boot")
		return err == nil && in.Phase == reconciler.Running
	})
	in, _ = p2.Instance(ctx, "boot")
	wait("exactly one domain of the instance", func() bool {
		got := domains(d2, "boot")
		return len(got) == 1 && got[0].ID == in.BackendID
	})
	if err := p2.Delete(ctx, "boot"); err != nil {
		t.Fatal(err)
	}
	wait("the instance deleted, and its domain", func() bool {
		in, err := p2.Instance(ctx, "boot")
		return err == nil && in.Phase == reconciler.Deleted && len(domains(d2, "boot")) == 0
	})
	// Nor a file: the storage directory (this test's own) is empty.
	wait("every file of the instance removed", func() bool {
		left, err := os.ReadDir(o.StorageDir)
		return (err == nil && len(left) == 0) || os.IsNotExist(err)
	})
}
