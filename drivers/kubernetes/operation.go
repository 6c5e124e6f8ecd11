package kubernetes

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/berth-dev/berth/driver"
)

// Wait hints of an operation: while a request is in flight (most take a
// few milliseconds), and while it waits for the informer to show a change.
const (
	callWait  = 2 * time.Millisecond
	watchWait = 20 * time.Millisecond
)

// step is one part of an operation: either a request to the API server,
// which runs in the background, or a look at the informer cache, which
// never blocks. Either may return the instance as far as it is known.
type step struct {
	name  string
	call  func(ctx context.Context) (*driver.Instance, error)
	check func() (done bool, inst *driver.Instance, err error)
}

// machine is an operation made of steps. Advance starts a request and
// returns, or collects a finished one, or looks at the cache: it never
// waits for the server, so a few goroutines drive thousands of operations.
// When a step fails, the cleanup steps (if any) run before the operation
// reports the failure, so that a failed create leaves nothing behind; their
// outcome settles the error (see settled).
type machine struct {
	d     *Driver
	start func(s step) *driver.Call // runs a request under the operation's context
	ended func() error              // the operation's context's error
	// startCleanup runs a cleanup request: under the operation's context
	// without its end, since what a create abandoned must still go.
	startCleanup func(s step) *driver.Call
	cleanupBy    time.Time // when the cleanup gives up waiting

	mu       sync.Mutex
	steps    []step
	i        int
	cur      *driver.Call
	inst     *driver.Instance
	cleanup  []step
	cleaning bool
	failure  error
	err      error
	over     bool
}

// newMachine returns an operation bound to ctx, which bounds every step.
func (d *Driver) newMachine(ctx context.Context, steps ...step) *machine {
	m := &machine{d: d, steps: steps, ended: ctx.Err}
	m.start = func(s step) *driver.Call { return d.launch(ctx, s.name, s.call) }
	m.startCleanup = func(s step) *driver.Call { return d.launch(context.WithoutCancel(ctx), s.name, s.call) }
	return m
}

// launch runs fn in the background under ctx with the call timeout. Close
// cancels it and waits for it.
func (d *Driver) launch(ctx context.Context, name string, fn func(ctx context.Context) (*driver.Instance, error)) *driver.Call {
	return d.calls.Go(ctx, d.opts.CallTimeout, "kubernetes: "+name, fn)
}

// Advance runs the operation as far as it can without waiting.
func (m *machine) Advance(ctx context.Context) (driver.Progress, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for !m.over {
		list := m.steps
		if m.cleaning {
			list = m.cleanup
		}
		if m.i == len(list) {
			m.finish(nil)
			break
		}
		s := list[m.i]
		var inst *driver.Instance
		var err error
		if s.check != nil {
			var done bool
			done, inst, err = s.check()
			if inst != nil {
				m.inst = inst
			}
			if err == nil && !done {
				if cerr := m.stepEnded(); cerr != nil {
					err = fmt.Errorf("%w: kubernetes: %s: %w", driver.ErrTimeout, s.name, cerr)
				} else {
					return driver.Progress{Instance: m.inst, Wait: watchWait}, nil
				}
			}
		} else {
			if m.cur == nil {
				if m.cleaning {
					m.cur = m.startCleanup(s)
				} else {
					m.cur = m.start(s)
				}
			}
			if !m.cur.Finished() {
				return driver.Progress{Instance: m.inst, Wait: callWait}, nil
			}
			inst, err = m.cur.Inst, m.cur.Err
			m.cur = nil
			if inst != nil {
				m.inst = inst
			}
		}
		if err != nil {
			m.finish(err)
			continue
		}
		m.i++
	}
	if m.err != nil {
		return driver.Progress{Instance: m.inst}, m.err
	}
	return driver.Progress{Done: true, Instance: m.inst}, nil
}

// stepEnded says why waiting in a check step must stop: the operation's
// context ended or, in the cleanup, the call timeout passed.
func (m *machine) stepEnded() error {
	if m.cleaning {
		if time.Now().After(m.cleanupBy) {
			return context.DeadlineExceeded
		}
		return nil
	}
	return m.ended()
}

// finish ends the steps (err nil: all done) or the cleanup.
func (m *machine) finish(err error) {
	switch {
	case m.cleaning:
		m.err = settled(m.failure, err)
		if err != nil {
			m.d.log.Warn("kubernetes: cleanup after a failed create", "instance", instID(m.inst), "error", err)
		}
		m.over = true
	case err != nil && len(m.cleanup) > 0:
		m.failure, m.cleaning, m.i = err, true, 0
		m.cleanupBy = time.Now().Add(m.d.opts.CallTimeout)
	default:
		m.err, m.over = err, true
	}
}

// settled is the error of an operation whose step failed with failure and
// whose cleanup ended with cerr: a step cut off with ErrTimeout whose
// cleanup removed everything is reported ErrRetryable (nothing took
// effect), and a failure whose cleanup failed is reported ErrTimeout (the
// pod may be left, for List to find).
func settled(failure, cerr error) error {
	switch kind := driver.ClassOf(failure); {
	case cerr == nil && kind == driver.ErrTimeout:
		return driver.Errorf(driver.ErrRetryable, "%v; what was made is removed, nothing took effect", failure)
	case cerr != nil && kind != driver.ErrTimeout:
		return driver.Errorf(driver.ErrTimeout, "%v; the cleanup failed, so the pod may be left: %v", failure, cerr)
	}
	return failure
}

func instID(inst *driver.Instance) string {
	if inst == nil {
		return ""
	}
	return inst.ID
}
