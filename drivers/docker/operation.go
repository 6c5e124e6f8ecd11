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
// When a step fails with anything but ErrTimeout, cleanup (if set) runs
// before the operation reports the failure, so a failed create leaves
// nothing behind; after ErrTimeout the outcome is unknown and the container
// is left for List to find.
type machine struct {
	d     *Driver
	start func(s step) *call // runs a step under the operation's context

	mu       sync.Mutex
	steps    []step
	i        int
	cur      *call
	inst     *driver.Instance
	cleanup  *step
	cleaning bool
	err      error
	over     bool
}

// call is one background Engine API call.
type call struct {
	done chan struct{}
	inst *driver.Instance
	err  error
}

func (c *call) finished() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

// newMachine returns an operation bound to ctx, which bounds every step.
func (d *Driver) newMachine(ctx context.Context, steps ...step) *machine {
	m := &machine{d: d, steps: steps}
	m.start = func(s step) *call { return d.launch(ctx, s) }
	return m
}

// launch runs s in its own goroutine under ctx with the call timeout. Close
// cancels it and waits for it.
func (d *Driver) launch(ctx context.Context, s step) *call {
	c := &call{done: make(chan struct{})}
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		c.err = driver.Errorf(driver.ErrTimeout, "%s: the driver was closed; the operation was abandoned", s.name)
		close(c.done)
		return c
	}
	id := d.nextCall
	d.nextCall++
	cctx, cancel := context.WithTimeout(ctx, d.opts.CallTimeout+s.extra)
	d.calls[id] = cancel
	d.callWG.Add(1)
	d.mu.Unlock()
	go func() {
		defer d.callWG.Done()
		c.inst, c.err = s.call(cctx)
		d.mu.Lock()
		delete(d.calls, id)
		d.mu.Unlock()
		cancel()
		close(c.done)
	}()
	return c
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
		if !m.cur.finished() {
			return driver.Progress{Instance: m.inst, Wait: stepWait}, nil
		}
		c := m.cur
		m.cur = nil
		if c.inst != nil {
			m.inst = c.inst
		}
		switch {
		case m.cleaning:
			if c.err != nil {
				m.d.log.Warn("cleanup after a failed create", "instance", instID(m.inst), "error", c.err)
			}
			m.over = true
		case c.err != nil:
			m.err = c.err
			if m.cleanup != nil && !isTimeout(c.err) {
				m.cleaning = true
				m.cur = m.start(*m.cleanup)
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

func isTimeout(err error) bool { return driver.KindOf(err) == driver.ErrTimeout }

func instID(inst *driver.Instance) string {
	if inst == nil {
		return ""
	}
	return inst.ID
}
