package scheduler

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/berth-dev/berth/driver"
)

// Default host port range for "any port" requests.
const (
	DefaultPortMin = 20000
	DefaultPortMax = 32767
)

// Cluster is the authoritative placement state: every node of every
// provider, what Berth has allocated on each, and a version per node that
// grows with every change. It is safe for concurrent use.
//
// Two ways to place:
//
//   - Place and PlaceGroup plan and commit in one step under the cluster's
//     lock. They cannot conflict; use them from one control loop.
//   - Snapshot gives a scheduler a private copy; it plans without the lock
//     (many snapshots in parallel) and Commit accepts each placement only if
//     what it counted is still free on the node, so no node is ever
//     double-booked. Rejected placements are conflicts: the scheduler
//     refreshes its snapshot and plans them again (Snapshot.Place does).
//
// A node counts as using, per resource and for its instance count, the
// larger of what its back-end reports (driver.Node.Reserved, Instances) and
// what Berth allocated there: the back-end's figure is taken to include
// Berth's own instances that already run, less those its back-end has let
// go since it was read (SetPresence). A host port is taken when the
// back-end reports it bound or Berth allocated it. A provider may admit
// cpu and memory by measured usage instead (SetOvercommit, SetMeasured).
type Cluster struct {
	mu      sync.Mutex
	st      state
	nodes   []driver.Node // latest record of every node, by index
	provOf  []int32
	removed []bool
	provs   []string
	caps    map[string][]string
	oc      map[string]Overcommit // usage policies by provider
	gen     uint64
	// seq counts the changes that tell whether a reading of a node counts
	// an instance (SetPresence, Release): ReadBegin returns it.
	seq uint64
	// Per node, by index as nodes: moved is seq at the last such change of
	// an instance there; changing how many allocations there are Changing;
	// read whether a reading reported the node.
	moved    []uint64
	changing []int32
	read     []bool
	allocs   allocTable
	elastic  map[*alloc]struct{} // the elastic ones among allocs
	log      []int32
	logBase  uint64 // position of log[0] in the whole change history
	portMin  int
	portMax  int
	ids      atomic.Uint64
	planner  *planner
	stats    Stats
	opts     Options
}

// Stats counts what the cluster approved.
type Stats struct {
	// Committed counts placements accepted (by Place, PlaceGroup or Commit).
	Committed uint64 `json:"committed"`
	// Conflicts counts placements Commit rejected because the node no
	// longer had what the plan counted on.
	Conflicts uint64 `json:"conflicts"`
	// Instances is how many allocations the cluster holds.
	Instances int `json:"instances"`
	// Nodes is how many nodes the cluster knows (removed ones excluded).
	Nodes int `json:"nodes"`
}

// ClusterOption configures NewCluster.
type ClusterOption func(*Cluster)

// WithPortRange sets the host ports "any port" requests choose from.
func WithPortRange(lo, hi int) ClusterOption {
	return func(c *Cluster) { c.portMin, c.portMax = lo, hi }
}

// WithOptions sets the options of the cluster's own planner (Place and
// PlaceGroup).
func WithOptions(o Options) ClusterOption {
	return func(c *Cluster) { c.opts = o }
}

// NewCluster returns an empty cluster; add nodes with UpdateNodes.
func NewCluster(opts ...ClusterOption) *Cluster {
	c := &Cluster{
		caps: map[string][]string{}, oc: map[string]Overcommit{}, elastic: map[*alloc]struct{}{},
		portMin: DefaultPortMin, portMax: DefaultPortMax,
	}
	for _, o := range opts {
		o(c)
	}
	c.st.log = &c.log
	c.rebuildLocked()
	c.planner = newPlanner(&c.st, c.opts, c.portMin, c.portMax, &c.ids)
	return c
}

func (c *Cluster) rebuildLocked() {
	c.gen++
	t := buildTopo(c.gen, slices.Clone(c.provs), slices.Clone(c.provOf), c.nodes, slices.Clone(c.removed), c.caps, c.oc)
	c.st.rebuild(t)
	// A new topology makes every snapshot copy everything; start the log
	// afresh.
	c.logBase += uint64(len(c.log))
	c.log = c.log[:0]
}

func (c *Cluster) provLocked(p string) int32 {
	if k := slices.Index(c.provs, p); k >= 0 {
		return int32(k)
	}
	c.provs = append(c.provs, p)
	return int32(len(c.provs) - 1)
}

