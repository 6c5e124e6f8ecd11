package driver_test

import (
	"context"
	"errors"
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
