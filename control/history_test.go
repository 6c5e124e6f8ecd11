package control_test

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/berth-dev/berth/control"
	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/reconciler"
	"github.com/berth-dev/berth/store/memory"
)

// TestUsageHour: over minutes of rounds (every 45 s, more than a
// HistoryStep), the instance, its node and the cluster each keep one point
// per round, used against reserved, and a round wakes the watchers. (How
// points within a step replace each other and leave the window:
// TestHourPut.)
func TestUsageHour(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		_, prov := newSteady(t, driver.CPUs(0.2))
		cfg := config(memory.New(memory.Options{}), prov)
		cfg.UsageInterval = 45 * time.Second
		p, _ := start(t, cfg)
		ctx := context.Background()
		r := cpuReq("a", 1)
		r.Memory = 512 * driver.MiB
		if _, err := p.Submit(ctx, r, ""); err != nil {
			t.Fatal(err)
		}
		waitPhase(t, p, "a", reconciler.Running)
		measured := p.UsageMeasured()
		select {
		case <-measured:
		case <-time.After(time.Minute):
			t.Fatal("no usage round ended within a minute of rounds every 45 s")
		}
		from := time.Now()
		time.Sleep(6 * time.Minute)
		synctest.Wait()

		inst, err := p.UsageHour(ctx, "a")
		if err != nil {
			t.Fatal(err)
		}
		nodes, err := p.Nodes(ctx)
		if err != nil || len(nodes) != 1 {
			t.Fatalf("nodes %+v %v", nodes, err)
		}
		for _, c := range []struct {
			what string
			pts  []control.UsagePoint
		}{
			{"instance", inst},
			{"node", p.NodeUsageHour(nodes[0].Provider, nodes[0].Name)},
			{"cluster", p.ClusterUsageHour()},
		} {
			if want := int(time.Since(from) / cfg.UsageInterval); len(c.pts) < want || len(c.pts) > want+2 {
				t.Fatalf("%s: %d points, want about %d (one per round)", c.what, len(c.pts), want)
			}
			now := time.Now()
			for k, pt := range c.pts {
				if now.Sub(pt.Time) > control.HistoryWindow {
					t.Fatalf("%s: point %d at %s, more than %s ago", c.what, k, pt.Time, control.HistoryWindow)
				}
				if k > 0 && pt.Time.Sub(c.pts[k-1].Time) < control.HistoryStep {
					t.Fatalf("%s: points %d and %d %s apart, want at least %s", c.what, k-1, k, pt.Time.Sub(c.pts[k-1].Time), control.HistoryStep)
				}
				if k == 0 && c.what != "instance" && (pt.CPU == driver.CPUs(1) || pt.ReservedCPU == 0) {
					// The round before the instance's first sample counts
					// it at its reservation; a round that began before its
					// submission, at the same instant of the fake clock,
					// does not count it at all.
					continue
				}
				if pt.CPU != driver.CPUs(0.2) || pt.Memory != 256*driver.MiB || pt.ReservedCPU != driver.CPUs(1) || pt.ReservedMemory != 512*driver.MiB {
					t.Fatalf("%s: point %d %+v, want 0.2 cpus and 256 MiB used of 1 cpu and 512 MiB reserved", c.what, k, pt)
				}
			}
		}
		if got := p.NodeUsageHour("sim", "no-such-node"); len(got) != 0 {
			t.Fatalf("an unknown node's hour: %+v", got)
		}
	})
}
