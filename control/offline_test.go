package control_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"testing/synctest"
	"time"

	"github.com/berth-dev/berth/control"
	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/drivers/sim"
	"github.com/berth-dev/berth/provider"
	"github.com/berth-dev/berth/reconciler"
	"github.com/berth-dev/berth/store/memory"
)

// otherNode returns the node of a two-node sim that is not node.
func otherNode(t *testing.T, prov *provider.Provider, node string) string {
	t.Helper()
	ps, err := prov.State(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range ps.Nodes {
		if n.Name != node {
			return n.Name
		}
	}
	t.Fatalf("no node other than %s", node)
	return ""
}

// A node going offline while launches are under way moves its instances to
// the other node, and never excludes (or marks stale) the node that stayed:
// the node-offline event names its node, so an instance that moved since the
// sync's snapshot (its create refused by the offline node) ignores it.
func TestNodeOfflineDuringLaunchesTouchesOnlyThatNode(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, prov := newSim(t, 2, nil)
		cfg := config(memory.New(memory.Options{}), prov)
		cfg.SyncInterval = 100 * time.Millisecond
		p, _ := start(t, cfg)
		ctx := context.Background()
		first, err := p.Submit(ctx, req("first", 1), "")
		if err != nil {
			t.Fatal(err)
		}
		gone := first.Instances[0].Node.Name
		kept := otherNode(t, prov, gone)
		waitPhase(t, p, "first", reconciler.Running)
		if err := s.SetNodeStatus(gone, driver.NodeOffline, "engine stopped"); err != nil {
			t.Fatal(err)
		}
		// Placed while the plane still sees both nodes online: the creates on
		// the offline node are refused and move on, some of them while the
		// sync tells the instances on that node that it went offline.
		const total = 200
		r := req("svc", total)
		r.Resources = driver.Resources{CPU: driver.CPUs(0.01), Memory: 16 * driver.MiB}
		r.RestartPolicy = driver.RestartPolicy{Name: "always"}
		ans, err := p.Submit(ctx, r, "")
		if err != nil {
			t.Fatal(err)
		}
		if !slices.ContainsFunc(ans.Instances, func(pl control.Placed) bool { return pl.Node.Name == gone }) {
			t.Fatalf("no instance was placed on %s before the plane saw it offline: the test did not exercise the path", gone)
		}
		waitFor(t, "every instance running on the node that stayed", func() bool {
			list, err := p.Instances(ctx, control.Filter{Request: "svc"})
			if err != nil {
				t.Fatal(err)
			}
			n := 0
			for _, in := range list {
				if in.Phase == reconciler.Running && in.Node == kept {
					n++
				}
			}
			return n == total
		})
		list, _ := p.Instances(ctx, control.Filter{Request: "svc"})
		for _, in := range list {
			if slices.Contains(in.Exclude, reconciler.NodeID("sim", kept)) {
				t.Errorf("%s excludes %s, which never went offline (exclude %v, message %q)", in.ID, kept, in.Exclude, in.Message)
			}
			for _, r := range in.Stale {
				if r.Node != gone {
					t.Errorf("%s has a stale copy on %s, which never went offline", in.ID, r.Node)
				}
			}
		}
	})
}

// An instance whose retry is deleting a failed copy on a node that went
// offline is not stuck in deleting until the node returns: the copy
// becomes stale and the instance is placed again at once; when the node
// returns the copy is deleted, so exactly one copy survives.
func TestFailedCopyOnAnOfflineNodeDoesNotBlockTheRetry(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		clock := sim.NewManualClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
		s, prov := newSim(t, 2, func(o *sim.Options) {
			o.Clock = clock
			// Creates finish only once the test moves the clock; until then
			// the plane looks again every (real) second.
			o.CreateLatency = time.Second
		})
		cfg := config(memory.New(memory.Options{}), prov)
		cfg.LaunchTimeout = 3 * time.Second
		p, _ := start(t, cfg)
		ctx := context.Background()
		ans, err := p.Submit(ctx, req("job", 1), "") // no restart policy
		if err != nil {
			t.Fatal(err)
		}
		gone := ans.Instances[0].Node.Name
		waitFor(t, "the first copy's back-end id", func() bool {
			in, _ := p.Instance(ctx, "job")
			return in.Phase == reconciler.Creating && in.BackendID != ""
		})
		first, _ := p.Instance(ctx, "job")
		if err := s.SetNodeStatus(gone, driver.NodeOffline, "engine stopped"); err != nil {
			t.Fatal(err)
		}
		// The launch times out; its cleanup cannot reach the offline node.
		waitFor(t, "job to be created again on the other node", func() bool {
			return slices.ContainsFunc(s.Calls(), func(c sim.Call) bool {
				return c.Op == "create" && c.Node != gone && c.Err == nil
			})
		})
		clock.Advance(time.Minute)
		moved := waitPhase(t, p, "job", reconciler.Running)
		if moved.Node == gone || len(moved.Stale) != 1 || moved.Stale[0].BackendID != first.BackendID {
			t.Fatalf("moved instance: node %s, stale %+v; want another node than %s and the first copy %s stale", moved.Node, moved.Stale, gone, first.BackendID)
		}
		if err := s.SetNodeStatus(gone, driver.NodeOnline, ""); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "the stale copy deleted", func() bool {
			in, _ := p.Instance(ctx, "job")
			return len(in.Stale) == 0
		})
		got := tagged(t, prov, map[string]string{driver.TagInstance: "job"})
		if len(got) != 1 || got[0].ID != moved.BackendID {
			t.Fatalf("copies of job: %v, want only %s", got, moved.BackendID)
		}
	})
}

