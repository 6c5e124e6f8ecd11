package driver

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// Calls runs a driver's background calls: each in a goroutine of its own,
// under its own deadline, so that an Operation's Advance only looks at
// whether one has finished and never waits for the back-end. Cancel ends
// the calls in flight and refuses new ones (a driver's Close); Wait waits
// for them. The zero value is ready to use.
type Calls struct {
	mu      sync.Mutex
	closed  bool
	cancels map[uint64]context.CancelFunc
	next    uint64
	wg      sync.WaitGroup
}

// Call is one background call. Inst and Err are set once Finished.
type Call struct {
	done  chan struct{}
	sent  atomic.Bool
	began time.Time
	Inst  *Instance
	Err   error
}

// Sent reports whether the call has been made: false while it waits for
// its slot (GoAfter), and for one that ended without being made.
func (c *Call) Sent() bool { return c.sent.Load() }

// Wait is the Wait hint of an operation waiting on the call: a tenth of the
// time the call has taken so far (waiting for its slot, then running), at
// least least and at most 100 ms, so that a quick call is seen soon and
// hundreds waiting their turn cost their caller little.
func (c *Call) Wait(least time.Duration) time.Duration {
	return min(max(time.Since(c.began)/10, least), 100*time.Millisecond)
}

// Finished reports whether the call has returned.
func (c *Call) Finished() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

// Go runs fn in its own goroutine under ctx and timeout. After Cancel it
// runs nothing and returns a call finished with ErrTimeout naming what
// (the operation is abandoned, and may or may not have taken effect).
func (cs *Calls) Go(ctx context.Context, timeout time.Duration, what string, fn func(ctx context.Context) (*Instance, error)) *Call {
	return cs.GoAfter(ctx, nil, timeout, what, fn, nil)
}

// GoAfter is Go for a call that first takes a slot of slots, a semaphore
// shared by calls that must not all run at once (nil: none): the call
// waits for a free slot in its goroutine, its timeout starts once it has
// one, and the slot is given back when fn returns. A call whose ctx ends,
// or that Cancel reaches, while it waits ends with ErrRetryable: nothing
// was sent, and unsent (if set) runs in fn's place, before the call is
// Finished, to undo what was made ready for fn.
func (cs *Calls) GoAfter(ctx context.Context, slots chan struct{}, timeout time.Duration, what string, fn func(ctx context.Context) (*Instance, error), unsent func()) *Call {
	c := &Call{done: make(chan struct{}), began: time.Now()}
	cs.mu.Lock()
	if cs.closed {
		cs.mu.Unlock()
		c.Err = Errorf(ErrTimeout, "%s: the driver was closed; the operation was abandoned", what)
		close(c.done)
		return c
	}
	if cs.cancels == nil {
		cs.cancels = map[uint64]context.CancelFunc{}
	}
	id := cs.next
	cs.next++
	cctx, cancel := context.WithCancel(ctx)
	cs.cancels[id] = cancel
	cs.wg.Add(1)
	cs.mu.Unlock()
	go func() {
		defer cs.wg.Done()
		defer close(c.done)
		defer func() {
			cs.mu.Lock()
			delete(cs.cancels, id)
			cs.mu.Unlock()
			cancel()
		}()
		if slots != nil {
			select {
			case slots <- struct{}{}:
				defer func() { <-slots }()
			case <-cctx.Done():
			}
			// A slot freed by the same Cancel (which marks cs closed
			// before it cancels anything) may be taken before this call
			// is cancelled: the end wins either way.
			cs.mu.Lock()
			closed := cs.closed
			cs.mu.Unlock()
			if err := cctx.Err(); err != nil || closed {
				c.Err = Errorf(ErrRetryable, "%s: not sent, it was still waiting for its turn when the call was cancelled", what)
				if unsent != nil {
					unsent()
				}
				return
			}
		}
		tctx, tcancel := context.WithTimeout(cctx, timeout)
		defer tcancel()
		c.sent.Store(true)
		c.Inst, c.Err = fn(tctx)
	}()
	return c
}

// Cancel cancels every call in flight and makes Go refuse new ones.
func (cs *Calls) Cancel() {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	cs.closed = true
	for _, cancel := range cs.cancels {
		cancel()
	}
}

// Wait waits until every call has returned.
func (cs *Calls) Wait() { cs.wg.Wait() }
