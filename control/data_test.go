package control_test

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/berth-dev/berth/control"
	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/reconciler"
	"github.com/berth-dev/berth/scheduler"
	"github.com/berth-dev/berth/store"
	"github.com/berth-dev/berth/store/bolt"
	"github.com/berth-dev/berth/store/etcd"
	"github.com/berth-dev/berth/store/etcd/etcdtest"
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

// badRecords are stored records a plane cannot take, by key: each is
// moved aside when it starts, and the plane starts with the rest.
var badRecords = map[string]string{
	control.PrefixInstances + "cut":      "\x01\x00\x05abc",
	control.PrefixInstances + "priority": `{"id":"priority","priority":4611686018427387904,"spec":{"image":"x"}}`,
	control.PrefixInstances + "nospec":   "\x01\x00\x00\x00\x00\x00\x00\x00\x07missing\x00\x00\x00\x00\x00\x00",
	control.PrefixInstances + "json":     "{not json",
	control.PrefixInstances + "ownspec":  `{"id":"ownspec","spec":{"image":"x","cpus":-1}}`,
	control.PrefixRequests + "garbage":   "\xff\xfe",
	control.PrefixRequests + "huge":      `{"request":{"id":"huge","image":"x","priority":4611686018427387904}}`,
	control.PrefixGroups + "broken":      `{"id":`,
}

// Records that cannot be read are moved aside, kept with their key and
// listed, and the plane starts with the rest, on every store; a second
// start finds them aside still and moves nothing more.
func TestStartSurvivesBadRecords(t *testing.T) {
	for _, kind := range []string{"memory", "bolt", "etcd"} {
		t.Run(kind, func(t *testing.T) {
			ctx := context.Background()
			_, prov := newSim(t, 2, nil)
			var st store.Store
			switch kind {
			case "memory":
				st = memory.New(memory.Options{})
			case "bolt":
				b, err := bolt.Open(filepath.Join(t.TempDir(), "berth.db"), bolt.Options{})
				if err != nil {
					t.Fatal(err)
				}
				st = b
			case "etcd":
				t.Cleanup(func() { etcdtest.AwaitClosed(t) })
				st = etcd.New(etcdtest.Client(t, etcdtest.Member(t)), etcd.Options{})
			}
			t.Cleanup(func() { _ = st.Close() })
			p, err := control.New(ctx, config(st, prov))
			if err != nil {
				t.Fatal(err)
			}
			if _, err := p.Submit(ctx, req("good", 1), "alice"); err != nil {
				t.Fatal(err)
			}
			for k, v := range badRecords {
				if _, err := st.Txn(ctx, nil, []store.Op{store.Put(k, []byte(v))}); err != nil {
					t.Fatal(err)
				}
			}
			for round := range 2 {
				p, err := control.New(ctx, config(st, prov))
				if err != nil {
					t.Fatalf("start %d on bad records: %v", round+1, err)
				}
				if _, err := p.Instance(ctx, "good"); err != nil {
					t.Fatalf("start %d: the good instance: %v", round+1, err)
				}
				list, err := p.Quarantined(ctx)
				if err != nil {
					t.Fatal(err)
				}
				got := map[string]string{}
				for _, q := range list {
					got[q.Key] = q.Reason
					if q.Reason == "" || q.Bytes != len(badRecords[q.Key]) {
						t.Errorf("start %d: %+v: want a reason and the record's %d bytes", round+1, q, len(badRecords[q.Key]))
					}
				}
				for k := range badRecords {
					if _, ok := got[k]; !ok {
						t.Errorf("start %d: %s is not listed as moved aside: %v", round+1, k, got)
					}
					if _, err := st.Get(ctx, k); !errors.Is(err, store.ErrNotFound) {
						t.Errorf("start %d: %s is still under its key: %v", round+1, k, err)
					}
				}
				if len(got) != len(badRecords) {
					t.Errorf("start %d: %d records aside, want %d: %v", round+1, len(got), len(badRecords), got)
				}
			}
		})
	}
}

// The back-end resource of an instance whose record is moved aside is not
// a leak: it keeps running, sync after sync, on this start and the next.
func TestAsideIsNoLeak(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		_, prov := newSim(t, 2, nil)
		st := memory.New(memory.Options{})
		ctx := context.Background()
		p1, stop1 := start(t, config(st, prov))
		if _, err := p1.Submit(ctx, req("keep", 1), "alice"); err != nil {
			t.Fatal(err)
		}
		waitPhase(t, p1, "keep", reconciler.Running)
		stop1()
		if _, err := st.Txn(ctx, nil, []store.Op{store.Put(control.PrefixInstances+"keep", []byte("\x01\x00\xff"))}); err != nil {
			t.Fatal(err)
		}
		for round := range 2 {
			_, stop := start(t, config(st, prov))
			time.Sleep(time.Second) // many sync intervals of the bubble's clock
			stop()
			if got := tagged(t, prov, map[string]string{driver.TagCluster: testCluster}); len(got) != 1 {
				t.Fatalf("start %d: %d resources of the cluster, want the one whose record is aside", round+1, len(got))
			}
		}
	})
}
