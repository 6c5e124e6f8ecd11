package scheduler

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/berth-dev/berth/driver"
)

// compiled is a request made ready for placement: expressions parsed once,
// amounts as a vector, flags saying which slow checks are needed.
type compiled struct {
	req       *Request
	need      [nRes]int64
	other     map[string]int64
	otherKeys []string // other's keys, sorted
	// fixedPorts are host ports the spec binds; anyPorts counts published
	// ports that take any free host port.
	fixedPorts []int
	anyPorts   int
	hard, soft []Expr // node constraints
	affHard    []affExpr
	affSoft    []affExpr
	provider   string
	caps       uint32
	strategy   Strategy
	// apart is true for services: replicas of one request are kept apart.
	apart bool
	// slow is true when a node needs checks beyond the hot vector.
	slow bool
	info *reqInfo
	// ids, when set, are the instance ids by index (computed once).
	ids []string
}

type affExpr struct {
	Expr
	kind  int
	label string
}

// compile parses r; r must have passed Validate (compile reports the first
// error it meets all the same).
func compile(r *Request, provider string) (*compiled, error) {
	if err := r.Validate(); err != nil {
		return nil, err
	}
	// Keep nothing the caller may change while the request is placed or
	// after: the instances' resources and labels live on in the cluster.
	rc := *r
	rc.Other = maps.Clone(r.Other)
	rc.Labels = maps.Clone(r.Labels)
	rc.Avoid = slices.Clone(r.Avoid)
	r = &rc
	c := &compiled{req: r, need: resVec(r.Resources), other: r.Other, provider: provider, strategy: r.EffectiveStrategy()}
	if c.provider == "" {
		c.provider = r.Provider
	}
	c.otherKeys = slices.Sorted(maps.Keys(c.other))
	c.apart = r.Type != driver.TypeBatch
	for _, p := range r.Ports {
		switch {
		case p.HostPort > 0:
			c.fixedPorts = append(c.fixedPorts, p.HostPort)
		case p.Publish:
			c.anyPorts++
		}
	}
	for _, s := range r.Constraints {
		e, _ := ParseExpr(s)
		if e.Soft {
			c.soft = append(c.soft, e)
		} else {
			c.hard = append(c.hard, e)
		}
	}
	for _, s := range r.Affinities {
		e, _ := ParseExpr(s)
		kind, label := affinityKey(e.Key)
		a := affExpr{Expr: e, kind: kind, label: label}
		if e.Soft {
			c.affSoft = append(c.affSoft, a)
		} else {
			c.affHard = append(c.affHard, a)
		}
	}
	for _, k := range r.Capabilities {
		c.caps |= capBit(k)
	}
	c.slow = len(c.other) > 0 || len(c.fixedPorts) > 0 || c.anyPorts > 0 || len(c.affHard) > 0 || r.MaxPerNode > 0
	c.info = &reqInfo{request: r.ID, owner: r.Owner, pool: r.Pool, group: r.Group, image: r.Image, labels: r.Labels, priority: r.Priority, res: r.Resources}
	return c, nil
}

// exprMatch returns, for every node, whether e (ignoring Negate) matches
// the node; computed once per topology and expression, then shared.
func (t *topo) exprMatch(e *Expr) []bool {
	key := "m\x00" + e.Key + "\x00" + e.Value
	if v, ok := t.cache.Load(key); ok {
		return v.([]bool)
	}
	n := len(t.names)
	out := make([]bool, n)
	switch e.Key {
	case "node":
		for i, name := range t.names {
			out[i] = e.MatchValue(name)
		}
	case "provider":
		byProv := make([]bool, len(t.providers))
		for p, name := range t.providers {
			byProv[p] = e.MatchValue(name)
		}
		for i := range n {
			out[i] = byProv[t.prov[i]]
		}
	default:
		col, ok := t.labelKey[e.Key]
		if ok {
			// Match each distinct value once, then look nodes up by value id.
			vals := t.labelVal[col]
			byVal := make([]bool, len(vals))
			for id := 1; id < len(vals); id++ {
				byVal[id] = e.MatchValue(vals[id])
			}
			for i, id := range t.labelCol[col] {
				out[i] = byVal[id]
			}
		}
	}
	if t.cached.Add(1) > maxCached {
		return out
	}
	v, _ := t.cache.LoadOrStore(key, out)
	return v.([]bool)
}