// UpdateNodes replaces what the cluster knows of provider's nodes with a
// fresh reading (driver.PlatformState.Nodes), as UpdateNodesRead does with
// a reading begun now. Nodes not in the list are marked removed; their
// allocations stay until released. Node names are unique within a
// provider.
func (c *Cluster) UpdateNodes(provider string, nodes []driver.Node) error {
	return c.updateNodes(provider, nodes, false, 0)
}

// Presence is what the cluster is told of an allocation's instance on its
// back-end (SetPresence). A node counts as using the larger of what its
// reading reports (driver.Node.Reserved, Instances) and what Berth
// allocated there; a reading that counts an instance its back-end has
// since let go would hold that room until the next reading. Presence tells
// which allocations a reading counts, so that their room is freed as soon
// as their back-end lets them go.
type Presence uint8

// Presences.
const (
	// Untracked, the zero value, says nothing: a reading that counts the
	// instance holds its room until a later reading no longer does. An
	// instance the back-end may have lost without a delete is untracked.
	Untracked Presence = iota
	// Changing: a create or a delete of the instance is under way; a
	// reading may or may not count it.
	Changing
	// Present: the back-end holds the instance; every reading begun after
	// counts it, until the instance is Changing (a delete under way),
	// Gone or Untracked.
	Present
	// Gone: the back-end has let the instance go; no reading begun after
	// counts it, and what the node's reading counted for it is free at
	// once.
	Gone
)

// SetPresence records what instance id's back-end holds of it (Presence).
// An unknown id returns an error wrapping driver.ErrNotFound.
func (c *Cluster) SetPresence(id string, p Presence) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	a := c.allocs.get(id)
	if a == nil {
		return driver.Errorf(driver.ErrNotFound, "instance %q holds nothing", id)
	}
	if a.pres == p {
		return nil
	}
	c.seq++
	c.moved[a.node] = c.seq
	if a.pres == Changing {
		c.changing[a.node]--
	}
	if p == Changing {
		c.changing[a.node]++
	}
	a.pres = p
	switch {
	case p == Gone && a.counted:
		c.st.leave(a)
		c.compactLocked()
		fallthrough
	case p == Untracked:
		a.counted = false
	}
	return nil
}

// ReadBegin returns the mark to hand to UpdateNodesRead with a reading of a
// back-end's nodes begun after it returned.
func (c *Cluster) ReadBegin() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.seq
}

// UpdateNodesRead is UpdateNodes for a reading begun after ReadBegin
// returned since. A node's reading counts the instances its back-end held
// when it was read: those Present before since and no Gone one. It is
// taken with what it counts whenever that is certain. When it is not (a
// create or a delete on the node was under way, or an instance's presence
// there changed after since, or an Untracked one was released) the node
// keeps what its last reading reported in use and the instances it
// counted, so that the room of an instance that goes is freed when it
// goes; the node's other facts are taken.
func (c *Cluster) UpdateNodesRead(provider string, nodes []driver.Node, since uint64) error {
	return c.updateNodes(provider, nodes, true, since)
}

func (c *Cluster) updateNodes(provider string, nodes []driver.Node, begun bool, since uint64) error {
	if provider == "" {
		return &driver.FieldError{Path: "provider", Reason: "required"}
	}
	seen := make(map[string]bool, len(nodes))
	var es driver.FieldErrors
	for k, n := range nodes {
		p := fmt.Sprintf("nodes[%d].", k)
		if n.Name == "" {
			es.Add(p+"name", "required")
		} else if seen[n.Name] {
			es.Add(p+"name", "%q appears twice", n.Name)
		}
		seen[n.Name] = true
		es.AddErr("", driver.ValidateCapacity(p+"capacity.", n.Capacity))
		es.AddErr("", driver.ValidateCapacity(p+"reserved.", n.Reserved))
		if n.MaxInstances < 0 {
			es.Add(p+"max_instances", "%d: must not be negative", n.MaxInstances)
		}
	}
	if err := es.Err(); err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if !begun {
		since = c.seq
	}
	pi := c.provLocked(provider)
	t := c.st.t
	for k := range c.nodes {
		if c.provOf[k] == pi && !seen[c.nodes[k].Name] {
			c.removed[k] = true
		}
	}
	for _, n := range nodes {
		// Keep nothing the caller may change later.
		n.Images = slices.Clone(n.Images)
		n.Ports = slices.Clone(n.Ports)
		n.Labels = maps.Clone(n.Labels)
		n.Attributes = maps.Clone(n.Attributes)
		n.Capacity.Other = maps.Clone(n.Capacity.Other)
		n.Reserved.Other = maps.Clone(n.Reserved.Other)
		n.InUse = nil
		i, ok := t.index[nodeKey{provider, n.Name}]
		if !ok {
			// New: nothing is allocated there yet.
			c.read[c.addNodeLocked(n, pi)] = true
			continue
		}
		certain := c.changing[i] == 0 && c.moved[i] <= since
		if !certain && c.read[i] && begun {
			// Keep what the last reading counted.
			n.Reserved, n.Instances = c.nodes[i].Reserved, c.nodes[i].Instances
			c.nodes[i], c.removed[i] = n, false
			continue
		}
		c.nodes[i], c.removed[i], c.read[i] = n, false, true
		sm := &c.st.sum[i]
		sm.left, sm.leftInst = [nRes]int64{}, 0
		for cl := c.st.lists[i]; cl != nil; cl = cl.next {
			cl.a.counted = certain && cl.a.pres == Present
		}
	}
	c.rebuildLocked()
	return nil
}

