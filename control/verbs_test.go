package control_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
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

// stopGated is the sim whose stops wait until gate is closed: what keeps
// an instance stopping.
type stopGated struct {
	*sim.Sim
	gate chan struct{}
}

func (g stopGated) Stop(ctx context.Context, id string, grace time.Duration) error {
	select {
	case <-g.gate:
	case <-ctx.Done():
		return ctx.Err()
	}
	return g.Sim.Stop(ctx, id, grace)
}

// verbCell is the outcome of one verb in one phase: the error the verb
// answers (nil: accepted), whether it changed nothing (the record's
// revision is the same), and the phase the instance reaches once what
// held it in its phase lets go.
type verbCell struct {
	err  error
	same bool
	then reconciler.Phase
}

// TestVerbsInEveryPhase: every verb against every phase, on the bubble's
// fake clock, each cell stating the outcome. Verbs are accepted wherever
// they can mean something and carried out when the instance can take
// them; a verb already satisfied changes nothing; only what can never
// apply is refused.
func TestVerbsInEveryPhase(t *testing.T) {
	ok := func(then reconciler.Phase) verbCell { return verbCell{then: then} }
	same := func(then reconciler.Phase) verbCell { return verbCell{same: true, then: then} }
	refused := func(err error, then reconciler.Phase) verbCell { return verbCell{err: err, same: true, then: then} }
	const (
		pending, scheduled, creating, running = reconciler.Pending, reconciler.Scheduled, reconciler.Creating, reconciler.Running
		stopping, stopped, exited, deleting   = reconciler.Stopping, reconciler.Stopped, reconciler.Exited, reconciler.Deleting
		deleted, failed, held, suspended      = reconciler.Deleted, reconciler.Failed, reconciler.Held, reconciler.Suspended
	)
	// Before the instance exists, a verb is recorded and done once it is.
	unborn := map[reconciler.Verb]verbCell{
		reconciler.VerbStop: ok(stopped), reconciler.VerbKill: ok(stopped), reconciler.VerbStart: ok(running),
		reconciler.VerbRestart: ok(running), reconciler.VerbSuspend: ok(suspended), reconciler.VerbResume: ok(running),
		reconciler.VerbDelete: ok(deleted),
	}
	invalid, notSuspended := driver.ErrInvalid, driver.ErrNotSuspended
	table := map[reconciler.Phase]map[reconciler.Verb]verbCell{
		pending: unborn, scheduled: unborn, creating: unborn,
		running: {
			reconciler.VerbStop: ok(stopped), reconciler.VerbKill: ok(exited), reconciler.VerbStart: same(running),
			reconciler.VerbRestart: ok(running), reconciler.VerbSuspend: ok(suspended), reconciler.VerbResume: same(running),
			reconciler.VerbDelete: ok(deleted),
		},
		stopping: {
			// A kill while the stop waits ends the process: the back-end
			// shows it exited.
			reconciler.VerbStop: same(stopped), reconciler.VerbKill: ok(exited), reconciler.VerbStart: ok(running),
			reconciler.VerbRestart: ok(running), reconciler.VerbSuspend: same(stopped), reconciler.VerbResume: refused(notSuspended, stopped),
			reconciler.VerbDelete: ok(deleted),
		},
		stopped: {
			reconciler.VerbStop: same(stopped), reconciler.VerbKill: same(stopped), reconciler.VerbStart: ok(running),
			reconciler.VerbRestart: ok(running), reconciler.VerbSuspend: same(stopped), reconciler.VerbResume: refused(notSuspended, stopped),
			reconciler.VerbDelete: ok(deleted),
		},
		exited: {
			reconciler.VerbStop: same(exited), reconciler.VerbKill: same(exited), reconciler.VerbStart: ok(running),
			reconciler.VerbRestart: ok(running), reconciler.VerbSuspend: same(exited), reconciler.VerbResume: refused(notSuspended, exited),
			reconciler.VerbDelete: ok(deleted),
		},
		deleting: {
			reconciler.VerbStop: same(deleted), reconciler.VerbKill: same(deleted), reconciler.VerbStart: refused(invalid, deleted),
			reconciler.VerbRestart: refused(invalid, deleted), reconciler.VerbSuspend: refused(invalid, deleted),
			reconciler.VerbResume: refused(invalid, deleted), reconciler.VerbDelete: same(deleted),
		},
		deleted: {
			reconciler.VerbStop: same(deleted), reconciler.VerbKill: same(deleted), reconciler.VerbStart: refused(invalid, deleted),
			reconciler.VerbRestart: refused(invalid, deleted), reconciler.VerbSuspend: refused(invalid, deleted),
			reconciler.VerbResume: refused(invalid, deleted), reconciler.VerbDelete: same(deleted),
		},
		failed: {
			reconciler.VerbStop: same(failed), reconciler.VerbKill: same(failed), reconciler.VerbStart: ok(running),
			reconciler.VerbRestart: ok(running), reconciler.VerbSuspend: same(failed), reconciler.VerbResume: refused(notSuspended, failed),
			reconciler.VerbDelete: ok(deleted),
		},
		held: {
			reconciler.VerbStop: ok(stopped), reconciler.VerbKill: ok(held), reconciler.VerbStart: same(held),
			reconciler.VerbRestart: ok(held), reconciler.VerbSuspend: refused(invalid, held), reconciler.VerbResume: same(held),
			reconciler.VerbDelete: ok(deleted),
		},
		suspended: {
			reconciler.VerbStop: ok(stopped), reconciler.VerbKill: ok(exited), reconciler.VerbStart: ok(running),
			reconciler.VerbRestart: ok(running), reconciler.VerbSuspend: same(suspended), reconciler.VerbResume: ok(running),
			reconciler.VerbDelete: ok(deleted),
		},
	}
	for _, ph := range reconciler.Phases {
		for _, v := range reconciler.Verbs {
			cell, ok := table[ph][v]
			if !ok {
				t.Fatalf("no outcome stated for %s of a %s instance", v, ph)
			}
			t.Run(fmt.Sprintf("%s/%s", ph, v), func(t *testing.T) {
				synctest.Test(t, func(t *testing.T) { verbInPhase(t, ph, v, cell) })
			})
		}
	}
}

