package scheduler

import (
	"cmp"
	"slices"
)

// Packing a batch group.
//
// A batch group (every service of type batch, binpacked, with nothing that
// ties an instance to its neighbours: no affinities, soft constraints, host
// ports or per-node cap) is placed largest first: its services in
// decreasing order of their dominant share of the cluster (best-fit
// decreasing, since binpack scores the fullest node that fits highest).
// Then an improvement pass tries to empty the group's least-filled nodes
// into its other nodes, swapping the group's own instances where that
// fills a node more (Levine and Ducatelle's local search for bin packing),
// within a budget of feasibility checks that grows with the group. The pass
// keeps a change only when it empties a node or fills the others more, so
// the group never uses more nodes than best-fit decreasing did; it moves
// the group's own instances only, and only onto nodes the group already
// uses.

// packBudget bounds the feasibility checks of one group's improvement
// pass: packBudgetBase plus packBudgetPer for each of its instances.
const (
	packBudgetBase = 20_000
	packBudgetPer  = 2_000
)

// packEmpty is how many of the least-filled nodes an attempt empties at
// once: more free instances give the swaps more to choose from.
const packEmpty = 2

// packs reports whether gg is a batch group whose instances may be
// ordered and moved freely among themselves.
func (gg *gang) packs() bool {
	if gg.g.Kind == KindNodeSet {
		return false
	}
	for _, c := range gg.cs {
		if c.apart || c.strategy != StrategyBinpack || len(c.soft) > 0 || len(c.affHard) > 0 ||
			len(c.affSoft) > 0 || len(c.fixedPorts) > 0 || c.anyPorts > 0 || c.req.MaxPerNode > 0 {
			return false
		}
	}
	return true
}

// order returns the indexes of gg's services in the order to place them:
// startup order, or for a batch group largest first by dominant share of
// the cluster's capacity (ties in startup order).
func (p *planner) order(gg *gang, packs bool) []int {
	order := seq(0, len(gg.cs))
	if !packs {
		return order
	}
	tot := p.st.totCap
	share := func(c *compiled) float64 {
		s := 0.0
		for r := range nRes {
			if tot[r] > 0 {
				s = max(s, float64(c.need[r])/float64(tot[r]))
			}
		}
		return s
	}
	slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(share(gg.cs[b]), share(gg.cs[a])) })
	return order
}

// startupOrder sorts a group's placements back into its services' startup
// order (instance order within a service), the order the plan promises.
func (gg *gang) startupOrder(pls []Placement) {
	svc := make(map[string]int, len(gg.cs))
	for k, c := range gg.cs {
		svc[c.req.ID] = k
	}
	slices.SortStableFunc(pls, func(a, b Placement) int {
		if c := cmp.Compare(svc[a.Request], svc[b.Request]); c != 0 {
			return c
		}
		return cmp.Compare(a.Index, b.Index)
	})
}

// packItem is one essential instance of a group in the improvement pass.
type packItem struct {
	k    int   // its index in the plan's placements
	svc  int   // its service's index in the gang
	node int32 // where it is; -1 while lifted
	size float64
}

// packer runs the improvement pass over one group's placements.
type packer struct {
	p      *planner
	gg     *gang
	plan   *Plan
	items  []packItem
	on     map[int32][]int // items by node
	static map[[2]int32]bool
	budget int
	// fast is true when resources and the instance cap are all a move
	// must keep to (no quotas, named resources or other slow checks): a
	// move is then checked by arithmetic before anything moves.
	fast bool
	// orig keeps, during an attempt, the placement of every item it
	// moved as it was before, for rollback; touched lists them in order.
	orig    map[int]Placement
	touched []int
}