// addNodeLocked adds node n of provider pi and returns its index; the
// state takes it at the next rebuildLocked.
func (c *Cluster) addNodeLocked(n driver.Node, pi int32) int32 {
	c.nodes = append(c.nodes, n)
	c.provOf = append(c.provOf, pi)
	c.removed = append(c.removed, false)
	c.moved = append(c.moved, 0)
	c.changing = append(c.changing, 0)
	c.read = append(c.read, false)
	return int32(len(c.nodes) - 1)
}

// SetCapabilities records the optional capabilities (driver.Capabilities)
// of provider's back-end, matched by Request.Capabilities.
func (c *Cluster) SetCapabilities(provider string, caps []string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.provLocked(provider)
	c.caps[provider] = slices.Clone(caps)
	c.rebuildLocked()
}

// Allocation is an instance that already exists, handed to Reserve.
type Allocation struct {
	ID        string
	Name      string
	Provider  string
	Node      string
	Resources driver.Resources
	Ports     []int
	Group     string
	Request   string
	Owner     string
	Pool      string
	Image     string
	Labels    map[string]string
	Priority  int
	Elastic   bool
	// Presence is what its back-end holds of it (SetPresence).
	Presence Presence
}

// Reserve records instances that exist already (at start-up, from the
// store). Reserving never fails for lack of room: the instances run. A node
// the cluster has not heard of yet is kept as an offline placeholder until
// UpdateNodes reports it. An id that is already allocated is an error
// wrapping driver.ErrAlreadyExists, and nothing of that call is reserved.
func (c *Cluster) Reserve(as ...Allocation) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.reserveLocked(as)
}

// Hold makes each of as the allocation its instance holds, as a change
// the store committed asks: an instance that holds nothing reserves it (as
// Reserve); one that holds an equal allocation on the same node (the
// reservation its placement made) keeps it as it is; one that holds
// another gives it back first, keeping what its back-end was told of it
// (SetPresence) and whether it is elastic (a group's placement says) when
// it stays on its node. Like Reserve it never fails for
// lack of room; an allocation that is not valid is an error, and nothing
// of that call is held.
func (c *Cluster) Hold(as ...Allocation) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	var fresh []Allocation
	var olds []*alloc
	going := map[*alloc]bool{}
	for _, a := range as {
		old := c.allocs.get(a.ID)
		if old == nil {
			fresh = append(fresh, a)
			continue
		}
		i, known := c.st.t.index[nodeKey{a.Provider, a.Node}]
		if known && old.node == i && old.equals(&a) {
			continue
		}
		if known && old.node == i {
			a.Presence, a.Elastic = old.pres, old.elastic
		}
		olds = append(olds, old)
		going[old] = true
		fresh = append(fresh, a)
	}
	if err := c.checkReserveLocked(fresh, going); err != nil {
		return err
	}
	for _, old := range olds {
		c.releaseLocked(old)
	}
	return c.reserveLocked(fresh)
}

