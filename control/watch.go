package control

import (
	"context"
	"errors"
	"time"

	"github.com/berth-dev/berth/store"
)

// watchStore follows changes of instances made by other writers of the
// store (another Berth server, an operator's tool): the cache takes the new
// record and the reconciler looks at the instance. The plane's own writes
// come back too and are skipped, since the cache already holds them.
func (s *state) watchStore(ctx context.Context, rt *runtime) {
	from := s.loadRev + 1
	for ctx.Err() == nil {
		w, err := s.st.Watch(ctx, PrefixInstances, from)
		if err != nil {
			if ctx.Err() == nil {
				s.log.Warn("store watch", "err", err)
				sleep(ctx, time.Second)
			}
			continue
		}
		for ev := range w.Events() {
			from = ev.KV.ModRevision + 1
			s.external(rt, ev)
		}
		switch err := w.Err(); {
		case ctx.Err() != nil:
			return
		case errors.Is(err, store.ErrCompacted):
			// Too far behind: read everything again.
			if rev, err := s.resync(ctx, rt); err == nil {
				from = rev + 1
			}
		default:
			s.log.Warn("store watch ended", "err", err)
			sleep(ctx, time.Second)
		}
	}
}

// external applies one watched change to the cache. A change of this
// plane's own may be watched before its commit has brought memory and the
// ledger in step: external waits for the commits in flight first, so that
// its record, deleted say, is never seen before the ledger has released
// what it held.
func (s *state) external(rt *runtime, ev store.Event) {
	id := ev.KV.Key[len(PrefixInstances):]
	if !s.knows(id, ev.KV.ModRevision) {
		s.committing.Lock() // waits for the commits in flight
		s.committing.Unlock()
	}
	if ev.Type == store.EventDelete {
		s.mu.Lock()
		if old := s.recs.get(id); old != nil && old.Revision < ev.KV.ModRevision {
			s.dropLocked(old)
		}
		s.mu.Unlock()
		return
	}
	// Most changes are this plane's own, cached already: skip them before
	// paying for the decoding.
	if s.knows(id, ev.KV.ModRevision) {
		return
	}
	in, err := decodeRecord(ev.KV, s.requestSpec)
	if err != nil {
		s.log.Warn("store watch", "key", ev.KV.Key, "err", err)
		return
	}
	s.remember(*in)
	s.tickAt(rt, id, s.now())
}

// knows reports whether memory holds instance id at revision rev or later.
func (s *state) knows(id string, rev int64) bool {
	s.mu.RLock()
	defer s.mu.RUnlock()
	cur := s.recs.get(id)
	return cur != nil && cur.Revision >= rev
}

// resync reloads every instance after the watch fell too far behind.
func (s *state) resync(ctx context.Context, rt *runtime) (int64, error) {
	kvs, rev, err := s.st.List(ctx, PrefixInstances)
	if err != nil {
		return 0, err
	}
	for _, kv := range kvs {
		s.external(rt, store.Event{Type: store.EventPut, KV: kv})
	}
	return rev, nil
}

// sleep waits d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