// improve runs the improvement pass over plan.Placements[mark:], the
// essential placements of the batch group gg.
func (p *planner) improve(gg *gang, plan *Plan, mark int) {
	svcOf := make(map[string]int, len(gg.cs))
	for k, c := range gg.cs {
		svcOf[c.req.ID] = k
	}
	pk := &packer{p: p, gg: gg, plan: plan, on: map[int32][]int{}, static: map[[2]int32]bool{}, orig: map[int]Placement{},
		fast: len(p.st.quotas) == 0}
	for _, c := range gg.cs {
		pk.fast = pk.fast && !c.slow
	}
	var lbSum [nRes]int64
	for k := mark; k < len(plan.Placements); k++ {
		pl := &plan.Placements[k]
		s := svcOf[pl.Request]
		c := gg.cs[s]
		pk.items = append(pk.items, packItem{k: k, svc: s, node: pl.a.node, size: p.size(c.need)})
		pk.on[pl.a.node] = append(pk.on[pl.a.node], len(pk.items)-1)
		for r := range nRes {
			lbSum[r] += c.need[r]
		}
	}
	if len(pk.on) < 2 {
		return
	}
	// Instances of one shape gain nothing from swaps.
	if !slices.ContainsFunc(gg.cs, func(c *compiled) bool { return c.need != gg.cs[0].need }) {
		return
	}
	// No packing of the group's instances alone uses fewer nodes than
	// its demand over the largest node.
	lb := 0
	largest := [nRes]int64{}
	for i := range p.st.t.capacity {
		v := resVec(p.st.t.capacity[i])
		for r := range nRes {
			largest[r] = max(largest[r], v[r])
		}
	}
	for r := range nRes {
		if largest[r] > 0 {
			lb = max(lb, int((lbSum[r]+largest[r]-1)/largest[r]))
		}
	}
	pk.budget = packBudgetBase + packBudgetPer*len(pk.items)
	tried := map[int32]bool{}
	for pk.budget > 0 && len(pk.on) > lb {
		es := pk.leastFilled(tried, packEmpty)
		if len(es) == 0 {
			return
		}
		tried[es[0]] = true
		if pk.attempt(es) {
			// A node fewer: every other node may be worth emptying again.
			clear(tried)
		}
	}
}

// size is a single number for what need takes of the largest node: the
// sum of its cpu and memory fractions.
func (p *planner) size(need [nRes]int64) float64 {
	t := p.st.t
	return float64(need[resCPU])*t.minInvCPU + float64(need[resMem])*t.minInvMem
}

// fill is how full node i is, on the same scale as size.
func (p *planner) fill(i int32) float64 {
	c := resVec(p.st.t.capacity[i])
	h := &p.st.hot[i]
	var u [nRes]int64
	for r := range nRes {
		u[r] = c[r] - h.free[r]
	}
	return p.size(u)
}

// slack is what node i has free, on the same scale as size; a set of
// instances larger than it cannot fit there.
func (p *planner) slack(i int32) float64 {
	return p.size(p.st.hot[i].free)
}

// emptiable reports whether node i holds nothing but the group's items.
func (pk *packer) emptiable(i int32) bool {
	return int(pk.p.st.hot[i].inst) == len(pk.on[i])
}

// leastFilled returns up to k of the least-filled nodes of the group
// that hold only the group's instances, the first not in skip, least
// filled first; none when every such node is in skip.
func (pk *packer) leastFilled(skip map[int32]bool, k int) []int32 {
	var all []int32
	for i := range pk.on {
		if pk.emptiable(i) {
			all = append(all, i)
		}
	}
	pk.sortFullest(all)
	slices.Reverse(all)
	for _, i := range all {
		if skip[i] {
			continue
		}
		out := []int32{i}
		for _, o := range all {
			if len(out) == k {
				break
			}
			if o != i {
				out = append(out, o)
			}
		}
		return out
	}
	return nil
}

// allowed reports whether item it may go to node i by the static filters
// (cached per service and node).
func (pk *packer) allowed(it int, i int32) bool {
	key := [2]int32{int32(pk.items[it].svc), i}
	ok, seen := pk.static[key]
	if !seen {
		pk.budget--
		ok = pk.gg.cs[pk.items[it].svc].staticReason(pk.p.st.t, i, false) == ""
		pk.static[key] = ok
	}
	return ok
}

