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
	"github.com/berth-dev/berth/driver/drivertest"
	"github.com/berth-dev/berth/drivers/sim"
	"github.com/berth-dev/berth/reconciler"
)

// TestSchedulersCountConflicts waits four requests of 3 cpus while the one
// node (4 cpus) is offline, brings it back and runs one placement round:
// one request is placed whatever the schedulers. One scheduler places
// through the ledger's lock and meets no conflict; four plan the round on
// snapshots taken before any of them commits, each sees the node free,
// and the ledger refuses the three plans that come after the first.
func TestSchedulersCountConflicts(t *testing.T) {
	for _, tc := range []struct {
		schedulers int
		conflicts  int
	}{{1, 0}, {4, 3}} {
		t.Run(fmt.Sprintf("schedulers=%d", tc.schedulers), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				s, prov := newSim(t, 1, nil)
				ctx := context.Background()
				node := simNodes(t, s)[0].Name
				if err := s.SetNodeStatus(node, driver.NodeOffline, "rebooting"); err != nil {
					t.Fatal(err)
				}
				rec := &recorder{launched: map[string]int{}, failed: map[string]int{}}
				cfg := config(newMemory(), prov)
				cfg.Schedulers, cfg.Metrics = tc.schedulers, rec
				p, err := control.New(ctx, cfg)
				if err != nil {
					t.Fatal(err)
				}
				ids := []string{"a", "b", "c", "d"}
				for _, id := range ids {
					r := req(id, 1)
					r.CPU = driver.CPUs(3)
					if _, err := p.Submit(ctx, r, ""); err != nil {
						t.Fatal(err)
					}
					if ph := phaseOf(t, p, id); ph != reconciler.Pending {
						t.Fatalf("%s is %s while the node is offline, want pending", id, ph)
					}
				}
				if err := s.SetNodeStatus(node, driver.NodeOnline, ""); err != nil {
					t.Fatal(err)
				}
				time.Sleep(10 * time.Millisecond) // past the provider's state cache
				p.RefreshNodes(ctx)
				p.PlaceOnce(ctx)

				placed := 0
				for _, id := range ids {
					in, err := p.Instance(ctx, id)
					if err != nil {
						t.Fatal(err)
					}
					switch {
					case in.Phase.HoldsNode():
						placed++
					case in.Phase == reconciler.Pending:
						if in.Message == "" {
							t.Errorf("%s waits without a reason", id)
						}
					default:
						t.Errorf("%s is %s", id, in.Phase)
					}
				}
				if placed != 1 {
					t.Fatalf("%d of the requests placed, want 1", placed)
				}
				st, err := p.Scheduler(ctx)
				if err != nil {
					t.Fatal(err)
				}
				if st.Schedulers != tc.schedulers || st.Conflicts != uint64(tc.conflicts) {
					t.Errorf("stats %+v, want %d schedulers and %d conflicts", st, tc.schedulers, tc.conflicts)
				}
				rec.get(func() {
					if rec.conflicts != tc.conflicts {
						t.Errorf("metrics saw %d conflicts, want %d", rec.conflicts, tc.conflicts)
					}
				})
			})
		})
	}
}

