package scheduler

import (
	"maps"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/berth-dev/berth/driver"
)

// Resource columns kept inline for every node.
const (
	resCPU = iota
	resMem
	resDisk
	resGPU
	nRes
)

// hot is what the placement scan reads for every candidate node: free
// amounts and the instance cap side by side, so that one cache line answers
// "does it fit" and "how full would it be".
type hot struct {
	free    [nRes]int64 // capacity minus the larger of reported and allocated use
	inst    int32       // instances counted on the node
	maxInst int32       // cap on instances; math.MaxInt32 when none
	invCPU  float64     // 1/capacity, 0 when the node has none
	invMem  float64
}

// sums is what Berth has allocated on a node, and what the node's reading
// (topo.ext, extInst) counts of Berth's instances that its back-end has
// let go since (Cluster.SetPresence): the node counts as using the reading
// less that.
type sums struct {
	res      [nRes]int64
	inst     int32
	left     [nRes]int64
	leftInst int32
}

// cell is one entry of a node's immutable list of allocations; snapshots
// share lists and the cluster never mutates a published cell.
type cell struct {
	a    *alloc
	next *cell
}

// nodeExtra is the rarely used per-node state, copied on write so that a
// snapshot may share it: host ports Berth allocated and amounts of named
// resources.
type nodeExtra struct {
	ports []int            // sorted host ports allocated by Berth
	other map[string]int64 // allocated named resources
}

// alloc is one placed instance. A cluster holds one per instance (a
// million of them, in 32 bytes each): what the instances of a placed
// request share is in info, the resources included.
type alloc struct {
	id   string
	info *reqInfo
	node int32
	// pres is what the cluster was told of the instance on its back-end
	// and counted whether its node's reading counts it; the cluster's
	// alone, under its lock (snapshots never read them).
	pres    Presence
	counted bool
	elastic bool
}

// newAlloc returns the alloc of instance id named name on node i.
func newAlloc(id, name string, i int32, ports []int, info *reqInfo, elastic bool) *alloc {
	if name == id {
		name = ""
	}
	if name != "" || len(ports) > 0 {
		own := *info
		own.name, own.ports = name, ports
		info = &own
	}
	return &alloc{id: id, node: i, info: info, elastic: elastic}
}

// equals reports whether a holds what b asks, its node and whether it is
// elastic aside.
func (a *alloc) equals(b *Allocation) bool {
	i := a.info
	name := b.Name
	if name == "" {
		name = b.ID
	}
	return a.name() == name && i.request == b.Request && i.owner == b.Owner &&
		i.pool == b.Pool && i.group == b.Group && i.image == b.Image && i.priority == b.Priority &&
		i.res.CPU == b.Resources.CPU && i.res.Memory == b.Resources.Memory && i.res.Disk == b.Resources.Disk &&
		i.res.GPUs == b.Resources.GPUs && maps.Equal(i.res.Other, b.Resources.Other) &&
		maps.Equal(i.labels, b.Labels) && slices.Equal(i.ports, b.Ports)
}

// name returns the instance's name.
func (a *alloc) name() string {
	if a.info.name == "" {
		return a.id
	}
	return a.info.name
}

// ports returns the host ports the instance holds.
func (a *alloc) ports() []int { return a.info.ports }

// reqInfo is what every instance of one request shares. The few instances
// with a name other than their id or with host ports each have a copy of
// their own, with name and ports set.
type reqInfo struct {
	request  string
	owner    string
	pool     string
	group    string
	image    string
	labels   map[string]string
	priority int
	// res is what each instance holds.
	res driver.Resources
	// name is the instance's name when it is not its id, ports the host
	// ports it holds: set only in an instance's own copy.
	name  string
	ports []int
}

