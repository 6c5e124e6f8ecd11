package scheduler

import (
	"cmp"
	"fmt"
	"math"
	"slices"

	"github.com/berth-dev/berth/driver"
)

// Rebalancing a running cluster.
//
// PlanRebalance takes a snapshot of the cluster (reservations, readings,
// measured use) and computes moves on it, without I/O: for the binpack
// goal the moves that empty the most nodes, for the spread goal those that
// bring the most loaded nodes under a threshold. A move of an instance to
// a node is legal exactly when placement would put it there: the instance
// is taken out of the snapshot, then the node must pass the static filters
// of its request (status, provider, capabilities, hard constraints) and
// the dynamic ones (instance cap, resources under the node's overcommit
// policy, quotas, named resources, host ports, max_per_node, hard
// affinities), the checks Place makes (staticReason, dynCheck). A move
// also keeps every other instance's hard affinities holding on the two
// nodes it changes, and never evicts or displaces anything, so no
// priority is overridden. Instances stay on their provider.
//
// Binpack: nodes are tried least filled first (the larger of their cpu and
// memory share held by Berth's instances). A node is closed, its instances
// are moved largest first, each to the fullest open node that takes it
// (binpack's best fit, through the free-capacity index), and the node
// counts as freed when all of them moved; when one cannot move, every move
// of that attempt is undone and the node is opened again. Nodes holding
// instances Berth does not manage are never emptied. The search stops
// when the nodes in use reach the bound no packing can beat, after
// rebalanceFails failed attempts in a row (the nodes after are fuller
// still), or at MaxMoves.
//
// Spread: nodes whose load (the larger of their cpu and memory share) is
// over the threshold are taken most loaded first; their instances move,
// largest first, to the emptiest node that takes them and stays under the
// threshold, until the node is under it.
//
// An instance moved twice (onto a node later emptied) is one move from
// where it is to where it ends.

// RebalanceGoal names what a rebalance aims at.
type RebalanceGoal string

// Rebalance goals.
const (
	// RebalanceBinpack empties the most nodes.
	RebalanceBinpack RebalanceGoal = "binpack"
	// RebalanceSpread brings the most loaded nodes under a threshold.
	RebalanceSpread RebalanceGoal = "spread"
)

// Load measures of the spread goal.
const (
	// LoadReserved counts a node's load as the scheduler counts its use:
	// the larger of its reading and Berth's reservations (under the usage
	// policy, measured use).
	LoadReserved = "reserved"
	// LoadMeasured counts what the node's instances were measured using
	// (SetMeasured), an instance by its measured use when the caller gives
	// it (RebalanceOptions.Measured), else by its reservation.
	LoadMeasured = "measured"
)

// Bounds and defaults of RebalanceOptions.
const (
	DefaultRebalanceMoves = 10_000
	MaxRebalanceMoves     = 1_000_000
	DefaultThreshold      = 0.8
	DefaultRebalanceStays = 1_000
	// rebalanceExplained is how many stays get the full count of the
	// filters that refused them (a scan of every node each).
	rebalanceExplained = 100
	// rebalanceFails is how many failed attempts in a row end the binpack
	// search.
	rebalanceFails = 64
)

// RebalanceOptions say what PlanRebalance aims at and what it may move.
type RebalanceOptions struct {
	// Goal is RebalanceBinpack (the default) or RebalanceSpread.
	Goal RebalanceGoal
	// Threshold is, for the spread goal, the load every node should stay
	// under: more than 0, at most 1; 0 means DefaultThreshold.
	Threshold float64
	// Load is LoadReserved (the default) or LoadMeasured.
	Load string
	// MaxMoves bounds the moves: 1 to MaxRebalanceMoves, 0 means
	// DefaultRebalanceMoves.
	MaxMoves int
	// MaxStays bounds the stays reported (Rebalance.StaysTotal counts them
	// all); 0 means DefaultRebalanceStays.
	MaxStays int
	// Request returns the placement request of request id (constraints,
	// affinities, max_per_node, capabilities...), as the control plane
	// places its instances; nil when it is not known, and the request's
	// instances stay.
	Request func(id string) *Request
	// Pinned returns why instance id must stay where it is (not running,
	// opted out, ...), "" when it may move; nil pins nothing.
	Pinned func(id string) string
	// Visible, when set, says whether the caller may see the instances of
	// a namespace: the others are not listed among the stays, and reasons
	// call them Hidden.
	Visible func(namespace string) bool
	// Refused returns the nodes ("provider/node") that refused instance id
	// for good: it never moves there. Nil means none.
	Refused func(id string) []string
	// Measured is what instances were measured using, by id, for
	// LoadMeasured.
	Measured map[string]driver.Resources
}