// verbInPhase brings an instance to phase ph, asks v of it and checks
// cell.
func verbInPhase(t *testing.T, ph reconciler.Phase, v reconciler.Verb, cell verbCell) {
	ctx := context.Background()
	s, err := sim.New(sim.Options{Nodes: 1, Shape: sim.Shape{Resources: driver.Resources{CPU: driver.CPUs(1), Memory: 8 * driver.GiB}},
		// Within the plane's launch timeout (config: 5s).
		CreateLatency: 3 * time.Second * time.Duration(btoi(ph == reconciler.Creating)),
		DeleteLatency: time.Minute * time.Duration(btoi(ph == reconciler.Deleting))})
	if err != nil {
		t.Fatal(err)
	}
	g := stopGated{Sim: s, gate: make(chan struct{})}
	open := sync.OnceFunc(func() { close(g.gate) })
	defer open()
	prov, err := provider.New(g, provider.Config{Name: "sim", Logger: quiet, StateTTL: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = prov.Close(context.Background()) })
	cfg := config(memory.New(memory.Options{}), prov)
	p, err := control.New(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	var stopRun func()
	run := func() {
		runCtx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- p.Run(runCtx) }()
		stopRun = func() { cancel(); <-done }
	}
	t.Cleanup(func() {
		if stopRun != nil {
			stopRun()
		}
	})
	if ph != reconciler.Scheduled {
		run()
	}
	// release lets go of what holds the instance in its phase.
	release := func() {}
	const id = "x"
	x := req(id, 1)
	switch ph {
	case reconciler.Pending:
		// The node is full until "big" goes.
		big := req("big", 1)
		big.Resources.CPU = driver.CPUs(1)
		if _, err := p.Submit(ctx, big, ""); err != nil {
			t.Fatal(err)
		}
		waitPhase(t, p, "big", reconciler.Running)
		release = func() {
			if err := p.Delete(ctx, "big"); err != nil {
				t.Fatal(err)
			}
		}
	case reconciler.Scheduled:
		release = run
	}
	if _, err := p.Submit(ctx, x, ""); err != nil {
		t.Fatal(err)
	}
	switch ph {
	case reconciler.Pending, reconciler.Scheduled, reconciler.Creating:
		waitPhase(t, p, id, ph)
		if ph == reconciler.Creating {
			release = func() { time.Sleep(3 * time.Second) }
		}
	default:
		in := waitPhase(t, p, id, reconciler.Running)
		switch ph {
		case reconciler.Stopping:
			if err := p.StopLater(ctx, id, time.Second); err != nil {
				t.Fatal(err)
			}
			release = open
		case reconciler.Stopped:
			open()
			if err := p.Stop(ctx, id, 0); err != nil {
				t.Fatal(err)
			}
		case reconciler.Exited:
			if err := s.Kill(ctx, in.BackendID, "TERM"); err != nil {
				t.Fatal(err)
			}
		case reconciler.Deleting, reconciler.Deleted:
			if err := p.Delete(ctx, id); err != nil {
				t.Fatal(err)
			}
			release = func() { time.Sleep(time.Minute) }
		case reconciler.Failed:
			// Lost behind the plane's back, without a restart policy.
			op, err := s.Delete(ctx, in.BackendID)
			if err != nil {
				t.Fatal(err)
			}
			for pr, err := op.Advance(ctx); !pr.Done; pr, err = op.Advance(ctx) {
				if err != nil {
					t.Fatal(err)
				}
			}
		case reconciler.Held:
			if err := p.Hold(ctx, id, time.Now().Add(time.Hour)); err != nil {
				t.Fatal(err)
			}
		case reconciler.Suspended:
			if err := p.Suspend(ctx, id); err != nil {
				t.Fatal(err)
			}
		}
		waitPhase(t, p, id, ph)
	}
	if ph != reconciler.Stopping {
		// Stops made by the verbs are not held.
		open()
	}

	before, err := p.Instance(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	err = verb(ctx, p, id, v)
	switch {
	case cell.err == nil && err != nil:
		t.Fatalf("%s of a %s instance: %v, want it accepted", v, ph, err)
	case cell.err != nil && !errors.Is(err, cell.err):
		t.Fatalf("%s of a %s instance: %v, want %v", v, ph, err, cell.err)
	}
	after, err := p.Instance(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if changed := after.Revision != before.Revision; cell.same && changed {
		t.Errorf("%s of a %s instance changed it: %s (want %q) → %s (want %q)", v, ph, before.Phase, before.Want, after.Phase, after.Want)
	}
	release()
	in := waitPhase(t, p, id, cell.then)
	if in.Want != "" {
		t.Errorf("%s of a %s instance: %s with want %q left", v, ph, in.Phase, in.Want)
	}
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// verb asks v of instance id.
func verb(ctx context.Context, p *control.Plane, id string, v reconciler.Verb) error {
	switch v {
	case reconciler.VerbStop:
		return p.Stop(ctx, id, time.Second)
	case reconciler.VerbKill:
		return p.Kill(ctx, id, "KILL")
	case reconciler.VerbStart:
		return p.Start(ctx, id)
	case reconciler.VerbRestart:
		return p.Restart(ctx, id, time.Second)
	case reconciler.VerbSuspend:
		return p.Suspend(ctx, id)
	case reconciler.VerbResume:
		return p.Resume(ctx, id)
	case reconciler.VerbDelete:
		return p.Delete(ctx, id)
	}
	panic("unknown verb " + v)
}
