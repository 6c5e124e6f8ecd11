package scheduler

import (
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync/atomic"

	"github.com/berth-dev/berth/driver"
)

// Options tune a planner. The zero value scores every feasible node with
// the default weights.
type Options struct {
	// Sample, when positive, scores only the first Sample feasible nodes
	// met from a random starting point (power of k choices) instead of all
	// of them: faster on very large clusters, at some cost in packing.
	Sample int
	// Seed seeds the random strategy and sampling; plans are reproducible
	// for a given seed and state.
	Seed uint64
	// Weights combine the scorers; zero fields take the defaults.
	Weights Weights
}

// Weights combine the scorers into one score per node.
type Weights struct {
	// Strategy multiplies the strategy's score (binpack, spread...), which
	// lies between 0 and 2. Default 1.
	Strategy float64
	// Soft is added for each soft constraint a node satisfies once soft
	// constraints had to be relaxed. Default 1.
	Soft float64
	// Affinity is added for each soft affinity a node satisfies. Default 1.
	Affinity float64
	// Image is added when the node already holds the spec's image: no
	// pull or copy before the create, and no refusal by an engine that
	// cannot get it. Default 1.
	Image float64
	// Apart is subtracted per replica of the same service already planned
	// on the node (services keep replicas apart). Default 0.5.
	Apart float64
}

func (w Weights) withDefaults() Weights {
	def := func(v *float64, d float64) {
		if *v == 0 {
			*v = d
		}
	}
	def(&w.Strategy, 1)
	def(&w.Soft, 1)
	def(&w.Affinity, 1)
	def(&w.Image, 1)
	def(&w.Apart, 0.5)
	return w
}

// Placement is one instance placed on one node.
type Placement struct {
	Instance  string           `json:"instance"`
	Name      string           `json:"name"`
	Request   string           `json:"request,omitempty"`
	Group     string           `json:"group,omitempty"`
	Index     int              `json:"index"`
	Provider  string           `json:"provider"`
	Node      string           `json:"node"`
	Address   string           `json:"address,omitempty"`
	Resources driver.Resources `json:"resources"`
	// Ports are the host ports the instance binds, in the order of the
	// spec's ports that need one (fixed first, then "any port" ones).
	Ports []int `json:"ports,omitempty"`
	// Elastic instances are best effort and may be evicted for essential
	// instances of another group.
	Elastic bool `json:"elastic,omitempty"`

	a *alloc
}

// Unplaced is a part of a request that found no node.
type Unplaced struct {
	Request string `json:"request,omitempty"`
	Group   string `json:"group,omitempty"`
	// Indexes are the instance indexes left unplaced.
	Indexes []int   `json:"indexes"`
	Elastic bool    `json:"elastic,omitempty"`
	Reasons Reasons `json:"reasons"`
}

// Plan is the result of placing a request or group.
type Plan struct {
	Placements []Placement `json:"placements"`
	Unplaced   []Unplaced  `json:"unplaced,omitempty"`
	// Relaxed lists the soft constraints that some placement could not
	// honour.
	Relaxed []string `json:"relaxed,omitempty"`
	// Evicted lists elastic instances removed to make room for this
	// group's essential ones; the caller deletes them.
	Evicted []string `json:"evicted,omitempty"`
}

// Complete reports whether every instance asked for was placed.
func (p *Plan) Complete() bool { return len(p.Unplaced) == 0 }

// planner places on one state. It mutates the state as it plans, so a
// state's later requests see the earlier ones.
type planner struct {
	st               *state
	w                Weights
	sample           int
	rng              *rand.Rand
	portMin, portMax int
	ids              *atomic.Uint64
	heap             []scored
	noIndex          bool // scan every candidate (tests compare the two)
	noImprove        bool // skip a batch group's improvement pass (tests compare)
}

func newPlanner(st *state, opt Options, portMin, portMax int, ids *atomic.Uint64) *planner {
	return &planner{
		st: st, w: opt.Weights.withDefaults(), sample: opt.Sample,
		rng:     rand.New(rand.NewPCG(opt.Seed, 0x9e3779b97f4a7c15)),
		portMin: portMin, portMax: portMax, ids: ids,
	}
}

type scored struct {
	s float64
	i int32
}

