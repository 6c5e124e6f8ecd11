package control

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"

	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/reconciler"
)

// records is the store's instances and requests in memory, a replica that
// changes only through applyStored, with their
// indexes and tallies, and the latest reading of every node. mu guards all
// of it.
type records struct {
	mu       sync.RWMutex
	recs     recIndex // the store's instances
	requests map[string]*storedRequest
	names    map[nameKey]string          // instance id by namespace and name, for live instances not named by their id (nameHolderLocked)
	nameNS   map[string]int              // keys of names per namespace, for lookups in every namespace
	queued   int                         // pending instances
	pending  map[string]bool             // ids of the pending instances
	phases   map[reconciler.Phase]int    // instances per phase
	nodeInfo map[string]driver.Node      // latest reading of every node, by provider/node, without images and ports
	largest  map[string]driver.Resources // per provider, the most of each resource one node has, as last listed

	// loadRev is the store revision the loaded instances reflect; the
	// store watch starts after it. Set before Run, then read only.
	loadRev int64
	// tombs are the recent removals of instances, for applyStored.
	tombs tombstones
	// aside holds the ids of the instances whose records are moved aside
	// (PrefixQuarantine), now or at an earlier start: their back-end
	// resources are not leaks to delete. Set by load, then read only.
	aside map[string]bool
}

// applyRequestLocked applies the change c of a request: a request stays
// as it first entered memory (its instances share its spec), and leaves it
// when removed.
func (s *records) applyRequestLocked(c change) {
	if c.req == nil {
		delete(s.requests, c.id)
		return
	}
	if _, known := s.requests[c.id]; !known {
		s.requests[c.id] = c.req
	}
}

// orphanRequests returns the ids of loaded requests none of whose
// instances has a record (left by a crash between removing the last
// instance and its request).
func (s *records) orphanRequests() []string {
	used := make(map[string]bool, len(s.requests))
	for in := range s.recs.all() {
		used[in.Request] = true
	}
	var out []string
	for id := range s.requests {
		if !used[id] {
			out = append(out, id)
		}
	}
	slices.Sort(out)
	return out
}

// instance is Plane.Instance.
func (s *records) instance(ctx context.Context, ref string) (Instance, error) {
	in, err := s.find(ref)
	if err != nil {
		return Instance{}, err
	}
	return viewOf(&in), nil
}

// instances is Plane.Instances.
func (s *records) instances(ctx context.Context, f Filter) ([]Instance, error) {
	if f.Limit < 0 {
		return nil, &driver.FieldError{Path: "limit", Reason: fmt.Sprintf("%d: want 0 (no limit) or more", f.Limit)}
	}
	for i, ph := range f.Phases {
		if !ph.Valid() {
			return nil, &driver.FieldError{Path: fmt.Sprintf("phases[%d]", i), Reason: fmt.Sprintf("%q: want one of %v", ph, reconciler.Phases)}
		}
	}
	recs := s.page(f.After, f.Limit, func(in *rec) bool {
		switch {
		case !f.All && in.Phase == reconciler.Deleted && !slices.Contains(f.Phases, reconciler.Deleted):
			return false
		case f.Provider != "" && in.Provider != f.Provider,
			f.Node != "" && in.Node != f.Node,
			f.Owner != "" && in.Owner != f.Owner,
			len(f.Owners) > 0 && !slices.Contains(f.Owners, in.Owner),
			f.Pool != "" && in.Pool != f.Pool,
			f.Group != "" && in.Group() != f.Group,
			f.Request != "" && in.Request != f.Request,
			f.Name != "" && in.Name() != f.Name,
			len(f.Phases) > 0 && !slices.Contains(f.Phases, in.Phase):
			return false
		}
		return true
	})
	out := make([]Instance, len(recs))
	for i, r := range recs {
		in := r.instance()
		out[i] = viewOf(&in)
	}
	return out, nil
}

// page returns the cached instances whose id sorts after after and that
// keep returns true for, sorted by id: all of them when limit is 0, else
// the first limit. It walks the ids in order, so a page costs what it
// skips and holds, not the size of the cache. A rec is never changed once
// cached: the caller reads them without the lock.
func (s *records) page(after string, limit int, keep func(*rec) bool) []*rec {
	var out []*rec
	s.mu.RLock()
	defer s.mu.RUnlock()
	for in := range s.recs.from(after) {
		if in.ID == after || !keep(in) {
			continue
		}
		out = append(out, in)
		if limit > 0 && len(out) == limit {
			break
		}
	}
	return out
}

// nodeRef describes a placed node for an answer.
func (s *records) nodeRef(prov, node string) *NodeRef {
	ref := &NodeRef{ID: reconciler.NodeID(prov, node), Provider: prov, Name: node}
	s.mu.RLock()
	n := s.nodeInfo[ref.ID]
	s.mu.RUnlock()
	ref.Address, ref.CPUs, ref.Memory = n.Address, n.Capacity.CPU, n.Capacity.Memory
	return ref
}

