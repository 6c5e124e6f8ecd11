package control

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/reconciler"
	"github.com/berth-dev/berth/scheduler"
	"github.com/berth-dev/berth/store"
)

// A txn is one change of the control plane's records. commit stores it in
// one store transaction and, once stored, brings memory and the
// scheduler's ledger in step with it. Every record write of the control
// plane is a txn: there is no other path from a decision to the store.
type txn struct {
	// puts are instance records to write, each compared at the revision it
	// was read at (0: a new instance, which must not exist yet).
	puts []instPut
	// dels are instance records to remove, compared at their Revision.
	dels []*reconciler.Instance
	// newReqs are requests to add, by id; none may exist yet. They enter
	// memory before the store (see commit).
	newReqs map[string]*storedRequest
	// dropReqs are the ids of requests to remove.
	dropReqs []string
	// newGroup is a group to add; it must not exist yet.
	newGroup *scheduler.Group
	// dropGroups are the ids of groups to remove.
	dropGroups []string
	// cmps and ops are writes of other records (node statuses, the
	// cluster's identity), with their comparisons.
	cmps []store.Cmp
	ops  []store.Op
	// placed marks the commit of placements the scheduler made: its puts
	// that start holding a node hold what Place reserved for them, and
	// applyStored leaves the ledger as it is for them instead of checking
	// each allocation under the records' lock.
	placed bool
}

// instPut is one instance record to write over the revision base.
type instPut struct {
	base int64
	in   *reconciler.Instance
}

// put adds the record in, read at revision base, to t.
func (t *txn) put(base int64, in *reconciler.Instance) {
	t.puts = append(t.puts, instPut{base: base, in: in})
}

// empty reports whether t changes nothing.
func (t *txn) empty() bool {
	return len(t.puts) == 0 && len(t.dels) == 0 && len(t.newReqs) == 0 && len(t.dropReqs) == 0 &&
		t.newGroup == nil && len(t.dropGroups) == 0 && len(t.ops) == 0
}

// commit stores t in one transaction through the plane's store, the only
// write path to it: a store that guards its writes (a leader's fence) sees
// every one of them. When a comparison fails it returns ok false and
// changes nothing (the caller reads again and decides again). When t is
// stored, applyStored brings memory and the scheduler's ledger in step
// with it (each put's in gets the new Revision), as the store watch would
// once it sees the change, and the log says which phases changed.
//
// New requests enter memory before the transaction and leave it again if
// it fails: once it commits, the store's watch may hand the new instances
// to the placer before commit returns, and the placer must find their
// requests then.
func (s *state) commit(ctx context.Context, t *txn) (ok bool, rev int64, err error) {
	if err := s.refuse(); err != nil {
		return false, 0, err
	}
	if t.empty() {
		return true, 0, nil
	}
	var added []string
	if len(t.newReqs) > 0 {
		s.mu.Lock()
		for id, sr := range t.newReqs {
			// An id already known is not touched: the transaction
			// refuses it.
			if _, known := s.requests[id]; !known {
				s.requests[id] = sr
				added = append(added, id)
			}
		}
		s.mu.Unlock()
	}
	forget := func() {
		if len(added) > 0 {
			s.mu.Lock()
			for _, id := range added {
				delete(s.requests, id)
			}
			s.mu.Unlock()
		}
	}
	cmps, ops, err := s.storeOps(t)
	if err != nil {
		forget()
		return false, 0, err
	}
	res, err := s.st.Txn(ctx, cmps, ops)
	if err != nil || !res.Succeeded {
		forget()
		if err != nil {
			return false, 0, fmt.Errorf("control: store: %w", err)
		}
		return false, res.Revision, nil
	}
	cs := make([]change, 0, len(t.puts)+len(t.dels)+len(t.dropReqs))
	for _, p := range t.puts {
		cs = append(cs, change{id: p.in.ID, in: p.in, rev: res.Revision, placed: t.placed})
	}
	for _, in := range t.dels {
		cs = append(cs, change{id: in.ID, rev: res.Revision})
	}
	for _, id := range t.dropReqs {
		cs = append(cs, change{id: id, request: true, rev: res.Revision})
	}
	for _, m := range s.applyStored(cs) {
		s.log.Debug("instance phase", "instance", m.id, "from", m.from, "to", m.to)
	}
	return true, res.Revision, nil
}

// moved is an instance whose phase a commit changed.
type moved struct {
	id       string
	from, to reconciler.Phase
}

// storeOps returns the comparisons and writes that store t.
func (s *state) storeOps(t *txn) ([]store.Cmp, []store.Op, error) {
	n := len(t.puts) + len(t.dels) + len(t.newReqs) + len(t.dropReqs) + len(t.dropGroups) + len(t.ops) + 1
	cmps := make([]store.Cmp, 0, n)
	ops := make([]store.Op, 0, n)
	if len(t.puts) > 0 {
		// The records leave out the specs their requests hold.
		shared := make([]*driver.Spec, len(t.puts))
		s.mu.RLock()
		for k, p := range t.puts {
			if r := s.requests[p.in.Request]; r != nil {
				shared[k] = r.spec
			}
		}
		s.mu.RUnlock()
		for k, p := range t.puts {
			key := PrefixInstances + p.in.ID
			b, err := encodeRecord(p.in, shared[k])
			if err != nil {
				return nil, nil, err
			}
			cmps = append(cmps, store.Cmp{Key: key, ModRevision: p.base})
			ops = append(ops, store.Put(key, b))
		}
	}
	for _, in := range t.dels {
		key := PrefixInstances + in.ID
		cmps = append(cmps, store.Cmp{Key: key, ModRevision: in.Revision})
		ops = append(ops, store.Delete(key))
	}
	for id, sr := range t.newReqs {
		b, err := json.Marshal(sr)
		if err != nil {
			return nil, nil, fmt.Errorf("control: encode request %s: %w", id, err)
		}
		cmps = append(cmps, store.Cmp{Key: PrefixRequests + id})
		ops = append(ops, store.Put(PrefixRequests+id, b))
	}
	for _, id := range t.dropReqs {
		ops = append(ops, store.Delete(PrefixRequests+id))
	}
	if g := t.newGroup; g != nil {
		b, err := json.Marshal(g)
		if err != nil {
			return nil, nil, fmt.Errorf("control: encode group %s: %w", g.ID, err)
		}
		cmps = append(cmps, store.Cmp{Key: PrefixGroups + g.ID})
		ops = append(ops, store.Put(PrefixGroups+g.ID, b))
	}
	for _, id := range t.dropGroups {
		ops = append(ops, store.Delete(PrefixGroups+id))
	}
	cmps = append(cmps, t.cmps...)
	ops = append(ops, t.ops...)

	return cmps, ops, nil
}