// score ranks node i for c: the strategy's score times its weight, plus
// soft constraint and soft affinity bonuses, minus the replica penalty.
func (p *planner) score(c *compiled, i int32, local map[int32]int32, relaxed bool) float64 {
	h := &p.st.hot[i]
	fc := float64(h.free[resCPU]-c.need[resCPU]) * h.invCPU // free fraction after placing
	fm := float64(h.free[resMem]-c.need[resMem]) * h.invMem
	var s float64
	switch c.strategy {
	case StrategyBinpack:
		s = 2 - fc - fm
	case StrategySpread:
		s = fc + fm
	case StrategyWaterfill:
		s = 2 * min(fc, fm)
	case StrategyAverage:
		u := 1 - (fc+fm)/2
		s = 2 - 2*math.Abs(u-p.average())
	case StrategyRandom:
		s = 2 * p.rng.Float64()
	}
	s *= p.w.Strategy
	if relaxed {
		for k := range c.soft {
			if p.st.t.exprHolds(&c.soft[k], i) {
				s += p.w.Soft
			}
		}
	}
	for k := range c.affSoft {
		if p.affinityHolds(&c.affSoft[k], i) {
			s += p.w.Affinity
		}
	}
	if c.info.image != "" && len(p.st.t.nodeImages[i]) > 0 && p.st.t.hasImage(i, c.info.image) {
		s += p.w.Image
	}
	if c.apart && local != nil {
		s -= p.w.Apart * float64(local[i])
	}
	return s
}

// average is the cluster's mean use of cpu and memory.
func (p *planner) average() float64 {
	s := p.st
	var u float64
	if s.totCap[resCPU] > 0 {
		u += float64(s.totUsed[resCPU]) / float64(s.totCap[resCPU])
	}
	if s.totCap[resMem] > 0 {
		u += float64(s.totUsed[resMem]) / float64(s.totCap[resMem])
	}
	return u / 2
}

// feasible reports whether node i, already past the static filters, takes
// one more instance of c.
func (p *planner) feasible(c *compiled, i int32, local map[int32]int32) bool {
	if !c.fitsHot(&p.st.hot[i]) {
		return false
	}
	if !c.slow && len(p.st.quotas) == 0 {
		return true
	}
	fail, _ := p.dynCheck(c, i, local)
	return fail == fits
}

// best returns the highest scoring feasible node among cands, or -1. With
// sampling it starts at a random candidate and stops after Sample feasible
// nodes. Ties go to the earliest candidate scanned.
func (p *planner) best(c *compiled, cl *candList, local map[int32]int32, relaxed bool) int32 {
	cands := cl.nodes
	n := len(cands)
	if n == 0 {
		return -1
	}
	start, limit := 0, n
	if p.sample > 0 {
		start, limit = p.rng.IntN(n), p.sample
	}
	bestI, bestS, found := int32(-1), math.Inf(-1), 0
	// The common case (no slow checks, no extra scorers) gets a loop with
	// the hot check and the binpack/spread score inline.
	simple := !c.slow && len(p.st.quotas) == 0 && !relaxed && len(c.affSoft) == 0 && (local == nil || !c.apart) &&
		(c.strategy == StrategyBinpack || c.strategy == StrategySpread) && !p.st.t.anyHolds(c.info.image)
	// Large candidate sets in repeated use go through the free-capacity
	// index; small ones are cheaper to scan.
	if simple && p.sample == 0 && !p.noIndex && n >= minGrid {
		if g := p.st.gridFor(cl); g != nil {
			return p.bestIndexed(c, g)
		}
	}
	sign := 1.0
	if c.strategy == StrategyBinpack {
		sign = -1
	}
	hots := p.st.hot
	for k := 0; k < n && found < limit; k++ {
		j := k + start
		if j >= n {
			j -= n
		}
		i := cands[j]
		h := &hots[i]
		if !c.fitsHot(h) {
			continue
		}
		var s float64
		if simple {
			s = sign * (float64(h.free[resCPU]-c.need[resCPU])*h.invCPU + float64(h.free[resMem]-c.need[resMem])*h.invMem)
		} else {
			if fail, _ := p.dynCheck(c, i, local); fail != fits {
				continue
			}
			s = p.score(c, i, local, relaxed)
		}
		found++
		if s > bestS {
			bestI, bestS = i, s
		}
	}
	return bestI
}

