package scheduler

import "math"

// The free-capacity index. For a candidate list in heavy use (a request
// shape: provider, capabilities, constraints) a state keeps a grid of
// gridN × gridN cells holding the list's nodes by free cpu fraction (row)
// and free memory fraction (column), in a list per cell kept in arrival
// order. Binpack walks the grid's diagonals (equal free fraction sums) from
// the fullest nodes that can still fit, spread from the emptiest, so that a
// placement looks at a few cells instead of every node. The index is exact
// about feasibility (each node is checked) and within one diagonal (2/gridN
// of a node) of the best score. Grids are updated on every change of a node
// they hold and dropped when the topology changes.
const (
	gridN    = 64
	nCells   = gridN * gridN
	nDiags   = 2*gridN - 1
	idxPeek  = 32 // feasible nodes scored in the first diagonal that has any
	maxGrids = 16 // per state; other shapes are scanned
	minGrid  = 256
)

type grid struct {
	nodes      []int32 // position -> node
	pos        []int32 // node -> position, -1 when not held
	cell       []int32 // position -> cell
	next, prev []int32 // by position
	head, tail [nCells]int32
	diag       [nDiags]int32 // positions per diagonal
}

// newGrid indexes the nodes of cl as they are in s.
func newGrid(cl *candList, s *state) *grid {
	n := len(cl.nodes)
	g := &grid{
		nodes: cl.nodes, pos: make([]int32, len(s.hot)),
		cell: make([]int32, n), next: make([]int32, n), prev: make([]int32, n),
	}
	for i := range g.pos {
		g.pos[i] = -1
	}
	for k := range g.head {
		g.head[k], g.tail[k] = -1, -1
	}
	for j, i := range cl.nodes {
		g.pos[i] = int32(j)
		g.cell[j] = -1
		if s.parked == nil || !s.parked[i] {
			g.update(int32(j), &s.hot[i])
		}
	}
	return g
}

func frac(free int64, inv float64) int32 {
	k := int32(float64(free) * inv * gridN)
	return min(max(k, 0), gridN-1)
}

func cellOf(h *hot) int32 {
	return frac(h.free[resCPU], h.invCPU)*gridN + frac(h.free[resMem], h.invMem)
}

func diagOf(c int32) int32 { return c/gridN + c%gridN }

// update moves position j to the cell h belongs in, at the tail.
func (g *grid) update(j int32, h *hot) {
	c := cellOf(h)
	if g.cell[j] == c {
		return
	}
	g.unlink(j)
	g.cell[j] = c
	g.prev[j], g.next[j] = g.tail[c], -1
	if t := g.tail[c]; t >= 0 {
		g.next[t] = j
	} else {
		g.head[c] = j
	}
	g.tail[c] = j
	g.diag[diagOf(c)]++
}

// unlink takes position j out of its cell, if it is in one.
func (g *grid) unlink(j int32) {
	old := g.cell[j]
	if old < 0 {
		return
	}
	p, n := g.prev[j], g.next[j]
	if p >= 0 {
		g.next[p] = n
	} else {
		g.head[old] = n
	}
	if n >= 0 {
		g.prev[n] = p
	} else {
		g.tail[old] = p
	}
	g.diag[diagOf(old)]--
	g.cell[j] = -1
}

// gridFor returns the state's grid for cl, building it on the second use
// (a one-off shape is cheaper to scan), or nil.
func (s *state) gridFor(cl *candList) *grid {
	if g, ok := s.gridOf[cl]; ok {
		return g
	}
	if len(s.grids) >= maxGrids {
		return nil
	}
	if s.uses == nil {
		s.uses = map[*candList]int{}
	}
	if s.uses[cl]++; s.uses[cl] < 2 {
		return nil
	}
	g := newGrid(cl, s)
	if s.gridOf == nil {
		s.gridOf = map[*candList]*grid{}
	}
	s.gridOf[cl] = g
	s.grids = append(s.grids, g)
	return g
}

// dropGrids forgets every grid (after a topology change or a full copy).
func (s *state) dropGrids() {
	s.grids, s.gridOf, s.uses = nil, nil, nil
}

// bestIndexed is best for binpack and spread without slow checks or extra
// scorers: it walks g's diagonals in strategy order, skipping rows and
// columns that cannot fit, and returns the best scored of the first idxPeek
// feasible nodes of the first diagonal that has any, or -1.
func (p *planner) bestIndexed(c *compiled, g *grid) int32 {
	s := p.st
	t := s.t
	lo := func(need int64, inv float64) int32 {
		k := int32(math.Floor(float64(need)*inv*gridN - 1e-9))
		return min(max(k, 0), gridN-1)
	}
	ic, jc := lo(c.need[resCPU], t.minInvCPU), lo(c.need[resMem], t.minInvMem)
	binpack := c.strategy == StrategyBinpack
	d, end, step := ic+jc, int32(nDiags), int32(1)
	sign := -1.0
	if !binpack {
		d, end, step, sign = nDiags-1, ic+jc-1, -1, 1
	}
	hots := s.hot
	for ; d != end; d += step {
		if g.diag[d] == 0 {
			continue
		}
		bestI, bestS, found := int32(-1), math.Inf(-1), 0
		for i := max(ic, d-(gridN-1)); i <= min(gridN-1, d-jc) && found < idxPeek; i++ {
			for j := g.head[i*gridN+d-i]; j >= 0 && found < idxPeek; j = g.next[j] {
				n := g.nodes[j]
				h := &hots[n]
				if !c.fitsHot(h) {
					continue
				}
				found++
				sc := sign * (float64(h.free[resCPU]-c.need[resCPU])*h.invCPU + float64(h.free[resMem]-c.need[resMem])*h.invMem)
				if sc > bestS || (sc == bestS && n < bestI) {
					bestI, bestS = n, sc
				}
			}
		}
		if bestI >= 0 {
			return bestI
		}
	}
	return -1
}
