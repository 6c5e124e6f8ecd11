package simulate

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/driver/drivertest"
	"github.com/berth-dev/berth/drivers/sim"
	"github.com/berth-dev/berth/scheduler"
)

// binWorkload is a bin-packing instance as a workload of one batch group:
// a node of capacity/10 cpus per item, and a service per distinct item
// size of size/10 cpus, in order of first appearance.
func binWorkload(name string, sizes []int, capacity int) *Workload {
	g := GroupItem{Group: scheduler.Group{ID: "bins"}}
	idx := map[int]int{}
	for _, s := range sizes {
		k, ok := idx[s]
		if !ok {
			k = len(g.Services)
			idx[s] = k
			g.Services = append(g.Services, scheduler.Service{Request: scheduler.Request{Spec: driver.Spec{
				Name: fmt.Sprint("s", s), Image: "job", Type: driver.TypeBatch,
				Resources: driver.Resources{CPU: driver.MilliCPU(s * 100), Memory: driver.MiB}}}})
		}
		g.Services[k].Count++
	}
	return &Workload{Name: name,
		Nodes: []sim.Pool{{Count: len(sizes), NamePrefix: "n", Shape: sim.Shape{
			Resources: driver.Resources{CPU: driver.MilliCPU(capacity * 100), Memory: 1024 * driver.GiB}}}},
		Groups: []GroupItem{g}}
}

// uSizes is a Falkenauer "u" instance: n items uniform in [20, 100] for
// bins of 150.
func uSizes(rng *rand.Rand, n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = 20 + rng.IntN(81)
	}
	return out
}

// tSizes is a Falkenauer "t" instance: triplets that each fill a bin of
// 1000 exactly (so the optimum is bins), shuffled.
func tSizes(rng *rand.Rand, bins int) []int {
	var out []int
	for range bins {
		a := 380 + rng.IntN(111)
		b := 250 + rng.IntN((1000-a)/2-250+1)
		out = append(out, a, b, 1000-a-b)
	}
	rng.Shuffle(len(out), func(i, j int) { out[i], out[j] = out[j], out[i] })
	return out
}

// firstFitDecreasing is the textbook heuristic the pass must beat, for
// comparison: the number of bins it uses.
func firstFitDecreasing(sizes []int, capacity int) int {
	s := slices.Clone(sizes)
	slices.Sort(s)
	slices.Reverse(s)
	var bins []int
	for _, x := range s {
		k := slices.IndexFunc(bins, func(used int) bool { return used+x <= capacity })
		if k < 0 {
			bins = append(bins, x)
		} else {
			bins[k] += x
		}
	}
	return len(bins)
}

func TestPackingUInstances(t *testing.T) {
	// Random "u" instances: the group is packed within 1% of the lower
	// bound ceil(sum / 150), summed over ten instances of each size (one
	// instance alone may need a node more: the bound is not always
	// reachable, and the pass is a local search).
	for _, c := range []struct{ n, count int }{{120, 10}, {250, 10}} {
		used, lb := 0, 0
		for seed := range uint64(c.count) {
			sizes := uSizes(rand.New(rand.NewPCG(seed, uint64(c.n))), c.n)
			res := run(t, binWorkload("u", sizes, 150), Options{})
			if res.Placed != c.n || res.Unplaced != 0 {
				t.Fatalf("u%d seed %d: placed %d, unplaced %d (%s)", c.n, seed, res.Placed, res.Unplaced, res.UnplacedReason)
			}
			sum := 0
			for _, s := range sizes {
				sum += s
			}
			if want := (sum + 149) / 150; res.LowerBoundNodes != want {
				t.Fatalf("u%d seed %d: lower bound %d, want %d", c.n, seed, res.LowerBoundNodes, want)
			}
			used += res.NodesUsed
			lb += res.LowerBoundNodes
		}
		ratio := float64(used) / float64(lb)
		t.Logf("u%d, %d instances: %d nodes used, lower bound %d, ratio %.4f", c.n, c.count, used, lb, ratio)
		if ratio > 1.01 {
			t.Errorf("u%d: packing ratio %.4f, want at most 1.01", c.n, ratio)
		}
	}
}

func TestPackingTriplets(t *testing.T) {
	// Triplet instances, optimum known: fewer nodes than first-fit
	// decreasing on the whole, never more on any one.
	used, ffd, opt := 0, 0, 0
	for seed := range uint64(5) {
		sizes := tSizes(rand.New(rand.NewPCG(seed, 60)), 20)
		res := run(t, binWorkload("t", sizes, 1000), Options{})
		if res.Placed != len(sizes) {
			t.Fatalf("seed %d: placed %d of %d", seed, res.Placed, len(sizes))
		}
		f := firstFitDecreasing(sizes, 1000)
		if res.NodesUsed > f {
			t.Errorf("seed %d: %d nodes used, first-fit decreasing %d", seed, res.NodesUsed, f)
		}
		used, ffd, opt = used+res.NodesUsed, ffd+f, opt+20
	}
	t.Logf("t60, 5 instances: %d nodes used, first-fit decreasing %d, optimum %d", used, ffd, opt)
	if used >= ffd {
		t.Errorf("%d nodes used, first-fit decreasing %d: want fewer", used, ffd)
	}
}