// place records instance idx of c on node i in the plan and in the state.
func (p *planner) place(c *compiled, i int32, idx int, elastic bool, plan *Plan) {
	r := c.req
	var ports []int
	if len(c.fixedPorts) > 0 || c.anyPorts > 0 {
		ports = append(ports, c.fixedPorts...)
		ports = append(ports, p.freePorts(i, c.anyPorts, ports)...)
	}
	var id string
	switch {
	case c.ids != nil:
		id = c.ids[idx]
	case r.ID != "":
		id = r.InstanceID(idx)
	default:
		id = "i-" + strconv.FormatUint(p.ids.Add(1), 10)
	}
	name := id
	if r.Name != "" {
		name = r.Name
		if r.N() > 1 {
			name += "-" + strconv.Itoa(idx)
		}
	}
	a := newAlloc(id, name, i, ports, c.info, elastic)
	p.st.apply(a)
	t := p.st.t
	plan.Placements = append(plan.Placements, Placement{
		Instance: id, Name: name, Request: r.ID, Group: r.Group, Index: idx,
		Provider: t.providers[t.prov[i]], Node: t.names[i], Address: t.addr[i],
		Resources: r.Resources, Ports: ports, Elastic: elastic, a: a,
	})
}

// placeIndexes is the placement stack for one request: it places the
// instances numbered idxs and returns those it could not place.
//
// First every hard filter and the soft constraints as if hard (Swarm:
// honoured when possible); what does not fit then goes through the relaxed
// pass where soft constraints only add to the score. Nodes are ranked by the
// weighted scorers. Several instances use a heap of scored nodes so that
// each placement costs a log instead of a scan: only the node just used
// changes score.
func (p *planner) placeIndexes(c *compiled, idxs []int, elastic bool, plan *Plan) []int {
	var local map[int32]int32
	if len(idxs) > 1 {
		local = map[int32]int32{}
	}
	left := idxs
	passes := []bool{false}
	if len(c.soft) > 0 {
		passes = []bool{false, true}
	}
	for _, relaxed := range passes {
		if len(left) == 0 {
			break
		}
		cands := c.candidates(p.st.t, !relaxed)
		before := len(left)
		if len(left) == 1 || p.sample > 0 {
			for len(left) > 0 {
				i := p.best(c, cands, local, relaxed)
				if i < 0 {
					break
				}
				p.place(c, i, left[0], elastic, plan)
				if local != nil {
					local[i]++
				}
				left = left[1:]
			}
		} else {
			left = p.placeHeap(c, cands, left, local, relaxed, elastic, plan)
		}
		if relaxed && len(left) < before {
			for _, e := range c.soft {
				if !slices.Contains(plan.Relaxed, e.Text) {
					plan.Relaxed = append(plan.Relaxed, e.Text)
				}
			}
		}
	}
	return left
}

func (p *planner) placeHeap(c *compiled, cl *candList, left []int, local map[int32]int32, relaxed, elastic bool, plan *Plan) []int {
	hp := p.heap[:0]
	for _, i := range cl.nodes {
		if p.feasible(c, i, local) {
			hp = append(hp, scored{p.score(c, i, local, relaxed), i})
		}
	}
	heapInit(hp)
	for len(left) > 0 && len(hp) > 0 {
		i := hp[0].i
		if len(p.st.quotas) > 0 && p.st.quotaRoom(c, i) >= 0 {
			// A quota filled by the instances placed so far: the node
			// is out (a quota's fill is not the node's own, so the heap
			// cannot tell).
			last := len(hp) - 1
			hp[0] = hp[last]
			hp = hp[:last]
			heapDown(hp, 0)
			continue
		}
		p.place(c, i, left[0], elastic, plan)
		local[i]++
		left = left[1:]
		if p.feasible(c, i, local) {
			hp[0].s = p.score(c, i, local, relaxed)
			heapDown(hp, 0)
		} else {
			last := len(hp) - 1
			hp[0] = hp[last]
			hp = hp[:last]
			heapDown(hp, 0)
		}
	}
	p.heap = hp[:0]
	return left
}

// heap of scored, best first; ties to the lower node index so that results
// match a scan.
func better(a, b scored) bool { return a.s > b.s || (a.s == b.s && a.i < b.i) }

func heapInit(h []scored) {
	for i := len(h)/2 - 1; i >= 0; i-- {
		heapDown(h, i)
	}
}

func heapDown(h []scored, i int) {
	n := len(h)
	for {
		l := 2*i + 1
		if l >= n {
			return
		}
		j := l
		if r := l + 1; r < n && better(h[r], h[l]) {
			j = r
		}
		if !better(h[j], h[i]) {
			return
		}
		h[i], h[j] = h[j], h[i]
		i = j
	}
}

// reasons explains why c fits nowhere: each node is counted under the first
// filter it fails, static filters first.
func (p *planner) reasons(c *compiled) Reasons {
	t := tally{}
	st := p.st
	for i := range int32(len(st.t.names)) {
		if st.t.removed[i] {
			continue
		}
		r := c.staticReason(st.t, i, false)
		if r == "" {
			r = p.dynReason(c, i, nil)
		}
		if r == "" {
			r = "lost to other instances of the same plan"
		}
		t[tallyKey{st.t.providers[st.t.prov[i]], r}]++
	}
	return t.reasons()
}