// fits reports, on the fast path, whether node m takes ins once outs are
// off it: Berth's sum with the change must fit the capacity beside what the
// back-end reports, and the instance count its cap.
func (pk *packer) fits(m int32, outs, ins []int) bool {
	st := pk.p.st
	t := st.t
	sum := st.sum[m].res
	for _, it := range outs {
		n := &pk.gg.cs[pk.items[it].svc].need
		for r := range nRes {
			sum[r] -= n[r]
		}
	}
	for _, it := range ins {
		n := &pk.gg.cs[pk.items[it].svc].need
		for r := range nRes {
			sum[r] += n[r]
		}
	}
	c := resVec(t.capacity[m])
	e, einst := st.reported(m)
	for r := range nRes {
		if max(e[r], sum[r]) > c[r] {
			return false
		}
	}
	inst := int(st.sum[m].inst) - len(outs) + len(ins)
	return len(ins) <= len(outs) || max(int(einst), inst) <= int(t.maxInst[m])
}

// keep remembers item it's placement before the attempt first moves it.
func (pk *packer) keep(it int) {
	if _, ok := pk.orig[it]; !ok {
		pk.orig[it] = pk.plan.Placements[pk.items[it].k]
		pk.touched = append(pk.touched, it)
	}
}

// lift takes item it off its node.
func (pk *packer) lift(it int) {
	pk.keep(it)
	x := &pk.items[it]
	pk.p.st.unapply(pk.plan.Placements[x.k].a)
	pk.on[x.node] = slices.DeleteFunc(pk.on[x.node], func(j int) bool { return j == it })
	if len(pk.on[x.node]) == 0 {
		delete(pk.on, x.node)
	}
	x.node = -1
}

// put places the lifted item it on node i when it fits there (force skips
// the check, for an item going back where it was) and reports whether it
// did.
func (pk *packer) put(it int, i int32, force bool) bool {
	x := &pk.items[it]
	if !force {
		if !pk.allowed(it, i) {
			return false
		}
		pk.budget--
		if !pk.p.feasible(pk.gg.cs[x.svc], i, nil) {
			return false
		}
	}
	pk.keep(it)
	pl := &pk.plan.Placements[x.k]
	a := *pl.a
	a.node = i
	pk.p.st.apply(&a)
	t := pk.p.st.t
	pl.a, pl.Node, pl.Provider, pl.Address = &a, t.names[i], t.providers[t.prov[i]], t.addr[i]
	x.node = i
	pk.on[i] = append(pk.on[i], it)
	return true
}

// rollback undoes every move of the attempt.
func (pk *packer) rollback() {
	for _, it := range pk.touched {
		if pk.items[it].node >= 0 {
			pk.lift(it)
		}
	}
	for _, it := range pk.touched {
		o := pk.orig[it]
		pk.p.st.apply(o.a)
		pk.plan.Placements[pk.items[it].k] = o
		pk.items[it].node = o.a.node
		pk.on[o.a.node] = append(pk.on[o.a.node], it)
	}
	pk.commit()
}

// commit forgets the attempt's undo log.
func (pk *packer) commit() {
	clear(pk.orig)
	pk.touched = pk.touched[:0]
}

// attempt lifts every item off the nodes es and tries to fit them into
// the group's other nodes, swapping items where that fills a node more;
// what is left goes back onto es, best fit, largest first. It reports
// whether some node of es ended empty. When the items cannot all be put
// somewhere, nothing changes.
func (pk *packer) attempt(es []int32) bool {
	var free []int
	for _, e := range es {
		free = append(free, pk.on[e]...)
	}
	for _, it := range free {
		pk.lift(it)
	}
	targets := make([]int32, 0, len(pk.on))
	for i := range pk.on {
		targets = append(targets, i)
	}
	// Fullest first: they need the least to be filled.
	pk.sortFullest(targets)
	for _, m := range targets {
		if len(free) == 0 || pk.budget <= 0 {
			break
		}
		free = pk.fillNode(m, free)
	}
	// Best fit for what is left: into the other nodes, then back onto es.
	pk.sortDesc(free)
	for _, it := range free {
		if !pk.bestFit(it, targets) && !pk.bestFit(it, es) {
			pk.rollback()
			return false
		}
	}
	pk.commit()
	for _, e := range es {
		if len(pk.on[e]) == 0 {
			return true
		}
	}
	return false
}

