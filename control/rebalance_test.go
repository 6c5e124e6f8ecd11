package control_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
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

// spreadOut submits web (count n, 1 cpu each: one per node of newSim's 4
// cpus) and waits until it runs.
func spreadOut(t *testing.T, p *control.Plane, n int) {
	t.Helper()
	r := req("web", n)
	r.CPU = driver.CPUs(1)
	if _, err := p.Submit(context.Background(), r, "shop"); err != nil {
		t.Fatal(err)
	}
	for i := range n {
		waitPhase(t, p, fmt.Sprintf("web-%d", i), reconciler.Running)
	}
}

// live returns web's instances that hold a node, by id.
func live(t *testing.T, p *control.Plane) map[string]control.Instance {
	t.Helper()
	list, err := p.Instances(context.Background(), control.Filter{Request: "web"})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]control.Instance{}
	for _, in := range list {
		if in.Phase.HoldsNode() {
			out[in.ID] = in
		}
	}
	return out
}

// waitRun waits until the rebalance run is no longer running.
func waitRun(t *testing.T, p *control.Plane) *control.RebalanceRun {
	t.Helper()
	var run *control.RebalanceRun
	waitFor(t, "the rebalance run to end", func() bool {
		var err error
		run, err = p.RebalanceStatus(context.Background())
		return err == nil && run.State != control.RunRunning
	})
	return run
}

// backendCopies counts the back-end's instances of the plane.
func backendCopies(t *testing.T, prov *provider.Provider) int {
	t.Helper()
	return len(tagged(t, prov, map[string]string{driver.TagCluster: testCluster}))
}

// TestRebalanceApplyMakeBreakWithinBudget spreads 4 instances over 4 nodes
// and applies a binpack rebalance with a group budget of 1: the moves end
// with the plan's nodes in use, at most one instance of the request is on
// its way at any time, and 4 run at every moment.
func TestRebalanceApplyMakeBreakWithinBudget(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		_, prov := newSim(t, 4, func(o *sim.Options) { o.CreateLatency = 30 * time.Millisecond; o.DeleteLatency = 10 * time.Millisecond })
		p, _ := start(t, config(memory.New(memory.Options{}), prov))
		spreadOut(t, p, 4)
		run, err := p.ApplyRebalance(context.Background(), control.ApplyOptions{GroupBudget: "1", Parallel: 4, Rate: 100})
		if err != nil {
			t.Fatal(err)
		}
		if run.Plan.NodesBefore != 4 || run.Plan.NodesAfter != 1 || len(run.Moves) != 3 || !run.Check.OK {
			t.Fatalf("run: %+v", run)
		}
		for {
			cur, err := p.RebalanceStatus(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			running, moving := 0, 0
			for _, in := range live(t, p) {
				switch in.Phase {
				case reconciler.Running:
					running++
				case reconciler.Scheduled, reconciler.Creating:
					moving++
				}
			}
			if running < 4 || moving > 1 {
				t.Fatalf("%d running and %d new copies on their way: %+v", running, moving, live(t, p))
			}
			if cur.State != control.RunRunning {
				run = cur
				break
			}
			time.Sleep(2 * time.Millisecond)
		}
		if run.State != control.RunDone {
			t.Fatalf("run: %+v", run)
		}
		nodes := map[string]bool{}
		for _, in := range live(t, p) {
			if in.Phase != reconciler.Running {
				continue
			}
			nodes[in.Node] = true
		}
		if len(nodes) != 1 || len(live(t, p)) != 4 {
			t.Fatalf("after the run: %d nodes, %+v", len(nodes), live(t, p))
		}
		waitFor(t, "one back-end copy per instance", func() bool { return backendCopies(t, prov) == 4 })
	})
}

