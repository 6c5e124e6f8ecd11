package control

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/store"
)

// ErrReadOnly is what every method of a read-only plane (Config.ReadOnly)
// that would change state or reach a back-end returns. It matches
// driver.ErrRetryable: the leader answers the same request.
var ErrReadOnly = fmt.Errorf("%w: this server does not lead: it only serves reads from its copy of the state; send the request to the leader", driver.ErrRetryable)

// refuse returns ErrReadOnly when the plane only reads.
func (s *state) refuse() error {
	if s.cfg.ReadOnly {
		return ErrReadOnly
	}
	return nil
}

// follower is what a read-only plane keeps while it follows the store.
type follower struct {
	// rev is the store revision the records reflect: every change of
	// instances and requests up to it is in memory.
	rev atomic.Int64
}

// Followed returns the store revision the plane's records reflect: every
// change of instances and requests up to it is in memory. A read-only
// plane (Config.ReadOnly) moves it forward as Run follows the store's
// watch; any other plane reports the revision it loaded.
func (p *Plane) Followed() int64 {
	if r := p.follow.rev.Load(); r > 0 {
		return r
	}
	return p.loadRev
}

// Current reports whether in, as a read-only plane (Config.ReadOnly)
// answered it, is the record the store holds now: one read of its key.
// The copy follows the store's watch, a little behind it; a reader that
// must see every change made before it asked (a client reading what it
// just changed through the leader) answers from the copy only when it
// is current, and asks the leader otherwise. A plane that writes holds
// the store's records itself: always true.
func (p *Plane) Current(ctx context.Context, in Instance) (bool, error) {
	if !p.cfg.ReadOnly {
		return true, nil
	}
	kv, err := p.verbs.st.Get(ctx, PrefixInstances+in.ID)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return false, nil
	case err != nil:
		return false, err
	}
	return kv.ModRevision == in.Revision, nil
}

// ReadOnly reports whether the plane only reads (Config.ReadOnly).
func (p *Plane) ReadOnly() bool { return p.cfg.ReadOnly }

// followStore is Run for a read-only plane: it follows every change of
// instances and requests in the store, keeping the records and the
// scheduler's ledger (what quotas report) in step, until ctx ends. It
// acts on nothing and writes nothing.
func (s *state) followStore(ctx context.Context) {
	from := s.loadRev + 1
	s.watching(from - 1)
	defer s.watching(-1)
	for ctx.Err() == nil {
		w, err := s.st.Watch(ctx, "/berth/", from)
		if err != nil {
			if ctx.Err() == nil {
				s.log.Warn("store watch", "err", err)
				sleep(ctx, time.Second)
			}
			continue
		}
		for ev := range w.Events() {
			from = ev.KV.ModRevision + 1
			s.followed(ctx, ev)
			s.follow.rev.Store(ev.KV.ModRevision)
		}
		switch err := w.Err(); {
		case ctx.Err() != nil:
			return
		case errors.Is(err, store.ErrCompacted):
			// Too far behind: read everything again.
			if rev, err := s.refollow(ctx); err == nil {
				from = rev + 1
				s.follow.rev.Store(rev)
			}
		default:
			s.log.Warn("store watch ended", "err", err)
			sleep(ctx, time.Second)
		}
	}
}

// followed applies one watched change of a request or an instance.
func (s *state) followed(ctx context.Context, ev store.Event) {
	key, rev := ev.KV.Key, ev.KV.ModRevision
	c := change{rev: rev, watched: true}
	switch {
	case strings.HasPrefix(key, PrefixRequests):
		c.id, c.request = strings.TrimPrefix(key, PrefixRequests), true
		if ev.Type == store.EventPut {
			r, err := decodeRequest(ev.KV)
			if err != nil {
				s.log.Warn("store watch", "key", key, "err", err)
				s.passed(rev)
				return
			}
			c.req = r
		}
	case strings.HasPrefix(key, PrefixInstances):
		c.id = strings.TrimPrefix(key, PrefixInstances)
		if ev.Type == store.EventPut {
			in, err := decodeRecord(ev.KV, s.specOf(ctx, true))
			if err != nil {
				s.log.Warn("store watch", "key", key, "err", err)
				s.passed(rev)
				return
			}
			c.in = in
		}
	default:
		s.passed(rev)
		return
	}
	s.applyStored([]change{c})
}

// specOf returns the spec of the instances of a request, read from the
// store when memory does not hold the request yet (a read-only plane may
// see an instance before its request: they are written in one
// transaction, the instance first). keep keeps a request so read in
// memory, for the goroutine that follows the store only.
func (s *state) specOf(ctx context.Context, keep bool) func(string) *driver.Spec {
	return func(id string) *driver.Spec {
		if spec := s.requestSpec(id); spec != nil || !s.cfg.ReadOnly || id == "" {
			return spec
		}
		kv, err := s.st.Get(ctx, PrefixRequests+id)
		if err != nil {
			return nil
		}
		r, err := decodeRequest(kv)
		if err != nil {
			return nil
		}
		if !keep {
			return r.spec
		}
		s.applyStored([]change{{id: id, request: true, req: r, rev: kv.ModRevision}})
		return s.requestSpec(id)
	}
}

// decodeRequest reads a request stored under PrefixRequests and checks
// its invariants (checkStoredRequest).
func decodeRequest(kv store.KV) (*storedRequest, error) {
	var r storedRequest
	if err := json.Unmarshal(kv.Value, &r); err != nil {
		return nil, fmt.Errorf("control: decode %s: %w", kv.Key, err)
	}
	if err := checkStoredRequest(&r); err != nil {
		return nil, fmt.Errorf("control: decode %s: %w", kv.Key, err)
	}
	r.spec = r.instanceSpec()
	return &r, nil
}

// refollow reads every request and instance again after the watch fell
// too far behind, and forgets the instances the store no longer holds.
func (s *state) refollow(ctx context.Context) (int64, error) {
	kvs, _, err := s.st.List(ctx, PrefixRequests)
	if err != nil {
		return 0, err
	}
	for _, kv := range kvs {
		s.followed(ctx, store.Event{Type: store.EventPut, KV: kv})
	}
	kvs, rev, err := s.st.List(ctx, PrefixInstances)
	if err != nil {
		return 0, err
	}
	for _, kv := range kvs {
		s.followed(ctx, store.Event{Type: store.EventPut, KV: kv})
	}
	s.dropUnlisted(kvs, rev)
	return rev, nil
}
