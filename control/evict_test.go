package control_test

import (
	"context"
	"fmt"
	"testing"
	"testing/synctest"
	"time"

	"github.com/berth-dev/berth/control"
	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/drivers/sim"
	"github.com/berth-dev/berth/provider"
	"github.com/berth-dev/berth/reconciler"
	"github.com/berth-dev/berth/scheduler"
	"github.com/berth-dev/berth/store/memory"
)

// evictionGroup is a group of n instances of cpus each, essential of them
// essential, at priority.
func evictionGroup(id string, n int, cpus float64, essential, priority int) scheduler.Group {
	return scheduler.Group{ID: id, Priority: priority, Services: []scheduler.Service{{Request: scheduler.Request{Count: n, Spec: driver.Spec{
		Name: id, Image: "busybox", Resources: driver.Resources{CPU: driver.CPUs(cpus)}}}, Essential: &essential}}}
}

// A group that evicts elastic instances is created only once their copies
// are gone from the back-end, which would refuse it for lack of room
// before: no failed attempt, no node excluded. Both the evictions made at
// submission and those of a later pass of the gang queue.
func TestEvictorsWaitForTheirVictims(t *testing.T) {
	t.Run("at submission", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			_, prov := newSim(t, 1, func(o *sim.Options) { o.DeleteLatency = 300 * time.Millisecond })
			p, _ := start(t, config(memory.New(memory.Options{}), prov))
			ctx := context.Background()
			if _, err := p.SubmitGroup(ctx, evictionGroup("low", 4, 1, 0, 1), ""); err != nil {
				t.Fatal(err)
			}
			for i := range 4 {
				waitPhase(t, p, fmt.Sprintf("low.low-%d", i), reconciler.Running)
			}
			ans, err := p.SubmitGroup(ctx, evictionGroup("high", 1, 3, 1, 5), "")
			if err != nil {
				t.Fatal(err)
			}
			if len(ans.Instances) != 1 || ans.Instances[0].Node == nil {
				t.Fatalf("high not placed: %+v", ans)
			}
			checkEvicted(t, p, prov, "high.high", 3)
		})
	})
	t.Run("by the gang queue", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			_, prov := newSim(t, 1, func(o *sim.Options) { o.DeleteLatency = 300 * time.Millisecond })
			p, _ := start(t, config(memory.New(memory.Options{}), prov))
			ctx := context.Background()
			plain := req("plain", 1)
			plain.CPU = driver.CPUs(2)
			if _, err := p.Submit(ctx, plain, ""); err != nil {
				t.Fatal(err)
			}
			if _, err := p.SubmitGroup(ctx, evictionGroup("low", 2, 1, 0, 1), ""); err != nil {
				t.Fatal(err)
			}
			for _, id := range []string{"plain", "low.low-0", "low.low-1"} {
				waitPhase(t, p, id, reconciler.Running)
			}
			// Evicting both elastic instances frees 2 cpus of the 3 it
			// needs: high waits in the queue.
			if _, err := p.SubmitGroup(ctx, evictionGroup("high", 1, 3, 1, 5), ""); err != nil {
				t.Fatal(err)
			}
			if ph := phaseOf(t, p, "high.high"); ph != reconciler.Pending {
				t.Fatalf("high is %s, want pending", ph)
			}
			// Once plain is gone, evicting one of them makes room.
			if err := p.Delete(ctx, "plain"); err != nil {
				t.Fatal(err)
			}
			checkEvicted(t, p, prov, "high.high", 1)
		})
	})
}

// checkEvicted waits until evictor runs, and checks that it never failed
// and that exactly evicted instances of group low were deleted, the rest
// running, and the back-end holds only what runs.
func checkEvicted(t *testing.T, p *control.Plane, prov *provider.Provider, evictor string, evicted int) {
	t.Helper()
	in := waitPhase(t, p, evictor, reconciler.Running)
	if in.Attempts != 0 || len(in.Exclude) != 0 {
		t.Errorf("%s: %d failed attempts, excluded %v (%s), want none", evictor, in.Attempts, in.Exclude, in.Message)
	}
	waitFor(t, fmt.Sprintf("%d evicted instances deleted", evicted), func() bool {
		all, err := p.Instances(context.Background(), control.Filter{All: true})
		n := 0
		for _, x := range all {
			if x.Group == "low" && x.Phase == reconciler.Deleted {
				n++
			}
		}
		return err == nil && n >= evicted
	})
	all, err := p.Instances(context.Background(), control.Filter{All: true})
	if err != nil {
		t.Fatal(err)
	}
	running, deleted := 0, 0
	for _, x := range all {
		switch x.Phase {
		case reconciler.Running:
			running++
		case reconciler.Deleted:
			if x.Group == "low" {
				deleted++
			}
		}
	}
	if deleted != evicted {
		t.Errorf("%d instances of low deleted, want %d", deleted, evicted)
	}
	waitFor(t, "the back-end to hold only what runs", func() bool {
		return len(tagged(t, prov, map[string]string{driver.TagCluster: testCluster})) == running
	})
}
