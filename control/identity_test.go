package control_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"testing/synctest"

	"github.com/berth-dev/berth/control"
	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/drivers/sim"
	"github.com/berth-dev/berth/provider"
	"github.com/berth-dev/berth/reconciler"
	"github.com/berth-dev/berth/store"
	"github.com/berth-dev/berth/store/memory"
)

// TestClusterIDMadeOnceAndKept: a new store gets a random cluster id, which
// the next plane on it keeps; another store gets another, even under the
// same name.
func TestClusterIDMadeOnceAndKept(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		_, prov := newSim(t, 1, nil)
		st := memory.New(memory.Options{})
		cfg := control.Config{Store: st, Providers: []*provider.Provider{prov}, Cluster: "same-name", Logger: quiet}
		p1, err := control.New(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		if len(p1.ClusterID()) != 32 || p1.ClusterID() == "same-name" {
			t.Fatalf("cluster id %q, want 32 random hex digits", p1.ClusterID())
		}
		p2, err := control.New(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		if p2.ClusterID() != p1.ClusterID() {
			t.Fatalf("the same store gave ids %s and %s", p1.ClusterID(), p2.ClusterID())
		}
		cfg.Store = memory.New(memory.Options{})
		p3, err := control.New(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		if p3.ClusterID() == p1.ClusterID() {
			t.Fatalf("two stores under one name share the id %s", p1.ClusterID())
		}
	})
}

// TestLegacyStoreKeepsItsName: a store holding instances from before
// cluster ids keeps the name as the id, since its resources carry it.
func TestLegacyStoreKeepsItsName(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		_, prov := newSim(t, 1, nil)
		st := memory.New(memory.Options{})
		old := []byte(`{"id": "old-1", "phase": "running", "provider": "sim", "node": "node-1", "backend_id": "x", "spec": {"image": "i"}}`)
		if _, err := st.Txn(ctx, nil, []store.Op{store.Put(control.PrefixInstances+"old-1", old)}); err != nil {
			t.Fatal(err)
		}
		p, err := control.New(ctx, control.Config{Store: st, Providers: []*provider.Provider{prov}, Cluster: "legacy", Logger: quiet})
		if err != nil {
			t.Fatal(err)
		}
		if p.ClusterID() != "legacy" {
			t.Fatalf("a store from before cluster ids: id %q, want its name", p.ClusterID())
		}
	})
}

// TestRestartedSimAdoptsNothingForeign: 100 instances, a restart (a new
// plane on the same store, a new sim back-end), 100 more, then the first
// 100 deleted: the second 100 keep running, and nothing is adopted that is
// not a record's own.
func TestRestartedSimAdoptsNothingForeign(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		st := memory.New(memory.Options{})
		_, prov1 := newSim(t, 30, nil)
		p1, stop1 := start(t, config(st, prov1))
		if _, err := p1.Submit(ctx, req("first", 100), "ns"); err != nil {
			t.Fatal(err)
		}
		for i := range 100 {
			waitPhase(t, p1, fmt.Sprintf("first-%d", i), reconciler.Running)
		}
		stop1()

		s2, prov2 := newSim(t, 30, nil)
		p2, _ := start(t, config(st, prov2))
		if _, err := p2.Submit(ctx, req("second", 100), "ns"); err != nil {
			t.Fatal(err)
		}
		for i := range 100 {
			waitPhase(t, p2, fmt.Sprintf("second-%d", i), reconciler.Running)
		}
		for i := range 100 {
			if err := p2.Delete(ctx, fmt.Sprintf("first-%d", i)); err != nil {
				t.Fatal(err)
			}
		}
		for i := range 100 {
			waitPhase(t, p2, fmt.Sprintf("first-%d", i), reconciler.Deleted)
		}
		// Every second-* record runs on a resource that is its own.
		for i := range 100 {
			id := fmt.Sprintf("second-%d", i)
			in := waitPhase(t, p2, id, reconciler.Running)
			got, err := s2.Get(ctx, in.BackendID)
			if err != nil {
				t.Fatalf("%s: its resource %s is gone: %v", id, in.BackendID, err)
			}
			if got.Tags[driver.TagInstance] != id {
				t.Fatalf("%s runs on %s, which is %s's", id, in.BackendID, got.Tags[driver.TagInstance])
			}
		}
		if n := len(tagged(t, prov2, map[string]string{driver.TagCluster: testCluster})); n != 100 {
			t.Fatalf("the back-end holds %d of the cluster's resources, want the 100 of second", n)
		}
	})
}

