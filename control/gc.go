package control

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/berth-dev/berth/reconciler"
	"github.com/berth-dev/berth/store"
)

// gcBatch is how many records one collecting transaction removes at most.
const gcBatch = 512

// collector removes expired records (see collect) until ctx ends, checking
// ten times per Retention and at least once a minute, and at every
// SyncInterval when more than MaxRetained deleted instances are kept.
func (s *state) collector(ctx context.Context) {
	every := max(min(s.cfg.Retention/10, time.Minute), 10*time.Millisecond)
	t := time.NewTicker(every)
	defer t.Stop()
	capTick := time.NewTicker(s.cfg.SyncInterval)
	defer capTick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-capTick.C:
			s.mu.RLock()
			over := s.phases[reconciler.Deleted] > s.cfg.MaxRetained
			s.mu.RUnlock()
			if !over {
				continue
			}
		}
		if _, err := s.collect(ctx); err != nil && ctx.Err() == nil {
			s.log.Warn("collect deleted records", "err", err)
		}
	}
}

// collect removes from the store the records nobody needs any more and
// returns how many instance records went:
//   - deleted instances that have been deleted for Config.Retention, and
//     beyond Config.MaxRetained deleted instances the oldest ones at once;
//   - the request of which no instance record is left, and the group of
//     which no instance record is left and that does not wait in the gang
//     queue.
//
// Each removal compares the record's revision, so an instance changed
// meanwhile is kept. Instances in any other phase, failed ones included,
// are never removed.
func (s *state) collect(ctx context.Context) (int, error) {
	now := s.now()
	s.mu.RLock()
	var gone []*reconciler.Instance
	for _, in := range s.recs {
		if in.Phase == reconciler.Deleted {
			gone = append(gone, in)
		}
	}
	s.mu.RUnlock()
	slices.SortFunc(gone, func(a, b *reconciler.Instance) int {
		if c := a.Updated.Compare(b.Updated); c != 0 {
			return c
		}
		return cmp.Compare(a.ID, b.ID)
	})
	over := len(gone) - s.cfg.MaxRetained
	var expired []*reconciler.Instance
	for i, in := range gone {
		if i < over || now.Sub(in.Updated) >= s.cfg.Retention {
			expired = append(expired, in)
		}
	}
	removed := 0
	for len(expired) > 0 {
		chunk := expired[:min(gcBatch, len(expired))]
		expired = expired[len(chunk):]
		n, err := s.removeInstances(ctx, chunk)
		removed += n
		if err != nil {
			return removed, err
		}
	}
	return removed, nil
}

// removeInstances deletes the records of ins in one transaction that
// compares their revisions; should one have changed, each is tried on its
// own.
func (s *state) removeInstances(ctx context.Context, ins []*reconciler.Instance) (int, error) {
	cmps := make([]store.Cmp, len(ins))
	ops := make([]store.Op, len(ins))
	for i, in := range ins {
		cmps[i] = store.Cmp{Key: PrefixInstances + in.ID, ModRevision: in.Revision}
		ops[i] = store.Delete(PrefixInstances + in.ID)
	}
	res, err := s.st.Txn(ctx, cmps, ops)
	if err != nil {
		return 0, fmt.Errorf("control: remove deleted instances: %w", err)
	}
	if res.Succeeded {
		return len(ins), s.forget(ctx, ins, res.Revision)
	}
	if len(ins) == 1 {
		return 0, nil
	}
	n := 0
	for _, in := range ins {
		k, err := s.removeInstances(ctx, []*reconciler.Instance{in})
		n += k
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// forget drops removed instances from the cache unless it holds a newer
// record of them, then removes the records of their requests and groups
// that have no instance left. Request and group ids are unique while their
// record exists, so no instance of them can be in flight.
func (s *state) forget(ctx context.Context, ins []*reconciler.Instance, rev int64) error {
	s.mu.Lock()
	owners := map[string]bool{}
	for _, in := range ins {
		owners[PrefixRequests+in.Request] = true
		if in.Group != "" {
			owners[PrefixGroups+in.Group] = true
		}
		cur, ok := s.recs[in.ID]
		if !ok || cur.Revision > rev {
			continue
		}
		s.dropLocked(cur)
	}
	for _, in := range s.recs {
		delete(owners, PrefixRequests+in.Request)
		if in.Group != "" {
			delete(owners, PrefixGroups+in.Group)
		}
	}
	var ops []store.Op
	for key := range owners {
		if id, ok := strings.CutPrefix(key, PrefixRequests); ok {
			delete(s.requests, id)
			ops = append(ops, store.Delete(key))
		}
	}
	s.mu.Unlock()
	for key := range owners {
		if id, ok := strings.CutPrefix(key, PrefixGroups); ok && !s.gangQueued(id) {
			ops = append(ops, store.Delete(key))
		}
	}
	if len(ops) == 0 {
		return nil
	}
	if _, err := s.st.Txn(ctx, nil, ops); err != nil {
		return fmt.Errorf("control: remove requests and groups: %w", err)
	}
	return nil
}

// orphanRequests returns the ids of loaded requests none of whose
// instances has a record (left by a crash between removing the last
// instance and its request).
func (s *state) orphanRequests() []string {
	used := make(map[string]bool, len(s.requests))
	for _, in := range s.recs {
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