// Check checks o's fields; every error names its field.
func (o *RebalanceOptions) Check() error {
	var es driver.FieldErrors
	switch o.Goal {
	case "", RebalanceBinpack, RebalanceSpread:
	default:
		es.Add("goal", "%q: want binpack or spread", o.Goal)
	}
	if math.IsNaN(o.Threshold) || o.Threshold < 0 || o.Threshold > 1 {
		es.Add("threshold", "%v: want more than 0 and at most 1", o.Threshold)
	}
	switch o.Load {
	case "", LoadReserved, LoadMeasured:
	default:
		es.Add("load", "%q: want reserved or measured", o.Load)
	}
	if o.MaxMoves < 0 || o.MaxMoves > MaxRebalanceMoves {
		es.Add("max_moves", "%d: want 1 to %d (0 means %d)", o.MaxMoves, MaxRebalanceMoves, DefaultRebalanceMoves)
	}
	if o.MaxStays < 0 {
		es.Add("max_stays", "%d: must not be negative", o.MaxStays)
	}
	return es.Err()
}

// Move is one instance moved from one node to another of its provider.
type Move struct {
	Instance  string           `json:"instance"`
	Name      string           `json:"name,omitempty"`
	Request   string           `json:"request,omitempty"`
	Group     string           `json:"group,omitempty"`
	Owner     string           `json:"namespace,omitempty"`
	Provider  string           `json:"provider"`
	From      string           `json:"from"`
	To        string           `json:"to"`
	Resources driver.Resources `json:"resources"`
	// Reason says why it moves: "empties node N" or "brings node N under
	// the threshold".
	Reason string `json:"reason"`
}

// Stay is an instance on a node the plan wanted to empty or unload, and
// why it could not move.
type Stay struct {
	Instance string `json:"instance"`
	Name     string `json:"name,omitempty"`
	Provider string `json:"provider"`
	Node     string `json:"node"`
	Reason   string `json:"reason"`
}

// NodeLoad is a node's load (the larger of its cpu and memory share)
// before and after the moves.
type NodeLoad struct {
	Provider string  `json:"provider"`
	Node     string  `json:"node"`
	Before   float64 `json:"before"`
	After    float64 `json:"after"`
}

// Rebalance is a rebalance plan: the moves, in the order to make them,
// and their effect.
type Rebalance struct {
	Goal      RebalanceGoal `json:"goal"`
	Threshold float64       `json:"threshold,omitempty"`
	Moves     []Move        `json:"moves"`
	// Stays are the instances that could not move, at most MaxStays;
	// StaysTotal counts them all.
	Stays      []Stay `json:"stays"`
	StaysTotal int    `json:"stays_total"`
	// NodesBefore and NodesAfter count the online nodes holding
	// instances; LowerBound is the fewest nodes any packing of Berth's
	// instances could use (per resource and provider, the demand over the
	// largest node, as berth sim counts it).
	NodesBefore int `json:"nodes_before"`
	NodesAfter  int `json:"nodes_after"`
	LowerBound  int `json:"lower_bound"`
	// Freed are the nodes the moves empty ("provider/node").
	Freed []string `json:"freed"`
	// Loads are, for the spread goal, the nodes whose load the moves
	// change or that stay over the threshold, most loaded first;
	// MaxLoad* and Over* sum them up over every node.
	Loads         []NodeLoad `json:"loads,omitempty"`
	MaxLoadBefore float64    `json:"max_load_before"`
	MaxLoadAfter  float64    `json:"max_load_after"`
	OverBefore    int        `json:"over_before"`
	OverAfter     int        `json:"over_after"`
	// Truncated is set when MaxMoves ended the search.
	Truncated bool `json:"truncated,omitempty"`
}