// exprHolds reports whether node i satisfies e, Negate applied. A node
// without the key satisfies != and fails ==.
func (t *topo) exprHolds(e *Expr, i int32) bool {
	return t.exprMatch(e)[i] != e.Negate
}

// staticReason is the first static filter node i fails for c, or "" when
// it passes them all. withSoft makes soft constraints count as hard.
//
// The order puts the cheapest, most common rejections first: a node that is
// not online, then the wrong provider, then a node the request avoids, then
// missing capabilities (one mask test), then constraints in the order
// written.
func (c *compiled) staticReason(t *topo, i int32, withSoft bool) string {
	if t.removed[i] {
		return "node removed"
	}
	switch t.status[i] {
	case driver.NodeOnline:
	case driver.NodeDraining:
		return "node draining"
	default:
		return "node offline"
	}
	if c.provider != "" && t.providers[t.prov[i]] != c.provider {
		return "provider is not " + c.provider
	}
	for _, a := range c.req.Avoid {
		if t.names[i] == a.Node && t.providers[t.prov[i]] == a.Provider {
			return "avoided: " + a.Reason
		}
	}
	if miss := c.caps &^ t.provCaps[t.prov[i]]; miss != 0 {
		for b, name := range knownCaps {
			if miss&(1<<b) != 0 {
				return "provider lacks capability " + name
			}
		}
	}
	for k := range c.hard {
		if !t.exprHolds(&c.hard[k], i) {
			return "constraint " + c.hard[k].Text
		}
	}
	if withSoft {
		for k := range c.soft {
			if !t.exprHolds(&c.soft[k], i) {
				return "constraint " + c.soft[k].Text
			}
		}
	}
	return ""
}

// candList is the nodes passing the static filters, in index order.
type candList struct {
	nodes []int32
}

// maxCached bounds the candidate lists and expression matches cached per
// topology (requests that exclude nodes one by one make many shapes).
const maxCached = 4096

// candidates returns the nodes that pass every static filter, cached per
// topology and request shape (provider, capabilities, constraints).
func (c *compiled) candidates(t *topo, withSoft bool) *candList {
	var b strings.Builder
	b.WriteString("c\x00")
	b.WriteString(c.provider)
	b.WriteByte(0)
	b.WriteString(strconv.FormatUint(uint64(c.caps), 16))
	for _, e := range c.hard {
		b.WriteByte(0)
		b.WriteString(e.Text)
	}
	for _, a := range c.req.Avoid {
		b.WriteString("\x00!")
		b.WriteString(a.Provider)
		b.WriteByte('/')
		b.WriteString(a.Node)
	}
	if withSoft {
		for _, e := range c.soft {
			b.WriteByte(0)
			b.WriteString(e.Text)
		}
	}
	key := b.String()
	if v, ok := t.cache.Load(key); ok {
		return v.(*candList)
	}
	out := &candList{}
	for i := range int32(len(t.names)) {
		if c.staticReason(t, i, withSoft) == "" {
			out.nodes = append(out.nodes, i)
		}
	}
	if t.cached.Add(1) > maxCached {
		return out
	}
	v, _ := t.cache.LoadOrStore(key, out)
	return v.(*candList)
}

// fitsHot is the fast dynamic check: instance cap and the four inline
// resources.
func (c *compiled) fitsHot(h *hot) bool {
	return h.inst < h.maxInst &&
		c.need[resCPU] <= h.free[resCPU] && c.need[resMem] <= h.free[resMem] &&
		c.need[resDisk] <= h.free[resDisk] && c.need[resGPU] <= h.free[resGPU]
}

var resNames = [nRes]string{"cpu", "memory", "disk", "gpus"}

// Dynamic filter failures, as dynCheck reports them.
const (
	fits = iota
	failCap
	failRes   // arg: resource column
	failOther // arg: index in otherKeys
	failPort  // arg: the port
	failAnyPort
	failPerNode
	failAffinity // arg: index in affHard
	failQuota    // arg: index of the quota
)

