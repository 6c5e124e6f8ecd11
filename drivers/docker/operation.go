package docker

import (
	"context"
	"sync"
	"time"

	"github.com/berth-dev/berth/driver"
)

// stepWait is the Wait hint an operation gives while an Engine API call is
// in flight: short, because most calls take a few milliseconds.
const stepWait = 2 * time.Millisecond

// step is one Engine API call of an operation. It runs in the background;
// it may return the instance as far as it is known.
type step struct {
	name  string
	extra time.Duration // added to call_timeout (a stop's grace period)
	call  func(ctx context.Context) (*driver.Instance, error)
}

// machine is an operation made of steps, each an Engine API call that runs
// in the background while Advance only looks at whether it has finished. So
// Advance never blocks, whatever the engine's latency (a container start
// can take seconds), and one goroutine can drive thousands of operations.
// When a step fails, cleanup (if set) runs before the operation reports
// the failure, so a failed create leaves nothing behind. Its outcome settles
// the operation's error: a step cut off with ErrTimeout whose cleanup
// removed everything is reported ErrRetryable (nothing took effect), and a
// ErrRetryable failure whose cleanup failed is reported ErrTimeout (the
// container may be left, for List to find).
type machine struct {
	d     *Driver
	start func(s step) *driver.Call // runs a step under the operation's context

	mu       sync.Mutex
	steps    []step
	i        int
	cur      *driver.Call
	inst     *driver.Instance
	cleanup  *cleanup
	cleaning bool
	err      error
	over     bool
}

// cleanup undoes what the steps of a failed operation made. call gets the
// step's failure and returns nil only when nothing the operation made is
// left.
type cleanup struct {
	name string
	call func(ctx context.Context, failure error) error
}

// newMachine returns an operation on engine e bound to ctx, which bounds
// every step.
func (d *Driver) newMachine(ctx context.Context, e *engine, steps ...step) *machine {
	m := &machine{d: d, steps: steps}
	m.start = func(s step) *driver.Call { return d.launch(ctx, e, s) }
	return m
}

// launch runs s in the background under ctx once one of e's slots is free
// (max_in_flight), with the call timeout (and the step's extra time) from
// then. Close cancels it and waits for it.
func (d *Driver) launch(ctx context.Context, e *engine, s step) *driver.Call {
	return d.calls.GoAfter(ctx, e.slots, d.opts.CallTimeout+s.extra, s.name, s.call)
}

// Advance starts the next step or collects the finished one; it never
// waits for the engine.
func (m *machine) Advance(ctx context.Context) (driver.Progress, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for !m.over {
		if m.cur == nil {
			if m.i == len(m.steps) {
				m.over = true
				break
			}
			m.cur = m.start(m.steps[m.i])
		}
		if !m.cur.Finished() {
			return driver.Progress{Instance: m.inst, Wait: stepWait}, nil
		}
		c := m.cur
		m.cur = nil
		if c.Inst != nil {
			m.inst = c.Inst
		}
		switch {
		case m.cleaning:
			m.err = settled(m.err, c.Err)
			if c.Err != nil {
				m.d.log.Warn("cleanup after a failed create", "instance", instID(m.inst), "error", c.Err)
			}
			m.over = true
		case c.Err != nil:
			m.err = c.Err
			if cl := m.cleanup; cl != nil {
				m.cleaning = true
				failure := c.Err
				m.cur = m.start(step{name: cl.name, call: func(ctx context.Context) (*driver.Instance, error) {
					return nil, cl.call(ctx, failure)
				}})
				continue
			}
			m.over = true
		default:
			m.i++
		}
	}
	if m.err != nil {
		return driver.Progress{Instance: m.inst}, m.err
	}
	return driver.Progress{Done: true, Instance: m.inst}, nil
}

func isTimeout(err error) bool { return driver.ClassOf(err) == driver.ErrTimeout }

// settled is the error of an operation whose step failed with failure and
// whose cleanup ended with cerr.
func settled(failure, cerr error) error {
	switch kind := driver.ClassOf(failure); {
	case cerr == nil && kind == driver.ErrTimeout:
		return driver.Errorf(driver.ErrRetryable, "%v; what was made is removed, nothing took effect", failure)
	case cerr != nil && kind == driver.ErrRetryable:
		return driver.Errorf(driver.ErrTimeout, "%v; the cleanup failed, so the container may be left: %v", failure, cerr)
	}
	return failure
}

func instID(inst *driver.Instance) string {
	if inst == nil {
		return ""
	}
	return inst.ID
}
