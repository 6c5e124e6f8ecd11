package scheduler

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/berth-dev/berth/driver"
)

// binGroup is a batch group of one-cpu-tenth items: a service per distinct
// size, in order of first appearance, each instance size/10 cpus.
func binGroup(id string, sizes []int) *Group {
	g := &Group{ID: id}
	idx := map[int]int{}
	for _, s := range sizes {
		k, ok := idx[s]
		if !ok {
			k = len(g.Services)
			idx[s] = k
			g.Services = append(g.Services, Service{Request: Request{Spec: driver.Spec{
				Name: fmt.Sprint("s", s), Image: "x", Type: driver.TypeBatch,
				Resources: driver.Resources{CPU: driver.MilliCPU(s * 100), Memory: driver.MiB}}}})
		}
		g.Services[k].Count++
	}
	return g
}

// packCluster is n nodes of capacity/10 cpus; noImprove turns the
// improvement pass off.
func packCluster(t *testing.T, n, capacity int, noImprove bool) *Cluster {
	t.Helper()
	nodes := mkNodes("n", n, float64(capacity)/10, 1024, nil)
	c := newTestCluster(t, "p", nodes)
	c.planner.noImprove = noImprove
	return c
}

// usedNodes counts the nodes holding Berth instances, and checks that the
// cluster's accounting matches the allocations on every node.
func usedNodes(t *testing.T, c *Cluster) int {
	t.Helper()
	used := 0
	for _, n := range c.Nodes() {
		if n.BerthInstances > 0 {
			used++
		}
		if n.Free.CPU != n.Capacity.CPU-n.Berth.CPU || n.Free.CPU < 0 {
			t.Fatalf("node %s: capacity %s, Berth holds %s, free %s", n.Name, n.Capacity.CPU, n.Berth.CPU, n.Free.CPU)
		}
	}
	if bad := c.Overbooked(); len(bad) > 0 {
		t.Fatalf("overbooked: %v", bad)
	}
	return used
}

func placeBins(t *testing.T, c *Cluster, g *Group) *Plan {
	t.Helper()
	p, err := c.PlaceGroup(g)
	if err != nil {
		t.Fatal(err)
	}
	if !p.Complete() {
		t.Fatalf("group %s not placed whole: %+v", g.ID, p.Unplaced)
	}
	return p
}

// uInstance is a Falkenauer "u" instance: n items uniform in [20, 100] for
// bins of 150.
func uInstance(rng *rand.Rand, n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = 20 + rng.IntN(81)
	}
	return out
}

// tInstance is a Falkenauer "t" instance: bins triplets of items, each
// triplet filling a bin of 1000 exactly, shuffled.
func tInstance(rng *rand.Rand, bins int) []int {
	var out []int
	for range bins {
		a := 380 + rng.IntN(111)
		b := 250 + rng.IntN((1000-a)/2-250+1)
		out = append(out, a, b, 1000-a-b)
	}
	rng.Shuffle(len(out), func(i, j int) { out[i], out[j] = out[j], out[i] })
	return out
}

func sum(xs []int) int {
	s := 0
	for _, x := range xs {
		s += x
	}
	return s
}

func TestPackLargestFirst(t *testing.T) {
	// Small items first: placed in that order, best fit fills three nodes
	// with 3+3+3 and leaves each 7 a node of its own (5 nodes); largest
	// first pairs every 7 with a 3 (4 nodes, the optimum).
	sizes := []int{3, 3, 3, 3, 7, 7, 7, 7}
	for _, noImprove := range []bool{true, false} {
		c := packCluster(t, 8, 10, noImprove)
		p := placeBins(t, c, binGroup("g", sizes))
		if n := usedNodes(t, c); n != 4 {
			t.Fatalf("improve %v: %d nodes used, want 4: %v", !noImprove, n, nodesOf(p))
		}
		// The plan keeps startup order: the s3 service first, as given.
		for k, pl := range p.Placements {
			want := "g.s3-" + fmt.Sprint(k)
			if k >= 4 {
				want = "g.s7-" + fmt.Sprint(k-4)
			}
			if pl.Instance != want {
				t.Fatalf("placement %d is %s, want %s", k, pl.Instance, want)
			}
		}
	}
}

func TestPackImprovesOnTriplets(t *testing.T) {
	// Best-fit decreasing leaves triplet instances well above their
	// optimum; the pass takes nodes away on most of them and never adds.
	better, ffdTotal, lsTotal, opt := 0, 0, 0, 0
	for seed := range uint64(10) {
		sizes := tInstance(rand.New(rand.NewPCG(seed, 1)), 20)
		var used [2]int
		for k, noImprove := range []bool{true, false} {
			c := packCluster(t, 40, 1000, noImprove)
			placeBins(t, c, binGroup("g", sizes))
			used[k] = usedNodes(t, c)
		}
		if used[1] > used[0] {
			t.Fatalf("seed %d: the pass used %d nodes, best-fit decreasing %d", seed, used[1], used[0])
		}
		if used[1] < used[0] {
			better++
		}
		ffdTotal += used[0]
		lsTotal += used[1]
		opt += 20
	}
	t.Logf("triplets, 10 instances of 20 nodes: best-fit decreasing %d nodes, with the pass %d, optimum %d", ffdTotal, lsTotal, opt)
	if better < 5 {
		t.Fatalf("the pass did better on %d instances of 10, want at least 5", better)
	}
}