// PlanRebalance computes a rebalance plan on a snapshot of the cluster
// (see the comment at the top of rebalance.go). It changes nothing in the
// cluster; the error is only for invalid options.
func (c *Cluster) PlanRebalance(opt RebalanceOptions) (*Rebalance, error) {
	if err := opt.Check(); err != nil {
		return nil, err
	}
	if opt.Goal == "" {
		opt.Goal = RebalanceBinpack
	}
	if opt.Threshold == 0 {
		opt.Threshold = DefaultThreshold
	}
	if opt.MaxMoves == 0 {
		opt.MaxMoves = DefaultRebalanceMoves
	}
	if opt.MaxStays == 0 {
		opt.MaxStays = DefaultRebalanceStays
	}
	s := c.Snapshot(Options{})
	rb := newRebalancer(s.p, opt)
	out := &Rebalance{Goal: opt.Goal, Moves: []Move{}, Stays: []Stay{}, Freed: []string{}}
	rb.out = out
	rb.measureBefore()
	if opt.Goal == RebalanceBinpack {
		rb.binpack()
	} else {
		out.Threshold = opt.Threshold
		rb.spread()
	}
	rb.finish()
	return out, nil
}

// rebalancer plans on a snapshot's planner, which it changes.
type rebalancer struct {
	p   *planner
	st  *state
	opt RebalanceOptions
	out *Rebalance
	// reqs are the compiled requests by request id and provider; nil
	// entries are unknown requests. anyAff is set when one has hard
	// affinities (moves must then keep others' affinities).
	reqs   map[[2]string]*compiled
	anyAff bool
	// origin is where each moved instance was at the start, cur its
	// allocation now.
	origin map[string]int32
	cur    map[string]*alloc
	order  []string // moved instances in order of their first move
	why    map[string]string
	// foreign counts, per node, the instances its reading reports beyond
	// Berth's: such a node is never freed.
	foreign []int32
	// least is the smallest cpu and memory of an instance: a node with
	// less free is full.
	least [nMeasured]int64
	// used is each node's cpu and memory in use as the load counts it,
	// kept up to date with the moves.
	used       [][nMeasured]int64
	explained  int
	loadBefore []float64
}

func newRebalancer(p *planner, opt RebalanceOptions) *rebalancer {
	st := p.st
	n := len(st.t.names)
	rb := &rebalancer{p: p, st: st, opt: opt, reqs: map[[2]string]*compiled{}, origin: map[string]int32{},
		cur: map[string]*alloc{}, why: map[string]string{}, foreign: make([]int32, n)}
	st.closed, st.parked = make([]bool, n), make([]bool, n)
	rb.least = [nMeasured]int64{math.MaxInt64, math.MaxInt64}
	rb.used = make([][nMeasured]int64, n)
	for i := range int32(n) {
		e, einst := st.reported(i)
		rb.foreign[i] = max(einst-st.sum[i].inst, 0)
		if opt.Load == LoadMeasured && (st.meas[i].used != [nMeasured]int64{}) {
			rb.used[i] = [nMeasured]int64{st.meas[i].load(resCPU), st.meas[i].load(resMem)}
		} else {
			for r := range nMeasured {
				rb.used[i][r] = max(e[r], st.sum[i].res[r])
			}
		}
		// Compile every request once: whether any has hard affinities
		// decides whether moves check the neighbours'.
		for e := st.lists[i]; e != nil; e = e.next {
			rb.compiledFor(e.a, i)
			rb.least[resCPU] = min(rb.least[resCPU], int64(e.a.info.res.CPU))
			rb.least[resMem] = min(rb.least[resMem], int64(e.a.info.res.Memory))
		}
	}
	for i := range int32(n) {
		rb.repark(i)
	}
	return rb
}