// topo is the static picture of the nodes: names, providers, labels,
// capacities and what the back-ends report. It is rebuilt by UpdateNodes and
// never mutated afterwards, so snapshots share it. Node indexes are stable:
// a node that disappears stays, marked removed.
type topo struct {
	gen       uint64
	names     []string
	index     map[nodeKey]int32
	prov      []int32
	providers []string
	provIdx   map[string]int32
	provCaps  []uint32 // bit per knownCaps entry
	// oc is the overcommit policy per provider, nil for the default; oc
	// itself is nil when every provider has the default.
	oc       []*Overcommit
	status   []driver.NodeStatus
	removed  []bool
	capacity []driver.Resources
	ext      []driver.Resources // Node.Reserved as reported
	extInst  []int32
	maxInst  []int32
	addr     []string

	labelKey map[string]int32 // label or attribute key -> column
	labelCol [][]int32        // column -> node -> value id (0: absent)
	labelVal [][]string       // column -> value id -> value

	imageIdx   map[string]int32
	imageNames []string
	nodeImages [][]int32 // images present on the node, as reported
	nodePorts  [][]int   // host ports bound on the node, as reported

	// minInvCPU and minInvMem are 1 / the largest capacity, bounds for the
	// free-capacity index.
	minInvCPU, minInvMem float64

	cache  sync.Map     // candidate lists and expression matches
	cached atomic.Int64 // entries stored in cache
}

type nodeKey struct{ provider, name string }

func capBit(c string) uint32 {
	i := slices.Index(knownCaps, c)
	if i < 0 {
		return 0
	}
	return 1 << i
}

// anyHolds reports whether some node holds image (then placement scores
// image presence).
func (t *topo) anyHolds(image string) bool {
	if image == "" || len(t.imageIdx) == 0 {
		return false
	}
	_, ok := t.imageIdx[image]
	if !ok && !strings.Contains(image[strings.LastIndexByte(image, '/')+1:], ":") {
		_, ok = t.imageIdx[image+":latest"]
	}
	return ok
}

// hasImage reports whether node i holds image, as named or, for a name
// without a tag, as name:latest.
func (t *topo) hasImage(i int32, image string) bool {
	id, ok := t.imageIdx[image]
	if !ok && !strings.Contains(image[strings.LastIndexByte(image, '/')+1:], ":") {
		id, ok = t.imageIdx[image+":latest"]
	}
	return ok && slices.Contains(t.nodeImages[i], id)
}

// buildTopo builds the static picture from the latest record of every node.
func buildTopo(gen uint64, provs []string, provOf []int32, nodes []driver.Node, removed []bool, caps map[string][]string, oc map[string]Overcommit) *topo {
	n := len(nodes)
	t := &topo{
		gen: gen, names: make([]string, n), index: make(map[nodeKey]int32, n),
		prov: provOf, providers: provs, provIdx: map[string]int32{},
		status: make([]driver.NodeStatus, n), removed: removed,
		capacity: make([]driver.Resources, n), ext: make([]driver.Resources, n),
		extInst: make([]int32, n), maxInst: make([]int32, n), addr: make([]string, n),
		labelKey: map[string]int32{}, imageIdx: map[string]int32{},
		nodeImages: make([][]int32, n), nodePorts: make([][]int, n),
	}
	for i, p := range provs {
		t.provIdx[p] = int32(i)
		var bits uint32
		for _, c := range caps[p] {
			bits |= capBit(c)
		}
		t.provCaps = append(t.provCaps, bits)
		if o, ok := oc[p]; ok && o.Usage() {
			if t.oc == nil {
				t.oc = make([]*Overcommit, len(provs))
			}
			t.oc[i] = &o
		}
	}
	valIdx := []map[string]int32{}
	setLabel := func(i int, k, v string) {
		col, ok := t.labelKey[k]
		if !ok {
			col = int32(len(t.labelCol))
			t.labelKey[k] = col
			t.labelCol = append(t.labelCol, make([]int32, n))
			t.labelVal = append(t.labelVal, []string{""})
			valIdx = append(valIdx, map[string]int32{})
		}
		id, ok := valIdx[col][v]
		if !ok {
			id = int32(len(t.labelVal[col]))
			valIdx[col][v] = id
			t.labelVal[col] = append(t.labelVal[col], v)
		}
		t.labelCol[col][i] = id
	}
	for i := range nodes {
		nd := &nodes[i]
		t.names[i] = nd.Name
		t.index[nodeKey{provs[provOf[i]], nd.Name}] = int32(i)
		t.status[i] = nd.Status
		if removed[i] {
			t.status[i] = driver.NodeOffline
		}
		t.capacity[i] = nd.Capacity
		t.ext[i] = nd.Reserved
		t.extInst[i] = int32(nd.Instances)
		t.maxInst[i] = math.MaxInt32
		if nd.MaxInstances > 0 {
			t.maxInst[i] = int32(min(nd.MaxInstances, math.MaxInt32))
		}
		t.addr[i] = nd.Address
		// Attributes first so that a label of the same key wins.
		for k, v := range nd.Attributes {
			setLabel(i, k, v)
		}
		for k, v := range nd.Labels {
			setLabel(i, k, v)
		}
		for _, im := range nd.Images {
			t.nodeImages[i] = append(t.nodeImages[i], t.image(im))
		}
		if len(nd.Ports) > 0 {
			t.nodePorts[i] = slices.Sorted(slices.Values(nd.Ports))
		}
	}
	var maxC, maxM int64
	for i := range nodes {
		maxC = max(maxC, int64(nodes[i].Capacity.CPU))
		maxM = max(maxM, int64(nodes[i].Capacity.Memory))
	}
	if maxC > 0 {
		t.minInvCPU = 1 / float64(maxC)
	}
	if maxM > 0 {
		t.minInvMem = 1 / float64(maxM)
	}
	return t
}