// TestRebalanceApplyAbortsOnFirstFailure gives the new copies less time
// to run than the sim takes to create them: the first move is undone (its
// new copy deleted), no other starts, and every instance runs where it
// ran.
func TestRebalanceApplyAbortsOnFirstFailure(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		_, prov := newSim(t, 4, func(o *sim.Options) { o.CreateLatency = 50 * time.Millisecond })
		p, _ := start(t, config(memory.New(memory.Options{}), prov))
		spreadOut(t, p, 4)
		before := live(t, p)
		if _, err := p.ApplyRebalance(context.Background(), control.ApplyOptions{Parallel: 1, Rate: 100, MoveTimeout: 10 * time.Millisecond}); err != nil {
			t.Fatal(err)
		}
		run := waitRun(t, p)
		if run.State != control.RunAborted || run.Moves[0].State != control.MoveUndone || run.Moves[1].State != control.MovePlanned {
			t.Fatalf("run: %+v", run)
		}
		waitFor(t, "the new copy deleted", func() bool { return len(live(t, p)) == 4 && backendCopies(t, prov) == 4 })
		for id, in := range live(t, p) {
			if b, ok := before[id]; !ok || b.Node != in.Node || in.Phase != reconciler.Running {
				t.Fatalf("%s: %+v, before %+v", id, in, b)
			}
		}
		if _, err := p.ApplyRebalance(context.Background(), control.ApplyOptions{GroupBudget: "0"}); err == nil {
			t.Fatal("a budget of 0 was taken")
		}
	})
}

// TestRebalanceRestartSettlesTheRun stops the plane in the middle of an
// apply whose copies take long to create, and starts another on the same
// store: the run is abandoned, and every instance of web ends with exactly
// one copy, none lost.
func TestRebalanceRestartSettlesTheRun(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		_, prov := newSim(t, 4, func(o *sim.Options) { o.CreateLatency = 200 * time.Millisecond })
		st := memory.New(memory.Options{})
		p1, stop1 := start(t, config(st, prov))
		spreadOut(t, p1, 4)
		if _, err := p1.ApplyRebalance(context.Background(), control.ApplyOptions{GroupBudget: "100%", Parallel: 4, Rate: 1000}); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "new copies on their way", func() bool { return len(live(t, p1)) > 4 })
		stop1()

		p2, _ := start(t, config(st, prov))
		run := waitRun(t, p2)
		if run.State != control.RunAbandoned {
			t.Fatalf("run: %+v", run)
		}
		waitFor(t, "four instances of web, one copy each", func() bool {
			l := live(t, p2)
			running := 0
			for _, in := range l {
				if in.Phase == reconciler.Running {
					running++
				}
			}
			return len(l) == 4 && running == 4 && backendCopies(t, prov) == 4
		})
		for _, in := range live(t, p2) {
			got := tagged(t, prov, map[string]string{driver.TagInstance: in.ID})
			if len(got) != 1 || got[0].ID != in.BackendID {
				t.Fatalf("%s: back-end copies %v, record says %s", in.ID, got, in.BackendID)
			}
		}
	})
}

// autoMetrics counts the continuous mode's rounds and runs.
type autoMetrics struct {
	mu            sync.Mutex
	rounds, ended int
	applied       int
	lastState     string
}

func (m *autoMetrics) Scheduled(time.Duration, bool) {}
func (m *autoMetrics) QueueDepth(int)                {}
func (m *autoMetrics) Launched(string, error)        {}
func (m *autoMetrics) QuotaUse(control.QuotaUse)     {}
func (m *autoMetrics) LeakFound(string)              {}
func (m *autoMetrics) Conflicts(int)                 {}
func (m *autoMetrics) RebalanceRound(applied bool, moves, freed int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.rounds++
	if applied {
		m.applied++
	}
}
func (m *autoMetrics) RebalanceEnded(state string, done, undone int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.ended++
	m.lastState = state
}

