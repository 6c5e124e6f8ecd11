package control_test

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/berth-dev/berth/control"
	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/reconciler"
	"github.com/berth-dev/berth/scheduler"
	"github.com/berth-dev/berth/store/memory"
)

// TestAdviceFromMeasuredUse: every instance measures 0.05 cpu and 256 MiB.
// One reserving 1.5 cpus and 4 GiB, and a group of two reserving 1 cpu each,
// are far from it; one reserving 0.05 cpu and 256 MiB is not. The
// advice lists the far ones with the suggested size, sums the group's, and
// says what the cluster gets back; a namespace filter keeps to it.
func TestAdviceFromMeasuredUse(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		_, prov := newSteady(t, driver.CPUs(0.05))
		cfg := config(memory.New(memory.Options{}), prov)
		cfg.UsageInterval = 100 * time.Millisecond
		p, _ := start(t, cfg)
		ctx := context.Background()
		big := cpuReq("big", 1.5)
		big.Memory = 4 * driver.GiB
		if _, err := p.Submit(ctx, big, "team"); err != nil {
			t.Fatal(err)
		}
		fit := cpuReq("fit", 0.05)
		fit.Memory = 256 * driver.MiB
		if _, err := p.Submit(ctx, fit, "team"); err != nil {
			t.Fatal(err)
		}
		svc := scheduler.Service{Request: scheduler.Request{Spec: driver.Spec{Name: "w", Image: "busybox", Resources: driver.Resources{CPU: driver.CPUs(1), Memory: 512 * driver.MiB}}, Count: 2}}
		if _, err := p.SubmitGroup(ctx, scheduler.Group{ID: "app", Services: []scheduler.Service{svc}}, "other"); err != nil {
			t.Fatal(err)
		}
		for _, id := range []string{"big", "fit", "app.w-0", "app.w-1"} {
			waitPhase(t, p, id, reconciler.Running)
		}
		var ans *control.AdviceAnswer
		waitFor(t, "advice on three instances", func() bool {
			var err error
			ans, err = p.Advice(ctx, control.Filter{}, scheduler.AdviceOptions{})
			return err == nil && len(ans.Instances) == 3
		})
		byID := map[string]control.InstanceAdvice{}
		for _, a := range ans.Instances {
			byID[a.Instance] = a
		}
		b, ok := byID["big"]
		// 0.05 cpu + 20% = 0.06; 256 MiB + 20%, rounded up to a MiB.
		if !ok || b.Suggested.CPUs != driver.CPUs(0.06) || b.Suggested.MemoryBytes != int64(308*driver.MiB) ||
			b.Reserved.CPUs != driver.CPUs(1.5) || b.Used.CPUs != driver.CPUs(0.05) || b.Samples == 0 || b.Namespace != "team" {
			t.Fatalf("advice on big: %+v", b)
		}
		if _, listed := byID["fit"]; listed {
			t.Fatalf("an instance reserving what it uses is advised on: %+v", byID["fit"])
		}
		if len(ans.Groups) != 1 || ans.Groups[0].Group != "app" || ans.Groups[0].Instances != 2 || ans.Groups[0].Reserved.CPUs != driver.CPUs(2) ||
			ans.Groups[0].Suggested.CPUs != driver.CPUs(0.12) {
			t.Fatalf("groups %+v", ans.Groups)
		}
		if want := driver.CPUs(1.5-0.06) + 2*driver.CPUs(1-0.06); ans.Saves.CPUs != want {
			t.Fatalf("the cluster gets back %s cpus, want %s", ans.Saves.CPUs, want)
		}
		// A limit bounds the list, largest savings first; the sums stay.
		top, err := p.Advice(ctx, control.Filter{Limit: 1}, scheduler.AdviceOptions{})
		if err != nil || len(top.Instances) != 1 || top.Instances[0].Instance != "big" || top.Advised != 3 || top.Saves != ans.Saves {
			t.Fatalf("advice with limit 1: %+v %v", top, err)
		}
		mine, err := p.Advice(ctx, control.Filter{Owners: []string{"team"}}, scheduler.AdviceOptions{})
		if err != nil || len(mine.Instances) != 1 || mine.Instances[0].Instance != "big" || len(mine.Groups) != 0 {
			t.Fatalf("advice in namespace team: %+v %v", mine, err)
		}
	})
}
