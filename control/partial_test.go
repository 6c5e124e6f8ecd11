package control_test

import (
	"context"
	"errors"
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

// listLog records every List call made through a provider: whether the
// listing was partial and how many calls the sim had recorded when it
// returned, which orders listings against the sim's call log.
type listLog struct {
	s *sim.Sim
	// after, when set, is called with each listing once it is recorded, on
	// the goroutine that listed and before that goroutine sees the listing.
	after func(e listed)

	mu   sync.Mutex
	list []listed
}

type listed struct {
	partial bool
	calls   int // s.CallCount() when the listing returned
}

func (l *listLog) Call(_, op string, _ time.Duration, err error) {
	if op != "list" {
		return
	}
	var partial *driver.PartialListError
	e := listed{partial: errors.As(err, &partial), calls: l.s.CallCount()}
	l.mu.Lock()
	l.list = append(l.list, e)
	l.mu.Unlock()
	if l.after != nil {
		l.after(e)
	}
}

func (l *listLog) BreakerChanged(string, string, string) {}

// count returns how many listings, partial or complete as asked, returned
// with from <= calls < to.
func (l *listLog) count(partial bool, from, to int) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, e := range l.list {
		if e.partial == partial && e.calls >= from && e.calls < to {
			n++
		}
	}
	return n
}

// callAt returns the position (1-based, as CallCount counts) of the first
// recorded call with op on instance id, or 0.
func callAt(s *sim.Sim, op, id string) int {
	for i, c := range s.Calls() {
		if c.Op == op && c.Instance == id {
			return i + 1
		}
	}
	return 0
}

// newListedSim is newSim with every listing recorded in the returned
// listLog, whose after hook may be set before the plane starts.
func newListedSim(t *testing.T, nodes int) (*sim.Sim, *provider.Provider, *listLog) {
	t.Helper()
	lists := &listLog{}
	s, prov := newSimWith(t, nodes, nil, provider.Config{Observer: lists})
	lists.s = s // before anything is listed: the plane is not started
	return s, prov, lists
}

// makeLeak creates, behind the plane's back, a resource on node tagged as
// the plane's instance ghost, which the store does not know.
func makeLeak(t *testing.T, s *sim.Sim, node, ghost string) string {
	t.Helper()
	ctx := context.Background()
	op, err := s.Create(ctx, node, &driver.Spec{Image: "busybox", Tags: map[string]string{
		driver.TagManaged: "true", driver.TagCluster: testCluster, driver.TagProvider: "sim", driver.TagInstance: ghost,
	}})
	if err != nil {
		t.Fatal(err)
	}
	in, err := driver.Drive(ctx, op)
	if err != nil {
		t.Fatal(err)
	}
	return in.ID
}

