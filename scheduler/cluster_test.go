package scheduler

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"

	"go.uber.org/goleak"

	"github.com/berth-dev/berth/driver"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestCommitConflict(t *testing.T) {
	c := newTestCluster(t, "p", mkNodes("n", 1, 4, 8, nil))
	s1, s2 := c.Snapshot(Options{}), c.Snapshot(Options{})
	p1, err := s1.Plan(req("a", 3, 64))
	if err != nil {
		t.Fatal(err)
	}
	p2, err := s2.Plan(req("b", 3, 64))
	if err != nil {
		t.Fatal(err)
	}
	if len(p1.Placements) != 1 || len(p2.Placements) != 1 {
		t.Fatal("both snapshots should see room")
	}
	if acc, rej := s1.Commit(p1); len(acc) != 1 || len(rej) != 0 {
		t.Fatalf("first commit: %d accepted, %d rejected", len(acc), len(rej))
	}
	if acc, rej := s2.Commit(p2); len(acc) != 0 || len(rej) != 1 {
		t.Fatalf("second commit: %d accepted, %d rejected", len(acc), len(rej))
	}
	if st := c.Stats(); st.Conflicts != 1 || st.Committed != 1 || st.Instances != 1 {
		t.Fatalf("stats %+v", st)
	}
	// The rejected snapshot is back in line: it sees 1 cpu free.
	p3, n, err := s2.Place(req("c", 1, 64))
	if err != nil || len(p3.Placements) != 1 || n != 0 {
		t.Fatalf("after resync: %+v conflicts %d %v", p3, n, err)
	}
	if p, _, _ := s2.Place(req("d", 0.5, 64)); len(p.Placements) != 0 {
		t.Fatalf("node is full, got %v", nodesOf(p))
	}
}

func TestSnapshotPlaceRetriesConflicts(t *testing.T) {
	c := newTestCluster(t, "p", mkNodes("n", 2, 4, 8, nil))
	s1, s2 := c.Snapshot(Options{}), c.Snapshot(Options{})
	// s1 takes n0 (binpack and ties go to the first node) behind s2's back.
	a := req("a", 3, 64)
	a.Type = driver.TypeBatch
	if p, _, _ := s1.Place(a); nodesOf(p)[0] != "n0" {
		t.Fatalf("a on %v", nodesOf(p))
	}
	b := req("b", 3, 64)
	b.Type = driver.TypeBatch
	p, conflicts, err := s2.Place(b)
	if err != nil || conflicts != 1 || len(p.Placements) != 1 || p.Placements[0].Node != "n1" {
		t.Fatalf("b: %v conflicts %d err %v", nodesOf(p), conflicts, err)
	}
}

func TestGangCommitAllOrNone(t *testing.T) {
	c := newTestCluster(t, "p", mkNodes("n", 2, 4, 8, nil))
	s1, s2 := c.Snapshot(Options{}), c.Snapshot(Options{})
	g := &Group{ID: "g", Services: []Service{svc("a", 3, 2, nil)}}
	pg, err := s1.PlanGroup(g)
	if err != nil || len(pg.Placements) != 2 {
		t.Fatal(pg, err)
	}
	// Someone else takes n1.
	if p, _, _ := s2.Place(&Request{ID: "x", Spec: driver.Spec{Image: "x", Resources: driver.Resources{CPU: driver.CPUs(2)}}, Constraints: []string{"node==n1"}}); len(p.Placements) != 1 {
		t.Fatal("x not placed")
	}
	acc, rej := s1.Commit(pg)
	if len(acc) != 0 || len(rej) != 2 {
		t.Fatalf("gang commit: %d accepted, %d rejected", len(acc), len(rej))
	}
	if st := c.Stats(); st.Instances != 1 {
		t.Fatalf("instances %d, want only x", st.Instances)
	}
}

// TestNeverOvercommit is the property test: any mix of requests, groups
// and releases, planned by several schedulers in parallel, never leaves a
// node holding more than it has. Run it with -race.
func TestNeverOvercommit(t *testing.T) {
	for seed := range uint64(6) {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 7))
			nodes := make([]driver.Node, 40)
			for i := range nodes {
				nodes[i] = driver.Node{
					Name: fmt.Sprintf("n%d", i), Status: driver.NodeOnline,
					Labels:       map[string]string{"zone": fmt.Sprintf("z%d", i%3)},
					Capacity:     driver.Resources{CPU: driver.CPUs(float64(1 + rng.IntN(8))), Memory: driver.Bytes(1+rng.IntN(16)) * driver.GiB, GPUs: int64(rng.IntN(2)), Other: map[string]int64{"fpga": int64(rng.IntN(3))}},
					MaxInstances: rng.IntN(20),
				}
			}
			c := newTestCluster(t, "p", nodes, WithPortRange(31000, 31009))
			k := 1 + int(seed)%4
			var wg sync.WaitGroup
			for w := range k {
				s := c.Snapshot(Options{Seed: seed*10 + uint64(w), Sample: int(seed % 3 * 5)})
				wr := rand.New(rand.NewPCG(seed, uint64(w)))
				wg.Go(func() {
					var mine []string
					for j := range 150 {
						r := randomRequest(wr, fmt.Sprintf("w%d-%d", w, j))
						if wr.IntN(5) == 0 {
							g := &Group{ID: r.ID, Services: []Service{{Request: *r, Essential: ip(wr.IntN(r.N() + 1))}}}
							g.Services[0].ID = ""
							p, err := s.PlanGroup(g)
							if err != nil {
								t.Error(err)
								return
							}
							acc, _ := s.Commit(p)
							for _, pl := range acc {
								mine = append(mine, pl.Instance)
							}
						} else {
							p, _, err := s.Place(r)
							if err != nil {
								t.Error(err)
								return
							}
							for _, pl := range p.Placements {
								mine = append(mine, pl.Instance)
							}
						}
						if len(mine) > 0 && wr.IntN(3) == 0 {
							k := wr.IntN(len(mine))
							id := mine[k]
							mine = append(mine[:k], mine[k+1:]...)
							if err := c.Release(id); err != nil {
								t.Errorf("release %s: %v", id, err)
							}
						}
						if wr.IntN(10) == 0 {
							s.Refresh()
						}
					}
				})
			}
			wg.Wait()
			if bad := c.Overbooked(); len(bad) > 0 {
				t.Fatalf("overbooked nodes: %v", bad)
			}
			// Independent check from the public view: nothing negative free.
			for _, n := range c.Nodes() {
				if n.Free.CPU < 0 || n.Free.Memory < 0 || n.Free.GPUs < 0 {
					t.Fatalf("node %s has negative free %+v", n.Name, n.Free)
				}
			}
			if c.Stats().Committed == 0 {
				t.Fatal("nothing was placed; the test proves nothing")
			}
		})
	}
}