func (t *topo) image(name string) int32 {
	id, ok := t.imageIdx[name]
	if !ok {
		id = int32(len(t.imageNames))
		t.imageIdx[name] = id
		t.imageNames = append(t.imageNames, name)
	}
	return id
}

// label returns node i's value of key k (label, else attribute) and whether
// it has one.
func (t *topo) label(i int32, k string) (string, bool) {
	col, ok := t.labelKey[k]
	if !ok {
		return "", false
	}
	id := t.labelCol[col][i]
	return t.labelVal[col][id], id != 0
}

// state is a view of every node's use: the cluster's authoritative one or a
// scheduler's private snapshot. The planner mutates the state it is given.
type state struct {
	t     *topo
	hot   []hot
	sum   []sums
	extra []*nodeExtra
	lists []*cell // allocations per node (for affinity and release)
	// meas is what was measured on each node; only nodes under the usage
	// policy read it.
	meas []measure
	ver  []uint64
	// grids index candidate lists by free capacity (index.go).
	grids  []*grid
	gridOf map[*candList]*grid
	uses   map[*candList]int
	// log, when set, receives the index of every node apply or unapply
	// changes (the cluster's change log that snapshots replay).
	log *[]int32
	// totals for the average strategy
	totCap  [nRes]int64
	totUsed [nRes]int64
	// quotas are the quotas placement keeps to (shared, replaced whole by
	// SetQuotas); qused is what each one's scope holds, by index.
	quotas []Quota
	qused  []quotaUsed
	// closed, when set, marks the nodes a rebalance plan keeps new
	// instances off (rebalance.go): their instance cap counts as 0.
	// parked marks the nodes the free-capacity index leaves out (closed
	// ones, and those that take nothing more); a scan still checks them.
	// Only a rebalancer's private snapshot sets them.
	closed []bool
	parked []bool
}

func resVec(r driver.Resources) [nRes]int64 {
	return [nRes]int64{int64(r.CPU), int64(r.Memory), int64(r.Disk), r.GPUs}
}