// compiledFor returns the compiled request of a on node i's provider, or
// nil when its request is unknown or does not compile.
func (rb *rebalancer) compiledFor(a *alloc, i int32) *compiled {
	t := rb.st.t
	prov := t.providers[t.prov[i]]
	key := [2]string{a.info.request, prov}
	c, ok := rb.reqs[key]
	if !ok {
		var r *Request
		if a.info.request != "" && rb.opt.Request != nil {
			r = rb.opt.Request(a.info.request)
		}
		if r != nil {
			rc := *r
			rc.Provider, rc.Avoid = prov, nil
			if cc, err := compile(&rc, prov); err == nil {
				c = cc
				rb.anyAff = rb.anyAff || len(c.affHard) > 0
			}
		}
		rb.reqs[key] = c
	}
	if c != nil {
		c.info = a.info
	}
	return c
}

// pinned says why a must stay, "" when it may move.
func (rb *rebalancer) pinned(a *alloc) string {
	if rb.opt.Pinned != nil {
		if why := rb.opt.Pinned(a.id); why != "" {
			return why
		}
	}
	if a.info.request == "" || rb.compiledFor(a, a.node) == nil {
		return "its request is not known"
	}
	return ""
}

// close closes or opens node i to new instances in the snapshot.
func (rb *rebalancer) close(i int32, closed bool) {
	rb.st.closed[i] = closed
	rb.st.recompute(i)
	rb.repark(i)
}

// full reports whether node i cannot take even the smallest instance.
func (rb *rebalancer) full(i int32) bool {
	h := &rb.st.hot[i]
	return h.inst >= h.maxInst || h.free[resCPU] < rb.least[resCPU] || h.free[resMem] < rb.least[resMem]
}

// repark keeps node i out of the free-capacity index while it is closed
// or full, so that a search for a node does not wade through every full
// one (a packed cluster has many).
func (rb *rebalancer) repark(i int32) { rb.st.park(i, rb.st.closed[i] || rb.full(i)) }

// allocsOn returns node i's allocations, largest first (by their larger
// share of the node's cpu and memory), then by id.
func (rb *rebalancer) allocsOn(i int32) []*alloc {
	var out []*alloc
	for e := rb.st.lists[i]; e != nil; e = e.next {
		out = append(out, e.a)
	}
	h := &rb.st.hot[i]
	size := func(a *alloc) float64 {
		return max(float64(a.info.res.CPU)*h.invCPU, float64(a.info.res.Memory)*h.invMem)
	}
	slices.SortFunc(out, func(a, b *alloc) int {
		if c := cmp.Compare(size(b), size(a)); c != 0 {
			return c
		}
		return cmp.Compare(a.id, b.id)
	})
	return out
}

// fill is node i's larger share of cpu and memory held by Berth.
func (rb *rebalancer) fill(i int32) float64 {
	t := rb.st.t
	sm := &rb.st.sum[i]
	var f float64
	if c := t.capacity[i].CPU; c > 0 {
		f = float64(sm.res[resCPU]) / float64(c)
	}
	if m := t.capacity[i].Memory; m > 0 {
		f = max(f, float64(sm.res[resMem])/float64(m))
	}
	return f
}

// online reports whether node i takes instances at all.
func (rb *rebalancer) online(i int32) bool {
	t := rb.st.t
	return !t.removed[i] && t.status[i] == driver.NodeOnline
}

// inUse reports whether node i holds instances now.
func (rb *rebalancer) inUse(i int32) bool { return rb.st.sum[i].inst > 0 || rb.foreign[i] > 0 }

