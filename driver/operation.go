package driver

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// Async adapts a back-end whose create or delete is one blocking call into an
// Operation: fn runs in its own goroutine under ctx and Advance only checks
// whether it has finished. fn must return when ctx ends. A deadline or
// cancellation of ctx is reported as ErrTimeout, because the back-end may
// have acted.
func Async(ctx context.Context, fn func(ctx context.Context) (*Instance, error)) Operation {
	op := &asyncOp{done: make(chan struct{})}
	go func() {
		defer close(op.done)
		inst, err := fn(ctx)
		if err != nil && (errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled)) && !errors.Is(err, ErrTimeout) {
			err = fmt.Errorf("%w: %w", ErrTimeout, err)
		}
		op.inst, op.err = inst, err
	}()
	return op
}

type asyncOp struct {
	done chan struct{}
	inst *Instance
	err  error
}

func (o *asyncOp) Advance(ctx context.Context) (Progress, error) {
	select {
	case <-o.done:
		if o.err != nil {
			return Progress{}, o.err
		}
		return Progress{Done: true, Instance: o.inst}, nil
	default:
		return Progress{}, nil
	}
}

// Finished returns an Operation that is already over, with inst or err.
func Finished(inst *Instance, err error) Operation { return finishedOp{inst, err} }

type finishedOp struct {
	inst *Instance
	err  error
}

func (o finishedOp) Advance(context.Context) (Progress, error) {
	if o.err != nil {
		return Progress{}, o.err
	}
	return Progress{Done: true, Instance: o.inst}, nil
}

// Steps builds an Operation from a list of non-blocking steps run in order
// (Nodepool's multi-step state machines written as a sequence). Each step is
// called on every Advance until it reports done; then the next step starts.
// The instance returned by the last step is the operation's result. A step
// must not block.
func Steps(steps ...func(ctx context.Context) (done bool, inst *Instance, err error)) Operation {
	return &stepsOp{steps: steps}
}

type stepsOp struct {
	mu    sync.Mutex
	steps []func(ctx context.Context) (bool, *Instance, error)
	i     int
	inst  *Instance
	err   error
}

func (o *stepsOp) Advance(ctx context.Context) (Progress, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.err != nil {
		return Progress{}, o.err
	}
	if o.i < len(o.steps) {
		done, inst, err := o.steps[o.i](ctx)
		if inst != nil {
			o.inst = inst
		}
		if err != nil {
			o.err = err
			return Progress{}, err
		}
		if done {
			o.i++
		}
	}
	return Progress{Done: o.i == len(o.steps), Instance: o.inst}, nil
}

// pollFloor and pollCeiling bound how often Drive polls an operation that
// gives no Wait hint: it backs off from the floor to the ceiling.
const (
	pollFloor   = time.Millisecond
	pollCeiling = 50 * time.Millisecond
)

// Drive calls op.Advance until it finishes or ctx ends, waiting as the
// progress hints say. It is for tests and simple callers; the reconciler
// drives thousands of operations from a few goroutines instead.
func Drive(ctx context.Context, op Operation) (*Instance, error) {
	wait := pollFloor
	for {
		p, err := op.Advance(ctx)
		if err != nil {
			return p.Instance, err
		}
		if p.Done {
			return p.Instance, nil
		}
		d := p.Wait
		if d <= 0 {
			d = wait
			wait = min(wait*2, pollCeiling)
		}
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return p.Instance, fmt.Errorf("%w: %w", ErrTimeout, ctx.Err())
		case <-t.C:
		}
	}
}