// releasedName reports whether instance id gave up its name: it is deleted
// or being deleted for good, or gone from the store.
func (s *records) releasedName(id string) bool {
	s.mu.RLock()
	defer s.mu.RUnlock()
	in := s.recs.get(id)
	return in == nil || !holdsName(in.Phase, in.After())
}

// sameNamespace reports whether instance id lives in namespace owner.
func (s *records) sameNamespace(id, owner string) bool {
	in, ok := s.get(id)
	return ok && in.Owner == owner
}

// get returns a copy of the cached instance id.
func (s *records) get(id string) (reconciler.Instance, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	in := s.recs.get(id)
	if in == nil {
		return reconciler.Instance{}, false
	}
	return in.instance(), true
}

// snapshot returns copies of the cached instances that keep returns true
// for.
func (s *records) snapshot(keep func(*rec) bool) []reconciler.Instance {
	s.mu.RLock()
	ptrs := make([]*rec, 0, 64)
	for in := range s.recs.all() {
		if keep == nil || keep(in) {
			ptrs = append(ptrs, in)
		}
	}
	// Cached records are replaced, never changed in place, so the pointers
	// stay valid after the lock is released.
	s.mu.RUnlock()
	slices.SortFunc(ptrs, func(a, b *rec) int {
		if c := cmp.Compare(a.created, b.created); c != 0 {
			return c
		}
		return cmp.Compare(a.ID, b.ID)
	})
	if len(ptrs) == 0 {
		return nil
	}
	out := make([]reconciler.Instance, len(ptrs))
	for i, in := range ptrs {
		out[i] = in.instance()
	}
	return out
}

// counts returns how many instances are in each phase.
func (s *records) counts() map[reconciler.Phase]int {
	s.mu.RLock()
	defer s.mu.RUnlock()
	out := make(map[reconciler.Phase]int, len(s.phases))
	for ph, n := range s.phases {
		if n > 0 {
			out[ph] = n
		}
	}
	return out
}

// find returns the instance with id ref, or else the instance that holds
// the name ref, or else the newest (by creation, then id) of the instances
// that were named ref, deleted or being deleted; in every namespace.
func (s *records) find(ref string) (reconciler.Instance, error) {
	return s.findIn(ref, Everywhere)
}