func TestPackRandomAccounting(t *testing.T) {
	// Random groups of random shapes with constraints, on nodes of two
	// shapes, some already partly used: every placement keeps its
	// constraint, the accounting stays exact, and for the first group the
	// pass never uses more nodes than sorting alone (later groups meet
	// different clusters).
	for seed := range uint64(30) {
		var first [2]int
		for k, noImprove := range []bool{true, false} {
			rng := rand.New(rand.NewPCG(seed, 7))
			nodes := append(mkNodes("a", 12, 8, 32, map[string]string{"zone": "a"}), mkNodes("b", 12, 4, 16, map[string]string{"zone": "b"})...)
			c := newTestCluster(t, "p", nodes)
			c.planner.noImprove = noImprove
			for i := range 4 {
				if err := c.Reserve(Allocation{ID: fmt.Sprint("x", i), Provider: "p", Node: nodes[i*5].Name,
					Resources: driver.Resources{CPU: driver.CPUs(1), Memory: driver.GiB}}); err != nil {
					t.Fatal(err)
				}
			}
			for gi := range 3 {
				g := &Group{ID: fmt.Sprint("g", gi)}
				for s := range 1 + rng.IntN(5) {
					sv := Service{Request: Request{Spec: driver.Spec{Name: fmt.Sprint("s", s), Image: "x", Type: driver.TypeBatch,
						Resources: driver.Resources{CPU: driver.MilliCPU(200 + rng.IntN(3000)), Memory: driver.Bytes(1+rng.IntN(6000)) * driver.MiB}},
						Count: 1 + rng.IntN(6)}}
					if rng.IntN(3) == 0 {
						sv.Constraints = []string{"zone==a"}
					}
					g.Services = append(g.Services, sv)
				}
				p, err := c.PlaceGroup(g)
				if err != nil {
					t.Fatal(err)
				}
				if gi == 0 {
					first[k] = usedNodes(t, c)
				}
				for _, pl := range p.Placements {
					var svc *Service
					for s := range g.Services {
						if g.ID+"."+g.Services[s].Name == pl.Request {
							svc = &g.Services[s]
						}
					}
					if svc == nil {
						t.Fatalf("placement %s of no service", pl.Instance)
					}
					if len(svc.Constraints) > 0 && pl.Node[0] != 'a' {
						t.Fatalf("seed %d: %s (zone==a) placed on %s", seed, pl.Instance, pl.Node)
					}
				}
			}
			usedNodes(t, c)
		}
		if first[1] > first[0] {
			t.Fatalf("seed %d: the pass used %d nodes, sorting alone %d", seed, first[1], first[0])
		}
	}
}

func TestPackOnlyBatchGroups(t *testing.T) {
	// A service group keeps its replicas apart: nothing is reordered or
	// moved, so it spreads as before.
	c := packCluster(t, 4, 10, false)
	g := binGroup("g", []int{3, 3, 7})
	for k := range g.Services {
		g.Services[k].Type = driver.TypeService
	}
	p := placeBins(t, c, g)
	nodes := nodesOf(p)
	slices.Sort(nodes)
	if len(slices.Compact(nodes)) != 3 {
		t.Fatalf("a service group was packed: %v", nodesOf(p))
	}
}

func BenchmarkPackGroup(b *testing.B) {
	for _, n := range []int{120, 250, 500, 1000} {
		sizes := uInstance(rand.New(rand.NewPCG(uint64(n), 3)), n)
		for _, pass := range []bool{false, true} {
			name := fmt.Sprintf("u%d/sorted", n)
			if pass {
				name = fmt.Sprintf("u%d/improved", n)
			}
			b.Run(name, func(b *testing.B) {
				lb := (sum(sizes) + 149) / 150
				used := 0
				for b.Loop() {
					b.StopTimer()
					nodes := mkNodes("n", n, 15, 1024, nil)
					c := NewCluster()
					if err := c.UpdateNodes("p", nodes); err != nil {
						b.Fatal(err)
					}
					c.planner.noImprove = !pass
					g := binGroup("g", sizes)
					b.StartTimer()
					if _, err := c.PlaceGroup(g); err != nil {
						b.Fatal(err)
					}
					b.StopTimer()
					used = 0
					for _, nu := range c.Nodes() {
						if nu.BerthInstances > 0 {
							used++
						}
					}
					b.StartTimer()
				}
				b.ReportMetric(float64(used), "nodes")
				b.ReportMetric(float64(used)/float64(lb), "ratio")
			})
		}
	}
}
