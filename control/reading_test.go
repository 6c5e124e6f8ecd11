package control_test

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/drivers/sim"
	"github.com/berth-dev/berth/reconciler"
	"github.com/berth-dev/berth/store/memory"
)

// TestDeletedRoomIsFreeDespiteAReading: a reading of the nodes taken while
// an instance ran there counts it in the node's reserved resources. Once
// the instance is deleted, its room is free at once: a request that needs
// it is placed on its submission, with no reading taken since. The reading
// is taken while the instance runs, while its create is under way, and
// while its delete is: the last two may or may not count it.
func TestDeletedRoomIsFreeDespiteAReading(t *testing.T) {
	for _, when := range []string{"running", "creating", "deleting"} {
		t.Run(when, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				back, prov := newSim(t, 1, func(o *sim.Options) {
					o.CreateLatency, o.DeleteLatency = time.Second, time.Second
				})
				cfg := config(memory.New(memory.Options{}), prov)
				cfg.SyncInterval = time.Hour // no reading but the test's
				p, _ := start(t, cfg)
				ctx := context.Background()
				whole := func(id string) {
					r := req(id, 1)
					r.CPU = driver.CPUs(4)
					ans, err := p.Submit(ctx, r, "")
					if err != nil {
						t.Fatal(err)
					}
					if in := ans.Instances[0]; in.Node == nil {
						t.Fatalf("%s: %s (%s), want placed at once", id, in.Instance.Phase, in.Instance.Message)
					}
				}
				// readAs reads the nodes once the back-end shows instance
				// id in state st.
				readAs := func(id string, st driver.State) {
					waitFor(t, "the back-end to show "+id+" "+string(st), func() bool {
						got := tagged(t, prov, map[string]string{driver.TagInstance: id})
						return len(got) == 1 && got[0].State == st
					})
					p.RefreshNodes(ctx)
				}
				whole("a")
				if when == "creating" {
					readAs("a", driver.StateCreating)
				}
				waitPhase(t, p, "a", reconciler.Running)
				if when == "running" {
					readAs("a", driver.StateRunning)
				}
				if err := p.Delete(ctx, "a"); err != nil {
					t.Fatal(err)
				}
				if when == "deleting" {
					readAs("a", driver.StateDeleting)
				}
				waitPhase(t, p, "a", reconciler.Deleted)
				if st, err := back.State(ctx); err != nil || st.Nodes[0].Instances != 0 {
					t.Fatalf("the back-end still holds %d instances (%v)", st.Nodes[0].Instances, err)
				}
				whole("b")
			})
		})
	}
}