// findIn is find within sc. A name is looked up in each namespace of sc;
// a name that live instances hold in several of them is an error that
// names those namespaces (all of them in sc) and asks for the id.
func (s *records) findIn(ref string, sc Scope) (reconciler.Instance, error) {
	if ref == "" {
		return reconciler.Instance{}, &driver.FieldError{Path: "ref", Reason: "an instance id or name is required"}
	}
	if in, ok := s.get(ref); ok && sc.Has(in.Owner) {
		return in, nil
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	namespaces := sc.Namespaces
	if sc.All {
		namespaces = slices.Collect(maps.Keys(s.nameNS))
	}
	var held []string // namespaces where a live instance holds ref
	id := ""
	for _, ns := range namespaces {
		if hid, ok := s.nameHolderLocked(ns, ref); ok && !slices.Contains(held, ns) {
			held, id = append(held, ns), hid
		}
	}
	if len(held) > 1 {
		slices.Sort(held)
		return reconciler.Instance{}, &driver.FieldError{Path: "ref", Reason: fmt.Sprintf("instances named %q live in namespaces %s: give the instance's id", ref, strings.Join(held, ", "))}
	}
	if id != "" {
		if in := s.recs.get(id); in != nil {
			return in.instance(), nil
		}
	}
	var newest *rec
	for in := range s.recs.all() {
		if in.Name() != ref || !sc.Has(in.Owner) {
			continue
		}
		if newest == nil || in.created > newest.created || (in.created == newest.created && in.ID > newest.ID) {
			newest = in
		}
	}
	if newest != nil {
		return newest.instance(), nil
	}
	return reconciler.Instance{}, driver.Errorf(driver.ErrNotFound, "instance %q", ref)
}

// requestSpec returns the spec the instances of request id share, or nil.
func (s *records) requestSpec(id string) *driver.Spec {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if r := s.requests[id]; r != nil {
		return r.spec
	}
	return nil
}

// nameHolderLocked returns the id of the live instance (or submission in
// flight) that holds name in namespace owner. s.mu must be held.
func (s *records) nameHolderLocked(owner, name string) (string, bool) {
	if id, ok := s.names[nameKey{owner, name}]; ok {
		return id, true
	}
	if in := s.recs.get(name); in != nil && in.Owner == owner && in.Name() == name && holdsName(in.Phase, in.After()) {
		return name, true
	}
	return "", false
}

// claimNameLocked records that instance id holds key. s.mu must be held
// for writing.
func (s *records) claimNameLocked(key nameKey, id string) {
	if _, ok := s.names[key]; !ok {
		s.nameNS[key.owner]++
	}
	s.names[key] = id
}

// releaseNameLocked forgets key when instance id holds it. s.mu must be
// held for writing.
func (s *records) releaseNameLocked(key nameKey, id string) {
	if s.names[key] != id {
		return
	}
	delete(s.names, key)
	if s.nameNS[key.owner]--; s.nameNS[key.owner] <= 0 {
		delete(s.nameNS, key.owner)
	}
}

// putLocked caches in and keeps the indexes in step: names of live
// instances, what each owner, pool and provider holds, and the queue
// length. s.mu must be held for writing.
func (s *records) putLocked(inst *reconciler.Instance) {
	in := newRec(inst)
	if old := s.recs.get(in.ID); old != nil {
		s.countLocked(old, -1)
		if old.Owner != in.Owner || old.Name() != in.Name() {
			// A pool instance handed out changes namespace; a renamed
			// one, name.
			s.releaseNameLocked(nameKey{old.Owner, old.Name()}, in.ID)
		}
	}
	s.recs.put(in)
	s.countLocked(in, 1)
	key := nameKey{inst.Owner, inst.Name}
	if !holdsName(in.Phase, in.After()) || inst.Name == in.ID {
		// An instance named by its id holds its name through recs.
		s.releaseNameLocked(key, in.ID)
		return
	}
	s.claimNameLocked(key, in.ID)
}

// dropLocked forgets the cached instance in and its share of the
// indexes. s.mu must be held for writing.
func (s *records) dropLocked(in *rec) {
	s.countLocked(in, -1)
	s.releaseNameLocked(nameKey{in.Owner, in.Name()}, in.ID)
	s.recs.delete(in.ID)
}

// countLocked adds (sign 1) or removes (-1) in from the tallies.
func (s *records) countLocked(in *rec, sign int) {
	s.phases[in.Phase] += sign
	if in.Phase == reconciler.Pending {
		s.queued += sign
		if sign > 0 {
			s.pending[in.ID] = true
		} else {
			delete(s.pending, in.ID)
		}
	}
}

// pendingSnapshot returns copies of the pending instances that keep
// returns true for, like snapshot but without visiting the others.
func (s *records) pendingSnapshot(keep func(*rec) bool) []reconciler.Instance {
	s.mu.RLock()
	ptrs := make([]*rec, 0, len(s.pending))
	for id := range s.pending {
		if in := s.recs.get(id); in != nil && (keep == nil || keep(in)) {
			ptrs = append(ptrs, in)
		}
	}
	s.mu.RUnlock()
	slices.SortFunc(ptrs, func(a, b *rec) int {
		if c := cmp.Compare(a.created, b.created); c != 0 {
			return c
		}
		return cmp.Compare(a.ID, b.ID)
	})
	out := make([]reconciler.Instance, len(ptrs))
	for i, in := range ptrs {
		out[i] = in.instance()
	}
	return out
}

// reserveNames claims the names of recs in their namespaces, refusing
// names that a live instance (or a submission in flight) of the same
// namespace holds. The error names only that namespace's instance.
func (s *records) reserveNames(recs []*reconciler.Instance) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for k, in := range recs {
		if id, taken := s.nameHolderLocked(in.Owner, in.Name); taken {
			for _, done := range recs[:k] {
				s.releaseNameLocked(nameKey{done.Owner, done.Name}, done.ID)
			}
			return fmt.Errorf("%w: %w", driver.ErrAlreadyExists, &driver.FieldError{Path: "name", Reason: fmt.Sprintf("%q is in use by instance %s", in.Name, id)})
		}
		s.claimNameLocked(nameKey{in.Owner, in.Name}, in.ID)
	}
	return nil
}

// unreserveNames drops the claims of recs; the names of stored live
// instances stay claimed through the cache.
func (s *records) unreserveNames(recs []*reconciler.Instance) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, in := range recs {
		if cur := s.recs.get(in.ID); cur != nil && holdsName(cur.Phase, cur.After()) {
			continue
		}
		s.releaseNameLocked(nameKey{in.Owner, in.Name}, in.ID)
	}
}

// unclaimName drops the claim of instance id on name in namespace owner,
// if it holds one: a claim reserveNames made for a change that did not
// happen.
func (s *records) unclaimName(owner, name, id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.releaseNameLocked(nameKey{owner, name}, id)
}

// knows reports whether memory holds instance id at revision rev or later.
func (s *records) knows(id string, rev int64) bool {
	s.mu.RLock()
	defer s.mu.RUnlock()
	cur := s.recs.get(id)
	return cur != nil && cur.Revision >= rev
}

// passed records that the store watch delivered every change up to rev;
// called by the watch's goroutine only, it takes no lock.
func (s *records) passed(rev int64) { s.tombs.pass(rev) }

// watching records that a store watch starts delivering the changes after
// rev, or, with rev -1, that it has stopped (tombstones).
func (s *records) watching(rev int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if rev < 0 {
		s.tombs.stop()
		return
	}
	s.tombs.start(rev)
}
