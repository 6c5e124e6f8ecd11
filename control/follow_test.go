package control_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/berth-dev/berth/control"
	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/drivers/sim"
	"github.com/berth-dev/berth/provider"
	"github.com/berth-dev/berth/reconciler"
	"github.com/berth-dev/berth/scheduler"
	"github.com/berth-dev/berth/store"
	"github.com/berth-dev/berth/store/memory"
)

// callCounter counts every call made through a provider.
type callCounter struct{ n atomic.Int64 }

func (c *callCounter) Call(string, string, time.Duration, error) { c.n.Add(1) }
func (c *callCounter) BreakerChanged(string, string, string)     {}

// TestReadOnlyPlaneFollowsAnotherWriter runs a read-only plane next to
// the plane that writes, on the same store, as a follower does next to
// the leader: it follows every change (instances, their requests, quota
// use), answers reads from its copy, refuses every write and operation,
// and neither writes the store nor calls its provider.
func TestReadOnlyPlaneFollowsAnotherWriter(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		_, prov := newSim(t, 2, nil)
		st := memory.New(memory.Options{})
		cfg := config(st, prov)
		cfg.Quotas = []control.Quota{{Owner: "bob", Instances: 5}}
		p, _ := start(t, cfg)
		ctx := context.Background()
		if _, err := p.Submit(ctx, req("before", 1), "bob"); err != nil {
			t.Fatal(err)
		}
		waitPhase(t, p, "before", reconciler.Running)

		// The follower's provider is a sim of its own that counts calls.
		s2, err := sim.New(*sim.DefaultOptions())
		if err != nil {
			t.Fatal(err)
		}
		roCfg, calls := followerConfig(t, cfg, s2)
		// With every goroutine of the writing plane waiting (its next
		// timer), the store's revision moves only if the follower
		// writes.
		synctest.Wait()
		_, revBefore, err := st.List(ctx, "/")
		if err != nil {
			t.Fatal(err)
		}
		ro, _ := start(t, roCfg)
		synctest.Wait()
		if _, rev, _ := st.List(ctx, "/"); rev != revBefore {
			t.Fatalf("the store moved from revision %d to %d as the follower started", revBefore, rev)
		}
		if !ro.ReadOnly() {
			t.Fatal("ReadOnly() is false")
		}
		if in := waitPhase(t, ro, "before", reconciler.Running); in.Spec == nil || in.Spec.Image != "busybox" {
			t.Fatalf("loaded instance %+v", in)
		}

		// Writes of the other plane are followed: a new request, its
		// instances' phases, a deletion.
		if _, err := p.Submit(ctx, req("after", 2), "bob"); err != nil {
			t.Fatal(err)
		}
		waitPhase(t, p, "after-1", reconciler.Running)
		in := waitFollowed(t, ro, "after-1", reconciler.Running)
		if in.Spec == nil || in.Spec.Image != "busybox" || in.Owner != "bob" {
			t.Fatalf("followed instance %+v", in)
		}
		waitFor(t, "the follower's quota use", func() bool {
			use, err := ro.Quotas(ctx)
			return err == nil && len(use) == 1 && use[0].UsedInstances == 3
		})
		if err := p.Delete(ctx, "after-0"); err != nil {
			t.Fatal(err)
		}
		waitFollowed(t, ro, "after-0", reconciler.Deleted)
		waitFor(t, "the follower's quota use after a delete", func() bool {
			use, _ := ro.Quotas(ctx)
			return len(use) == 1 && use[0].UsedInstances == 2
		})
		list, err := ro.Instances(ctx, control.Filter{Owner: "bob"})
		if err != nil || len(list) != 2 {
			t.Fatalf("follower lists %v, %v; want before and after-1", ids(list), err)
		}
		if _, rev, _ := st.List(ctx, "/berth/instances/"); ro.Followed() < rev {
			t.Fatalf("Followed() = %d, want at least %d", ro.Followed(), rev)
		}

		// Every write and every call to a back-end is refused.
		refused := map[string]error{}
		_, refused["submit"] = ro.Submit(ctx, req("no", 1), "bob")
		_, refused["submit group"] = ro.SubmitGroup(ctx, scheduler.Group{ID: "g"}, "bob")
		_, refused["plan"] = ro.Plan(ctx, req("no", 1))
		refused["delete"] = ro.Delete(ctx, "after-1")
		refused["stop"] = ro.Stop(ctx, "after-1", time.Second)
		refused["start"] = ro.Start(ctx, "after-1")
		refused["restart"] = ro.Restart(ctx, "after-1", time.Second)
		refused["suspend"] = ro.Suspend(ctx, "after-1")
		refused["resume"] = ro.Resume(ctx, "after-1")
		refused["kill"] = ro.Kill(ctx, "after-1", "TERM")
		refused["resize"] = ro.Resize(ctx, "after-1", driver.Resources{CPU: driver.CPUs(1)})
		refused["hold"] = ro.Hold(ctx, "after-1", time.Now().Add(time.Hour))
		refused["logs"] = ro.Logs(ctx, "after-1", driver.LogOptions{}, nil, nil)
		if ro.ReadsBackend("after-1") {
			t.Error("ReadsBackend is true for an instance on a sim, which is the leader's own")
		}
		_, refused["nodes"] = ro.Nodes(ctx)
		_, refused["providers"] = ro.Providers(ctx)
		_, refused["images"] = ro.Images(ctx, "sim", "node-1")
		refused["preload"] = ro.Preload(ctx, "sim", "busybox", nil, nil)
		_, refused["usage"] = ro.Usage(ctx, "after-1")
		refused["place round"] = ro.PlaceRound(ctx)
		for what, err := range refused {
			if !errors.Is(err, control.ErrReadOnly) || !errors.Is(err, driver.ErrRetryable) {
				t.Errorf("%s on a read-only plane: %v, want ErrReadOnly", what, err)
			}
		}
		waitPhase(t, p, "after-1", reconciler.Running)
		if n := calls.n.Load(); n != 0 {
			t.Fatalf("the read-only plane made %d provider calls", n)
		}
	})
}