// reserveLocked is Reserve with c.mu held.
func (c *Cluster) reserveLocked(as []Allocation) error {
	if err := c.checkReserveLocked(as, nil); err != nil {
		return err
	}
	pending := map[nodeKey]bool{}
	for _, a := range as {
		k := nodeKey{a.Provider, a.Node}
		if _, ok := c.st.t.index[k]; !ok && !pending[k] {
			c.addNodeLocked(driver.Node{Name: a.Node, Status: driver.NodeOffline, Reason: "not reported by its provider yet"}, c.provLocked(a.Provider))
			pending[k] = true
		}
	}
	if len(pending) > 0 {
		c.rebuildLocked()
	}
	infos := map[infoKey]*reqInfo{}
	for _, a := range as {
		i := c.st.t.index[nodeKey{a.Provider, a.Node}]
		name := a.Name
		if name == "" {
			name = a.ID
		}
		al := newAlloc(a.ID, name, i, slices.Clone(a.Ports), sharedInfo(infos, &a), a.Elastic)
		c.st.apply(al)
		c.addAllocLocked(al)
		c.seq++
		c.moved[i] = c.seq
		al.pres = a.Presence
		if al.pres == Changing {
			c.changing[i]++
		}
	}
	c.compactLocked()
	return nil
}

// checkReserveLocked checks as for reserveLocked, counting the ids of
// going, about to be released, as free.
func (c *Cluster) checkReserveLocked(as []Allocation, going map[*alloc]bool) error {
	seen := make(map[string]bool, len(as))
	for k, a := range as {
		if a.ID == "" {
			return fmt.Errorf("reserve: %w", &driver.FieldError{Path: fmt.Sprintf("[%d].id", k), Reason: "required"})
		}
		if err := driver.ValidateCapacity(fmt.Sprintf("[%d].", k), a.Resources); err != nil {
			return fmt.Errorf("reserve: %w", err)
		}
		held := c.allocs.get(a.ID)
		if going[held] {
			held = nil
		}
		if held != nil || seen[a.ID] {
			return driver.Errorf(driver.ErrAlreadyExists, "reserve: instance %q is already allocated", a.ID)
		}
		seen[a.ID] = true
	}
	return nil
}

// infoKey is the comparable part of the reqInfo of an Allocation.
type infoKey struct {
	request, owner, pool, group, image string
	priority                           int
	cpu                                driver.MilliCPU
	memory, disk                       driver.Bytes
	gpus                               int64
}

// sharedInfo returns the reqInfo of a, one for all the allocations of a
// Reserve call that have the same (as a request's instances do): a restarted
// plane reserves a million at once.
func sharedInfo(infos map[infoKey]*reqInfo, a *Allocation) *reqInfo {
	r := a.Resources
	k := infoKey{request: a.Request, owner: a.Owner, pool: a.Pool, group: a.Group, image: a.Image, priority: a.Priority,
		cpu: r.CPU, memory: r.Memory, disk: r.Disk, gpus: r.GPUs}
	if info, ok := infos[k]; ok && maps.Equal(info.labels, a.Labels) && maps.Equal(info.res.Other, r.Other) {
		return info
	}
	r.Other = maps.Clone(r.Other)
	info := &reqInfo{request: a.Request, owner: a.Owner, pool: a.Pool, group: a.Group,
		image: a.Image, labels: maps.Clone(a.Labels), priority: a.Priority, res: r}
	infos[k] = info
	return info
}

// Release frees what instance id holds (after it was deleted). An unknown
// id returns an error wrapping driver.ErrNotFound, which callers count as
// done.
func (c *Cluster) Release(id string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	a := c.allocs.get(id)
	if a == nil {
		return driver.Errorf(driver.ErrNotFound, "instance %q holds nothing", id)
	}
	c.releaseLocked(a)
	c.compactLocked()
	return nil
}

// releaseLocked frees what a holds.
func (c *Cluster) releaseLocked(a *alloc) {
	c.delAllocLocked(a)
	c.st.unapply(a)
	if a.pres == Untracked {
		// A reading under way may count it, or not.
		c.seq++
		c.moved[a.node] = c.seq
	}
}

// Place plans r on the current state and commits it at once, under the
// lock: no conflict is possible. Instances that fit nowhere are in
// Plan.Unplaced with the reasons; the error is only for an invalid request
// (driver.ErrInvalid) or an instance id already allocated
// (driver.ErrAlreadyExists).
func (c *Cluster) Place(r *Request) (*Plan, error) {
	cr, err := compile(r, "")
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if r.ID != "" {
		for k := range r.N() {
			if c.allocs.get(r.InstanceID(k)) != nil {
				return nil, driver.Errorf(driver.ErrAlreadyExists, "instance %q is already allocated", r.InstanceID(k))
			}
		}
	}
	plan := &Plan{}
	c.planner.placeRequest(cr, nil, false, plan)
	c.recordLocked(plan)
	return plan, nil
}

