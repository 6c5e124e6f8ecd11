package control

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/drivers/sim"
	"github.com/berth-dev/berth/provider"
	"github.com/berth-dev/berth/reconciler"
	"github.com/berth-dev/berth/scheduler"
	"github.com/berth-dev/berth/store"
	"github.com/berth-dev/berth/store/memory"
)

// applyPlane returns a plane without Run on a memory store and one sim
// node of 4 cpus, holding instance "a" placed on it (1 cpu), and that
// instance's stored form.
func applyPlane(t *testing.T) (*Plane, store.Store, store.KV) {
	t.Helper()
	ctx := context.Background()
	opts := *sim.DefaultOptions()
	opts.Nodes = 1
	opts.Shape = sim.Shape{Resources: driver.Resources{CPU: driver.CPUs(4), Memory: 8 * driver.GiB}}
	b, err := sim.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	prov, err := provider.New(b, provider.Config{Name: "sim", Logger: quiet, StateTTL: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = prov.Close(ctx) })
	st := memory.New(memory.Options{})
	p, err := New(ctx, Config{Store: st, Providers: []*provider.Provider{prov}, Cluster: "test", Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	r := scheduler.Request{ID: "a", Count: 1, Spec: driver.Spec{Image: "busybox", Resources: driver.Resources{CPU: driver.CPUs(1)}}}
	ans, err := p.Submit(ctx, r, "")
	if err != nil {
		t.Fatal(err)
	}
	if len(ans.Instances) != 1 || ans.Instances[0].Instance.ID != "a" {
		t.Fatalf("submitted %+v, want one instance a", ans.Instances)
	}
	in, ok := p.get("a")
	if !ok || !in.Phase.HoldsNode() {
		t.Fatalf("a not placed: %+v", in)
	}
	kv, err := st.Get(ctx, PrefixInstances+"a")
	if err != nil {
		t.Fatal(err)
	}
	return p, st, kv
}

// freeCPU is what the plane's ledger has free on its one node.
func freeCPU(p *Plane) driver.MilliCPU {
	for _, n := range p.cluster.c.Nodes() {
		return n.Free.CPU
	}
	return -1
}

// TestApplyStoredOneChangeTwice: the plane's own change comes back from
// the store watch after commit applied it, or before: either way memory
// and the ledger take it once, and the records never show an instance
// gone while the ledger still holds its room.
func TestApplyStoredOneChangeTwice(t *testing.T) {
	for _, watchFirst := range []bool{false, true} {
		p, st, kv := applyPlane(t)
		if got := freeCPU(p); got != driver.CPUs(3) {
			t.Fatalf("free cpu with a placed: %v, want 3", got)
		}
		p.watching(kv.ModRevision)
		// The instance is removed: the store's delete, as commit and the
		// watch both hand it over.
		res, err := st.Txn(context.Background(), nil, []store.Op{store.Delete(PrefixInstances + "a")})
		if err != nil || !res.Succeeded {
			t.Fatal(res, err)
		}
		commit := change{id: "a", rev: res.Revision}
		watched := change{id: "a", rev: res.Revision, watched: true}
		first, second := commit, watched
		if watchFirst {
			first, second = watched, commit
		}
		p.applyStored([]change{first})
		if _, ok := p.get("a"); ok || freeCPU(p) != driver.CPUs(4) {
			t.Fatalf("watch first %v: after the removal a is in memory %v, %v cpu free; want gone and 4", watchFirst, ok, freeCPU(p))
		}
		p.applyStored([]change{second})
		if got := freeCPU(p); got != driver.CPUs(4) {
			t.Fatalf("watch first %v: the second copy of the removal left %v cpu free, want 4", watchFirst, got)
		}
		// A watch still behind delivers the instance's older write: it
		// does not come back, nor take room again.
		in, err := decodeRecord(kv, p.requestSpec)
		if err != nil {
			t.Fatal(err)
		}
		p.applyStored([]change{{id: "a", in: in, rev: kv.ModRevision, watched: true}})
		if _, ok := p.get("a"); ok || freeCPU(p) != driver.CPUs(4) {
			t.Fatalf("watch first %v: a lagging watch brought a back (%v) or its room (%v cpu free)", watchFirst, ok, freeCPU(p))
		}
		p.watching(-1)
	}
}

// TestApplyStoredLedgerFollowsRecords: the ledger follows what the stored
// records hold: a resize holds the new size once, a record that stops
// holding its node gives it back, and a record written by another writer
// takes its room.
func TestApplyStoredLedgerFollowsRecords(t *testing.T) {
	p, _, _ := applyPlane(t)
	in, _ := p.get("a")
	rev := in.Revision

	bigger := in
	spec := *in.Spec
	spec.Resources.CPU = driver.CPUs(2)
	bigger.Spec = &spec
	rev++
	p.applyStored([]change{{id: "a", in: &bigger, rev: rev}})
	if got := freeCPU(p); got != driver.CPUs(2) {
		t.Fatalf("after a resize to 2 cpus: %v free, want 2", got)
	}

	done := bigger
	done.Phase = reconciler.Failed
	rev++
	p.applyStored([]change{{id: "a", in: &done, rev: rev}})
	if got := freeCPU(p); got != driver.CPUs(4) {
		t.Fatalf("after a gave its node back: %v free, want 4", got)
	}

	other := bigger
	other.ID, other.Name = "b", "b"
	rev++
	p.applyStored([]change{{id: "b", in: &other, rev: rev}})
	if got := freeCPU(p); got != driver.CPUs(2) {
		t.Fatalf("after another writer's b of 2 cpus: %v free, want 2", got)
	}
	// An older write of a than memory holds changes nothing.
	p.applyStored([]change{{id: "a", in: &bigger, rev: rev - 2}})
	if got, _ := p.get("a"); got.Phase != reconciler.Failed || freeCPU(p) != driver.CPUs(2) {
		t.Fatalf("an older write was applied: a %s, %v cpu free", got.Phase, freeCPU(p))
	}
}
