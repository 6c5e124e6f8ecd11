package control

import (
	"context"
	"errors"
	"strings"
	"time"

	"github.com/berth-dev/berth/store"
)

// watchStore follows changes of instances made by other writers of the
// store (another Berth server, an operator's tool): the cache takes the new
// record and the reconciler looks at the instance. The plane's own writes
// come back too and are skipped, since the cache already holds them.
func (s *state) watchStore(ctx context.Context, rt *runtime) {
	from := s.loadRev + 1
	s.watching(from - 1)
	defer s.watching(-1)
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

// external applies one watched change: most are this plane's own, in
// memory already (commit applied them), and are skipped before paying for
// the decoding; applyStored skips what memory holds a newer form of.
func (s *state) external(rt *runtime, ev store.Event) {
	id := ev.KV.Key[len(PrefixInstances):]
	if ev.Type == store.EventDelete {
		s.applyStored([]change{{id: id, rev: ev.KV.ModRevision, watched: true}})
		return
	}
	if s.knows(id, ev.KV.ModRevision) {
		s.passed(ev.KV.ModRevision)
		return
	}
	in, err := decodeRecord(ev.KV, s.requestSpec)
	if err != nil {
		s.log.Warn("store watch", "key", ev.KV.Key, "err", err)
		s.passed(ev.KV.ModRevision)
		return
	}
	s.applyStored([]change{{id: id, in: in, rev: ev.KV.ModRevision, watched: true}})
	s.runner.tickAt(rt, id, s.now())
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
	s.dropUnlisted(kvs, rev)
	return rev, nil
}

// dropUnlisted removes from memory the instances that a listing of every
// instance at revision rev, kvs, no longer holds.
func (s *state) dropUnlisted(kvs []store.KV, rev int64) {
	seen := make(map[string]bool, len(kvs))
	for _, kv := range kvs {
		seen[strings.TrimPrefix(kv.Key, PrefixInstances)] = true
	}
	var gone []change
	s.mu.RLock()
	for in := range s.recs.all() {
		if !seen[in.ID] && in.Revision <= rev {
			gone = append(gone, change{id: in.ID, rev: rev})
		}
	}
	s.mu.RUnlock()
	s.applyStored(gone)
	s.passed(rev)
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
