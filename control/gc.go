package control

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/berth-dev/berth/reconciler"
)

// gcBatch is how many records one collecting transaction removes at most.
const gcBatch = 512

// collector removes expired records (see collect) until ctx ends, checking
// ten times per Retention and at least once a minute, and at every
// SyncInterval when more than MaxRetained deleted instances are kept.
func (s syncer) collector(ctx context.Context) {
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
func (s syncer) collect(ctx context.Context) (int, error) {
	now := s.now()
	s.mu.RLock()
	var gone []*rec
	for in := range s.recs.all() {
		if in.Phase == reconciler.Deleted {
			gone = append(gone, in)
		}
	}
	s.mu.RUnlock()
	slices.SortFunc(gone, func(a, b *rec) int {
		if c := cmp.Compare(a.updated, b.updated); c != 0 {
			return c
		}
		return cmp.Compare(a.ID, b.ID)
	})
	over := len(gone) - s.cfg.MaxRetained
	var expired []*reconciler.Instance
	for i, in := range gone {
		if i < over || now.Sub(in.Updated()) >= s.cfg.Retention {
			x := in.instance()
			expired = append(expired, &x)
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
func (s syncer) removeInstances(ctx context.Context, ins []*reconciler.Instance) (int, error) {
	ok, _, err := s.commit(ctx, &txn{dels: ins})
	if err != nil {
		return 0, fmt.Errorf("control: remove deleted instances: %w", err)
	}
	if ok {
		return len(ins), s.forget(ctx, ins)
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

// forget removes the records of the requests and groups of removed
// instances ins that have no instance left. Request and group ids are
// unique while their record exists, so no instance of them can be in
// flight.
func (s syncer) forget(ctx context.Context, ins []*reconciler.Instance) error {
	t := &txn{}
	reqs := map[string]bool{}
	groups := map[string]bool{}
	for _, in := range ins {
		reqs[in.Request] = true
		if in.Group != "" {
			groups[in.Group] = true
		}
	}
	s.mu.RLock()
	for in := range s.recs.all() {
		delete(reqs, in.Request)
		if in.Group() != "" {
			delete(groups, in.Group())
		}
	}
	s.mu.RUnlock()
	for id := range reqs {
		t.dropReqs = append(t.dropReqs, id)
	}
	for id := range groups {
		if !s.admitter.gangQueued(id) {
			t.dropGroups = append(t.dropGroups, id)
		}
	}
	if _, _, err := s.commit(ctx, t); err != nil {
		return fmt.Errorf("control: remove requests and groups: %w", err)
	}
	return nil
}
