package scheduler

import (
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/berth-dev/berth/driver"
)

func w2Nodes(n int) []driver.Node {
	nodes := mkNodes("n", n, 4, 32, nil)
	for i := range nodes {
		disk := "hdd"
		if i%2 == 0 {
			disk = "ssd"
		}
		nodes[i].Labels = map[string]string{"disk": disk}
	}
	return nodes
}

// BenchmarkPlaceW2 is w2's decision alone: one request of 0.5 cpu /
// 256 MiB with disk==ssd, placed and committed, on 10,000 nodes. The
// cluster is refilled when it gets full.
func BenchmarkPlaceW2(b *testing.B) {
	c := newTestCluster(b, "p", w2Nodes(10000))
	k := 0
	for b.Loop() {
		r := req(fmt.Sprint("r", k), 0.5, 256)
		r.Constraints = []string{"disk==ssd"}
		p, err := c.Place(r)
		if err != nil {
			b.Fatal(err)
		}
		if len(p.Placements) == 0 {
			b.StopTimer()
			c = newTestCluster(b, "p", w2Nodes(10000))
			b.StartTimer()
		}
		k++
	}
}

// BenchmarkBareScan is the baseline the issue compares with: a plain Go
// loop over 10,000 nodes that picks the first ssd node with room and
// commits to it.
func BenchmarkBareScan(b *testing.B) {
	type node struct {
		ssd            bool
		freeCPU, freeM int64
	}
	fresh := func() []node {
		ns := make([]node, 10000)
		for i := range ns {
			ns[i] = node{ssd: i%2 == 0, freeCPU: 4000, freeM: 32 << 30}
		}
		return ns
	}
	ns := fresh()
	for b.Loop() {
		best, bestFree := -1, int64(-1)
		for i := range ns {
			n := &ns[i]
			if n.ssd && n.freeCPU >= 500 && n.freeM >= 256<<20 && n.freeCPU > bestFree {
				best, bestFree = i, n.freeCPU
			}
		}
		if best < 0 {
			ns = fresh()
			continue
		}
		ns[best].freeCPU -= 500
		ns[best].freeM -= 256 << 20
	}
}

// BenchmarkPlaceW3 is w3's placement alone: 1,000 batch groups of 1,000
// instances of 0.1 cpu / 256 MiB, each constrained to one of 10 zones,
// placed all or none by Cluster.PlaceGroup on 5,000 nodes of 32 cpus /
// 128 GiB. It reports the time per instance and the live heap the cluster
// keeps per instance placed (instance ids included).
func BenchmarkPlaceW3(b *testing.B) {
	const nodes, groups, per = 5_000, 1_000, 1_000
	ns := mkNodes("n", nodes, 32, 128, nil)
	for i := range ns {
		ns[i].Labels = map[string]string{"zone": fmt.Sprintf("z%d", i%10)}
	}
	for b.Loop() {
		c := newTestCluster(b, "sim", ns)
		runtime.GC()
		var before runtime.MemStats
		runtime.ReadMemStats(&before)
		start := time.Now()
		for g := range groups {
			grp := &Group{ID: fmt.Sprintf("w3-%04d", g), Services: []Service{{Request: Request{
				Spec:        driver.Spec{Image: "berth/sim", Type: driver.TypeBatch, Resources: driver.Resources{CPU: driver.CPUs(0.1), Memory: 256 * driver.MiB}},
				Count:       per,
				Constraints: []string{fmt.Sprintf("zone==z%d", g%10)},
			}}}}
			p, err := c.PlaceGroup(grp)
			if err != nil {
				b.Fatal(err)
			}
			if len(p.Placements) != per {
				b.Fatalf("group %d: %d placements, want %d", g, len(p.Placements), per)
			}
		}
		elapsed := time.Since(start)
		runtime.GC()
		var after runtime.MemStats
		runtime.ReadMemStats(&after)
		b.ReportMetric(float64(elapsed.Nanoseconds())/(groups*per), "ns/instance")
		b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/(groups*per), "live-B/instance")
		b.ReportMetric(float64(after.Mallocs-before.Mallocs)/(groups*per), "allocs/instance")
		if n := c.Stats().Instances; n != groups*per {
			b.Fatalf("%d instances allocated, want %d", n, groups*per)
		}
	}
}