// Retryable create failures on a node that went offline before the plane
// noticed do not use up the attempts: the node is excluded, its cached
// state dropped, and the instances go to the other node.
func TestRetryableFailuresOnAnOfflineNodeMoveOnWithoutUsingAttempts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, prov := newSim(t, 2, nil)
		cfg := config(memory.New(memory.Options{}), prov)
		cfg.MaxAttempts = 1
		p, err := control.New(context.Background(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		// Placed before Run, while the plane still sees both nodes online.
		var gone string
		var ids []string
		for i := range 4 {
			ans, err := p.Submit(ctx, req(fmt.Sprintf("w-%d", i), 1), "")
			if err != nil {
				t.Fatal(err)
			}
			pl := ans.Instances[0]
			ids = append(ids, pl.Instance.ID)
			if i == 0 {
				gone = pl.Node.Name
			}
		}
		if err := s.SetNodeStatus(gone, driver.NodeOffline, "engine stopped"); err != nil {
			t.Fatal(err)
		}
		runCtx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- p.Run(runCtx) }()
		defer func() {
			cancel()
			if err := <-done; !errors.Is(err, context.Canceled) {
				t.Errorf("Run returned %v", err)
			}
		}()
		for _, id := range ids {
			in := waitPhase(t, p, id, reconciler.Running)
			if in.Node == gone || in.Attempts != 0 {
				t.Errorf("%s: node %s, attempts %d; want the other node and no attempt used", id, in.Node, in.Attempts)
			}
		}
		refused := 0
		for _, c := range s.Calls() {
			if c.Op == "create" && c.Node == gone && errors.Is(c.Err, driver.ErrRetryable) {
				refused++
			}
		}
		if refused == 0 {
			t.Fatalf("no create reached the offline node %s: the test did not exercise the path", gone)
		}
	})
}

// Exclusions steer placement but never strand an instance: when the node
// it avoids is the only healthy one left, it goes there rather than wait
// for the exclusion to expire.
func TestExcludedNodeIsUsedWhenNoOtherIsHealthy(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, prov := newSim(t, 2, nil)
		cfg := config(memory.New(memory.Options{}), prov)
		cfg.ExcludeFor = time.Hour
		p, _ := start(t, cfg)
		ctx := context.Background()
		r := req("svc", 1)
		r.RestartPolicy = driver.RestartPolicy{Name: "always"}
		ans, err := p.Submit(ctx, r, "")
		if err != nil {
			t.Fatal(err)
		}
		a := ans.Instances[0].Node.Name
		b := otherNode(t, prov, a)
		waitPhase(t, p, "svc", reconciler.Running)
		if err := s.SetNodeStatus(a, driver.NodeOffline, "engine stopped"); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "svc to run on "+b, func() bool {
			in, _ := p.Instance(ctx, "svc")
			return in.Phase == reconciler.Running && in.Node == b
		})
		if in, _ := p.Instance(ctx, "svc"); !slices.Contains(in.Exclude, reconciler.NodeID("sim", a)) || !time.Now().Before(in.ExcludeUntil) {
			t.Fatalf("svc does not exclude %s after it went offline: %v until %v", a, in.Exclude, in.ExcludeUntil)
		}
		if err := s.SetNodeStatus(a, driver.NodeOnline, ""); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "the stale copy on "+a+" deleted", func() bool {
			in, _ := p.Instance(ctx, "svc")
			return len(in.Stale) == 0
		})
		if err := s.SetNodeStatus(b, driver.NodeOffline, "engine stopped"); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "svc to run on "+a+", which it excludes, the only healthy node", func() bool {
			in, _ := p.Instance(ctx, "svc")
			return in.Phase == reconciler.Running && in.Node == a
		})
	})
}
