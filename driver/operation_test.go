package driver_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/berth-dev/berth/driver"
)

func TestAsync(t *testing.T) {
	defer goleak.VerifyNone(t)
	ctx := context.Background()
	release := make(chan struct{})
	op := driver.Async(ctx, func(ctx context.Context) (*driver.Instance, error) {
		<-release
		return &driver.Instance{ID: "a"}, nil
	})
	if p, err := op.Advance(ctx); p.Done || err != nil {
		t.Errorf("Advance before the call returns: %+v %v, want not done", p, err)
	}
	close(release)
	inst, err := driver.Drive(ctx, op)
	if err != nil || inst.ID != "a" {
		t.Fatalf("Drive: %+v %v", inst, err)
	}
	if p, err := op.Advance(ctx); !p.Done || err != nil || p.Instance.ID != "a" {
		t.Errorf("Advance after the end repeats %+v %v", p, err)
	}

	op = driver.Async(ctx, func(context.Context) (*driver.Instance, error) {
		return nil, driver.Errorf(driver.ErrPermanent, "build failed")
	})
	if _, err := driver.Drive(ctx, op); !errors.Is(err, driver.ErrPermanent) {
		t.Errorf("failing call: %v", err)
	}

	cctx, cancel := context.WithCancel(ctx)
	op = driver.Async(cctx, func(ctx context.Context) (*driver.Instance, error) {
		<-ctx.Done()
		return nil, ctx.Err()
	})
	cancel()
	if _, err := driver.Drive(ctx, op); !errors.Is(err, driver.ErrTimeout) || !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled call: %v, want ErrTimeout wrapping context.Canceled", err)
	}
}

func TestFinished(t *testing.T) {
	p, err := driver.Finished(&driver.Instance{ID: "x"}, nil).Advance(context.Background())
	if !p.Done || err != nil || p.Instance.ID != "x" {
		t.Errorf("Finished ok: %+v %v", p, err)
	}
	p, err = driver.Finished(nil, driver.ErrNotFound).Advance(context.Background())
	if p.Done || !errors.Is(err, driver.ErrNotFound) {
		t.Errorf("Finished with error: %+v %v", p, err)
	}
}

func TestSteps(t *testing.T) {
	ctx := context.Background()
	var trace []string
	polls := 0
	op := driver.Steps(
		func(context.Context) (bool, *driver.Instance, error) {
			trace = append(trace, "submit")
			return true, &driver.Instance{ID: "i-1"}, nil
		},
		func(context.Context) (bool, *driver.Instance, error) {
			polls++
			trace = append(trace, "poll")
			if polls < 3 {
				return false, nil, nil
			}
			return true, &driver.Instance{ID: "i-1", State: driver.StateRunning}, nil
		},
	)
	p, err := op.Advance(ctx)
	if p.Done || err != nil || p.Instance.ID != "i-1" {
		t.Errorf("after the first step: %+v %v, want the id known and not done", p, err)
	}
	inst, err := driver.Drive(ctx, op)
	if err != nil || inst.State != driver.StateRunning {
		t.Fatalf("Drive: %+v %v", inst, err)
	}
	if got := len(trace); got != 4 || trace[0] != "submit" {
		t.Errorf("steps ran %v", trace)
	}
	if p, _ := op.Advance(ctx); !p.Done || len(trace) != 4 {
		t.Errorf("Advance after done ran a step again: %v", trace)
	}

	calls := 0
	op = driver.Steps(func(context.Context) (bool, *driver.Instance, error) {
		calls++
		return false, nil, driver.Errorf(driver.ErrQuotaExceeded, "quota")
	})
	for range 3 {
		if _, err := op.Advance(ctx); !errors.Is(err, driver.ErrQuotaExceeded) {
			t.Errorf("failed step: %v", err)
		}
	}
	if calls != 1 {
		t.Errorf("a failed step ran %d times, want once", calls)
	}
}

// waitOp is done after n Advance calls and hints a wait each time.
type waitOp struct {
	n, calls int
	wait     time.Duration
}

func (o *waitOp) Advance(context.Context) (driver.Progress, error) {
	o.calls++
	if o.calls >= o.n {
		return driver.Progress{Done: true, Instance: &driver.Instance{ID: "w"}}, nil
	}
	return driver.Progress{Wait: o.wait, Instance: &driver.Instance{ID: "w"}}, nil
}

func TestDrive(t *testing.T) {
	op := &waitOp{n: 4, wait: time.Millisecond}
	inst, err := driver.Drive(context.Background(), op)
	if err != nil || inst.ID != "w" || op.calls != 4 {
		t.Errorf("Drive: %+v %v after %d calls", inst, err, op.calls)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	never := &waitOp{n: 1 << 30, wait: time.Hour}
	inst, err = driver.Drive(ctx, never)
	if !errors.Is(err, driver.ErrTimeout) || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Drive past the deadline: %v, want ErrTimeout wrapping the deadline", err)
	}
	if inst == nil || inst.ID != "w" {
		t.Errorf("Drive past the deadline returned %+v, want the instance as far as known", inst)
	}
}