func TestWorkloadGroups(t *testing.T) {
	// A group repeated, with a duration: each repeat is placed whole,
	// and leaves so that the next fits.
	src := `{"name": "jobs",
		"nodes": [{"count": 4, "cpus": 8, "memory": "16Gi"}],
		"groups": [{"id": "job", "repeat": 3, "interval": 10, "duration": 5,
			"services": [{"name": "big", "image": "job", "type": "batch", "cpus": 6, "memory": 512, "count": 4},
			             {"name": "small", "image": "job", "type": "batch", "cpus": 2, "memory": 512, "count": 4}]}]}`
	for _, path := range []Path{PathScheduler, PathFull} {
		w, err := Decode(strings.NewReader(src))
		if err != nil {
			t.Fatal(err)
		}
		res := run(t, w, Options{Path: path})
		if res.Requests != 3 || res.Instances != 24 || res.Placed != 24 || res.Unplaced != 0 || res.Released != 16 {
			t.Fatalf("%s: requests %d, instances %d, placed %d, unplaced %d (%s), released %d", path,
				res.Requests, res.Instances, res.Placed, res.Unplaced, res.UnplacedReason, res.Released)
		}
		// Each 6 pairs with a 2: four full nodes, the lower bound.
		if res.NodesUsed != 4 || res.LowerBoundNodes != 4 {
			t.Fatalf("%s: nodes used %d, lower bound %d", path, res.NodesUsed, res.LowerBoundNodes)
		}
	}
}

func TestWorkloadGroupErrors(t *testing.T) {
	nodes := `"nodes": [{"count": 1, "cpus": 1, "memory": 1}]`
	tests := []struct{ in, path string }{
		{`{` + nodes + `, "groups": [{"services": [{"image": "x"}]}]}`, "groups[0].id"},
		{`{` + nodes + `, "groups": [{"id": "a.b", "services": [{"image": "x"}]}]}`, "groups[0].id"},
		{`{` + nodes + `, "groups": [{"id": "r1", "services": [{"image": "x"}]}]}`, "groups[0].id"},
		{`{` + nodes + `, "groups": [{"id": "a", "services": [{"image": "x"}]}, {"id": "a", "services": [{"image": "x"}]}]}`, "groups[1].id"},
		{`{` + nodes + `, "groups": [{"id": "a", "services": []}]}`, "groups[0].services"},
		{`{` + nodes + `, "groups": [{"id": "a", "services": [{"image": "x", "cpus": -1}]}]}`, "groups[0].services[0].cpus"},
		{`{` + nodes + `, "groups": [{"id": "a", "duration": -1, "services": [{"image": "x"}]}]}`, "groups[0].duration"},
		{`{` + nodes + `, "groups": [{"id": "a", "repeat": -2, "services": [{"image": "x"}]}]}`, "groups[0].repeat"},
		{`{` + nodes + `}`, "requests"},
	}
	for _, tt := range tests {
		_, err := Decode(strings.NewReader(tt.in))
		if !drivertest.HasField(err, tt.path) {
			t.Errorf("%s: err %v, want field %s", tt.in, err, tt.path)
		}
	}
}

func TestAdvisedReplay(t *testing.T) {
	// 40 requests reserve 2 cpus and use a tenth of one; 20 more use about
	// what they reserve. As given they need 100 cpus: 25 nodes of 4. With
	// the advised sizes the idle ones ask for 0.12 cpu and the cluster
	// needs far fewer nodes.
	w, err := Decode(strings.NewReader(`{"name": "idle",
		"nodes": [{"count": 40, "cpus": 4, "memory": "16Gi"}],
		"requests": [
			{"image": "idle", "type": "batch", "cpus": 2, "memory": 1024, "repeat": 40, "used": {"cpus": 0.1, "memory": 200}},
			{"image": "busy", "type": "batch", "cpus": 1, "memory": 1024, "repeat": 20, "used": {"cpus": 0.95, "memory": 1000}}]}`))
	if err != nil {
		t.Fatal(err)
	}
	given := run(t, w, Options{})
	aw, resized := w.Advised(scheduler.AdviceOptions{})
	advised := run(t, aw, Options{})
	t.Logf("as given %d nodes, advised %d nodes, %d requests resized", given.NodesUsed, advised.NodesUsed, resized)
	if resized != 40 {
		t.Fatalf("%d requests resized, want the 40 idle ones", resized)
	}
	if given.NodesUsed != 25 || advised.NodesUsed >= given.NodesUsed/2 {
		t.Fatalf("nodes used: as given %d (want 25), advised %d (want under half)", given.NodesUsed, advised.NodesUsed)
	}
	if w.Requests[0].CPU != driver.CPUs(2) {
		t.Fatalf("Advised changed the workload it was given: %s", w.Requests[0].CPU)
	}
	if _, err := Decode(strings.NewReader(`{"nodes": [{"count": 1, "cpus": 1, "memory": 1}], "requests": [{"image": "x", "used": {"cpus": -1}}]}`)); !drivertest.HasField(err, "requests[0].used.cpus") {
		t.Fatalf("negative use: %v", err)
	}
}
