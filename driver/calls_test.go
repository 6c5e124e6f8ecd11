package driver_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/berth-dev/berth/driver"
)

func TestCalls(t *testing.T) {
	defer goleak.VerifyNone(t)
	var cs driver.Calls
	started := make(chan struct{})
	blocked := cs.Go(context.Background(), time.Hour, "block", func(ctx context.Context) (*driver.Instance, error) {
		close(started)
		<-ctx.Done()
		return nil, ctx.Err()
	})
	done := cs.Go(context.Background(), time.Hour, "quick", func(ctx context.Context) (*driver.Instance, error) {
		if _, ok := ctx.Deadline(); !ok {
			return nil, errors.New("no deadline")
		}
		return &driver.Instance{ID: "x"}, nil
	})
	<-started
	for !done.Finished() {
		time.Sleep(time.Millisecond)
	}
	if done.Err != nil || done.Inst == nil || done.Inst.ID != "x" {
		t.Fatalf("quick call: %+v %v", done.Inst, done.Err)
	}
	if blocked.Finished() {
		t.Fatal("the blocked call finished before Cancel")
	}
	cs.Cancel()
	cs.Wait()
	if !blocked.Finished() || !errors.Is(blocked.Err, context.Canceled) {
		t.Fatalf("after Cancel and Wait: finished %v, err %v", blocked.Finished(), blocked.Err)
	}
	late := cs.Go(context.Background(), time.Hour, "late", func(context.Context) (*driver.Instance, error) {
		t.Error("a call ran after Cancel")
		return nil, nil
	})
	if !late.Finished() || !errors.Is(late.Err, driver.ErrTimeout) {
		t.Fatalf("a call after Cancel: finished %v, err %v", late.Finished(), late.Err)
	}
}

// TestCallsTakeTurns: calls sharing one slot run one at a time, each
// one's timeout starting when it gets the slot; one still waiting when
// Cancel comes ends ErrRetryable without having run.
func TestCallsTakeTurns(t *testing.T) {
	defer goleak.VerifyNone(t)
	var cs driver.Calls
	slots := make(chan struct{}, 1)
	release, holds := make(chan struct{}), make(chan struct{})
	first := cs.GoAfter(context.Background(), slots, time.Hour, "first", func(ctx context.Context) (*driver.Instance, error) {
		close(holds)
		<-release
		return &driver.Instance{ID: "first"}, nil
	}, nil)
	<-holds
	var released time.Time
	ran := make(chan time.Time, 1)
	second := cs.GoAfter(context.Background(), slots, time.Minute, "second", func(ctx context.Context) (*driver.Instance, error) {
		dl, _ := ctx.Deadline()
		ran <- dl
		return &driver.Instance{ID: "second"}, nil
	}, func() { t.Error("unsent ran for a call that was made") })
	// The second may only run once the first has given its slot back.
	select {
	case <-ran:
		close(release)
		t.Fatal("the second call ran while the first held the only slot")
	case <-time.After(50 * time.Millisecond):
	}
	if !first.Sent() || second.Sent() {
		close(release)
		t.Fatalf("sent: the first %v, the second (waiting) %v", first.Sent(), second.Sent())
	}
	released = time.Now()
	close(release)
	deadline := <-ran
	if !deadline.After(released) {
		t.Errorf("the second call's deadline %v is before the first gave its slot back (%v): its timeout ran while it waited", deadline, released)
	}
	for !first.Finished() || !second.Finished() {
		time.Sleep(time.Millisecond)
	}
	if first.Err != nil || second.Err != nil || second.Inst.ID != "second" {
		t.Fatalf("first %v, second %+v %v", first.Err, second.Inst, second.Err)
	}

	// A call waiting for a slot when Cancel comes never runs.
	hold := make(chan struct{})
	holding := cs.GoAfter(context.Background(), slots, time.Hour, "hold", func(ctx context.Context) (*driver.Instance, error) {
		close(hold)
		<-ctx.Done()
		return nil, ctx.Err()
	}, nil)
	<-hold
	var undone atomic.Bool
	waiting := cs.GoAfter(context.Background(), slots, time.Hour, "waiting", func(context.Context) (*driver.Instance, error) {
		t.Error("a call waiting for its turn ran after Cancel")
		return nil, nil
	}, func() { undone.Store(true) })
	cs.Cancel()
	cs.Wait()
	if !holding.Finished() || !errors.Is(holding.Err, context.Canceled) {
		t.Errorf("the call holding the slot: finished %v, err %v", holding.Finished(), holding.Err)
	}
	if !waiting.Finished() || !errors.Is(waiting.Err, driver.ErrRetryable) || waiting.Sent() {
		t.Errorf("the waiting call: finished %v, sent %v, err %v, want ErrRetryable (nothing sent)", waiting.Finished(), waiting.Sent(), waiting.Err)
	}
	if !undone.Load() {
		t.Error("the waiting call ended unsent without running its unsent")
	}
}
