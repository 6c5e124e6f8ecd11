package integration_test

import (
	"context"
	"testing"
	"time"

	"github.com/berth-dev/berth/control"
	"github.com/berth-dev/berth/reconciler"
	"github.com/berth-dev/berth/scheduler"
)

// TestUsageOfARealContainer: the usage loop samples a running container
// through the engine's stats, and the node's measured use shows it.
func TestUsageOfARealContainer(t *testing.T) {
	e := setup(t, func(c *control.Config) { c.UsageInterval = time.Second })
	ctx := context.Background()
	if _, err := e.plane.Submit(ctx, e.named(scheduler.Request{ID: "meter", Spec: helloSpec()}), ""); err != nil {
		t.Fatal(err)
	}
	in := e.allIn(t, reconciler.Running, 1)[0]
	e.waitFor(t, "a sample of the container", func() bool {
		h, err := e.plane.UsageHistory(ctx, in.ID)
		return err == nil && len(h) > 0
	})
	h, _ := e.plane.UsageHistory(ctx, in.ID)
	if s := h[len(h)-1]; s.Memory <= 0 || s.Time.IsZero() {
		t.Errorf("sample %+v: want the container's memory and the engine's time", s)
	}
	e.waitFor(t, "the node's measured use", func() bool {
		nodes, err := e.plane.Nodes(ctx)
		if err != nil {
			return false
		}
		for _, n := range nodes {
			if n.Name == in.Node && n.Measured != nil && n.Measured.Sampled >= 1 && n.Measured.MemoryBytes > 0 {
				return true
			}
		}
		return false
	})
	e.deleteAll(t)
	e.waitFor(t, "the samples of the deleted instance to go", func() bool {
		h, err := e.plane.UsageHistory(ctx, in.ID)
		return err == nil && len(h) == 0
	})
}