// TestRebalanceContinuousMode runs the plane with the continuous mode on:
// a round frees the nodes a spread-out service leaves, the later rounds
// find nothing worth moving, and the metrics count them.
func TestRebalanceContinuousMode(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		_, prov := newSim(t, 4, func(o *sim.Options) { o.CreateLatency = 10 * time.Millisecond })
		cfg := config(memory.New(memory.Options{}), prov)
		m := &autoMetrics{}
		cfg.Metrics = m
		cfg.Rebalance = control.AutoRebalance{Every: time.Second, Options: control.ApplyOptions{Rate: 100}}
		p, _ := start(t, cfg)
		spreadOut(t, p, 4)
		run := waitRun(t, p)
		if run.State != control.RunDone || len(run.Moves) != 3 {
			t.Fatalf("run: %+v", run)
		}
		waitFor(t, "two more rounds", func() bool {
			m.mu.Lock()
			defer m.mu.Unlock()
			return m.rounds >= 3
		})
		m.mu.Lock()
		defer m.mu.Unlock()
		if m.applied != 1 || m.ended != 1 || m.lastState != control.RunDone {
			t.Fatalf("metrics: %+v", m)
		}
		nodes := map[string]bool{}
		for _, in := range live(t, p) {
			nodes[in.Node] = true
		}
		if len(nodes) != 1 {
			t.Fatalf("instances on %v", nodes)
		}
	})
}

// TestRebalanceApplyKeepsGroupRunning moves the members of a group: the
// group runs throughout and after, and the moved members' records are
// gone (the run says which copies replaced them).
func TestRebalanceApplyKeepsGroupRunning(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		_, prov := newSim(t, 4, func(o *sim.Options) { o.CreateLatency = 10 * time.Millisecond })
		p, _ := start(t, config(memory.New(memory.Options{}), prov))
		ctx := context.Background()
		svc := scheduler.Service{Request: scheduler.Request{Count: 4, Spec: driver.Spec{Name: "w", Image: "busybox", Resources: driver.Resources{CPU: driver.CPUs(1)}}}}
		if _, err := p.SubmitGroup(ctx, scheduler.Group{ID: "job", Services: []scheduler.Service{svc}}, "shop"); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "the group running", func() bool {
			g, err := p.Group(ctx, "job")
			return err == nil && g.State == control.GroupRunning
		})
		if _, err := p.ApplyRebalance(ctx, control.ApplyOptions{Rate: 100}); err != nil {
			t.Fatal(err)
		}
		run := waitRun(t, p)
		if run.State != control.RunDone || len(run.Moves) == 0 {
			t.Fatalf("run: %+v", run)
		}
		g, err := p.Group(ctx, "job")
		if err != nil {
			t.Fatal(err)
		}
		if g.State != control.GroupRunning || g.Services[0].Running != 4 {
			t.Fatalf("group after the run: %+v", g)
		}
		for _, m := range run.Moves {
			if _, err := p.Instance(ctx, m.Instance); !errors.Is(err, driver.ErrNotFound) {
				t.Fatalf("moved instance %s: %v", m.Instance, err)
			}
			if in, err := p.Instance(ctx, m.New); err != nil || in.Phase != reconciler.Running || in.Node != m.To || in.Group != "job" {
				t.Fatalf("new copy %s: %+v, %v", m.New, in, err)
			}
		}
	})
}

func TestRebalanceRunForANamespace(t *testing.T) {
	run := &control.RebalanceRun{State: control.RunAborted, Error: "move of secret-db from n1 to n2: boom", Moves: []control.MoveRun{
		{Move: scheduler.Move{Instance: "web-0", Owner: "a"}, State: control.MoveDone},
		{Move: scheduler.Move{Instance: "secret-db", Owner: "b"}, State: control.MoveUndone, Error: "boom"},
	}}
	got := run.For(func(ns string) bool { return ns == "a" })
	if len(got.Moves) != 1 || got.Moves[0].Instance != "web-0" || strings.Contains(got.Error, "secret") || len(run.Moves) != 2 {
		t.Fatalf("for a: %+v (from %+v)", got, run)
	}
	if all := run.For(func(string) bool { return true }); all.Error != run.Error || len(all.Moves) != 2 {
		t.Fatalf("for all: %+v", all)
	}
}