// PlaceGroup plans and commits g under the lock: its essential instances
// all or none, then its elastic ones best effort. When the essential
// instances do not fit, elastic instances of groups with a priority no
// higher than g's are evicted (lowest priority first) if that makes room;
// they are listed in Plan.Evicted, already released, and the caller
// deletes them. When even that does not help nothing changes and the plan
// lists the essential instances as unplaced.
func (c *Cluster) PlaceGroup(g *Group) (*Plan, error) {
	if err := g.Validate(); err != nil {
		return nil, err
	}
	gg, err := compileGroup(g)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.placeGroupLocked(g, gg)
}

// placeGroupLocked is PlaceGroup of g, compiled as gg, with c.mu held.
func (c *Cluster) placeGroupLocked(g *Group, gg *gang) (*Plan, error) {
	for _, list := range gg.ids() {
		for _, id := range list {
			if c.allocs.get(id) != nil {
				return nil, driver.Errorf(driver.ErrAlreadyExists, "instance %q of group %q is already allocated", id, g.ID)
			}
		}
	}
	plan := &Plan{}
	c.planner.placeGroup(gg, plan)
	if c.essentialMissing(plan) {
		c.evictFor(gg, plan)
	}
	c.recordLocked(plan)
	return plan, nil
}

func (c *Cluster) essentialMissing(plan *Plan) bool {
	for _, u := range plan.Unplaced {
		if !u.Elastic {
			return true
		}
	}
	return false
}

// evictFor tries to make room for g's essential instances by removing
// elastic instances of lower or equal priority. It takes all candidates out,
// places the group, then puts back every candidate that still fits where it
// was, highest priority first; those that do not are evicted.
func (c *Cluster) evictFor(gg *gang, plan *Plan) {
	g := gg.g
	prio := groupPriority(g)
	var cand []*alloc
	for a := range c.elastic {
		if a.info.priority <= prio && a.info.group != g.ID {
			cand = append(cand, a)
		}
	}
	if len(cand) == 0 {
		return
	}
	slices.SortFunc(cand, func(a, b *alloc) int {
		if x := cmp.Compare(b.info.priority, a.info.priority); x != 0 {
			return x
		}
		return cmp.Compare(a.id, b.id)
	})
	// A candidate its node's reading counts is taken out of the reading
	// too: evicted, its room is the group's (Berth deletes it; the
	// group's creates wait for that).
	out := func(a *alloc) {
		c.st.unapply(a)
		if a.counted {
			c.st.leave(a)
		}
	}
	back := func(a *alloc) {
		if a.counted {
			c.st.enter(a)
		}
		c.st.apply(a)
	}
	for _, a := range cand {
		out(a)
	}
	trial := &Plan{}
	c.planner.placeGroup(gg, trial)
	if c.essentialMissing(trial) {
		c.planner.rollback(trial, 0)
		for _, a := range cand {
			back(a)
		}
		return
	}
	// Put back what still fits, highest priority first.
	var evicted []string
	for _, a := range cand {
		if c.fitsLocked(a, false) {
			back(a)
		} else {
			evicted = append(evicted, a.id)
			c.delAllocLocked(a)
		}
	}
	*plan = *trial
	plan.Evicted = evicted
}

// fitsLocked reports whether a still fits on its node in the authoritative
// state: resources, instance cap, named resources and host ports; and, when
// online is set, whether the node still takes new instances.
func (c *Cluster) fitsLocked(a *alloc, online bool) bool {
	i := a.node
	t := c.st.t
	if online && (t.removed[i] || t.status[i] != driver.NodeOnline) {
		return false
	}
	h := &c.st.hot[i]
	if h.inst >= h.maxInst {
		return false
	}
	need := resVec(a.info.res)
	for r := range nRes {
		if need[r] > h.free[r] {
			return false
		}
	}
	for k, q := range a.info.res.Other {
		if q > c.st.otherFree(i, k) {
			return false
		}
	}
	for _, p := range a.ports() {
		if !c.st.portFree(i, p) {
			return false
		}
	}
	return true
}

func (c *Cluster) addAllocLocked(a *alloc) {
	c.allocs.add(a)
	if a.elastic {
		c.elastic[a] = struct{}{}
	}
}

func (c *Cluster) delAllocLocked(a *alloc) {
	c.allocs.del(a)
	delete(c.elastic, a)
	if a.pres == Changing {
		c.changing[a.node]--
	}
}

// recordLocked registers a plan's placements as allocations.
func (c *Cluster) recordLocked(plan *Plan) {
	for k := range plan.Placements {
		c.addAllocLocked(plan.Placements[k].a)
	}
	c.stats.Committed += uint64(len(plan.Placements))
	c.compactLocked()
}

