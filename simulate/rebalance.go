package simulate

import (
	"fmt"
	"math/rand/v2"

	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/scheduler"
)

// Fragmented is a cluster after random arrivals and departures: what a
// rebalance starts from.
type Fragmented struct {
	Provider    string
	Nodes       []driver.Node
	Requests    map[string]*scheduler.Request
	Allocations []scheduler.Allocation
}

// Request returns request id, or nil.
func (f *Fragmented) Request(id string) *scheduler.Request { return f.Requests[id] }

// Cluster returns a fresh scheduler ledger holding f.
func (f *Fragmented) Cluster() (*scheduler.Cluster, error) {
	c := scheduler.NewCluster()
	if err := c.UpdateNodes(f.Provider, f.Nodes); err != nil {
		return nil, err
	}
	if err := c.Reserve(f.Allocations...); err != nil {
		return nil, err
	}
	return c, nil
}

// Replay replays moves on a fresh ledger holding f
// (scheduler.ReplayRebalance).
func (f *Fragmented) Replay(moves []scheduler.Move) scheduler.ReplayResult {
	return scheduler.ReplayRebalance(scheduler.ReplayInput{
		Nodes: map[string][]driver.Node{f.Provider: f.Nodes}, Allocations: f.Allocations, Request: f.Request, Moves: moves,
	})
}

// Fragment builds a fragmented cluster of about instances instances on
// nodes nodes of 16 cpus and 64 GiB, in three zones (label zone=z0..z2):
// 100 requests of sizes from 0.25 to 4 cpus, a tenth of them constrained
// to one zone, whose instances arrive on random nodes that have room and
// satisfy their constraints, half of them leave at random, and more
// arrive until there are instances. The same seed gives the same cluster.
func Fragment(nodes, instances int, seed uint64) *Fragmented {
	rng := rand.New(rand.NewPCG(seed, 0x5eed))
	f := &Fragmented{Provider: "sim", Requests: map[string]*scheduler.Request{}}
	cpu := driver.CPUs(16)
	mem := 64 * driver.GiB
	for i := range nodes {
		f.Nodes = append(f.Nodes, driver.Node{
			Name: fmt.Sprintf("n%d", i), Status: driver.NodeOnline,
			Labels:   map[string]string{"zone": fmt.Sprintf("z%d", i%3)},
			Capacity: driver.Resources{CPU: cpu, Memory: mem},
		})
	}
	sizes := []float64{0.25, 0.5, 1, 1, 2, 2, 4}
	var reqs []*scheduler.Request
	zoneOf := map[string]int{}
	for k := range 100 {
		c := sizes[rng.IntN(len(sizes))]
		r := &scheduler.Request{ID: fmt.Sprintf("r%d", k), Spec: driver.Spec{Image: "app", Resources: driver.Resources{
			CPU: driver.CPUs(c), Memory: driver.Bytes(float64(driver.GiB) * c * (1 + 3*rng.Float64())),
		}}}
		zoneOf[r.ID] = -1
		if k%10 == 0 {
			z := rng.IntN(3)
			r.Constraints = []string{fmt.Sprintf("zone==z%d", z)}
			zoneOf[r.ID] = z
		}
		reqs = append(reqs, r)
		f.Requests[r.ID] = r
	}
	type inst struct {
		id   string
		r    *scheduler.Request
		node int
	}
	usedC := make([]driver.MilliCPU, nodes)
	usedM := make([]driver.Bytes, nodes)
	var live []inst
	next := 0
	arrive := func() bool {
		r := reqs[rng.IntN(len(reqs))]
		for range 32 {
			n := rng.IntN(nodes)
			if z := zoneOf[r.ID]; z >= 0 && n%3 != z {
				continue
			}
			if usedC[n]+r.CPU > cpu || usedM[n]+r.Memory > mem {
				continue
			}
			usedC[n] += r.CPU
			usedM[n] += r.Memory
			live = append(live, inst{id: fmt.Sprintf("%s-%d", r.ID, next), r: r, node: n})
			next++
			return true
		}
		return false
	}
	fill := func(n int) {
		for misses := 0; len(live) < n && misses < 1000; {
			if arrive() {
				misses = 0
			} else {
				misses++
			}
		}
	}
	fill(instances * 3 / 2)
	rng.Shuffle(len(live), func(i, j int) { live[i], live[j] = live[j], live[i] })
	for _, in := range live[:len(live)/2] {
		usedC[in.node] -= in.r.CPU
		usedM[in.node] -= in.r.Memory
	}
	live = live[len(live)/2:]
	fill(instances)
	for _, in := range live {
		f.Allocations = append(f.Allocations, scheduler.Allocation{
			ID: in.id, Provider: f.Provider, Node: f.Nodes[in.node].Name, Resources: in.r.Resources,
			Request: in.r.ID, Image: in.r.Image,
		})
	}
	return f
}

// FreshPacking places f's instances as one batch group on a fresh ledger
// of f's nodes (scheduler.Cluster.PlaceGroup: largest first, then the
// improvement pass) and returns how many nodes it uses, or -1 when the
// group does not fit.
func (f *Fragmented) FreshPacking() (int, error) {
	c := scheduler.NewCluster()
	if err := c.UpdateNodes(f.Provider, f.Nodes); err != nil {
		return 0, err
	}
	count := map[string]int{}
	var order []string
	for _, a := range f.Allocations {
		if count[a.Request] == 0 {
			order = append(order, a.Request)
		}
		count[a.Request]++
	}
	g := scheduler.Group{ID: "fresh"}
	for _, id := range order {
		r := *f.Requests[id]
		r.ID, r.Count, r.Type = "", count[id], driver.TypeBatch
		r.Name = id
		g.Services = append(g.Services, scheduler.Service{Request: r})
	}
	plan, err := c.PlaceGroup(&g)
	if err != nil {
		return 0, err
	}
	if !plan.Complete() {
		return -1, nil
	}
	used := map[string]bool{}
	for _, pl := range plan.Placements {
		used[pl.Node] = true
	}
	return len(used), nil
}
