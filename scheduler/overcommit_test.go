package scheduler

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/berth-dev/berth/driver"
)

// busyNode is a cluster of one node of 4 cpus and 8 GiB on provider "p"
// whose instance "busy" reserves every cpu and measures cpu.
func busyNode(t *testing.T, cpu float64) *Cluster {
	t.Helper()
	c := newTestCluster(t, "p", mkNodes("n", 1, 4, 8, nil))
	if err := c.Reserve(Allocation{ID: "busy", Provider: "p", Node: "n0", Resources: driver.Resources{CPU: driver.CPUs(4), Memory: driver.GiB}}); err != nil {
		t.Fatal(err)
	}
	if err := c.SetMeasured("p", "n0", driver.Resources{CPU: driver.CPUs(cpu), Memory: 512 * driver.MiB}); err != nil {
		t.Fatal(err)
	}
	return c
}

func placeN(t *testing.T, c *Cluster, id string, n int, cpus float64) *Plan {
	t.Helper()
	r := req(id, cpus, 256)
	r.Count = n
	plan, err := c.Place(r)
	if err != nil {
		t.Fatal(err)
	}
	return plan
}

func reasonOf(p *Plan) string {
	if len(p.Unplaced) == 0 {
		return ""
	}
	return p.Unplaced[0].Reasons.String()
}

func TestUsagePolicyTakesMoreOnAnIdleFullNode(t *testing.T) {
	c := busyNode(t, 0.2)
	// 4 of 4 cpus reserved: the default policy takes nothing more.
	plan := placeN(t, c, "a", 1, 1)
	if len(plan.Placements) != 0 || reasonOf(plan) != "1 node: not enough cpu (reservations)" {
		t.Fatalf("default policy: %v placed, reasons %q", nodesOf(plan), reasonOf(plan))
	}
	if err := c.SetOvercommit("p", Overcommit{Policy: PolicyUsage, Ratio: 2}); err != nil {
		t.Fatal(err)
	}
	// 0.2 cpus measured: 3 more one-cpu instances fit (0.2 + 3 ≤ 4), the
	// fourth would take measured use to 4.2.
	plan = placeN(t, c, "b", 5, 1)
	if len(plan.Placements) != 3 || reasonOf(plan) != "1 node: not enough cpu (usage, measured + headroom 0)" {
		t.Fatalf("usage policy: %d placed, reasons %q", len(plan.Placements), reasonOf(plan))
	}
	// Measured again, the new instances idle: the ratio caps what is
	// reserved at 8 cpus.
	if err := c.SetMeasured("p", "n0", driver.Resources{CPU: driver.CPUs(0.5)}); err != nil {
		t.Fatal(err)
	}
	plan = placeN(t, c, "c", 3, 1)
	if len(plan.Placements) != 1 || reasonOf(plan) != "1 node: not enough cpu (usage, ratio 2)" {
		t.Fatalf("ratio: %d placed, reasons %q", len(plan.Placements), reasonOf(plan))
	}
	if got := c.Overbooked(); len(got) != 0 {
		t.Errorf("overbooked %v: 8 cpus reserved of 4 is within ratio 2", got)
	}
	n := c.Nodes()[0]
	if n.Policy != "usage, ratio 2, headroom 0" || n.Measured.CPU != driver.CPUs(0.5) || n.Berth.CPU != driver.CPUs(8) || n.Free.CPU != 0 {
		t.Errorf("node %+v", n)
	}
	// Back to the default: nothing fits, and the node is overbooked by
	// reservations.
	if err := c.SetOvercommit("p", Overcommit{}); err != nil {
		t.Fatal(err)
	}
	if plan = placeN(t, c, "d", 1, 0.1); len(plan.Placements) != 0 || reasonOf(plan) != "1 node: not enough cpu (reservations)" {
		t.Fatalf("default again: %v, %q", nodesOf(plan), reasonOf(plan))
	}
	if got := c.Overbooked(); !slices.Equal(got, []string{"p/n0"}) {
		t.Errorf("overbooked %v, want p/n0", got)
	}
}

func TestUsagePolicyHeadroom(t *testing.T) {
	for _, tc := range []struct {
		measured float64
		fits     bool
	}{
		{2, true}, // 2 + 1 headroom + 1 = 4
		{2.001, false},
		{0, true},
	} {
		t.Run(fmt.Sprint(tc.measured), func(t *testing.T) {
			c := busyNode(t, tc.measured)
			if err := c.SetOvercommit("p", Overcommit{Policy: PolicyUsage, Ratio: 3, Headroom: 0.25}); err != nil {
				t.Fatal(err)
			}
			plan := placeN(t, c, "a", 1, 1)
			if got := len(plan.Placements) == 1; got != tc.fits {
				t.Fatalf("placed %v, want %v (reasons %q)", got, tc.fits, reasonOf(plan))
			}
			if !tc.fits && reasonOf(plan) != "1 node: not enough cpu (usage, measured + headroom 0.25)" {
				t.Errorf("reasons %q", reasonOf(plan))
			}
		})
	}
}