// move moves a to the best open node its request allows (by the request's
// compiled strategy, set by the caller) and returns the new allocation, or
// nil and why not. accept, when set, must also approve the node.
func (rb *rebalancer) move(a *alloc, c *compiled, accept func(j int32) bool) (*alloc, string) {
	st := rb.st
	from := a.node
	var before map[string]bool
	if rb.anyAff {
		before = rb.affinitiesHold(from)
	}
	st.unapply(a)
	j := rb.p.best(c, c.candidates(st.t, false), nil, false)
	why, rest := "no other node takes it", "would break another instance's affinity"
	if j >= 0 && rb.opt.Refused != nil {
		t := st.t
		if slices.Contains(rb.opt.Refused(a.id), t.providers[t.prov[j]]+"/"+t.names[j]) {
			j, why = -1, "the node that would take it refused it for good"
		}
	}
	if j >= 0 && accept != nil && !accept(j) {
		j, why, rest = -1, "no node that takes it stays under the threshold", "would go over the threshold"
	}
	if j < 0 {
		if rb.explained < rebalanceExplained {
			rb.explained++
			why += ": " + rb.reasons(c, rest).String()
		}
		st.apply(a)
		return nil, why
	}
	var beforeTo map[string]bool
	if rb.anyAff {
		beforeTo = rb.affinitiesHold(j)
	}
	// Not a copy of *a: the cluster changes its presence fields under its
	// own lock.
	na := alloc{id: a.id, info: a.info, node: j, elastic: a.elastic}
	if len(c.fixedPorts) > 0 || c.anyPorts > 0 {
		ports := append([]int(nil), c.fixedPorts...)
		ports = append(ports, rb.p.freePorts(j, c.anyPorts, ports)...)
		own := *a.info
		own.ports = ports
		na.info = &own
	}
	st.apply(&na)
	defer func() {
		rb.repark(from)
		rb.repark(j)
	}()
	if rb.anyAff {
		if k := rb.broken(from, before); k != "" {
			st.unapply(&na)
			st.apply(a)
			return nil, "moving it would break the affinity of " + k
		}
		if k := rb.broken(j, beforeTo); k != "" {
			st.unapply(&na)
			st.apply(a)
			return nil, "moving it would break the affinity of " + k
		}
	}
	return &na, ""
}

// affinitiesHold returns the instances on node i whose hard affinities
// all hold.
func (rb *rebalancer) affinitiesHold(i int32) map[string]bool {
	out := map[string]bool{}
	for e := rb.st.lists[i]; e != nil; e = e.next {
		if rb.holds(e.a, i) {
			out[e.a.id] = true
		}
	}
	return out
}

// holds reports whether every hard affinity of a holds on node i.
func (rb *rebalancer) holds(a *alloc, i int32) bool {
	c := rb.compiledFor(a, i)
	if c == nil {
		return true
	}
	for k := range c.affHard {
		if !rb.p.affinityHolds(&c.affHard[k], i) {
			return false
		}
	}
	return true
}

// broken returns the name of an instance on node i whose hard affinities
// held before (affinitiesHold's answer then) and no longer do, or "".
func (rb *rebalancer) broken(i int32, before map[string]bool) string {
	for e := rb.st.lists[i]; e != nil; e = e.next {
		if before[e.a.id] && !rb.holds(e.a, i) {
			return rb.nameOf(e.a)
		}
	}
	return ""
}

// reasons counts, over the open nodes, why c's instance fits none; a node
// that passes every filter is counted under rest.
func (rb *rebalancer) reasons(c *compiled, rest string) Reasons {
	t := tally{}
	st := rb.st
	for i := range int32(len(st.t.names)) {
		if st.t.removed[i] {
			continue
		}
		r := c.staticReason(st.t, i, false)
		if r == "" && st.closed[i] {
			r = "being emptied, unloaded or freed"
		}
		if r == "" {
			r = rb.p.dynReason(c, i, nil)
		}
		if r == "" {
			r = rest
		}
		t[tallyKey{st.t.providers[st.t.prov[i]], r}]++
	}
	return t.reasons()
}

// record notes a's move to na.
func (rb *rebalancer) record(a, na *alloc, why string) {
	if _, ok := rb.origin[a.id]; !ok {
		rb.origin[a.id] = a.node
		rb.order = append(rb.order, a.id)
	}
	rb.cur[a.id] = na
	rb.why[a.id] = why
	rb.shift(a, a.node, na.node)
}

