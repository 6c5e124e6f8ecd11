package simulate

import (
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/scheduler"
)

// checkMoves applies moves to f's instances and checks the end state
// instance by instance, with nothing of the scheduler's: every move starts
// where its instance is, no node holds more cpu or memory than it has, and
// every instance's node has the zone its request's constraint names.
func checkMoves(t *testing.T, f *Fragmented, moves []scheduler.Move) (nodesUsed int) {
	t.Helper()
	where := map[string]scheduler.Allocation{}
	for _, a := range f.Allocations {
		where[a.ID] = a
	}
	for _, m := range moves {
		a, ok := where[m.Instance]
		if !ok || a.Node != m.From {
			t.Fatalf("move %+v: the instance is on %q", m, a.Node)
		}
		a.Node = m.To
		where[m.Instance] = a
	}
	nodes := map[string]driver.Node{}
	for _, n := range f.Nodes {
		nodes[n.Name] = n
	}
	sums := map[string]driver.Resources{}
	for id, a := range where {
		n, ok := nodes[a.Node]
		if !ok {
			t.Fatalf("%s is on unknown node %q", id, a.Node)
		}
		s := sums[a.Node]
		s.CPU += a.Resources.CPU
		s.Memory += a.Resources.Memory
		sums[a.Node] = s
		for _, c := range f.Requests[a.Request].Constraints {
			zone, ok := strings.CutPrefix(c, "zone==")
			if !ok {
				t.Fatalf("constraint %q not understood by the checker", c)
			}
			if n.Labels["zone"] != zone {
				t.Errorf("%s (%s) on %s in zone %s", id, c, a.Node, n.Labels["zone"])
			}
		}
	}
	for name, s := range sums {
		if c := nodes[name].Capacity; s.CPU > c.CPU || s.Memory > c.Memory {
			t.Errorf("node %s holds %v of %v", name, s, c)
		}
	}
	return len(sums)
}

func TestRebalanceFragmentedThousandNodes(t *testing.T) {
	f := Fragment(1000, 3600, 1)
	c, err := f.Cluster()
	if err != nil {
		t.Fatal(err)
	}
	before := checkMoves(t, f, nil)
	rb, err := c.PlanRebalance(scheduler.RebalanceOptions{Request: f.Request, MaxMoves: scheduler.MaxRebalanceMoves})
	if err != nil {
		t.Fatal(err)
	}
	fresh, err := f.FreshPacking()
	if err != nil || fresh <= 0 {
		t.Fatalf("fresh packing: %d, %v", fresh, err)
	}
	after := checkMoves(t, f, rb.Moves)
	t.Logf("%d instances: %d nodes before, %d after (%d moves, %d freed), fresh batch packing %d, lower bound %d",
		len(f.Allocations), before, after, len(rb.Moves), len(rb.Freed), fresh, rb.LowerBound)
	if rb.NodesBefore != before || rb.NodesAfter != after || len(rb.Freed) != before-after {
		t.Fatalf("the plan says %d -> %d nodes (%d freed), the checker counts %d -> %d", rb.NodesBefore, rb.NodesAfter, len(rb.Freed), before, after)
	}
	if before < fresh*3/2 {
		t.Fatalf("the cluster is not fragmented: %d nodes used, %d would do", before, fresh)
	}
	if float64(after) > 1.05*float64(fresh) {
		t.Errorf("rebalanced to %d nodes, more than 5%% over a fresh packing's %d", after, fresh)
	}
	res := f.Replay(rb.Moves)
	if !res.OK() || res.Moved != len(rb.Moves) || res.NodesAfter != after {
		t.Fatalf("replay: %+v", res)
	}
}

func TestRebalanceSpreadThousandNodes(t *testing.T) {
	f := Fragment(1000, 5000, 2)
	c, err := f.Cluster()
	if err != nil {
		t.Fatal(err)
	}
	rb, err := c.PlanRebalance(scheduler.RebalanceOptions{Goal: scheduler.RebalanceSpread, Threshold: 0.6, Request: f.Request, MaxMoves: scheduler.MaxRebalanceMoves})
	if err != nil {
		t.Fatal(err)
	}
	checkMoves(t, f, rb.Moves)
	t.Logf("spread to 0.6: max load %.3f -> %.3f, %d -> %d nodes over, %d moves", rb.MaxLoadBefore, rb.MaxLoadAfter, rb.OverBefore, rb.OverAfter, len(rb.Moves))
	if rb.OverBefore == 0 || rb.OverAfter != 0 || rb.MaxLoadAfter > 0.6 {
		t.Fatalf("plan: over %d -> %d, max load %v -> %v", rb.OverBefore, rb.OverAfter, rb.MaxLoadBefore, rb.MaxLoadAfter)
	}
	if res := f.Replay(rb.Moves); !res.OK() || res.Moved != len(rb.Moves) {
		t.Fatalf("replay: %+v", res)
	}
}

// cpuTime is the CPU time this process has used (user and system): on a
// shared machine it says more of the work than the wall clock.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkRebalance plans a binpack rebalance of fragmented clusters of
// 10k, 100k and 1M instances (a node per 3.6 instances, as in the
// 1,000-node test) and reports the nodes freed and the time to plan, by
// the clock and in CPU time.
func BenchmarkRebalance(b *testing.B) {
	for _, n := range []int{10_000, 100_000, 1_000_000} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			f := Fragment(n*5/18, n, 1)
			c, err := f.Cluster()
			if err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			var rb *scheduler.Rebalance
			cpu0 := cpuTime()
			start := time.Now()
			for range b.N {
				rb, err = c.PlanRebalance(scheduler.RebalanceOptions{Request: f.Request, MaxMoves: scheduler.MaxRebalanceMoves})
				if err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			b.ReportMetric(time.Since(start).Seconds()/float64(b.N), "s/plan")
			b.ReportMetric((cpuTime()-cpu0).Seconds()/float64(b.N), "cpu_s/plan")
			b.ReportMetric(float64(len(f.Allocations)), "instances")
			b.ReportMetric(float64(rb.NodesBefore), "nodes_before")
			b.ReportMetric(float64(rb.NodesAfter), "nodes_after")
			b.ReportMetric(float64(len(rb.Freed)), "freed")
			b.ReportMetric(float64(len(rb.Moves)), "moves")
			b.ReportMetric(float64(rb.LowerBound), "lower_bound")
		})
	}
}