// TestUsagePolicyMemoryAndDisk: memory is admitted by measured use too;
// disk stays admitted by reservations under the usage policy.
func TestUsagePolicyMemoryAndDisk(t *testing.T) {
	nodes := mkNodes("n", 1, 4, 8, nil)
	nodes[0].Capacity.Disk = 10 * driver.GiB
	c := newTestCluster(t, "p", nodes)
	if err := c.SetOvercommit("p", Overcommit{Policy: PolicyUsage, Ratio: 2}); err != nil {
		t.Fatal(err)
	}
	if err := c.Reserve(Allocation{ID: "big", Provider: "p", Node: "n0", Resources: driver.Resources{CPU: driver.CPUs(1), Memory: 8 * driver.GiB, Disk: 10 * driver.GiB}}); err != nil {
		t.Fatal(err)
	}
	if err := c.SetMeasured("p", "n0", driver.Resources{CPU: driver.CPUs(0.1), Memory: driver.GiB}); err != nil {
		t.Fatal(err)
	}
	plan := placeN(t, c, "m", 1, 0.5)
	if len(plan.Placements) != 1 {
		t.Fatalf("memory by use: %q", reasonOf(plan))
	}
	r := req("d", 0.5, 256)
	r.Disk = driver.GiB
	plan, err := c.Place(r)
	if err != nil {
		t.Fatal(err)
	}
	if len(plan.Placements) != 0 || reasonOf(plan) != "1 node: not enough disk (reservations)" {
		t.Fatalf("disk: %v, %q", nodesOf(plan), reasonOf(plan))
	}
}

// TestCommitRechecksMeasuredUse: a plan made on a snapshot before a new
// measurement is rejected when the measurement leaves no room.
func TestCommitRechecksMeasuredUse(t *testing.T) {
	c := busyNode(t, 0.2)
	if err := c.SetOvercommit("p", Overcommit{Policy: PolicyUsage, Ratio: 2}); err != nil {
		t.Fatal(err)
	}
	s := c.Snapshot(Options{})
	plan, err := s.Plan(req("a", 1, 256))
	if err != nil || len(plan.Placements) != 1 {
		t.Fatalf("plan: %v %+v", err, plan)
	}
	if err := c.SetMeasured("p", "n0", driver.Resources{CPU: driver.CPUs(3.5)}); err != nil {
		t.Fatal(err)
	}
	acc, rej := s.Commit(plan)
	if len(acc) != 0 || len(rej) != 1 {
		t.Fatalf("commit after the node got busy: %d accepted, %d rejected", len(acc), len(rej))
	}
	if st := c.Stats(); st.Conflicts != 1 || st.Instances != 1 {
		t.Errorf("stats %+v", st)
	}
	// The snapshot sees the measurement: planning again finds no room.
	plan, _ = s.Plan(req("b", 1, 256))
	if len(plan.Placements) != 0 || reasonOf(plan) != "1 node: not enough cpu (usage, measured + headroom 0)" {
		t.Fatalf("replan: %v %q", nodesOf(plan), reasonOf(plan))
	}
	// Idle again: the same plan commits.
	if err := c.SetMeasured("p", "n0", driver.Resources{CPU: driver.CPUs(0.3)}); err != nil {
		t.Fatal(err)
	}
	s.Refresh()
	plan, _ = s.Plan(req("c", 1, 256))
	if acc, _ := s.Commit(plan); len(acc) != 1 {
		t.Fatalf("commit on an idle node: %+v", plan)
	}
}

// TestMeasuredIgnoredByDefault: under the default policy a measurement
// changes neither what fits nor the node's version.
func TestMeasuredIgnoredByDefault(t *testing.T) {
	c := newTestCluster(t, "p", mkNodes("n", 1, 4, 8, nil))
	before := c.Nodes()[0]
	if err := c.SetMeasured("p", "n0", driver.Resources{CPU: driver.CPUs(4), Memory: 8 * driver.GiB}); err != nil {
		t.Fatal(err)
	}
	after := c.Nodes()[0]
	if after.Version != before.Version || after.Free.CPU != before.Free.CPU || after.Measured.CPU != driver.CPUs(4) || after.Policy != "reservations" {
		t.Fatalf("before %+v, after %+v", before, after)
	}
	if plan := placeN(t, c, "a", 4, 1); len(plan.Placements) != 4 {
		t.Fatalf("placed %d, want 4", len(plan.Placements))
	}
	if err := c.SetMeasured("p", "nope", driver.Resources{}); !errors.Is(err, driver.ErrNotFound) {
		t.Errorf("unknown node: %v", err)
	}
	if err := c.SetMeasured("p", "n0", driver.Resources{CPU: -1}); !errors.Is(err, driver.ErrInvalid) {
		t.Errorf("negative use: %v", err)
	}
}

