package control_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"testing/synctest"

	"github.com/berth-dev/berth/control"
	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/scheduler"
	"github.com/berth-dev/berth/store/memory"
)

// A number the store cannot hold is refused at submit, naming the field,
// and nothing is stored: the plane answers on, and a new plane starts on
// the same store.
func TestNumbersOutOfRange(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		_, prov := newSim(t, 2, nil)
		st := memory.New(memory.Options{})
		p, stop := start(t, config(st, prov))
		ctx := context.Background()

		huge := 1 << 62
		for _, c := range []struct {
			field string
			tune  func(*scheduler.Request)
		}{
			{"priority", func(r *scheduler.Request) { r.Priority = huge }},
			{"priority", func(r *scheduler.Request) { r.Priority = -huge }},
			{"max_per_node", func(r *scheduler.Request) { r.MaxPerNode = huge }},
			{"cpus", func(r *scheduler.Request) { r.CPU = driver.MilliCPU(huge) }},
			{"memory", func(r *scheduler.Request) { r.Memory = driver.Bytes(huge) }},
			{"gpus", func(r *scheduler.Request) { r.GPUs = int64(huge) }},
			{"restart_policy.max_retries", func(r *scheduler.Request) {
				r.RestartPolicy = driver.RestartPolicy{Name: "on-failure", MaxRetries: huge}
			}},
		} {
			r := req("big", 1)
			c.tune(&r)
			_, err := p.Submit(ctx, r, "alice")
			checkOutOfRange(t, "submit", c.field, err)
		}
		g := scheduler.Group{ID: "g", Priority: huge, Services: []scheduler.Service{{Request: req("a", 1)}}}
		_, err := p.SubmitGroup(ctx, g, "alice")
		checkOutOfRange(t, "group", "priority", err)
		g = scheduler.Group{ID: "g", Services: []scheduler.Service{{Request: req("a", 1), StartupOrder: huge}}}
		_, err = p.SubmitGroup(ctx, g, "alice")
		checkOutOfRange(t, "group", "services[0].startup_order", err)

		// The plane answers on and holds nothing of the refused.
		if _, err := p.Submit(ctx, req("ok", 1), "alice"); err != nil {
			t.Fatal(err)
		}
		ins, err := p.Instances(ctx, control.Filter{})
		if err != nil || len(ins) != 1 {
			t.Fatalf("instances after the refusals: %d, %v; want the one accepted", len(ins), err)
		}
		stop()
		p2, err := control.New(ctx, config(st, prov))
		if err != nil {
			t.Fatalf("restart on the same store: %v", err)
		}
		if _, err := p2.Instance(ctx, "ok"); err != nil {
			t.Fatalf("after the restart: %v", err)
		}
	})
}

// checkOutOfRange fails unless err is a driver.ErrInvalid naming field as
// out of range.
func checkOutOfRange(t *testing.T, what, field string, err error) {
	t.Helper()
	var fe *driver.FieldError
	if !errors.Is(err, driver.ErrInvalid) || !errors.As(err, &fe) {
		t.Fatalf("%s with %s out of range: %v, want a field error", what, field, err)
	}
	var found bool
	var fes driver.FieldErrors
	if errors.As(err, &fes) {
		for _, e := range fes {
			found = found || (e.Path == field && strings.Contains(e.Reason, "out of range"))
		}
	} else {
		found = fe.Path == field && strings.Contains(fe.Reason, "out of range")
	}
	if !found {
		t.Errorf("%s with %s out of range: %v, want it named as out of range", what, field, err)
	}
}
