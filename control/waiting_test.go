package control_test

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"

	"github.com/berth-dev/berth/control"
	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/drivers/sim"
	"github.com/berth-dev/berth/metrics"
	"github.com/berth-dev/berth/reconciler"
	"github.com/berth-dev/berth/store"
	"github.com/berth-dev/berth/store/memory"
)

// countingStore is the memory store, counting transactions.
type countingStore struct {
	store.Store
	txns atomic.Int64
}

func (c *countingStore) Txn(ctx context.Context, cmps []store.Cmp, ops []store.Op) (store.TxnResult, error) {
	c.txns.Add(1)
	return c.Store.Txn(ctx, cmps, ops)
}

// scheduled returns how many placement decisions m has recorded.
func scheduled(t *testing.T, m *metrics.Metrics) uint64 {
	t.Helper()
	fams, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	var n uint64
	for _, f := range fams {
		if f.GetName() == "berth_schedule_duration_seconds" {
			for _, mm := range f.GetMetric() {
				n += mm.GetHistogram().GetSampleCount()
			}
		}
	}
	return n
}

// TestManyWaitingInstances keeps 400 instances of one request waiting (at
// least: a launch that runs late under load may make one more) and changes
// why they wait: the new reason reaches every record in a few
// commits, not one each, and each placement round decides for the request
// once, not once per instance.
func TestManyWaitingInstances(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, prov := newSim(t, 2, func(o *sim.Options) {
			o.Shape = sim.Shape{Resources: driver.Resources{CPU: driver.CPUs(1), Memory: driver.GiB}}
		})
		st := &countingStore{Store: memory.New(memory.Options{})}
		m := metrics.New()
		cfg := config(st, prov)
		cfg.Metrics = m
		p, _ := start(t, cfg)
		ctx := context.Background()
		r := req("wide", 402)
		r.CPU, r.Memory = driver.CPUs(1), 64*driver.MiB
		if _, err := p.Submit(ctx, r, ""); err != nil {
			t.Fatal(err)
		}
		var last string // what the last look saw, for a failure's message
		waiting := func(reason string) func() bool {
			return func() bool {
				list, err := p.Instances(ctx, control.Filter{Request: "wide", Phases: []control.Phase{reconciler.Pending}})
				if err != nil {
					t.Fatal(err)
				}
				// 400 wait; a placed one whose launch ran late under load may
				// wait again, for reasons of its own.
				n := 0
				for _, in := range list {
					if strings.Contains(in.Message, reason) {
						n++
					} else {
						last = fmt.Sprintf("%s waits because %q", in.ID, in.Message)
					}
				}
				if n < 400 {
					last = fmt.Sprintf("%d of %d pending wait for %s; %s", n, len(list), reason, last)
				}
				return n >= 400
			}
		}
		defer func() {
			if t.Failed() {
				t.Logf("last seen: %s", last)
			}
		}()
		waitFor(t, "400 instances waiting for cpu", waiting("cpu"))
		before, decided := st.txns.Load(), scheduled(t, m)

		// A node goes offline: every waiting instance gets a new reason.
		nodes, err := p.Nodes(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.SetNodeStatus(nodes[0].Node.Name, driver.NodeOffline, "unplugged"); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "the new reason on every waiting instance", waiting("offline"))
		if n := st.txns.Load() - before; n >= 100 {
			t.Errorf("updating the reason of 400 waiting instances took %d transactions, want far fewer", n)
		}
		// Placement rounds run at least every second and on every change; each
		// decides once for the whole request (the few instances placed again
		// off the offline node decide on their own).
		rounds := scheduled(t, m) - decided
		if rounds >= 400 {
			t.Errorf("%d placement decisions while 400 instances of one request waited, want about one per round", rounds)
		}
	})
}