// compactLocked bounds the change log: once it is much longer than the
// node count, snapshots that far behind copy everything anyway.
func (c *Cluster) compactLocked() {
	if len(c.log) > 4*len(c.nodes)+1024 {
		c.logBase += uint64(len(c.log))
		c.log = c.log[:0]
	}
}

// Commit applies a plan made on a snapshot. Each placement is accepted only
// if its node still has what it needs (resources, instance cap, named
// resources, ports) and its instance id is not taken; otherwise it is
// rejected and counted as a conflict. The essential placements of a group
// are one unit: all accepted or all rejected, and when they are rejected so
// are that group's elastic ones. Other placements stand alone. Accepted
// placements hold their resources until Release.
func (c *Cluster) Commit(p *Plan) (accepted, rejected []Placement) {
	c.mu.Lock()
	defer c.mu.Unlock()
	failedGroups := map[string]bool{}
	// Essential group units first, all or none.
	units := map[string][]int{}
	var order []string
	for k, pl := range p.Placements {
		if pl.Group != "" && !pl.Elastic {
			if _, ok := units[pl.Group]; !ok {
				order = append(order, pl.Group)
			}
			units[pl.Group] = append(units[pl.Group], k)
		}
	}
	done := make([]bool, len(p.Placements))
	for _, g := range order {
		var applied []*alloc
		ok := true
		for _, k := range units[g] {
			pl := &p.Placements[k]
			if !c.acceptableLocked(pl) {
				ok = false
				break
			}
			c.st.apply(pl.a)
			c.addAllocLocked(pl.a)
			applied = append(applied, pl.a)
		}
		if !ok {
			for j := len(applied) - 1; j >= 0; j-- {
				c.st.unapply(applied[j])
				c.delAllocLocked(applied[j])
			}
			failedGroups[g] = true
		}
		for _, k := range units[g] {
			done[k] = true
			if ok {
				accepted = append(accepted, p.Placements[k])
			} else {
				rejected = append(rejected, p.Placements[k])
			}
		}
	}
	for k := range p.Placements {
		if done[k] {
			continue
		}
		pl := &p.Placements[k]
		if failedGroups[pl.Group] || !c.acceptableLocked(pl) {
			rejected = append(rejected, *pl)
			continue
		}
		c.st.apply(pl.a)
		c.addAllocLocked(pl.a)
		accepted = append(accepted, *pl)
	}
	c.stats.Committed += uint64(len(accepted))
	c.stats.Conflicts += uint64(len(rejected))
	c.compactLocked()
	return accepted, rejected
}

func (c *Cluster) acceptableLocked(pl *Placement) bool {
	if pl.a == nil || int(pl.a.node) >= len(c.nodes) {
		return false
	}
	if c.allocs.get(pl.Instance) != nil {
		return false
	}
	return c.fitsLocked(pl.a, true) && c.st.quotaFits(pl.a)
}

// Stats returns the cluster's counters.
func (c *Cluster) Stats() Stats {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.stats
	s.Instances = c.allocs.len()
	for _, r := range c.removed {
		if !r {
			s.Nodes++
		}
	}
	return s
}

// Overbooked independently re-adds every allocation and returns the nodes
// where Berth allocated more than the capacity of some resource (for cpu
// and memory under the usage policy, more than the ratio allows), or more
// instances than the node's cap, or one host port twice. Reserve may
// legitimately produce such nodes (what runs, runs); Place and Commit never
// do.
func (c *Cluster) Overbooked() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	type acc struct {
		res   driver.Resources
		n     int
		ports map[int]bool
		dup   bool
	}
	per := map[int32]*acc{}
	for a := range c.allocs.all() {
		x := per[a.node]
		if x == nil {
			x = &acc{ports: map[int]bool{}}
			per[a.node] = x
		}
		x.res = x.res.Add(a.info.res)
		x.n++
		for _, p := range a.ports() {
			if x.ports[p] || slices.Contains(c.nodes[a.node].Ports, p) {
				x.dup = true
			}
			x.ports[p] = true
		}
	}
	var out []string
	for i, x := range per {
		n := &c.nodes[i]
		capLeft := n.Capacity
		if oc := c.st.t.policyOf(i); oc != nil {
			capLeft.CPU = driver.MilliCPU(oc.ratioLimit(int64(capLeft.CPU)))
			capLeft.Memory = driver.Bytes(oc.ratioLimit(int64(capLeft.Memory)))
		}
		if !x.res.Fits(capLeft) || (n.MaxInstances > 0 && x.n > n.MaxInstances) || x.dup {
			out = append(out, c.provs[c.provOf[i]]+"/"+n.Name)
		}
	}
	slices.Sort(out)
	return out
}