func randomRequest(rng *rand.Rand, id string) *Request {
	r := &Request{ID: id, Spec: driver.Spec{Image: "img", Resources: driver.Resources{
		CPU: driver.MilliCPU(50 + rng.IntN(2000)), Memory: driver.Bytes(64+rng.IntN(2048)) * driver.MiB,
	}}}
	r.Count = 1 + rng.IntN(4)
	if rng.IntN(2) == 0 {
		r.Type = driver.TypeBatch
	}
	if rng.IntN(6) == 0 {
		r.GPUs = 1
	}
	if rng.IntN(6) == 0 {
		r.Other = map[string]int64{"fpga": 1}
	}
	switch rng.IntN(6) {
	case 0:
		r.Ports = []driver.Port{{ContainerPort: 80, Publish: true}}
	case 1:
		r.Ports = []driver.Port{{ContainerPort: 80, HostPort: 8080}}
	}
	switch rng.IntN(5) {
	case 0:
		r.Constraints = []string{fmt.Sprintf("zone==z%d", rng.IntN(3))}
	case 1:
		r.Constraints = []string{"zone!=~z0"}
	}
	if rng.IntN(8) == 0 {
		r.Affinities = []string{"image!=~img"}
	}
	r.Strategy = Strategies[rng.IntN(len(Strategies))]
	return r
}

func TestSnapshotRefresh(t *testing.T) {
	c := newTestCluster(t, "p", mkNodes("n", 2, 4, 8, nil))
	s := c.Snapshot(Options{})
	// A topology change: a new provider's node appears.
	if err := c.UpdateNodes("q", mkNodes("m", 1, 64, 64, nil)); err != nil {
		t.Fatal(err)
	}
	r := req("big", 32, 64)
	if p, _ := s.Plan(r); len(p.Placements) != 0 {
		t.Fatal("a stale snapshot placed on a node it cannot know")
	}
	s.Refresh()
	p, err := s.Plan(req("big2", 32, 64))
	if err != nil || len(p.Placements) != 1 || p.Placements[0].Provider != "q" {
		t.Fatalf("after refresh: %+v %v", p, err)
	}
	// A snapshot far behind (the change log was compacted) copies all.
	s2 := c.Snapshot(Options{})
	for k := range 3000 {
		if _, err := c.Place(req(fmt.Sprint("x", k), 0.001, 1)); err != nil {
			t.Fatal(err)
		}
		if k%2 == 0 {
			if err := c.Release(fmt.Sprint("x", k)); err != nil {
				t.Fatal(err)
			}
		}
	}
	s2.Refresh()
	for i := range c.st.hot {
		if s2.st.hot[i] != c.st.hot[i] || s2.st.ver[i] != c.st.ver[i] {
			t.Fatalf("node %d differs after a refresh across compaction", i)
		}
	}
}

func TestSnapshotPlaceGroupRetries(t *testing.T) {
	c := newTestCluster(t, "p", mkNodes("n", 3, 4, 8, nil))
	s1, s2 := c.Snapshot(Options{}), c.Snapshot(Options{})
	// s2 does not know that s1 takes n0 and n1.
	for _, n := range []string{"n0", "n1"} {
		r := req("x"+n, 3, 64)
		r.Constraints = []string{"node==" + n}
		if p, _, _ := s1.Place(r); len(p.Placements) != 1 {
			t.Fatal("setup")
		}
	}
	g := &Group{ID: "g", Services: []Service{svc("a", 3, 1, nil), svc("b", 2, 2, ip(0))}}
	p, conflicts, err := s2.PlaceGroup(g)
	if err != nil {
		t.Fatal(err)
	}
	if conflicts == 0 {
		t.Fatal("s2 planned on stale nodes, a conflict was expected")
	}
	if len(p.Placements) == 0 || p.Placements[0].Node != "n2" {
		t.Fatalf("essential a on %v, want n2 after the retry", nodesOf(p))
	}
	if bad := c.Overbooked(); len(bad) > 0 {
		t.Fatalf("overbooked %v", bad)
	}
}
