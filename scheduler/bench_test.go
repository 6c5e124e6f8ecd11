package scheduler

import (
	"fmt"
	"testing"

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