// followerConfig is cfg for a read-only plane whose provider, named sim,
// is d, counting every call made through it.
func followerConfig(t *testing.T, cfg control.Config, d driver.Driver) (control.Config, *callCounter) {
	t.Helper()
	calls := &callCounter{}
	prov, err := provider.New(d, provider.Config{Name: "sim", Logger: quiet, Observer: calls})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = prov.Close(context.Background()) })
	cfg.Providers = []*provider.Provider{prov}
	cfg.ReadOnly = true
	return cfg, calls
}

// sharedSim is a sim that says every server reaches it, as one sim
// reached by two planes in one process is.
type sharedSim struct{ *sim.Sim }

func (sharedSim) SharedBackend() bool { return true }

// TestReadOnlyPlaneReadsASharedBackend: a read-only plane whose provider
// is a shared back-end (driver.SharedBackend) reads an instance's logs
// and usage through it, as a follower does through the leader's Docker
// engine, and still refuses every write and every other call.
func TestReadOnlyPlaneReadsASharedBackend(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, cfg, p := writerWithWeb(t)
		ctx := context.Background()

		roCfg, calls := followerConfig(t, cfg, sharedSim{s})
		ro, _ := start(t, roCfg)
		waitFollowed(t, ro, "web", reconciler.Running)

		if !ro.ReadsBackend("web") {
			t.Fatal("ReadsBackend is false for an instance on a shared back-end")
		}
		var want, got strings.Builder
		if err := p.Logs(ctx, "web", driver.LogOptions{Stdout: true, Stderr: true}, &want, &want); err != nil {
			t.Fatal(err)
		}
		if err := ro.Logs(ctx, "web", driver.LogOptions{Stdout: true, Stderr: true}, &got, &got); err != nil {
			t.Fatalf("logs on the read-only plane: %v", err)
		}
		if got.String() == "" || got.String() != want.String() {
			t.Fatalf("the read-only plane read logs %q, the leader %q", got.String(), want.String())
		}
		if u, err := ro.Usage(ctx, "web"); err != nil || u.Memory == 0 {
			t.Fatalf("usage on the read-only plane: %+v, %v", u, err)
		}
		if n := calls.n.Load(); n < 2 {
			t.Fatalf("the read-only plane made %d provider calls, want its logs and usage", n)
		}

		refused := map[string]error{}
		refused["stop"] = ro.Stop(ctx, "web", time.Second)
		refused["kill"] = ro.Kill(ctx, "web", "TERM")
		refused["resize"] = ro.Resize(ctx, "web", driver.Resources{CPU: driver.CPUs(1)})
		refused["delete"] = ro.Delete(ctx, "web")
		_, refused["nodes"] = ro.Nodes(ctx)
		_, refused["images"] = ro.Images(ctx, "sim", "node-1")
		for what, err := range refused {
			if !errors.Is(err, control.ErrReadOnly) {
				t.Errorf("%s on a read-only plane: %v, want ErrReadOnly", what, err)
			}
		}
		waitPhase(t, p, "web", reconciler.Running)
	})
}

