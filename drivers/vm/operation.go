package vm

import (
	"context"
	"sync"
	"time"

	"github.com/berth-dev/berth/driver"
)

// stepWait is the Wait hint of an operation whose step is in flight.
const stepWait = 50 * time.Millisecond

// step is one blocking part of an operation (a libvirt call, qemu-img, the
// wait for the ready line); it runs in the background.
type step struct {
	name string
	call func(ctx context.Context) error
}

// machine is an operation made of steps, each run in its own goroutine
// while Advance only looks at whether it has finished: Advance never
// blocks. When a step fails, cleanup runs before the failure is reported
// (unless the first step failed without acting), so a failed create leaves
// nothing behind; final, when set, reads the
// instance once every step is done.
type machine struct {
	d       *Driver
	ctx     context.Context
	id      string
	cleanup func(ctx context.Context) error
	final   func(ctx context.Context) (*driver.Instance, error)

	mu    sync.Mutex
	steps []step
	i     int
	cur   chan error
	phase int // 0 steps, 1 cleanup, 2 final, 3 over
	inst  *driver.Instance
	err   error
	// finalInst is what final read, set by its goroutine.
	finalInst *driver.Instance
}

func (d *Driver) newMachine(ctx context.Context, id string, steps ...step) *machine {
	return &machine{d: d, ctx: ctx, id: id, steps: steps, inst: &driver.Instance{ID: id, State: driver.StateCreating}}
}

// launch runs fn in the background under the operation's context; the
// driver's Close waits for it.
func (m *machine) launch(fn func(ctx context.Context) error) chan error {
	ch := make(chan error, 1)
	if !m.d.track() {
		ch <- driver.Errorf(driver.ErrTimeout, "vm: the driver was closed; the operation was abandoned")
		return ch
	}
	go func() {
		defer m.d.calls.Done()
		ch <- fn(m.ctx)
	}()
	return ch
}

// Advance starts the next step or collects the finished one.
func (m *machine) Advance(context.Context) (driver.Progress, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for m.phase < 3 {
		if m.cur == nil {
			switch {
			case m.phase == 0 && m.i < len(m.steps):
				m.cur = m.launch(m.steps[m.i].call)
			case m.phase == 0:
				m.phase = 2
				continue
			case m.phase == 2 && m.final != nil:
				m.cur = m.launch(func(ctx context.Context) error {
					inst, err := m.final(ctx)
					m.finalInst = inst // read once the channel has answered
					return err
				})
			default:
				m.phase = 3
				continue
			}
		}
		var err error
		select {
		case err = <-m.cur:
		default:
			return driver.Progress{Instance: m.inst, Wait: stepWait}, nil
		}
		m.cur = nil
		switch m.phase {
		case 0:
			if err == nil {
				m.i++
				continue
			}
			m.err = classifyStep(m.steps[m.i].name, err)
			// A first step that failed for sure made nothing to clean up.
			if m.cleanup == nil || m.i == 0 && driver.ClassOf(m.err) != driver.ErrTimeout {
				m.phase = 3
				continue
			}
			m.phase = 1
			m.cur = m.launch(m.cleanup)
		case 1:
			if err != nil && !isNotFound(err) {
				m.d.log.Warn("cleanup after a failed create", "instance", m.id, "error", err)
				if driver.ClassOf(m.err) == driver.ErrRetryable {
					m.err = driver.Errorf(driver.ErrTimeout, "%v; the cleanup failed, so the domain may be left: %v", m.err, err)
				}
			}
			m.phase = 3
		case 2:
			if err == nil {
				m.inst = m.finalInst
			}
			m.err = err
			m.phase = 3
		}
	}
	if m.err != nil {
		return driver.Progress{Instance: m.inst}, m.err
	}
	return driver.Progress{Done: true, Instance: m.inst}, nil
}

func isNotFound(err error) bool { return driver.ClassOf(err) == driver.ErrNotFound }

// classifyStep gives a step's unclassified failure (a file that could not
// be written) a class: ErrPermanent, naming the step.
func classifyStep(name string, err error) error {
	if driver.ClassOf(err) != nil {
		return err
	}
	return driver.Errorf(driver.ErrPermanent, "vm: %s: %v", name, err)
}