// NodeUse is one node's state as the cluster sees it.
type NodeUse struct {
	Provider  string            `json:"provider"`
	Name      string            `json:"name"`
	Status    driver.NodeStatus `json:"status"`
	Capacity  driver.Resources  `json:"capacity"`
	Free      driver.Resources  `json:"free"`
	Instances int               `json:"instances"`
	Version   uint64            `json:"version"`
	// Berth is what the instances placed here by Berth hold, and
	// BerthInstances how many they are.
	Berth          driver.Resources `json:"berth"`
	BerthInstances int              `json:"berth_instances"`
	// Measured is the cpu and memory the node's instances were last
	// measured using (SetMeasured).
	Measured driver.Resources `json:"measured"`
	// Policy names the overcommit policy that admits instances here
	// (Overcommit.String); Free is counted by it.
	Policy string `json:"policy"`
}

// Nodes returns every node that is not removed, in index order.
func (c *Cluster) Nodes() []NodeUse {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]NodeUse, 0, len(c.nodes))
	t := c.st.t
	for i := range c.nodes {
		if t.removed[i] {
			continue
		}
		h := &c.st.hot[i]
		sm := &c.st.sum[i]
		berth := driver.Resources{
			CPU: driver.MilliCPU(sm.res[resCPU]), Memory: driver.Bytes(sm.res[resMem]),
			Disk: driver.Bytes(sm.res[resDisk]), GPUs: sm.res[resGPU],
		}
		if x := c.st.extra[i]; x != nil {
			for k, q := range x.other {
				if q != 0 {
					if berth.Other == nil {
						berth.Other = map[string]int64{}
					}
					berth.Other[k] = q
				}
			}
		}
		policy := PolicyReservations
		if oc := t.policyOf(int32(i)); oc != nil {
			policy = oc.String()
		}
		m := &c.st.meas[i]
		out = append(out, NodeUse{
			Berth: berth, BerthInstances: int(sm.inst), Policy: policy,
			Measured: driver.Resources{CPU: driver.MilliCPU(m.used[resCPU]), Memory: driver.Bytes(m.used[resMem])},
			Provider: t.providers[t.prov[i]], Name: t.names[i], Status: t.status[i],
			Capacity: t.capacity[i],
			Free: driver.Resources{
				CPU: driver.MilliCPU(h.free[resCPU]), Memory: driver.Bytes(h.free[resMem]),
				Disk: driver.Bytes(h.free[resDisk]), GPUs: h.free[resGPU],
			},
			Instances: int(h.inst), Version: c.st.ver[i],
		})
	}
	return out
}

// Snapshot returns a private copy of the cluster's state for a scheduler to
// plan on without holding the cluster's lock.
func (c *Cluster) Snapshot(opt Options) *Snapshot {
	s := &Snapshot{c: c}
	s.p = newPlanner(&s.st, opt, c.portMin, c.portMax, &c.ids)
	s.Refresh()
	return s
}

// Snapshot is one scheduler's private view of a Cluster. Plans made on it
// update it, so consecutive plans see each other; other schedulers' commits
// appear after Refresh. A Snapshot is not safe for concurrent use: give each
// scheduler goroutine its own.
type Snapshot struct {
	c      *Cluster
	st     state
	p      *planner
	gen    uint64
	logPos uint64 // position in the cluster's change history
}

// Refresh catches up with the cluster: it copies only the nodes changed
// since the last refresh, or everything after a topology change.
func (s *Snapshot) Refresh() {
	c := s.c
	c.mu.Lock()
	defer c.mu.Unlock()
	if s.gen != c.gen || s.logPos < c.logBase {
		s.st.copyFrom(&c.st)
		s.gen = c.gen
	} else {
		for _, i := range c.log[s.logPos-c.logBase:] {
			s.st.copyNode(&c.st, i)
		}
		s.st.copyQuotas(&c.st)
	}
	s.logPos = c.logBase + uint64(len(c.log))
}

// Commit commits a plan made on this snapshot to the cluster (see
// Cluster.Commit) and brings the snapshot back in line for the rejected
// placements, which it had counted as used.
func (s *Snapshot) Commit(p *Plan) (accepted, rejected []Placement) {
	accepted, rejected = s.c.Commit(p)
	if len(rejected) > 0 {
		s.resync(rejected)
	}
	return accepted, rejected
}

