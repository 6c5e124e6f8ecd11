package control

import (
	"slices"
	"sync/atomic"

	"github.com/berth-dev/berth/reconciler"
	"github.com/berth-dev/berth/scheduler"
)

// A change is one write of the store that committed: an instance's record
// as stored at revision rev, or its removal (in nil); or, with request
// set, a request's (req, or its removal when nil).
type change struct {
	id      string
	in      *reconciler.Instance
	request bool
	req     *storedRequest
	rev     int64
	// watched marks a change the store watch delivered: the watch has
	// passed rev.
	watched bool
	// placed marks a change committed by the one that placed it (txn's
	// placed): if it starts holding a node, the ledger already holds it.
	placed bool
}

// applyStored is the one way the store's records of instances and
// requests reach memory. Commit calls it once its transaction is stored,
// the store watch for every change it sees, a read-only plane for every
// change it follows, load at start-up, and reload and the resyncs for what
// they read again: a leader's memory and a follower's come out of the same
// code.
//
// It brings the records, their indexes and tallies, the names, the
// scheduler's ledger and the usage meter in step with cs, under the
// records' lock, so whoever reads the records sees the ledger that goes
// with them. The ledger follows from the records: an instance whose
// record starts holding a node holds its allocation (Cluster.Hold keeps
// the reservation its placement made; the commit of a placement by the
// one that placed it skips even that check, change.placed), one whose
// allocation changed (a resize, a pool instance handed out) holds the new
// one, one that stops holding a node or is removed gives it back.
//
// The same change may arrive twice (from commit and from the watch) and
// out of order (a lagging watch): a change not newer than what memory
// holds of its instance, or than the removal memory last applied
// (tombstones), is skipped. It returns the phases it changed.
func (s *state) applyStored(cs []change) []moved {
	var phases []moved
	var release []string
	var hold []scheduler.Allocation
	s.mu.Lock()
	defer s.mu.Unlock()
	var passed int64
	for _, c := range cs {
		if c.watched {
			passed = max(passed, c.rev)
		}
		if c.request {
			s.applyRequestLocked(c)
			continue
		}
		if c.in != nil {
			c.in.Revision = c.rev
		}
		cur := s.recs.get(c.id)
		if cur != nil && cur.Revision >= c.rev || cur == nil && s.tombs.covers(c.id, c.rev) {
			continue
		}
		if c.in == nil {
			if cur == nil {
				continue
			}
			if cur.Phase.HoldsNode() {
				release = append(release, c.id)
			}
			s.dropLocked(cur)
			s.tombs.add(c.id, c.rev)
			continue
		}
		held := cur != nil && cur.Phase.HoldsNode()
		switch holds := c.in.Phase.HoldsNode(); {
		case held && !holds:
			release = append(release, c.id)
		case holds && !held && c.placed:
			// Place reserved it a moment ago.
		case holds && (!held || allocationChanged(cur, c.in)):
			hold = append(hold, allocationOf(c.in))
		}
		if cur != nil && cur.Phase != c.in.Phase {
			phases = append(phases, moved{c.id, cur.Phase, c.in.Phase})
		}
		s.putLocked(c.in)
	}
	if passed > 0 {
		s.tombs.pass(passed)
	}
	for _, id := range release {
		s.cluster.release(id)
		s.meter.drop(id)
	}
	if len(hold) > 0 {
		if err := s.cluster.c.Hold(hold...); err != nil {
			s.log.Error("hold", "err", err)
		}
	}
	return phases
}

// allocationChanged reports whether in, which holds a node as old does,
// holds another allocation than old: another node, size, owner, name,
// priority or host ports. Specs are shared and never changed in place, so
// the same spec is the same size.
func allocationChanged(old *rec, in *reconciler.Instance) bool {
	if old.Provider != in.Provider || old.Node != in.Node || old.Owner != in.Owner || old.Pool != in.Pool ||
		old.Request != in.Request || old.Spec != in.Spec || old.Priority() != in.Priority || old.Name() != nameOf(in) ||
		old.Group() != in.Group {
		return true
	}
	var ports []int
	if old.cold != nil {
		ports = old.cold.hostPorts
	}
	return !slices.Equal(ports, in.HostPorts)
}

// nameOf returns in's name: its id when it has none.
func nameOf(in *reconciler.Instance) string {
	if in.Name == "" {
		return in.ID
	}
	return in.Name
}

// tombstones are the revisions at which instances were removed, kept while
// a watch may still deliver an older write of theirs: without them a
// lagging watch would bring a removed instance back. The store watch
// moves watched forward; removals it has passed are forgotten.
type tombstones struct {
	at map[string]int64
	// on is set while a watch runs; without one nothing older can
	// arrive, and no tombstone is kept.
	on bool
	// watched is the store revision the watch has delivered up to. Only
	// the watch's goroutine moves it, with no lock (pass); the records'
	// lock guards the rest.
	watched atomic.Int64
	// sweepAt is the size at which the next sweep runs.
	sweepAt int
}

// covers reports whether a write of id at rev is older than its removal.
func (t *tombstones) covers(id string, rev int64) bool {
	r, ok := t.at[id]
	return ok && rev <= r
}

// add keeps the removal of id at rev while a watch may still deliver
// older writes.
func (t *tombstones) add(id string, rev int64) {
	if !t.on || rev <= t.watched.Load() {
		return
	}
	if t.at == nil {
		t.at = map[string]int64{}
	}
	t.at[id] = rev
	if len(t.at) >= t.sweepAt {
		t.sweep()
	}
}

// start records that a watch delivers every change after rev.
func (t *tombstones) start(rev int64) {
	t.on = true
	t.watched.Store(rev)
}

// stop records that no watch runs any more.
func (t *tombstones) stop() {
	t.on, t.at, t.sweepAt = false, nil, 0
}

// pass records that the watch delivered every change up to rev.
func (t *tombstones) pass(rev int64) {
	if rev > t.watched.Load() {
		t.watched.Store(rev)
	}
}

// sweep forgets the removals the watch has passed.
func (t *tombstones) sweep() {
	for id, r := range t.at {
		if r <= t.watched.Load() {
			delete(t.at, id)
		}
	}
	t.sweepAt = 2*len(t.at) + 1024
}