// TestSchedulersNeverDoubleBook has four schedulers share the placer's
// rounds on a cluster of three 4-cpu nodes while waves of concurrent
// submissions ask for more than it holds and a third of what runs is
// deleted after each wave, so that the rounds place what waits. What the
// back-end runs never exceeds a node (summed from its instances, not from
// the plane's ledger), the back-end never refused a create for lack of
// room, and whenever nothing is in flight the plane's records fit every
// node too.
func TestSchedulersNeverDoubleBook(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, prov := newSim(t, 3, nil)
		rec := &recorder{launched: map[string]int{}, failed: map[string]int{}}
		cfg := config(newMemory(), prov)
		cfg.Schedulers, cfg.Metrics = 4, rec
		p, _ := start(t, cfg)
		ctx := context.Background()
		nodes := simNodes(t, s)
		before, err := p.Scheduler(ctx)
		if err != nil {
			t.Fatal(err)
		}

		sizes := []float64{0.5, 1, 1.5, 2}
		for wave := range 4 {
			var wg sync.WaitGroup
			for g := range 8 {
				wg.Go(func() {
					for k := range 3 {
						r := req(fmt.Sprintf("w%d-%d-%d", wave, g, k), 1+k%2)
						r.CPU, r.Memory = driver.CPUs(sizes[(g+k)%len(sizes)]), 512*driver.MiB
						if _, err := p.Submit(ctx, r, ""); err != nil {
							t.Error(err)
						}
					}
				})
			}
			wg.Wait()
			backendFits(t, s, nodes)
			running, err := p.Instances(ctx, control.Filter{Phases: []reconciler.Phase{reconciler.Running}})
			if err != nil {
				t.Fatal(err)
			}
			for i, in := range running {
				if i%3 == 0 {
					if err := p.Delete(ctx, in.ID); err != nil {
						t.Fatal(err)
					}
				}
			}
			settled(t, p, nodes)
			if err := p.PlaceRound(ctx); err != nil {
				t.Fatal(err)
			}
			settled(t, p, nodes)
			backendFits(t, s, nodes)
		}
		for _, c := range s.Calls() {
			if c.Op == "create" && errors.Is(c.Err, driver.ErrInsufficientCapacity) {
				t.Errorf("the back-end refused a create for lack of room: %v", c.Err)
			}
		}
		st, err := p.Scheduler(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if st.Schedulers != 4 || st.Committed <= before.Committed {
			t.Errorf("stats %+v: want 4 schedulers and placements", st)
		}
		rec.get(func() {
			if uint64(rec.conflicts) != st.Conflicts {
				t.Errorf("metrics saw %d conflicts, the ledger counted %d", rec.conflicts, st.Conflicts)
			}
		})
		t.Logf("%d placements committed, %d conflicts", st.Committed, st.Conflicts)
	})
}

// TestSchedulerKnobsChecked: New refuses a scheduler count out of range
// and a pool's unknown queue policy, naming the field.
func TestSchedulerKnobsChecked(t *testing.T) {
	_, prov := newSim(t, 1, nil)
	for _, tc := range []struct {
		tune func(*control.Config)
		path string
	}{
		{func(c *control.Config) { c.Schedulers = -1 }, "schedulers"},
		{func(c *control.Config) { c.Schedulers = control.MaxSchedulers + 1 }, "schedulers"},
		{func(c *control.Config) {
			c.Pools = []control.Pool{{Name: "ci", Provider: "sim", QueuePolicy: "lifo"}}
		}, "pools[0].queue_policy"},
	} {
		cfg := config(newMemory(), prov)
		tc.tune(&cfg)
		if _, err := control.New(context.Background(), cfg); !drivertest.HasField(err, tc.path) {
			t.Errorf("%s: %v, want an error naming it", tc.path, err)
		}
	}
}

// simNodes returns the sim's nodes.
func simNodes(t *testing.T, s *sim.Sim) []driver.Node {
	t.Helper()
	ps, err := s.State(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return ps.Nodes
}

// backendFits fails the test when the instances the back-end holds on a
// node need more than its capacity.
func backendFits(t *testing.T, s *sim.Sim, nodes []driver.Node) {
	t.Helper()
	ins, err := s.List(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	used := map[string]driver.Resources{}
	for _, in := range ins {
		used[in.Node] = used[in.Node].Add(in.Resources)
	}
	for _, n := range nodes {
		if !used[n.Name].Fits(n.Capacity) {
			t.Errorf("node %s: the back-end holds %+v of %+v", n.Name, used[n.Name], n.Capacity)
		}
	}
}

// settled waits until no instance is being placed, created or deleted, and
// checks that the instances the plane's records hold on each node then fit
// it. (While one is deleting, the ledger may already have given its room
// to another: the records catch up when it is deleted.)
func settled(t *testing.T, p *control.Plane, nodes []driver.Node) {
	t.Helper()
	var list []control.Instance
	waitFor(t, "no instance in flight", func() bool {
		var err error
		if list, err = p.Instances(context.Background(), control.Filter{}); err != nil {
			t.Fatal(err)
		}
		for _, in := range list {
			switch in.Phase {
			case reconciler.Scheduled, reconciler.Creating, reconciler.Deleting:
				return false
			}
		}
		return true
	})
	used := map[string]driver.Resources{}
	for _, in := range list {
		if in.Phase.HoldsNode() {
			used[in.Node] = used[in.Node].Add(in.Spec.Resources)
		}
	}
	for _, n := range nodes {
		if !used[n.Name].Fits(n.Capacity) {
			t.Errorf("node %s: the plane's records hold %+v of %+v", n.Name, used[n.Name], n.Capacity)
		}
	}
}
