package control_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

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
}

// TestLegacyStoreKeepsItsName: a store holding instances from before
// cluster ids keeps the name as the id, since its resources carry it.
func TestLegacyStoreKeepsItsName(t *testing.T) {
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
}

// TestRestartedSimAdoptsNothingForeign: 100 instances, a restart (a new
// plane on the same store, a new sim back-end), 100 more, then the first
// 100 deleted: the second 100 keep running, and nothing is adopted that is
// not a record's own.
func TestRestartedSimAdoptsNothingForeign(t *testing.T) {
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
}

// TestRefusedNodeFailsOver: nodes without the image refuse a create for
// good (a cluster without a registry); the instance is placed again,
// never on them, until the node with the image runs it. When no node has
// it, the instance fails once every node has refused it, naming each.
func TestRefusedNodeFailsOver(t *testing.T) {
	ctx := context.Background()
	shape := sim.Shape{Resources: driver.Resources{CPU: driver.CPUs(16), Memory: 32 * driver.GiB}}
	with := shape
	with.Images = []string{"app"}
	_, prov := newSim(t, 0, func(o *sim.Options) {
		o.StrictImages = true
		o.Pools = []sim.Pool{{Count: 3, NamePrefix: "bare-", Shape: shape}, {Count: 1, NamePrefix: "img-", Shape: with}}
	})
	p, _ := start(t, config(memory.New(memory.Options{}), prov))
	refusedAny := false
	for i := range 6 {
		r := req(fmt.Sprintf("app%d", i), 1)
		r.Image = "app"
		if _, err := p.Submit(ctx, r, "ns"); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 6 {
		in := waitPhase(t, p, fmt.Sprintf("app%d", i), reconciler.Running)
		if !strings.HasPrefix(in.Node, "img-") {
			t.Errorf("%s runs on %s, which lacks the image", in.ID, in.Node)
		}
		for _, n := range in.RefusedNodes() {
			refusedAny = true
			if !strings.Contains(n, "bare-") {
				t.Errorf("%s: refused by %s", in.ID, n)
			}
		}
	}
	if !refusedAny {
		t.Fatal("no instance was ever refused: the failover was not exercised")
	}

	r := req("nowhere", 1)
	r.Image = "missing"
	if _, err := p.Submit(ctx, r, "ns"); err != nil {
		t.Fatal(err)
	}
	in := waitPhase(t, p, "nowhere", reconciler.Failed)
	if len(in.Refused) != 4 || !strings.Contains(in.Message, "refused") {
		t.Fatalf("an image no node has: %d refusals, message %q; want all 4 nodes named", len(in.Refused), in.Message)
	}
}