// recompute refreshes node i's hot entry from capacity, reported use and
// Berth's allocations: the node counts as using, per resource, the larger of
// what the back-end reports and what Berth allocated. Under the usage
// policy (Overcommit) cpu and memory are free by its two limits instead,
// so that every check of the hot entry (the scan, the free-capacity index,
// Commit) applies the policy.
func (s *state) recompute(i int32) {
	t := s.t
	c := resVec(t.capacity[i])
	e, einst := s.reported(i)
	h := &s.hot[i]
	sm := &s.sum[i]
	oc := t.policyOf(i)
	for r := range nRes {
		free := c[r] - max(e[r], sm.res[r])
		if oc != nil && r < nMeasured {
			free = oc.free(c[r], max(e[r], sm.res[r]), s.meas[i].load(r))
		}
		s.totUsed[r] += h.free[r] - free
		h.free[r] = free
	}
	h.inst = max(einst, sm.inst)
	h.maxInst = t.maxInst[i]
	if s.closed != nil && s.closed[i] {
		h.maxInst = 0
	}
	h.invCPU, h.invMem = 0, 0
	if c[resCPU] > 0 {
		h.invCPU = 1 / float64(c[resCPU])
	}
	if c[resMem] > 0 {
		h.invMem = 1 / float64(c[resMem])
	}
	if s.parked != nil && s.parked[i] {
		return
	}
	for _, g := range s.grids {
		if j := g.pos[i]; j >= 0 {
			g.update(j, h)
		}
	}
}

// park leaves node i out of the free-capacity index (parked true) or puts
// it back.
func (s *state) park(i int32, parked bool) {
	if s.parked[i] == parked {
		return
	}
	s.parked[i] = parked
	for _, g := range s.grids {
		if j := g.pos[i]; j >= 0 {
			if parked {
				g.unlink(j)
			} else {
				g.update(j, &s.hot[i])
			}
		}
	}
}

// reported returns what node i's reading counts, less what it counts of
// instances its back-end has let go since: resources and instances.
func (s *state) reported(i int32) ([nRes]int64, int32) {
	e := resVec(s.t.ext[i])
	sm := &s.sum[i]
	for r := range nRes {
		e[r] = max(e[r]-sm.left[r], 0)
	}
	return e, max(s.t.extInst[i]-sm.leftInst, 0)
}

// leave takes a, which node a.node's reading counts, out of what that
// reading counts: its back-end has let it go.
func (s *state) leave(a *alloc) { s.countLeft(a, 1) }

// enter undoes leave(a): node a.node's reading counts a again.
func (s *state) enter(a *alloc) { s.countLeft(a, -1) }

// countLeft adds k times a to what node a.node's reading counts that its
// back-end has let go.
func (s *state) countLeft(a *alloc, k int64) {
	i := a.node
	v := resVec(a.info.res)
	sm := &s.sum[i]
	for r := range nRes {
		sm.left[r] += k * v[r]
	}
	sm.leftInst += int32(k)
	s.touch(i)
}

// rebuild re-derives every hot entry after the topology changed.
func (s *state) rebuild(t *topo) {
	n := len(t.names)
	s.t = t
	s.hot = slices.Grow(s.hot, n-len(s.hot))[:n]
	for len(s.sum) < n {
		s.sum = append(s.sum, sums{})
		s.extra = append(s.extra, nil)
		s.lists = append(s.lists, nil)
		s.ver = append(s.ver, 0)
		s.meas = append(s.meas, measure{})
	}
	s.totCap, s.totUsed = [nRes]int64{}, [nRes]int64{}
	s.dropGrids()
	for i := range n {
		c := resVec(t.capacity[i])
		s.hot[i] = hot{free: c} // zero use; recompute adds it
		for r := range nRes {
			s.totCap[r] += c[r]
		}
		s.recompute(int32(i))
		s.ver[i]++
	}
}

// otherFree returns how much of named resource k is free on node i.
func (s *state) otherFree(i int32, k string) int64 {
	t := s.t
	c := t.capacity[i].Other[k]
	used := t.ext[i].Other[k]
	if x := s.extra[i]; x != nil {
		used = max(used, x.other[k])
	}
	return c - used
}

// portFree reports whether host port p is free on node i.
func (s *state) portFree(i int32, p int) bool {
	if _, found := slices.BinarySearch(s.t.nodePorts[i], p); found {
		return false
	}
	if x := s.extra[i]; x != nil {
		if _, found := slices.BinarySearch(x.ports, p); found {
			return false
		}
	}
	return true
}