// A listing that misses a node is complete for the others: instances on
// the missed node are neither lost nor placed again, even one that is in
// fact gone; leaks on the covered nodes are deleted after two sightings and
// lost instances there are handled as lost; a leak on the missed node is
// counted only once the node is listed again.
func TestPartialListingIsCompleteForTheNodesItCovers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, prov, lists := newListedSim(t, 3)
		p, _ := start(t, config(memory.New(memory.Options{}), prov))
		ctx := context.Background()

		const missed = "node-2"
		on := func(r scheduler.Request, node string) scheduler.Request {
			r.Constraints = []string{"node==" + node}
			return r
		}
		stay := on(req("stay", 2), missed)
		stay.RestartPolicy = driver.RestartPolicy{Name: "always"}
		for _, r := range []scheduler.Request{
			stay,
			on(req("hidden", 1), missed),   // deleted behind Berth's back while its node is missed
			on(req("vanish", 1), "node-1"), // deleted behind Berth's back on a covered node
			on(req("killed", 1), "node-3"), // killed behind Berth's back on a covered node
		} {
			if _, err := p.Submit(ctx, r, ""); err != nil {
				t.Fatal(err)
			}
		}
		before := map[string]control.Instance{}
		for _, id := range []string{"stay-0", "stay-1", "hidden", "vanish", "killed"} {
			before[id] = waitPhase(t, p, id, reconciler.Running)
		}
		if before["stay-0"].Node != missed || before["hidden"].Node != missed {
			t.Fatalf("stay-0 on %s, hidden on %s; want both on %s", before["stay-0"].Node, before["hidden"].Node, missed)
		}

		if err := s.SetNodeUnlisted(missed, true); err != nil {
			t.Fatal(err)
		}
		unlistedAt := s.CallCount()
		for _, id := range []string{"hidden", "vanish"} {
			op, err := s.Delete(ctx, before[id].BackendID)
			if err == nil {
				_, err = driver.Drive(ctx, op)
			}
			if err != nil {
				t.Fatal(err)
			}
		}
		if err := s.Kill(ctx, before["killed"].BackendID, "KILL"); err != nil {
			t.Fatal(err)
		}
		covered := makeLeak(t, s, "node-1", "ghost-1")
		onMissed := makeLeak(t, s, missed, "ghost-2")
		setUp := s.CallCount()

		// The covered nodes are handled as by a complete listing.
		waitFor(t, "the leak on node-1 deleted", func() bool {
			_, err := s.Get(ctx, covered)
			return errors.Is(err, driver.ErrNotFound)
		})
		if del := callAt(s, "delete", covered); lists.count(true, callAt(s, "create", covered), del) < 2 {
			t.Errorf("the leak on node-1 was deleted after %d partial listings, want 2 sightings first", lists.count(true, callAt(s, "create", covered), del))
		}
		vanish := waitPhase(t, p, "vanish", reconciler.Failed)
		if !strings.Contains(vanish.Message, "lost") {
			t.Errorf("vanish: message %q, want the instance lost", vanish.Message)
		}
		waitFor(t, "killed observed as exited", func() bool {
			in, _ := p.Instance(ctx, "killed")
			return in.Phase == reconciler.Exited
		})
		// Several more partial listings: a miss on the missed node would have
		// made hidden lost by now (two listings, then a Get that finds nothing).
		waitFor(t, "five partial listings after the set-up", func() bool { return lists.count(true, setUp, 1<<62) >= 5 })

		// The instances on the missed node are left as they were.
		for _, id := range []string{"stay-0", "stay-1", "hidden"} {
			in, err := p.Instance(ctx, id)
			if err != nil {
				t.Fatal(err)
			}
			if b := before[id]; in.Phase != reconciler.Running || in.BackendID != b.BackendID || in.Node != missed || in.Incarnation != b.Incarnation {
				t.Errorf("%s while %s is missed: %s on %s as %s (incarnation %d, %q); want running on %s as %s (incarnation %d)",
					id, missed, in.Phase, in.Node, in.BackendID, in.Incarnation, in.Message, missed, b.BackendID, b.Incarnation)
			}
		}
		// The leak on the missed node is not touched while it is missed.
		if _, err := s.Get(ctx, onMissed); err != nil {
			t.Fatalf("the leak on %s while it is missed: %v", missed, err)
		}

		if err := s.SetNodeUnlisted(missed, false); err != nil {
			t.Fatal(err)
		}
		listedAt := s.CallCount()
		waitFor(t, "the leak on "+missed+" deleted", func() bool {
			_, err := s.Get(ctx, onMissed)
			return errors.Is(err, driver.ErrNotFound)
		})
		if n := lists.count(false, listedAt, callAt(s, "delete", onMissed)); n < 2 {
			t.Errorf("the leak on %s was deleted after %d complete listings, want 2 sightings once it is listed", missed, n)
		}
		hidden := waitPhase(t, p, "hidden", reconciler.Failed)
		if !strings.Contains(hidden.Message, "lost") {
			t.Errorf("hidden: message %q, want the instance lost once its node is listed", hidden.Message)
		}
		for _, id := range []string{"stay-0", "stay-1"} {
			if in, _ := p.Instance(ctx, id); in.Phase != reconciler.Running || in.BackendID != before[id].BackendID {
				t.Errorf("%s after %s is listed again: %s as %s, want running as %s", id, missed, in.Phase, in.BackendID, before[id].BackendID)
			}
		}
		// Nothing was placed again: the only creates since the node was
		// missed are the test's two leaks.
		for _, c := range s.Calls()[unlistedAt:] {
			if c.Op == "create" && c.Instance != covered && c.Instance != onMissed {
				t.Errorf("create of %s on %s after %s was missed", c.Instance, c.Node, missed)
			}
		}
	})
}

// A sighting of a leak made before its node was missed is kept through the
// partial listings, which cannot tell a leak that went away from one on a
// node they miss: it counts with the first sighting once the node is listed
// again, and the leak is deleted then.
func TestPartialListingKeepsLeakSightings(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, prov, lists := newListedSim(t, 2)
		ctx := context.Background()
		const missed = "node-2"
		leak := makeLeak(t, s, missed, "ghost")
		var (
			mu       sync.Mutex
			complete int
			hookErr  error
			checked  bool
		)
		lists.after = func(e listed) {
			if e.partial {
				return
			}
			mu.Lock()
			complete++
			n := complete
			mu.Unlock()
			switch n {
			case 1:
				// The plane has seen the leak once; every listing after this
				// one misses its node until the test lists it again.
				err := s.SetNodeUnlisted(missed, true)
				mu.Lock()
				hookErr = err
				mu.Unlock()
			case 3:
				// The second complete listing since: the one before it made the
				// second sighting, so the leak's delete is under way. Held here,
				// this listing cannot be the one that starts it.
				deadline := time.Now().Add(10 * time.Second)
				for {
					if _, err := s.Get(ctx, leak); errors.Is(err, driver.ErrNotFound) {
						break
					}
					if time.Now().After(deadline) {
						mu.Lock()
						hookErr = errors.New("the leak was not deleted after the first complete listing once its node was listed again")
						mu.Unlock()
						break
					}
					time.Sleep(5 * time.Millisecond)
				}
				mu.Lock()
				checked = true
				mu.Unlock()
			}
		}
		start(t, config(memory.New(memory.Options{}), prov))
		waitFor(t, "three partial listings", func() bool { return lists.count(true, 0, 1<<62) >= 3 })
		if _, err := s.Get(ctx, leak); err != nil {
			t.Fatalf("the leak, seen once, while its node is missed: %v", err)
		}
		if err := s.SetNodeUnlisted(missed, false); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "the leak deleted and the listing after it checked", func() bool {
			mu.Lock()
			defer mu.Unlock()
			return checked || hookErr != nil
		})
		mu.Lock()
		defer mu.Unlock()
		if hookErr != nil {
			t.Fatal(hookErr)
		}
	})
}
