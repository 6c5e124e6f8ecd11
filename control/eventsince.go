package control

import (
	"context"
	"errors"
	"fmt"

	"github.com/berth-dev/berth/store"
)

// revisionProbe is a prefix nothing is stored under: listing it answers
// the store's current revision and nothing else.
const revisionProbe = "/berth/revision-probe/"

// EventsHeld calls fn, as Events does, for every change of instances and
// nodes that the store still holds in its history, oldest first, then
// caughtUp once the changes made before the call are all given, then every
// change that follows, until ctx ends, and returns ctx's error then.
//
// How far back it reaches is the store's history: the embedded store
// (bbolt) holds the latest changes made since the server opened it, up to
// its History revisions and HistoryBytes; etcd the latest History
// revisions. A change held is the whole record as it was written, so
// its Updated says when the change was made; a deleted record says
// nothing but its id. A read-only plane answers it too: it reads only the
// store.
func (p *Plane) EventsHeld(ctx context.Context, caughtUp func(), fn func(Event)) error {
	var w store.Watcher
	var now int64
	for try := 0; ; try++ {
		from, cur, err := p.verbs.held(ctx)
		if err != nil {
			return err
		}
		now = cur
		w, err = p.verbs.st.Watch(ctx, "", from)
		if errors.Is(err, store.ErrCompacted) && try == 0 {
			continue // compacted in between: probe again
		}
		if err != nil {
			return fmt.Errorf("control: events held: %w", err)
		}
		if from >= now {
			caughtUp()
			now = -1
		}
		break
	}
	for ev := range w.Events() {
		if out, ok := p.verbs.eventOf(ctx, ev); ok {
			fn(out)
		}
		if now >= 0 && ev.KV.ModRevision >= now {
			caughtUp()
			now = -1
		}
	}
	err := w.Err()
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) || err == nil {
		return ctx.Err()
	}
	return err
}

// held returns the oldest revision a watch may start from (the changes
// after it are held) and the current revision. The store tells neither:
// the current is a listing's, the oldest is found by trying watches, a
// watch from before the history failing at once with store.ErrCompacted.
func (s verbs) held(ctx context.Context) (from, now int64, err error) {
	_, now, err = s.st.List(ctx, revisionProbe)
	if err != nil {
		return 0, 0, fmt.Errorf("control: events held: %w", err)
	}
	accepts := func(rev int64) (bool, error) {
		pctx, cancel := context.WithCancel(ctx)
		defer cancel()
		w, err := s.st.Watch(pctx, revisionProbe, rev)
		if errors.Is(err, store.ErrCompacted) {
			return false, nil
		}
		if err != nil {
			return false, fmt.Errorf("control: events held: %w", err)
		}
		cancel()
		for range w.Events() {
		}
		return true, nil
	}
	// The smallest revision in [1, now] a watch accepts; now always is.
	lo, hi := int64(1), max(now, 1)
	for lo < hi {
		mid := lo + (hi-lo)/2
		ok, err := accepts(mid)
		if err != nil {
			return 0, 0, err
		}
		if ok {
			hi = mid
		} else {
			lo = mid + 1
		}
	}
	return lo, now, nil
}
