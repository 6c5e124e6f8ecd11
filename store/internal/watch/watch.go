// Package watch runs store watches for implementations that keep their own
// change history. A watch reads the history from its position forward, sends
// what it finds, and sleeps until the store signals a commit; the history is
// the watch's buffer, so a slow reader never loses events, and a reader that
// falls behind the history's start ends with store.ErrCompacted.
package watch

import (
	"context"
	"errors"
	"sync"

	"github.com/berth-dev/berth/store"
)

// Source is a store's committed history.
type Source interface {
	// Revisions returns the compact revision (history holds every change
	// made after it) and the current revision.
	Revisions() (compact, current int64, err error)
	// Changes returns the changes to keys with prefix at revisions in
	// (after, through], oldest first, where through is the highest revision
	// read: at most after+limit and at most the current revision, but never
	// less than after. It returns store.ErrCompacted when after is older
	// than the compact revision and store.ErrClosed after Close.
	Changes(prefix string, after int64, limit int) (events []store.Event, through int64, err error)
}

// batchRevisions is how many revisions a watch reads at once.
const batchRevisions = 256

// Hub wakes a store's watches on commit and ends them on Close.
type Hub struct {
	mu     sync.Mutex
	wake   chan struct{}
	closed bool
	done   chan struct{}
	wg     sync.WaitGroup
}

// NewHub returns a hub with no watches.
func NewHub() *Hub {
	return &Hub{wake: make(chan struct{}), done: make(chan struct{})}
}

// Notify wakes every watch to read the history again. Stores call it after
// each commit that changed something.
func (h *Hub) Notify() {
	h.mu.Lock()
	close(h.wake)
	h.wake = make(chan struct{})
	h.mu.Unlock()
}

func (h *Hub) waitChan() chan struct{} {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.wake
}

// Close ends every watch with store.ErrClosed and waits for their
// goroutines to return. It is safe to call more than once.
func (h *Hub) Close() {
	h.mu.Lock()
	if !h.closed {
		h.closed = true
		close(h.done)
	}
	h.mu.Unlock()
	h.wg.Wait()
}

// Start validates fromRev, resolves 0 to the current revision and starts a
// watch of prefix on src. It returns store.ErrCompacted when fromRev is
// older than src's history and store.ErrClosed after Close.
func (h *Hub) Start(ctx context.Context, src Source, prefix string, fromRev int64) (store.Watcher, error) {
	if err := store.ValidateFromRev(fromRev); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	compact, current, err := src.Revisions()
	if err != nil {
		return nil, err
	}
	if fromRev == 0 {
		fromRev = current
	}
	if fromRev < compact {
		return nil, store.ErrCompacted
	}
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return nil, store.ErrClosed
	}
	h.wg.Add(1)
	h.mu.Unlock()
	w := &watcher{ch: make(chan store.Event)}
	go func() {
		defer h.wg.Done()
		w.run(ctx, h, src, prefix, fromRev)
	}()
	return w, nil
}

type watcher struct {
	ch  chan store.Event
	mu  sync.Mutex
	err error
}

func (w *watcher) Events() <-chan store.Event { return w.ch }

func (w *watcher) Err() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.err
}

func (w *watcher) run(ctx context.Context, h *Hub, src Source, prefix string, pos int64) {
	err := w.loop(ctx, h, src, prefix, pos)
	if ctx.Err() != nil {
		err = ctx.Err()
	}
	w.mu.Lock()
	w.err = err
	w.mu.Unlock()
	close(w.ch)
}

func (w *watcher) loop(ctx context.Context, h *Hub, src Source, prefix string, pos int64) error {
	for {
		// Take the wake channel before reading, so a commit between the read
		// and the wait is never missed.
		wake := h.waitChan()
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-h.done:
			return store.ErrClosed
		default:
		}
		events, through, err := src.Changes(prefix, pos, batchRevisions)
		if err != nil {
			if errors.Is(err, store.ErrClosed) {
				return store.ErrClosed
			}
			return err
		}
		for _, ev := range events {
			select {
			case w.ch <- ev:
			case <-ctx.Done():
				return ctx.Err()
			case <-h.done:
				return store.ErrClosed
			}
		}
		if through > pos {
			pos = through
			continue
		}
		select {
		case <-wake:
		case <-ctx.Done():
			return ctx.Err()
		case <-h.done:
			return store.ErrClosed
		}
	}
}
