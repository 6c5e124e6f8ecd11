package scheduler

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/berth-dev/berth/driver"
)

// TestIndexMatchesScan checks the free-capacity index against a scan of
// every candidate: both find a node or neither does, and the index's choice
// scores within one grid diagonal (2/gridN) of the best.
func TestIndexMatchesScan(t *testing.T) {
	for seed := range uint64(4) {
		rng := rand.New(rand.NewPCG(seed, 3))
		nodes := mkNodes("n", 600, 4, 16, nil)
		for i := range nodes {
			if i%3 == 0 {
				nodes[i].Labels = map[string]string{"disk": "ssd"}
			}
			if i%50 == 0 {
				nodes[i].Status = driver.NodeDraining
			}
		}
		c := newTestCluster(t, "p", nodes)
		// Fill nodes unevenly.
		for i := range nodes {
			used := driver.Resources{CPU: driver.MilliCPU(rng.IntN(4001)), Memory: driver.Bytes(rng.IntN(17)) * driver.GiB}
			if err := c.Reserve(Allocation{ID: fmt.Sprint("f", i), Provider: "p", Node: nodes[i].Name, Resources: used}); err != nil {
				t.Fatal(err)
			}
		}
		scan := newPlanner(&c.st, Options{}, DefaultPortMin, DefaultPortMax, &c.ids)
		scan.noIndex = true
		for k := range 300 {
			r := req(fmt.Sprint("r", seed, k), float64(rng.IntN(3000))/1000, int64(rng.IntN(8192)))
			r.Strategy = []Strategy{StrategyBinpack, StrategySpread}[rng.IntN(2)]
			if rng.IntN(3) == 0 {
				r.Constraints = []string{"disk!=ssd"}
			}
			cr, err := compile(r, "")
			if err != nil {
				t.Fatal(err)
			}
			cl := cr.candidates(c.st.t, true)
			if len(cl.nodes) < 256 {
				t.Fatalf("only %d candidates: the index is not used", len(cl.nodes))
			}
			a := c.planner.best(cr, cl, nil, false)
			b := scan.best(cr, cl, nil, false)
			if (a < 0) != (b < 0) {
				t.Fatalf("request %d: index %d, scan %d", k, a, b)
			}
			if a < 0 {
				continue
			}
			if !cr.fitsHot(&c.st.hot[a]) || !slices.Contains(cl.nodes, a) {
				t.Fatalf("index chose infeasible node %d", a)
			}
			sa, sb := c.planner.score(cr, a, nil, false), scan.score(cr, b, nil, false)
			if sb-sa > 2.0/gridN+1e-9 {
				t.Fatalf("request %d (%s): index scored %.4f, scan %.4f", k, r.Strategy, sa, sb)
			}
			// Place it so that the state moves on.
			p := &Plan{}
			c.planner.place(cr, a, 0, false, p)
			c.allocs.add(p.Placements[0].a)
		}
		if bad := c.Overbooked(); len(bad) > 0 {
			t.Fatalf("overbooked %v", bad)
		}
		if len(c.st.grids) != 2 {
			t.Fatalf("%d grids, want one per constraint set", len(c.st.grids))
		}
		checkIndex(t, &c.st)
	}
}

// checkIndex verifies that every grid of st lists each of its nodes exactly
// once, in the cell its free capacity says, with consistent links and
// diagonal counts.
func checkIndex(t *testing.T, st *state) {
	t.Helper()
	for _, g := range st.grids {
		seen := 0
		var diag [nDiags]int32
		for cell := range int32(nCells) {
			prev := int32(-1)
			for j := g.head[cell]; j >= 0; j = g.next[j] {
				seen++
				diag[diagOf(cell)]++
				n := g.nodes[j]
				if g.pos[n] != j || g.cell[j] != cell || cellOf(&st.hot[n]) != cell || g.prev[j] != prev {
					t.Fatalf("node %d listed in cell %d, belongs in %d", n, cell, cellOf(&st.hot[n]))
				}
				prev = j
			}
			if g.tail[cell] != prev {
				t.Fatalf("cell %d: tail %d, last %d", cell, g.tail[cell], prev)
			}
		}
		if seen != len(g.nodes) || diag != g.diag {
			t.Fatalf("grid lists %d nodes of %d; diagonals %v, want %v", seen, len(g.nodes), g.diag, diag)
		}
	}
}

func TestIndexInSnapshots(t *testing.T) {
	c := newTestCluster(t, "p", mkNodes("n", 400, 4, 16, nil))
	s1, s2 := c.Snapshot(Options{}), c.Snapshot(Options{Seed: 1})
	rng := rand.New(rand.NewPCG(9, 9))
	for k := range 2000 {
		s := s1
		if k%2 == 1 {
			s = s2
		}
		r := req(fmt.Sprint("r", k), float64(1+rng.IntN(1500))/1000, int64(64+rng.IntN(4096)))
		r.Strategy = []Strategy{StrategyBinpack, StrategySpread}[rng.IntN(2)]
		if _, _, err := s.Place(r); err != nil {
			t.Fatal(err)
		}
		if k%300 == 0 {
			_ = c.Release(fmt.Sprint("r", k/2))
		}
	}
	s1.Refresh()
	s2.Refresh()
	if len(c.st.grids)+len(s1.st.grids)+len(s2.st.grids) == 0 {
		t.Fatal("no grid was built: the test does not exercise the index")
	}
	checkIndex(t, &c.st)
	checkIndex(t, &s1.st)
	checkIndex(t, &s2.st)
	for i := range c.st.hot {
		if s1.st.hot[i] != c.st.hot[i] || s2.st.hot[i] != c.st.hot[i] {
			t.Fatalf("node %d differs after refresh", i)
		}
	}
	if bad := c.Overbooked(); len(bad) > 0 {
		t.Fatalf("overbooked %v", bad)
	}
}