// dynCheck runs the dynamic filters on node i and returns the first that
// fails (fits when none does), with its argument. local counts this
// request's instances already planned per node. It allocates nothing.
//
// Order: the instance cap and cpu/memory first (one compare each and the
// usual binding limits), then disk and GPUs, then the quotas (a few
// compares, when there are quotas), then named resources (map lookups), then host ports (set lookups), then the per-request cap and
// affinities, which walk the node's instances and are the most expensive.
func (p *planner) dynCheck(c *compiled, i int32, local map[int32]int32) (fail, arg int) {
	s := p.st
	h := &s.hot[i]
	if h.inst >= h.maxInst {
		return failCap, 0
	}
	for r := range nRes {
		if c.need[r] > h.free[r] {
			return failRes, r
		}
	}
	if k := s.quotaRoom(c, i); k >= 0 {
		return failQuota, k
	}
	if !c.slow {
		return fits, 0
	}
	for k, name := range c.otherKeys {
		if c.other[name] > s.otherFree(i, name) {
			return failOther, k
		}
	}
	for _, port := range c.fixedPorts {
		if !s.portFree(i, port) {
			return failPort, port
		}
	}
	if c.anyPorts > 0 && p.countFreePorts(i, c.anyPorts) < c.anyPorts {
		return failAnyPort, 0
	}
	if m := c.req.MaxPerNode; m > 0 && p.countRequest(c, i, local) >= m {
		return failPerNode, 0
	}
	for k := range c.affHard {
		if !p.affinityHolds(&c.affHard[k], i) {
			return failAffinity, k
		}
	}
	return fits, 0
}

// dynReason is dynCheck's answer in words, or "" when node i fits.
func (p *planner) dynReason(c *compiled, i int32, local map[int32]int32) string {
	fail, arg := p.dynCheck(c, i, local)
	switch fail {
	case failCap:
		return "instance cap reached"
	case failRes:
		return "not enough " + resNames[arg] + " (" + p.st.refusal(i, arg, c.need[arg]) + ")"
	case failOther:
		return "not enough " + c.otherKeys[arg]
	case failPort:
		return fmt.Sprintf("host port %d in use", arg)
	case failAnyPort:
		return fmt.Sprintf("no free host port in %d-%d", p.portMin, p.portMax)
	case failPerNode:
		return "max_per_node reached"
	case failAffinity:
		return "affinity " + c.affHard[arg].Text
	case failQuota:
		u := p.st.use(arg)
		return u.Blocks(c.req.Resources)
	}
	return ""
}

// countRequest counts instances of c's request on node i.
func (p *planner) countRequest(c *compiled, i int32, local map[int32]int32) int {
	if c.info.request == "" {
		return int(local[i])
	}
	n := 0
	for e := p.st.lists[i]; e != nil; e = e.next {
		if e.a.info.request == c.info.request {
			n++
		}
	}
	return n
}

// affinityMatches reports whether anything on node i matches a's value.
func (p *planner) affinityMatches(a *affExpr, i int32) bool {
	t := p.st.t
	if a.kind == affImage {
		for _, id := range t.nodeImages[i] {
			if a.MatchValue(t.imageNames[id]) {
				return true
			}
		}
	}
	for e := p.st.lists[i]; e != nil; e = e.next {
		var v string
		ok := true
		switch a.kind {
		case affInstance:
			v = e.a.name()
		case affGroup:
			v, ok = e.a.info.group, e.a.info.group != ""
		case affImage:
			v = e.a.info.image
		case affLabel:
			v, ok = e.a.info.labels[a.label]
		}
		if ok && a.MatchValue(v) {
			return true
		}
	}
	return false
}

// affinityHolds applies Negate: == needs a match on the node, != none.
func (p *planner) affinityHolds(a *affExpr, i int32) bool {
	return p.affinityMatches(a, i) != a.Negate
}

// countFreePorts counts free host ports of node i in the port range, up to
// n.
func (p *planner) countFreePorts(i int32, n int) int {
	k := 0
	for port := p.portMin; port <= p.portMax && k < n; port++ {
		if p.st.portFree(i, port) {
			k++
		}
	}
	return k
}

// freePorts returns up to n free host ports of node i in the port range,
// skipping those in taken.
func (p *planner) freePorts(i int32, n int, taken []int) []int {
	var out []int
	for port := p.portMin; port <= p.portMax && len(out) < n; port++ {
		if p.st.portFree(i, port) && !containsInt(taken, port) {
			out = append(out, port)
		}
	}
	return out
}

func containsInt(s []int, v int) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}
