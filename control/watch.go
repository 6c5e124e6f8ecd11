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

// external applies one watched change to the cache.
func (s *state) external(rt *runtime, ev store.Event) {
	id := ev.KV.Key[len(PrefixInstances):]
	if ev.Type == store.EventDelete {
		s.mu.Lock()
		if old, ok := s.recs[id]; ok && old.Revision < ev.KV.ModRevision {
			s.dropLocked(old)
		}
		s.mu.Unlock()
		return
	}
	// Most changes are this plane's own, cached already: skip them before
	// paying for the decoding.
	s.mu.RLock()
	cur, ok := s.recs[id]
	known := ok && cur.Revision >= ev.KV.ModRevision
	s.mu.RUnlock()
	if known {
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
