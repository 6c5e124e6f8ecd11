package driver

import (
	"context"
	"errors"
	"sync"
	"time"
)

// ListCache shares one listing of a back-end among many callers: within TTL
// every caller gets the same result, and concurrent callers of an expired
// listing wait for a single fetch (Nodepool's shared, cached listings, so
// that thousands of polling state machines cost one API call).
type ListCache[T any] struct {
	// TTL is how long a listing stays fresh.
	TTL time.Duration
	// Fetch reads the listing from the back-end.
	Fetch func(ctx context.Context) (T, error)
	// Now is the clock; nil means time.Now.
	Now func() time.Time

	mu    sync.Mutex
	val   T
	at    time.Time
	valid bool
	call  *listCall[T] // the fetch in flight, if any
	gen   uint64       // bumped by Invalidate
}

type listCall[T any] struct {
	done chan struct{}
	val  T
	err  error
	gen  uint64 // the cache's gen when the fetch began
}

func (c *ListCache[T]) now() time.Time {
	if c.Now != nil {
		return c.Now()
	}
	return time.Now()
}

// Get returns the cached listing if fresh, or fetches it once for all
// concurrent callers, who all receive that fetch's result (unless it failed
// only because the fetching caller's context ended; then a waiter whose own
// context is live fetches again). A failed fetch is not cached. A caller
// that comes after Invalidate never gets a fetch that began before it.
func (c *ListCache[T]) Get(ctx context.Context) (T, error) {
	c.mu.Lock()
	if c.valid && c.now().Sub(c.at) < c.TTL {
		v := c.val
		c.mu.Unlock()
		return v, nil
	}
	if call := c.call; call != nil && call.gen == c.gen {
		c.mu.Unlock()
		select {
		case <-ctx.Done():
			var zero T
			return zero, ctx.Err()
		case <-call.done:
			// A fetch that ended because its caller's context ended says
			// nothing about the back-end: fetch again under this context.
			if isContextErr(call.err) && ctx.Err() == nil {
				return c.Get(ctx)
			}
			return call.val, call.err
		}
	}
	call := &listCall[T]{done: make(chan struct{}), gen: c.gen}
	c.call = call
	c.mu.Unlock()

	call.val, call.err = c.Fetch(ctx)

	c.mu.Lock()
	if call.err == nil && call.gen == c.gen {
		c.val, c.at, c.valid = call.val, c.now(), true
	}
	if c.call == call {
		c.call = nil
	}
	c.mu.Unlock()
	close(call.done)
	return call.val, call.err
}

// Invalidate forgets the cached listing, so the next Get fetches anew. Call
// it after a change the caller must see at once.
func (c *ListCache[T]) Invalidate() {
	c.mu.Lock()
	c.valid = false
	c.gen++
	c.mu.Unlock()
}

func isContextErr(err error) bool {
	return errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)
}