// bestFit puts the lifted item it on the fullest of nodes where it fits
// and reports whether it found one.
func (pk *packer) bestFit(it int, nodes []int32) bool {
	best, bestF := int32(-1), -1.0
	one := []int{it}
	for _, m := range nodes {
		if pk.budget <= 0 {
			break
		}
		if pk.p.slack(m) < pk.items[it].size-1e-12 || !pk.allowed(it, m) {
			continue
		}
		pk.budget--
		ok := false
		if pk.fast {
			ok = pk.fits(m, nil, one)
		} else {
			ok = pk.p.feasible(pk.gg.cs[pk.items[it].svc], m, nil)
		}
		if ok {
			if f := pk.p.fill(m); f > bestF {
				best, bestF = m, f
			}
		}
	}
	return best >= 0 && pk.put(it, best, true)
}

// sortFullest sorts nodes fullest first (ties by index).
func (pk *packer) sortFullest(nodes []int32) {
	fills := make(map[int32]float64, len(nodes))
	for _, i := range nodes {
		fills[i] = pk.p.fill(i)
	}
	slices.SortFunc(nodes, func(a, b int32) int {
		if c := cmp.Compare(fills[b], fills[a]); c != 0 {
			return c
		}
		return cmp.Compare(a, b)
	})
}

// sortDesc sorts items by size, largest first (ties by index).
func (pk *packer) sortDesc(its []int) {
	slices.SortFunc(its, func(a, b int) int {
		if c := cmp.Compare(pk.items[b].size, pk.items[a].size); c != 0 {
			return c
		}
		return cmp.Compare(a, b)
	})
}

// fillNode makes node m fuller with the free items: it inserts those that
// fit, then swaps one or two of the group's items on m for one or two free
// ones that are larger in total, while any move fits and budget lasts. It
// returns the free items after the moves.
func (pk *packer) fillNode(m int32, free []int) []int {
	size := func(its ...int) float64 {
		s := 0.0
		for _, it := range its {
			s += pk.items[it].size
		}
		return s
	}
	// try lifts outs off m and puts ins on it; when an in does not fit,
	// everything goes back and it reports false.
	try := func(outs, ins []int) bool {
		if size(ins...)-size(outs...) > pk.p.slack(m)+1e-12 {
			return false
		}
		for _, it := range ins {
			if !pk.allowed(it, m) {
				return false
			}
		}
		pk.budget--
		if pk.fast && !pk.fits(m, outs, ins) {
			return false
		}
		for _, it := range outs {
			pk.lift(it)
		}
		for j, it := range ins {
			if !pk.put(it, m, false) {
				for _, back := range ins[:j] {
					pk.lift(back)
				}
				for _, back := range outs {
					pk.put(back, m, true)
				}
				return false
			}
		}
		return true
	}
	swap := func(free, outs, ins []int) []int {
		out := slices.DeleteFunc(free, func(it int) bool { return slices.Contains(ins, it) })
		return append(out, outs...)
	}
	for changed := true; changed && pk.budget > 0; {
		changed = false
		pk.sortDesc(free)
		// Insert whatever fits, largest first.
		for j := 0; j < len(free) && pk.budget > 0; {
			if try(nil, free[j:j+1]) {
				free = slices.Delete(free, j, j+1)
				changed = true
				continue
			}
			j++
		}
		if len(free) == 0 {
			return free
		}
		on := slices.Clone(pk.on[m])
		// One or two on m for one or two free, larger in total.
	swaps:
		for a := 0; a < len(on) && pk.budget > 0; a++ {
			for b := a; b < len(on) && pk.budget > 0; b++ {
				outs := []int{on[a]}
				if b > a {
					outs = append(outs, on[b])
				}
				so := size(outs...)
				for x := 0; x < len(free) && pk.budget > 0; x++ {
					for y := x; y < len(free) && pk.budget > 0; y++ {
						pk.budget--
						ins := []int{free[x]}
						if y > x {
							ins = append(ins, free[y])
						}
						if size(ins...) <= so+1e-12 {
							continue
						}
						if try(outs, ins) {
							free = swap(free, outs, ins)
							changed = true
							break swaps
						}
					}
				}
			}
		}
	}
	return free
}