// TestRefusedNodeFailsOver: the node holding the image is preferred; when
// it is full, nodes without the image refuse the create for good (a
// cluster without a registry) and the instance waits, never placed on them
// again, until the node with the image has room. When no node has the
// image, the instance fails once every node has refused it, naming each.
func TestRefusedNodeFailsOver(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		shape := sim.Shape{Resources: driver.Resources{CPU: driver.CPUs(16), Memory: 32 * driver.GiB}}
		with := shape
		with.Images = []string{"app"}
		_, prov := newSim(t, 0, func(o *sim.Options) {
			o.StrictImages = true
			o.Pools = []sim.Pool{{Count: 3, NamePrefix: "bare-", Shape: shape}, {Count: 1, NamePrefix: "img-", Shape: with}}
		})
		p, _ := start(t, config(memory.New(memory.Options{}), prov))
		for i := range 6 {
			r := req(fmt.Sprintf("app%d", i), 1)
			r.Image = "app"
			if _, err := p.Submit(ctx, r, "ns"); err != nil {
				t.Fatal(err)
			}
		}
		for i := range 6 {
			in := waitPhase(t, p, fmt.Sprintf("app%d", i), reconciler.Running)
			if !strings.HasPrefix(in.Node, "img-") || len(in.Refused) != 0 {
				t.Errorf("%s runs on %s after %d refusals: the node with the image should be chosen first", in.ID, in.Node, len(in.Refused))
			}
		}
		// Fill the node with the image; the next instance tries the others.
		filler := req("filler", 1)
		filler.Image, filler.CPU = "app", driver.CPUs(13)
		if _, err := p.Submit(ctx, filler, "ns"); err != nil {
			t.Fatal(err)
		}
		if in := waitPhase(t, p, "filler", reconciler.Running); !strings.HasPrefix(in.Node, "img-") {
			t.Fatalf("filler on %s", in.Node)
		}
		late := req("late", 1)
		late.Image, late.CPU = "app", driver.CPUs(1)
		if _, err := p.Submit(ctx, late, "ns"); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "every node without the image to refuse late", func() bool {
			in, err := p.Instance(ctx, "late")
			return err == nil && len(in.Refused) == 3 && in.Phase == reconciler.Pending
		})
		if err := p.Delete(ctx, "filler"); err != nil {
			t.Fatal(err)
		}
		in := waitPhase(t, p, "late", reconciler.Running)
		if !strings.HasPrefix(in.Node, "img-") {
			t.Fatalf("late runs on %s", in.Node)
		}
		for _, r := range in.Refused {
			if n, _, _ := strings.Cut(r, ": "); !strings.Contains(n, "bare-") {
				t.Errorf("late: refused by %s", n)
			}
		}

		r := req("nowhere", 1)
		r.Image = "missing"
		if _, err := p.Submit(ctx, r, "ns"); err != nil {
			t.Fatal(err)
		}
		in = waitPhase(t, p, "nowhere", reconciler.Failed)
		if len(in.Refused) != 4 || !strings.Contains(in.Message, "refused") {
			t.Fatalf("an image no node has: %d refusals, message %q; want all 4 nodes named", len(in.Refused), in.Message)
		}
	})
}

// TestIdentityKeptTwice: a copy of the cluster's identity that cannot be
// read is moved aside and written again from the other, the id kept;
// with both unreadable, a store without instances gets a new id and one
// with instances is refused, naming the record.
func TestIdentityKeptTwice(t *testing.T) {
	ctx := context.Background()
	_, prov := newSim(t, 2, nil)
	st := memory.New(memory.Options{})
	defer st.Close()
	cfg := config(st, prov)
	p, err := control.New(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	id := p.ClusterID()
	if _, err := p.Submit(ctx, req("kept", 1), "alice"); err != nil {
		t.Fatal(err)
	}
	put := func(key, value string) {
		t.Helper()
		if _, err := st.Txn(ctx, nil, []store.Op{store.Put(key, []byte(value))}); err != nil {
			t.Fatal(err)
		}
	}
	for _, key := range []string{control.KeyCluster, control.KeyClusterCopy} {
		put(key, "not json")
		p, err := control.New(ctx, cfg)
		if err != nil {
			t.Fatalf("start with %s unreadable: %v", key, err)
		}
		if p.ClusterID() != id {
			t.Fatalf("start with %s unreadable: cluster id %q, want %q", key, p.ClusterID(), id)
		}
		kv, err := st.Get(ctx, key)
		if err != nil || !strings.Contains(string(kv.Value), id) {
			t.Fatalf("%s after the start: %q %v, want it written again", key, kv.Value, err)
		}
		q, err := p.Quarantined(ctx)
		if err != nil || !slices.ContainsFunc(q, func(q control.Quarantined) bool { return q.Key == key }) {
			t.Fatalf("quarantined: %+v %v, want %s among them", q, err, key)
		}
	}
	// Both unreadable, with an instance stored: refused.
	put(control.KeyCluster, "not json")
	put(control.KeyClusterCopy, `{"id": ""}`)
	if _, err := control.New(ctx, cfg); err == nil || !strings.Contains(err.Error(), control.KeyCluster) {
		t.Fatalf("start with both copies unreadable and an instance stored: %v, want a refusal naming %s", err, control.KeyCluster)
	}
	// Both unreadable on a store without instances: a new id.
	empty := memory.New(memory.Options{})
	defer empty.Close()
	for _, key := range []string{control.KeyCluster, control.KeyClusterCopy} {
		if _, err := empty.Txn(ctx, nil, []store.Op{store.Put(key, []byte("\x00"))}); err != nil {
			t.Fatal(err)
		}
	}
	p2, err := control.New(ctx, config(empty, prov))
	if err != nil || p2.ClusterID() == "" {
		t.Fatalf("start of an empty store with both copies unreadable: %v, id %q", err, p2.ClusterID())
	}
}