// placeRequest places every instance of r (or those in idxs when set).
func (p *planner) placeRequest(c *compiled, idxs []int, elastic bool, plan *Plan) []int {
	if idxs == nil {
		idxs = make([]int, c.req.N())
		for k := range idxs {
			idxs[k] = k
		}
	}
	plan.Placements = slices.Grow(plan.Placements, len(idxs))
	left := p.placeIndexes(c, idxs, elastic, plan)
	if len(left) > 0 {
		plan.Unplaced = append(plan.Unplaced, Unplaced{
			Request: c.req.ID, Group: c.req.Group, Indexes: left, Elastic: elastic, Reasons: p.reasons(c),
		})
	}
	return left
}

// rollback removes placements [from:] of plan from the state and the plan.
func (p *planner) rollback(plan *Plan, from int) {
	for k := len(plan.Placements) - 1; k >= from; k-- {
		p.st.unapply(plan.Placements[k].a)
	}
	plan.Placements = plan.Placements[:from]
}

// gang is a group compiled for placement: its services in startup order
// and how many instances of each are essential.
type gang struct {
	g   *Group
	cs  []*compiled
	ess []int
}

// compileGroup validates g and compiles its services in startup order.
func compileGroup(g *Group) (*gang, error) {
	if err := g.Validate(); err != nil {
		return nil, err
	}
	order := make([]int, len(g.Services))
	for k := range order {
		order[k] = k
	}
	slices.SortStableFunc(order, func(a, b int) int { return g.Services[a].StartupOrder - g.Services[b].StartupOrder })
	gg := &gang{g: g, cs: make([]*compiled, len(order)), ess: make([]int, len(order))}
	for k, si := range order {
		r := g.ServiceRequest(si)
		c, err := compile(&r, "")
		if err != nil {
			return nil, err
		}
		gg.cs[k], gg.ess[k] = c, g.Services[si].EssentialCount()
	}
	return gg, nil
}

// ids returns the instance ids of every service, computed once.
func (gg *gang) ids() [][]string {
	out := make([][]string, len(gg.cs))
	for k, c := range gg.cs {
		ids := make([]string, c.req.N())
		for j := range ids {
			ids[j] = c.req.InstanceID(j)
		}
		c.ids = ids
		out[k] = ids
	}
	return out
}

func seq(from, to int) []int {
	out := make([]int, 0, max(to-from, 0))
	for j := from; j < to; j++ {
		out = append(out, j)
	}
	return out
}

// placeGroup places a compiled group: the essential instances of every
// service all or none, then the elastic ones best effort. A node set without
// a provider tries each provider in turn until one takes it whole.
func (p *planner) placeGroup(gg *gang, plan *Plan) {
	g := gg.g
	provs := []string{""}
	if g.Kind == KindNodeSet && g.Provider == "" {
		provs = p.st.t.providers
	}
	var failed []Unplaced
	ok := false
	packs := gg.packs()
	order := p.order(gg, packs)
	for _, prov := range provs {
		mark, um := len(plan.Placements), len(plan.Unplaced)
		ok = true
		for _, k := range order {
			c := gg.cs[k]
			if prov != "" {
				c.provider = prov
			}
			if len(p.placeRequest(c, seq(0, gg.ess[k]), false, plan)) > 0 {
				ok = false
				break
			}
		}
		if ok {
			if packs {
				if !p.noImprove {
					p.improve(gg, plan, mark)
				}
				gg.startupOrder(plan.Placements[mark:])
			}
			break
		}
		failed = append(failed, plan.Unplaced[um:]...)
		plan.Unplaced = plan.Unplaced[:um]
		p.rollback(plan, mark)
	}
	if !ok {
		// Report every essential instance of the group as unplaced, with
		// the reasons of the service that did not fit.
		for k, c := range gg.cs {
			var rs Reasons
			for _, u := range failed {
				if u.Request == c.req.ID {
					rs = u.Reasons
				}
			}
			if gg.ess[k] > 0 {
				plan.Unplaced = append(plan.Unplaced, Unplaced{Request: c.req.ID, Group: g.ID, Indexes: seq(0, gg.ess[k]), Reasons: rs})
			}
		}
		return
	}
	for k, c := range gg.cs {
		if n := c.req.N(); gg.ess[k] < n {
			p.placeRequest(c, seq(gg.ess[k], n), true, plan)
		}
	}
}