// moves counts the moves so far (an instance back where it was counts
// none; it is left out by finish).
func (rb *rebalancer) moves() int { return len(rb.order) }

// Hidden is how a plan names an instance its caller may not see.
const Hidden = "an instance of another namespace"

// nameOf is a's name, or Hidden when the caller may not see it.
func (rb *rebalancer) nameOf(a *alloc) string {
	if rb.opt.Visible != nil && !rb.opt.Visible(a.info.owner) {
		return Hidden
	}
	return a.name()
}

// stay notes that a stays on node i for why; an instance the caller may
// not see is neither listed nor counted.
func (rb *rebalancer) stay(a *alloc, i int32, why string) {
	if rb.opt.Visible != nil && !rb.opt.Visible(a.info.owner) {
		return
	}
	rb.out.StaysTotal++
	if len(rb.out.Stays) >= rb.opt.MaxStays {
		return
	}
	t := rb.st.t
	rb.out.Stays = append(rb.out.Stays, Stay{Instance: a.id, Name: a.name(), Provider: t.providers[t.prov[i]], Node: t.names[i], Reason: why})
}

// undo takes back the moves of one attempt: done are the new allocations,
// old the ones they replaced, prev the bookkeeping before.
type undoEntry struct {
	old, new  *alloc
	hadOrigin bool
	prevCur   *alloc
	prevWhy   string
}

func (rb *rebalancer) undo(done []undoEntry) {
	for k := len(done) - 1; k >= 0; k-- {
		u := done[k]
		rb.st.unapply(u.new)
		rb.st.apply(u.old)
		rb.repark(u.new.node)
		rb.repark(u.old.node)
		rb.shift(u.old, u.new.node, u.old.node)
		if !u.hadOrigin {
			delete(rb.origin, u.old.id)
			delete(rb.cur, u.old.id)
			delete(rb.why, u.old.id)
			rb.order = rb.order[:len(rb.order)-1]
		} else {
			rb.cur[u.old.id], rb.why[u.old.id] = u.prevCur, u.prevWhy
		}
	}
}

// binpack empties nodes, least filled first.
func (rb *rebalancer) binpack() {
	st := rb.st
	t := st.t
	var cands []int32
	for i := range int32(len(t.names)) {
		if rb.online(i) && st.sum[i].inst > 0 {
			cands = append(cands, i)
		}
	}
	fills := make([]float64, len(t.names))
	for _, i := range cands {
		fills[i] = rb.fill(i)
	}
	slices.SortFunc(cands, func(a, b int32) int {
		if c := cmp.Compare(fills[a], fills[b]); c != 0 {
			return c
		}
		if c := cmp.Compare(st.sum[a].inst, st.sum[b].inst); c != 0 {
			return c
		}
		return cmp.Compare(a, b)
	})
	// Nodes with nothing on them stay closed: moving onto them frees
	// nothing.
	for i := range int32(len(t.names)) {
		if rb.online(i) && !rb.inUse(i) {
			rb.close(i, true)
		}
	}
	used := 0
	for i := range int32(len(t.names)) {
		if rb.online(i) && rb.inUse(i) {
			used++
		}
	}
	fails := 0
	for _, i := range cands {
		if used <= rb.out.LowerBound || fails >= rebalanceFails {
			break
		}
		if rb.moves() >= rb.opt.MaxMoves {
			rb.out.Truncated = true
			break
		}
		if rb.foreign[i] > 0 {
			continue
		}
		switch rb.empty(i) {
		case emptied:
			used--
			fails = 0
		case failed:
			fails++
		}
	}
}

// Outcomes of empty.
const (
	emptied = iota
	failed
	pinnedThere // an instance on the node may not move: nothing was tried
)

