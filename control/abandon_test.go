package control_test

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/drivers/sim"
	"github.com/berth-dev/berth/provider"
	"github.com/berth-dev/berth/reconciler"
	"github.com/berth-dev/berth/store/memory"
)

// gatedSim is a sim whose Create, for the instances given a gate, waits
// until the gate is opened before it makes the copy: a back-end call
// already sent, which finishes whatever its caller's context says.
type gatedSim struct {
	*sim.Sim
	entered chan string
	gates   map[string]chan struct{}
}

func (g *gatedSim) Create(ctx context.Context, node string, spec *driver.Spec) (driver.Operation, error) {
	id := spec.Tags[driver.TagInstance]
	if gate, ok := g.gates[id]; ok {
		g.entered <- id
		<-gate
	}
	return g.Sim.Create(ctx, node, spec)
}

// TestDeleteFindsTheCopyOfAnAbandonedCreate: an instance deleted while its
// create call is in flight is looked up by its tags once the call has
// returned. The listing the lookup reads must not be one taken before the
// call made its copy (here, for the delete of another instance): the copy
// would be left behind, holding its room on the node.
func TestDeleteFindsTheCopyOfAnAbandonedCreate(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		back, _ := newSim(t, 2, nil)
		g := &gatedSim{Sim: back, entered: make(chan string), gates: map[string]chan struct{}{"x": make(chan struct{}), "z": make(chan struct{})}}
		prov, err := provider.New(g, provider.Config{Name: "sim", Logger: quiet, StateTTL: time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = prov.Close(context.Background()) })
		cfg := config(memory.New(memory.Options{}), prov)
		cfg.SyncInterval = time.Hour // no listing but the deletes'
		p, _ := start(t, cfg)
		ctx := context.Background()
		for _, id := range []string{"x", "z"} {
			if _, err := p.Submit(ctx, req(id, 1), ""); err != nil {
				t.Fatal(err)
			}
		}
		// Both creates are in flight; both instances are deleted.
		for range 2 {
			<-g.entered
		}
		for _, id := range []string{"x", "z"} {
			if err := p.Delete(ctx, id); err != nil {
				t.Fatal(err)
			}
		}
		// z's call returns first: its delete lists the tagged resources
		// (x has no copy yet) and deletes z's.
		close(g.gates["z"])
		waitPhase(t, p, "z", reconciler.Deleted)
		// Then x's call makes x's copy and returns.
		close(g.gates["x"])
		waitPhase(t, p, "x", reconciler.Deleted)
		if got := tagged(t, prov, map[string]string{driver.TagCluster: testCluster}); len(got) != 0 {
			t.Fatalf("the back-end holds %d copies of deleted instances: %s %s", len(got), got[0].Tags[driver.TagInstance], got[0].State)
		}
	})
}