func TestOvercommitCheck(t *testing.T) {
	for _, tc := range []struct {
		o    Overcommit
		path string
	}{
		{Overcommit{}, ""},
		{Overcommit{Policy: "reservations"}, ""},
		{Overcommit{Policy: "usage"}, ""},
		{Overcommit{Policy: "usage", Ratio: 10, Headroom: 0.99}, ""},
		{Overcommit{Policy: "greedy"}, "oc.policy"},
		{Overcommit{Ratio: 2}, "oc.ratio"},
		{Overcommit{Headroom: 0.1}, "oc.headroom"},
		{Overcommit{Policy: "usage", Ratio: 0.5}, "oc.ratio"},
		{Overcommit{Policy: "usage", Ratio: 11}, "oc.ratio"},
		{Overcommit{Policy: "usage", Ratio: math.NaN()}, "oc.ratio"},
		{Overcommit{Policy: "usage", Headroom: 1}, "oc.headroom"},
		{Overcommit{Policy: "usage", Headroom: -0.1}, "oc.headroom"},
	} {
		es := tc.o.Check("oc")
		if tc.path == "" {
			if len(es) != 0 {
				t.Errorf("%+v: %v", tc.o, es)
			}
			continue
		}
		if len(es) != 1 || es[0].Path != tc.path {
			t.Errorf("%+v: %v, want one error on %s", tc.o, es, tc.path)
		}
	}
	c := NewCluster()
	if err := c.SetOvercommit("p", Overcommit{Policy: "usage", Ratio: 20}); !errors.Is(err, driver.ErrInvalid) {
		t.Errorf("SetOvercommit with a bad ratio: %v", err)
	}
}

// TestIndexMatchesScanUnderUsage is TestIndexMatchesScan with the usage
// policy and uneven measured use: the index stays exact about
// feasibility.
func TestIndexMatchesScanUnderUsage(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	nodes := mkNodes("n", 600, 4, 16, nil)
	c := newTestCluster(t, "p", nodes)
	if err := c.SetOvercommit("p", Overcommit{Policy: PolicyUsage, Ratio: 1.5, Headroom: 0.1}); err != nil {
		t.Fatal(err)
	}
	for i := range nodes {
		used := driver.Resources{CPU: driver.MilliCPU(rng.IntN(6001)), Memory: driver.Bytes(rng.IntN(24)) * driver.GiB}
		if err := c.Reserve(Allocation{ID: fmt.Sprint("f", i), Provider: "p", Node: nodes[i].Name, Resources: used}); err != nil {
			t.Fatal(err)
		}
		m := driver.Resources{CPU: driver.MilliCPU(rng.IntN(4001)), Memory: driver.Bytes(rng.IntN(17)) * driver.GiB}
		if err := c.SetMeasured("p", nodes[i].Name, m); err != nil {
			t.Fatal(err)
		}
	}
	scan := newPlanner(&c.st, Options{}, DefaultPortMin, DefaultPortMax, &c.ids)
	scan.noIndex = true
	found := 0
	for k := range 300 {
		r := req(fmt.Sprint("r", k), float64(rng.IntN(3000))/1000, int64(rng.IntN(8192)))
		r.Strategy = []Strategy{StrategyBinpack, StrategySpread}[rng.IntN(2)]
		cr, err := compile(r, "")
		if err != nil {
			t.Fatal(err)
		}
		cl := cr.candidates(c.st.t, true)
		a := c.planner.best(cr, cl, nil, false)
		b := scan.best(cr, cl, nil, false)
		if (a < 0) != (b < 0) {
			t.Fatalf("request %d: index %d, scan %d", k, a, b)
		}
		if a < 0 {
			continue
		}
		found++
		if c.st.gridFor(cl) == nil && k > 1 {
			t.Fatal("the index is not used")
		}
		oc := c.st.t.policyOf(a)
		i := a
		cap := resVec(c.st.t.capacity[i])
		for r := range nMeasured {
			if cr.need[r] > oc.free(cap[r], c.st.sum[i].res[r], c.st.meas[i].load(r)) {
				t.Fatalf("index chose node %d without room for resource %d", a, r)
			}
		}
	}
	if found == 0 {
		t.Fatal("no request fitted anywhere")
	}
}