// empty tries to move every instance off node i, and undoes what it
// moved when one cannot move.
func (rb *rebalancer) empty(i int32) int {
	st := rb.st
	t := st.t
	as := rb.allocsOn(i)
	rb.close(i, true)
	var done []undoEntry
	why := "empties " + t.names[i]
	fail := func(a *alloc, reason string) int {
		rb.undo(done)
		rb.close(i, false)
		rb.stay(a, i, reason)
		for _, b := range as {
			if b != a {
				rb.stay(b, i, fmt.Sprintf("node %s cannot be emptied: %s stays", t.names[i], rb.nameOf(a)))
			}
		}
		return failed
	}
	for _, a := range as {
		if why := rb.pinned(a); why != "" {
			fail(a, why)
			return pinnedThere
		}
	}
	for _, a := range as {
		if rb.moves() >= rb.opt.MaxMoves {
			rb.out.Truncated = true
			return fail(a, "the plan reached its bound on moves")
		}
		c := rb.compiledFor(a, i)
		bc := *c
		bc.strategy = StrategyBinpack
		bc.apart = false
		na, reason := rb.move(a, &bc, nil)
		if na == nil {
			return fail(a, reason)
		}
		_, had := rb.origin[a.id]
		done = append(done, undoEntry{old: a, new: na, hadOrigin: had, prevCur: rb.cur[a.id], prevWhy: rb.why[a.id]})
		rb.record(a, na, why)
	}
	rb.out.Freed = append(rb.out.Freed, t.providers[t.prov[i]]+"/"+t.names[i])
	return emptied
}

// weight is what a counts for in its node's load.
func (rb *rebalancer) weight(a *alloc) [nMeasured]int64 {
	if rb.opt.Load == LoadMeasured {
		if m, ok := rb.opt.Measured[a.id]; ok {
			return [nMeasured]int64{int64(m.CPU), int64(m.Memory)}
		}
	}
	return [nMeasured]int64{int64(a.info.res.CPU), int64(a.info.res.Memory)}
}

// loadWith is node i's load (the larger of its cpu and memory share in
// use) with w more in use.
func (rb *rebalancer) loadWith(i int32, w [nMeasured]int64) float64 {
	c := resVec(rb.st.t.capacity[i])
	var l float64
	for r := range nMeasured {
		if c[r] > 0 {
			l = max(l, float64(rb.used[i][r]+w[r])/float64(c[r]))
		}
	}
	return l
}

// load is node i's load now.
func (rb *rebalancer) load(i int32) float64 { return rb.loadWith(i, [nMeasured]int64{}) }

// shift moves a's weight from node from to node to in the loads.
func (rb *rebalancer) shift(a *alloc, from, to int32) {
	w := rb.weight(a)
	for r := range nMeasured {
		rb.used[from][r] -= w[r]
		rb.used[to][r] += w[r]
	}
}

// spread unloads the nodes over the threshold, most loaded first.
func (rb *rebalancer) spread() {
	st := rb.st
	t := st.t
	th := rb.opt.Threshold
	var over []int32
	for i := range int32(len(t.names)) {
		if rb.online(i) && rb.loadBefore[i] > th {
			over = append(over, i)
		}
	}
	slices.SortFunc(over, func(a, b int32) int {
		if c := cmp.Compare(rb.loadBefore[b], rb.loadBefore[a]); c != 0 {
			return c
		}
		return cmp.Compare(a, b)
	})
	for _, i := range over {
		rb.close(i, true)
		why := "brings " + t.names[i] + " under the threshold"
		type left struct {
			a   *alloc
			why string
		}
		var stays []left
		for _, a := range rb.allocsOn(i) {
			if rb.load(i) <= th {
				break
			}
			if rb.moves() >= rb.opt.MaxMoves {
				rb.out.Truncated = true
				stays = append(stays, left{a, "the plan reached its bound on moves"})
				continue
			}
			if why := rb.pinned(a); why != "" {
				stays = append(stays, left{a, why})
				continue
			}
			sc := *rb.compiledFor(a, i)
			sc.strategy, sc.apart = StrategySpread, false
			w := rb.weight(a)
			na, reason := rb.move(a, &sc, func(j int32) bool { return rb.loadWith(j, w) <= th })
			if na == nil {
				stays = append(stays, left{a, reason})
				continue
			}
			rb.record(a, na, why)
		}
		rb.close(i, false)
		if rb.load(i) > th {
			for _, l := range stays {
				rb.stay(l.a, i, l.why)
			}
		}
	}
}

