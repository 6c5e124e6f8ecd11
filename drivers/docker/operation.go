package docker

import (
	"context"
	"sync"
	"time"

	"github.com/berth-dev/berth/driver"
)

// stepWait is the least Wait hint an operation gives while its steps wait
// for their slot or run (driver.Call.Wait): most Engine API calls take a
// few milliseconds.
const stepWait = 2 * time.Millisecond

// step is one Engine API call of an operation; it may return the instance
// as far as it is known.
type step struct {
	name  string
	extra time.Duration // added to call_timeout (a stop's grace period)
	call  func(ctx context.Context) (*driver.Instance, error)
}

// machine is an operation made of steps, each an Engine API call under
// call_timeout (and its extra time), that run one after another in the
// background while Advance only looks at how far they have got. So
// Advance never blocks, whatever the engine's latency (a container start
// can take seconds), and one goroutine can drive thousands of operations.
//
// The steps hold one of the engine's slots (max_in_flight) from the first
// to the last: an operation waits its turn once, and then runs to its
// end, so that with hundreds waiting a container is started as soon as it
// is made rather than after every waiting one has been made. Until it has
// its slot, Advance reports it Queued.
//
// When a step fails, cleanup (if set) runs before the operation reports
// the failure, so a failed create leaves nothing behind. Its outcome settles
// the operation's error: a step cut off with ErrTimeout whose cleanup
// removed everything is reported ErrRetryable (nothing took effect), and a
// ErrRetryable failure whose cleanup failed is reported ErrTimeout (the
// container may be left, for List to find).
type machine struct {
	d       *Driver
	ctx     context.Context // bounds every step
	e       *engine
	what    string // the operation, for an error
	steps   []step
	cleanup cleanup

	mu   sync.Mutex
	call *driver.Call     // the steps, in the background; nil until the first Advance
	inst *driver.Instance // as far as the steps have made it known
}

// cleanup undoes what the steps of a failed operation made: it gets the
// step's failure and returns nil only when nothing the operation made is
// left.
type cleanup func(ctx context.Context, failure error) error

// newMachine returns the operation what on engine e bound to ctx, which
// bounds every step.
func (d *Driver) newMachine(ctx context.Context, e *engine, what string, steps ...step) *machine {
	return &machine{d: d, ctx: ctx, e: e, what: what, steps: steps}
}

// Advance starts the steps, or reports how far they have got; it never
// waits for the engine.
func (m *machine) Advance(context.Context) (driver.Progress, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.call == nil {
		// Every step's time, and the cleanup's: the steps bound
		// themselves (run).
		total := m.d.opts.CallTimeout
		for _, s := range m.steps {
			total += m.d.opts.CallTimeout + s.extra
		}
		m.call = m.d.calls.GoAfter(m.ctx, m.e.slots, total, "engine "+m.e.cfg.Name+": "+m.what, m.run, nil)
	}
	if !m.call.Finished() {
		return driver.Progress{Instance: m.inst, Wait: m.call.Wait(stepWait), Queued: !m.call.Sent()}, nil
	}
	if m.call.Err != nil {
		return driver.Progress{Instance: m.inst}, m.call.Err
	}
	return driver.Progress{Done: true, Instance: m.inst}, nil
}

// run makes the steps one after another, each under its own timeout, and
// the cleanup after one that fails.
func (m *machine) run(ctx context.Context) (*driver.Instance, error) {
	for _, s := range m.steps {
		sctx, cancel := context.WithTimeout(ctx, m.d.opts.CallTimeout+s.extra)
		inst, err := s.call(sctx)
		cancel()
		m.mu.Lock()
		if inst != nil {
			m.inst = inst
		}
		inst = m.inst
		m.mu.Unlock()
		if err == nil {
			continue
		}
		if m.cleanup == nil {
			return inst, err
		}
		cctx, cancel := context.WithTimeout(ctx, m.d.opts.CallTimeout)
		cerr := m.cleanup(cctx, err)
		cancel()
		if cerr != nil {
			m.d.log.Warn("cleanup after a failed create", "instance", instID(inst), "step", s.name, "error", cerr)
		}
		return inst, settled(err, cerr)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.inst, nil
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