// apply adds a to node a.node. The caller has checked that it fits.
func (s *state) apply(a *alloc) {
	i := a.node
	v := resVec(a.info.res)
	sm := &s.sum[i]
	for r := range nRes {
		sm.res[r] += v[r]
	}
	sm.inst++
	m := &s.meas[i]
	for r := range nMeasured {
		m.pend[r] += v[r]
	}
	s.touch(i)
	s.countQuotas(a, 1)
	s.lists[i] = &cell{a: a, next: s.lists[i]}
	if len(a.ports()) == 0 && len(a.info.res.Other) == 0 {
		return
	}
	x := &nodeExtra{}
	if old := s.extra[i]; old != nil {
		*x = *old
	}
	if len(a.ports()) > 0 {
		ports := make([]int, 0, len(x.ports)+len(a.ports()))
		ports = append(append(ports, x.ports...), a.ports()...)
		slices.Sort(ports)
		x.ports = ports
	}
	if len(a.info.res.Other) > 0 {
		other := maps.Clone(x.other)
		if other == nil {
			other = map[string]int64{}
		}
		for k, q := range a.info.res.Other {
			other[k] += q
		}
		x.other = other
	}
	s.extra[i] = x
}

// touch recomputes node i after a change, bumps its version and logs it.
func (s *state) touch(i int32) {
	s.recompute(i)
	s.ver[i]++
	if s.log != nil {
		*s.log = append(*s.log, i)
	}
}

// unapply removes a from its node.
func (s *state) unapply(a *alloc) {
	i := a.node
	v := resVec(a.info.res)
	sm := &s.sum[i]
	for r := range nRes {
		sm.res[r] -= v[r]
	}
	sm.inst--
	// An instance placed before the last measurement is in its figure,
	// not in pend: pend never goes below zero.
	m := &s.meas[i]
	for r := range nMeasured {
		m.pend[r] = max(m.pend[r]-v[r], 0)
	}
	s.touch(i)
	s.countQuotas(a, -1)
	// Rebuild the list up to a, sharing the rest.
	var kept []*alloc
	c := s.lists[i]
	for ; c != nil && c.a != a; c = c.next {
		kept = append(kept, c.a)
	}
	if c != nil {
		c = c.next
	}
	for j := len(kept) - 1; j >= 0; j-- {
		c = &cell{a: kept[j], next: c}
	}
	s.lists[i] = c
	old := s.extra[i]
	if old == nil || (len(a.ports()) == 0 && len(a.info.res.Other) == 0) {
		return
	}
	x := *old
	if len(a.ports()) > 0 {
		ports := make([]int, 0, len(x.ports))
		for _, p := range x.ports {
			if !slices.Contains(a.ports(), p) {
				ports = append(ports, p)
			}
		}
		x.ports = ports
	}
	if len(a.info.res.Other) > 0 {
		other := maps.Clone(x.other)
		for k, q := range a.info.res.Other {
			other[k] -= q
		}
		x.other = other
	}
	s.extra[i] = &x
}

// copyFrom makes s an independent copy of o (sharing immutable parts).
func (s *state) copyFrom(o *state) {
	s.t = o.t
	s.hot = append(s.hot[:0], o.hot...)
	s.sum = append(s.sum[:0], o.sum...)
	s.extra = append(s.extra[:0], o.extra...)
	s.lists = append(s.lists[:0], o.lists...)
	s.ver = append(s.ver[:0], o.ver...)
	s.meas = append(s.meas[:0], o.meas...)
	s.dropGrids()
	s.totCap, s.totUsed = o.totCap, o.totUsed
	s.copyQuotas(o)
}

// copyQuotas copies the quotas and their use from o.
func (s *state) copyQuotas(o *state) {
	s.quotas = o.quotas
	s.qused = append(s.qused[:0], o.qused...)
}

// copyNode copies node i from o.
func (s *state) copyNode(o *state, i int32) {
	for r := range nRes {
		s.totUsed[r] += s.hot[i].free[r] - o.hot[i].free[r]
	}
	s.hot[i] = o.hot[i]
	for _, g := range s.grids {
		if j := g.pos[i]; j >= 0 {
			g.update(j, &s.hot[i])
		}
	}
	s.sum[i] = o.sum[i]
	s.extra[i] = o.extra[i]
	s.lists[i] = o.lists[i]
	s.ver[i] = o.ver[i]
	s.meas[i] = o.meas[i]
}