// writerWithWeb starts a plane that writes, on a sim of two nodes and a
// memory store, with bob's instance web running: what a follower follows.
func writerWithWeb(t *testing.T) (*sim.Sim, control.Config, *control.Plane) {
	t.Helper()
	s, prov := newSim(t, 2, nil)
	cfg := config(memory.New(memory.Options{}), prov)
	p, _ := start(t, cfg)
	if _, err := p.Submit(context.Background(), req("web", 1), "bob"); err != nil {
		t.Fatal(err)
	}
	waitPhase(t, p, "web", reconciler.Running)
	return s, cfg, p
}

// TestReadOnlyPlaneWritesNothingOnANewStore makes a read-only plane on an
// empty store: the cluster's id is the writer's to make.
func TestReadOnlyPlaneWritesNothingOnANewStore(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		_, prov := newSim(t, 1, nil)
		st := memory.New(memory.Options{})
		ctx := context.Background()
		ro, err := control.New(ctx, control.Config{Store: st, Providers: []*provider.Provider{prov}, Logger: quiet, ReadOnly: true})
		if err != nil {
			t.Fatal(err)
		}
		if kvs, _, err := st.List(ctx, "/"); err != nil || len(kvs) != 0 {
			t.Fatalf("the store holds %d keys after New (%v), want none", len(kvs), err)
		}
		if ro.ClusterID() != "" {
			t.Fatalf("cluster id %q", ro.ClusterID())
		}
	})
}

// waitFollowed waits until the read-only plane ro holds instance id in
// phase want; it may not know the instance yet.
func waitFollowed(t *testing.T, ro *control.Plane, id string, want reconciler.Phase) control.Instance {
	t.Helper()
	var in control.Instance
	waitFor(t, "the follower to see "+id+" "+string(want), func() bool {
		var err error
		in, err = ro.Instance(context.Background(), id)
		if err != nil && !errors.Is(err, driver.ErrNotFound) {
			t.Fatal(err)
		}
		return err == nil && in.Phase == want
	})
	return in
}

// TestReadOnlyPlaneCurrent: Current says whether a read-only plane's copy
// of an instance is the record the store holds now: true while the copy
// has followed its last change, false once the copy is behind (its plane
// stopped following here) and once the record is gone; a plane that
// writes is always current.
func TestReadOnlyPlaneCurrent(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		_, cfg, p := writerWithWeb(t)
		st := cfg.Store
		ctx := context.Background()
		s2, err := sim.New(*sim.DefaultOptions())
		if err != nil {
			t.Fatal(err)
		}
		roCfg, _ := followerConfig(t, cfg, s2)
		ro, stopFollowing := start(t, roCfg)
		in := waitFollowed(t, ro, "web", reconciler.Running)
		synctest.Wait()
		if in, err = ro.Instance(ctx, "web"); err != nil {
			t.Fatal(err)
		}
		if ok, err := ro.Current(ctx, in); !ok || err != nil {
			t.Fatalf("Current of a copy that followed the last change: %t, %v; want true", ok, err)
		}
		stopFollowing()
		if err := p.Stop(ctx, "web", time.Second); err != nil {
			t.Fatal(err)
		}
		waitPhase(t, p, "web", reconciler.Stopped)
		if in, err = ro.Instance(ctx, "web"); err != nil || in.Phase != reconciler.Running {
			t.Fatalf("the stopped follower's copy: %+v, %v; want it still running", in, err)
		}
		if ok, err := ro.Current(ctx, in); ok || err != nil {
			t.Fatalf("Current of a copy behind the store: %t, %v; want false", ok, err)
		}
		if pin, err := p.Instance(ctx, "web"); err != nil {
			t.Fatal(err)
		} else if ok, err := p.Current(ctx, pin); !ok || err != nil {
			t.Fatalf("Current on the plane that writes: %t, %v; want true", ok, err)
		}
		// A record gone from the store, as a deleted instance's goes in
		// time (taken out here).
		if _, err := st.Txn(ctx, nil, []store.Op{store.Delete(control.PrefixInstances + in.ID)}); err != nil {
			t.Fatal(err)
		}
		if ok, err := ro.Current(ctx, in); ok || err != nil {
			t.Fatalf("Current of a copy whose record is gone: %t, %v; want false", ok, err)
		}
	})
}