// measureBefore records loads and nodes in use before any move.
func (rb *rebalancer) measureBefore() {
	st := rb.st
	t := st.t
	n := len(t.names)
	rb.loadBefore = make([]float64, n)
	demand := map[int32]*[nRes + 1]int64{}
	largest := map[int32]*[nRes + 1]int64{}
	for i := range int32(n) {
		if !rb.online(i) {
			continue
		}
		rb.loadBefore[i] = rb.load(i)
		if rb.inUse(i) {
			rb.out.NodesBefore++
		}
		if rb.loadBefore[i] > rb.out.MaxLoadBefore {
			rb.out.MaxLoadBefore = rb.loadBefore[i]
		}
		if rb.loadBefore[i] > rb.opt.Threshold {
			rb.out.OverBefore++
		}
		p := t.prov[i]
		if demand[p] == nil {
			demand[p], largest[p] = &[nRes + 1]int64{}, &[nRes + 1]int64{}
		}
		cv := resVec(t.capacity[i])
		e, einst := st.reported(i)
		sm := &st.sum[i]
		for r := range nRes {
			demand[p][r] += max(e[r], sm.res[r])
			largest[p][r] = max(largest[p][r], cv[r])
		}
		demand[p][nRes] += int64(max(einst, sm.inst))
		if mi := t.maxInst[i]; mi != math.MaxInt32 {
			largest[p][nRes] = max(largest[p][nRes], int64(mi))
		}
	}
	for p, d := range demand {
		lb := 0
		for r := range nRes + 1 {
			if l := largest[p][r]; l > 0 && d[r] > 0 {
				lb = max(lb, int((d[r]+l-1)/l))
			}
		}
		rb.out.LowerBound += lb
	}
}

// finish writes the moves, the nodes in use and the loads after.
func (rb *rebalancer) finish() {
	st := rb.st
	t := st.t
	out := rb.out
	for _, id := range rb.order {
		a := rb.cur[id]
		from := rb.origin[id]
		if a.node == from {
			continue
		}
		out.Moves = append(out.Moves, Move{
			Instance: id, Name: a.name(), Request: a.info.request, Group: a.info.group, Owner: a.info.owner,
			Provider: t.providers[t.prov[from]], From: t.names[from], To: t.names[a.node], Resources: a.info.res,
			Reason: rb.why[id],
		})
	}
	for i := range int32(len(t.names)) {
		if !rb.online(i) {
			continue
		}
		if rb.inUse(i) {
			out.NodesAfter++
		}
		l := rb.loadAfter(i)
		out.MaxLoadAfter = max(out.MaxLoadAfter, l)
		if l > rb.opt.Threshold {
			out.OverAfter++
		}
		if out.Goal == RebalanceSpread && (l != rb.loadBefore[i] || l > rb.opt.Threshold) {
			out.Loads = append(out.Loads, NodeLoad{Provider: t.providers[t.prov[i]], Node: t.names[i], Before: round3(rb.loadBefore[i]), After: round3(l)})
		}
	}
	out.MaxLoadBefore, out.MaxLoadAfter = round3(out.MaxLoadBefore), round3(out.MaxLoadAfter)
	slices.SortFunc(out.Loads, func(a, b NodeLoad) int {
		if c := cmp.Compare(b.Before, a.Before); c != 0 {
			return c
		}
		return cmp.Compare(a.Provider+"/"+a.Node, b.Provider+"/"+b.Node)
	})
	if len(out.Loads) > rb.opt.MaxStays {
		out.Loads = out.Loads[:rb.opt.MaxStays]
	}
}

// loadAfter is node i's load after the moves: its load before plus what
// moved in less what moved out (the node's reading still counts what
// left it).
func (rb *rebalancer) loadAfter(i int32) float64 {
	return rb.load(i)
}

func round3(f float64) float64 { return math.Round(f*1000) / 1000 }
