package integration_test

import (
	"context"
	"testing"
	"time"

	"github.com/berth-dev/berth/control"
	"github.com/berth-dev/berth/driver"
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

// TestAdviceOnARealContainer: a container reserving 2 cpus and 512 MiB
// that sleeps is advised to reserve a small part of that, from the
// engine's own measurements.
func TestAdviceOnARealContainer(t *testing.T) {
	e := setup(t, func(c *control.Config) { c.UsageInterval = time.Second })
	ctx := context.Background()
	spec := helloSpec()
	spec.CPU, spec.Memory = driver.CPUs(2), 512*driver.MiB
	if _, err := e.plane.Submit(ctx, e.named(scheduler.Request{ID: "idle", Spec: spec}), ""); err != nil {
		t.Fatal(err)
	}
	in := e.allIn(t, reconciler.Running, 1)[0]
	var got control.InstanceAdvice
	e.waitFor(t, "advice on the idle container from two samples", func() bool {
		ans, err := e.plane.Advice(ctx, control.Filter{}, scheduler.AdviceOptions{})
		if err != nil {
			return false
		}
		for _, a := range ans.Instances {
			if a.Instance == in.ID && a.Samples >= 2 {
				got = a
				return true
			}
		}
		return false
	})
	t.Logf("advice: reserved %s cpus / %d B, used %s / %d B, suggested %s / %d B", got.Reserved.CPUs, got.Reserved.MemoryBytes,
		got.Used.CPUs, got.Used.MemoryBytes, got.Suggested.CPUs, got.Suggested.MemoryBytes)
	if got.Suggested.CPUs > driver.CPUs(0.5) || got.Suggested.MemoryBytes >= int64(256*driver.MiB) || got.Used.MemoryBytes <= 0 || got.Saves.CPUs < driver.CPUs(1.5) {
		t.Fatalf("advice %+v: want a small fraction of 2 cpus and 512 MiB", got)
	}
	e.deleteAll(t)
}