// resync refreshes the snapshot and re-copies the nodes of rejected
// placements, which the snapshot had counted as used.
func (s *Snapshot) resync(rej []Placement) {
	s.Refresh()
	c := s.c
	c.mu.Lock()
	defer c.mu.Unlock()
	if s.gen != c.gen {
		return
	}
	for _, pl := range rej {
		s.st.copyNode(&c.st, pl.a.node)
	}
}

// Plan places r on the snapshot (not on the cluster); commit it with
// Commit.
func (s *Snapshot) Plan(r *Request) (*Plan, error) {
	cr, err := compile(r, "")
	if err != nil {
		return nil, err
	}
	plan := &Plan{}
	s.p.placeRequest(cr, nil, false, plan)
	return plan, nil
}

// PlanGroup places g on the snapshot; commit it with Commit. Unlike
// Cluster.PlaceGroup it never evicts elastic instances.
func (s *Snapshot) PlanGroup(g *Group) (*Plan, error) {
	gg, err := compileGroup(g)
	if err != nil {
		return nil, err
	}
	plan := &Plan{}
	s.p.placeGroup(gg, plan)
	return plan, nil
}

// PlaceGroup plans g on the snapshot and commits it. When the cluster
// rejects its essential placements (another scheduler took the room), the
// snapshot is refreshed and the whole group planned again, up to MaxRounds
// times; rejected elastic placements are left unplaced. Unlike
// Cluster.PlaceGroup it never evicts elastic instances.
func (s *Snapshot) PlaceGroup(g *Group) (plan *Plan, conflicts int, err error) {
	gg, err := compileGroup(g)
	if err != nil {
		return nil, 0, err
	}
	for round := 1; ; round++ {
		p := &Plan{}
		s.p.placeGroup(gg, p)
		acc, rej := s.Commit(p)
		conflicts += len(rej)
		essentialRejected := false
		for _, pl := range rej {
			essentialRejected = essentialRejected || !pl.Elastic
		}
		if !essentialRejected || round >= MaxRounds {
			out := &Plan{Placements: acc, Unplaced: p.Unplaced, Relaxed: p.Relaxed}
			if len(rej) > 0 {
				idxs := make(map[string][]int)
				var order []string
				for _, pl := range rej {
					if _, ok := idxs[pl.Request]; !ok {
						order = append(order, pl.Request)
					}
					idxs[pl.Request] = append(idxs[pl.Request], pl.Index)
				}
				for _, req := range order {
					out.Unplaced = append(out.Unplaced, Unplaced{Request: req, Group: g.ID, Indexes: idxs[req], Elastic: !essentialRejected,
						Reasons: Reasons{Counts: []ReasonCount{{Reason: "conflicts with other schedulers", Nodes: len(idxs[req])}}}})
				}
			}
			return out, conflicts, nil
		}
	}
}

// MaxRounds bounds how often Snapshot.Place re-plans rejected placements.
const MaxRounds = 16

// Place plans r on the snapshot and commits it; placements the cluster
// rejects are planned again on a refreshed snapshot, up to MaxRounds times.
// The returned plan holds the accepted placements and what is left
// unplaced; conflicts is how many placements were rejected on the way.
func (s *Snapshot) Place(r *Request) (plan *Plan, conflicts int, err error) {
	cr, err := compile(r, "")
	if err != nil {
		return nil, 0, err
	}
	out := &Plan{}
	var idxs []int
	for round := 1; ; round++ {
		p := &Plan{}
		s.p.placeRequest(cr, idxs, false, p)
		acc, rej := s.Commit(p)
		out.Placements = append(out.Placements, acc...)
		out.Unplaced = append(out.Unplaced, p.Unplaced...)
		for _, x := range p.Relaxed {
			if !slices.Contains(out.Relaxed, x) {
				out.Relaxed = append(out.Relaxed, x)
			}
		}
		conflicts += len(rej)
		if len(rej) == 0 {
			return out, conflicts, nil
		}
		idxs = make([]int, 0, len(rej))
		for _, pl := range rej {
			idxs = append(idxs, pl.Index)
		}
		if round >= MaxRounds {
			out.Unplaced = append(out.Unplaced, Unplaced{Request: r.ID, Group: r.Group, Indexes: idxs,
				Reasons: Reasons{Counts: []ReasonCount{{Reason: "conflicts with other schedulers", Nodes: len(rej)}}}})
			return out, conflicts, nil
		}
	}
}
