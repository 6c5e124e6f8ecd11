package control_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/berth-dev/berth/control"
	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/drivers/sim"
	"github.com/berth-dev/berth/reconciler"
	"github.com/berth-dev/berth/scheduler"
	"github.com/berth-dev/berth/store"
	"github.com/berth-dev/berth/store/memory"
)

func named(name string) scheduler.Request {
	r := req("", 1)
	r.Name = name
	return r
}

func TestNameIsReusableOnceItsHolderIsDeleted(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		// Deletes take a while, so that the new hello is created while the
		// back-end still holds the old one under the name.
		_, prov := newSim(t, 1, func(o *sim.Options) { o.DeleteLatency = 300 * time.Millisecond })
		p, _ := start(t, config(memory.New(memory.Options{}), prov))
		ctx := context.Background()

		first, err := p.Submit(ctx, named("hello"), "")
		if err != nil {
			t.Fatal(err)
		}
		oldID := first.Instances[0].Instance.ID
		if oldID == "hello" || oldID == "" {
			t.Fatalf("instance id = %q, want a generated id", oldID)
		}
		waitPhase(t, p, oldID, reconciler.Running)
		if _, err := p.Submit(ctx, named("hello"), ""); !errors.Is(err, driver.ErrAlreadyExists) {
			t.Fatalf("second hello while the first runs: %v, want ErrAlreadyExists", err)
		}
		if err := p.Delete(ctx, "hello"); err != nil {
			t.Fatal(err)
		}
		// The name is free as soon as the delete is asked for, like docker rm.
		second, err := p.Submit(ctx, named("hello"), "")
		if err != nil {
			t.Fatalf("hello again after rm: %v", err)
		}
		newID := second.Instances[0].Instance.ID
		if newID == oldID {
			t.Fatalf("the new hello reuses id %s", oldID)
		}
		running := waitPhase(t, p, newID, reconciler.Running)
		waitPhase(t, p, oldID, reconciler.Deleted)
		if running.Incarnation != 1 {
			t.Errorf("new hello incarnation %d, want 1: created under hello.1 while the old resource still held hello", running.Incarnation)
		}
		if in, err := p.Instance(ctx, "hello"); err != nil || in.ID != newID {
			t.Fatalf("Instance(hello) = %s, %v; want the live %s", in.ID, err, newID)
		}
		all, err := p.Instances(ctx, control.Filter{Name: "hello", All: true})
		if err != nil || len(all) != 2 {
			t.Fatalf("ps -a --name hello = %v, %v; want both", ids(all), err)
		}
		live, err := p.Instances(ctx, control.Filter{Name: "hello"})
		if err != nil || len(live) != 1 || live[0].ID != newID {
			t.Fatalf("ps --name hello = %v, %v; want %s", ids(live), err, newID)
		}
		if err := p.Delete(ctx, "hello"); err != nil {
			t.Fatal(err)
		}
		waitPhase(t, p, newID, reconciler.Deleted)
		// All deleted: the name resolves to the newest, for inspect.
		if in, err := p.Instance(ctx, "hello"); err != nil || in.ID != newID {
			t.Fatalf("Instance(hello) after both are deleted = %s, %v; want the newest %s", in.ID, err, newID)
		}
	})
}

func TestDeletedRecordsAreCollectedAfterRetention(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		_, prov := newSim(t, 2, nil)
		st := memory.New(memory.Options{})
		cfg := config(st, prov)
		cfg.Retention = 300 * time.Millisecond
		p, _ := start(t, cfg)
		ctx := context.Background()

		if _, err := p.Submit(ctx, req("kept", 1), ""); err != nil {
			t.Fatal(err)
		}
		if _, err := p.Submit(ctx, req("gone", 1), ""); err != nil {
			t.Fatal(err)
		}
		waitPhase(t, p, "kept", reconciler.Running)
		waitPhase(t, p, "gone", reconciler.Running)
		if err := p.Delete(ctx, "gone"); err != nil {
			t.Fatal(err)
		}
		waitPhase(t, p, "gone", reconciler.Deleted)
		// Still visible right after the delete.
		if all, _ := p.Instances(ctx, control.Filter{All: true}); len(all) != 2 {
			t.Fatalf("ps -a right after the delete = %v, want kept and gone", ids(all))
		}
		// The instance's record goes first, its request's in a later
		// commit of the same collection.
		waitFor(t, "the deleted records to be collected", func() bool {
			if _, err := p.Instance(ctx, "gone"); !errors.Is(err, driver.ErrNotFound) {
				return false
			}
			for _, key := range []string{control.PrefixInstances + "gone", control.PrefixRequests + "gone"} {
				if _, err := st.Get(ctx, key); !errors.Is(err, store.ErrNotFound) {
					return false
				}
			}
			return true
		})
		for _, key := range []string{control.PrefixInstances + "kept", control.PrefixRequests + "kept"} {
			if _, err := st.Get(ctx, key); err != nil {
				t.Errorf("%s of a running instance: %v", key, err)
			}
		}
		if ph := phaseOf(t, p, "kept"); ph != reconciler.Running {
			t.Fatalf("kept is %s", ph)
		}
		if c, _ := p.Counts(ctx); c[reconciler.Deleted] != 0 || c[reconciler.Running] != 1 {
			t.Fatalf("counts after collection = %v", c)
		}
	})
}

func TestDeletedRecordsBeyondTheCapAreCollectedOldestFirst(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		_, prov := newSim(t, 2, nil)
		cfg := config(memory.New(memory.Options{}), prov)
		cfg.MaxRetained = 2
		p, _ := start(t, cfg)
		ctx := context.Background()
		names := []string{"a", "b", "c", "d"}
		for _, n := range names {
			if _, err := p.Submit(ctx, req(n, 1), ""); err != nil {
				t.Fatal(err)
			}
			waitPhase(t, p, n, reconciler.Running)
		}
		for _, n := range names {
			if err := p.Delete(ctx, n); err != nil {
				t.Fatal(err)
			}
			waitPhase(t, p, n, reconciler.Deleted)
		}
		waitFor(t, "the two oldest deleted records to go", func() bool {
			all, err := p.Instances(ctx, control.Filter{All: true})
			return err == nil && strings.Join(ids(all), ",") == "c,d"
		})
	})
}

func TestRequestLargerThanEveryNodeIsDeclined(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		_, prov := newSim(t, 3, nil) // 4 cpus, 8 GiB each
		p, _ := start(t, config(memory.New(memory.Options{}), prov))
		ctx := context.Background()
		for _, c := range []struct {
			res  driver.Resources
			want string
		}{
			{driver.Resources{CPU: driver.CPUs(5), Memory: driver.GiB}, "cpus"},
			{driver.Resources{CPU: driver.CPUs(1), Memory: 9 * driver.GiB}, "memory"},
			{driver.Resources{CPU: driver.CPUs(1), GPUs: 1}, "gpus"},
		} {
			r := req("", 1)
			r.Resources = c.res
			_, err := p.Submit(ctx, r, "")
			if !errors.Is(err, driver.ErrInsufficientCapacity) || !strings.Contains(err.Error(), c.want) {
				t.Errorf("%+v: err = %v, want ErrInsufficientCapacity naming %s", c.res, err, c.want)
			}
		}
		if all, _ := p.Instances(ctx, control.Filter{All: true}); len(all) != 0 {
			t.Fatalf("declined requests left instances: %v", ids(all))
		}
		// What fits the largest node but not now is accepted and waits.
		fits := req("fits", 2)
		fits.Resources = driver.Resources{CPU: driver.CPUs(4), Memory: 8 * driver.GiB}
		if _, err := p.Submit(ctx, fits, ""); err != nil {
			t.Fatalf("a request as large as a node: %v", err)
		}
	})
}

func TestGroupMemberLosingItsNodeIsPlacedAgainAndTheGroupSaysWhenItCannot(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, prov := newSim(t, 2, nil) // 4 cpus each: web and db cannot share a node
		cfg := config(memory.New(memory.Options{}), prov)
		cfg.ExcludeFor = 300 * time.Millisecond
		p, _ := start(t, cfg)
		ctx := context.Background()
		svc := func(name string) scheduler.Service {
			return scheduler.Service{Request: scheduler.Request{Spec: driver.Spec{Name: name, Image: "busybox", Resources: driver.Resources{CPU: driver.CPUs(3)}}}}
		}
		if _, err := p.SubmitGroup(ctx, scheduler.Group{ID: "app", Services: []scheduler.Service{svc("web"), svc("db")}}, ""); err != nil {
			t.Fatal(err)
		}
		web := waitPhase(t, p, "app.web", reconciler.Running)
		waitPhase(t, p, "app.db", reconciler.Running)
		waitFor(t, "the group to run", func() bool {
			st, err := p.Group(ctx, "app")
			return err == nil && st.State == control.GroupRunning
		})

		// web has no restart policy, yet as a group member it is placed again;
		// the other node has no room, so the group is degraded and says why.
		if err := s.SetNodeStatus(web.Node, driver.NodeOffline, "pulled the plug"); err != nil {
			t.Fatal(err)
		}
		var st control.GroupStatus
		waitFor(t, "the group to be degraded", func() bool {
			var err error
			st, err = p.Group(ctx, "app")
			return err == nil && st.State == control.GroupDegraded
		})
		if !strings.Contains(st.Message, "app.web") {
			t.Fatalf("degraded group message %q does not name app.web", st.Message)
		}
		// The node returns; once the exclusion expires web goes back there.
		if err := s.SetNodeStatus(web.Node, driver.NodeOnline, ""); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "the group to run again", func() bool {
			st, err := p.Group(ctx, "app")
			return err == nil && st.State == control.GroupRunning
		})
		again, _ := p.Instance(ctx, "app.web")
		if again.Node != web.Node || again.Incarnation != 1 {
			t.Fatalf("web after the node returned: node %s incarnation %d, want %s and 1", again.Node, again.Incarnation, web.Node)
		}
		waitFor(t, "one copy of web", func() bool {
			return len(tagged(t, prov, map[string]string{driver.TagInstance: "app.web"})) == 1
		})
		if _, err := p.Group(ctx, "nope"); !errors.Is(err, driver.ErrNotFound) {
			t.Fatalf("unknown group: %v", err)
		}
	})
}

func TestQuotasThatCanNeverAdmitDecline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		_, prov := newSim(t, 4, nil)
		cfg := config(memory.New(memory.Options{}), prov)
		cfg.Quotas = []control.Quota{{Owner: "bob", Instances: 3, CPU: driver.CPUs(2)}}
		p, _ := start(t, cfg)
		ctx := context.Background()
		svc := func(name string, count int, cpu float64) scheduler.Service {
			return scheduler.Service{Request: scheduler.Request{Count: count, Spec: driver.Spec{Name: name, Image: "busybox", Resources: driver.Resources{CPU: driver.CPUs(cpu)}}}}
		}
		for _, c := range []struct {
			g    scheduler.Group
			want string
		}{
			{scheduler.Group{ID: "many", Services: []scheduler.Service{svc("a", 2, 0.1), svc("b", 2, 0.1)}}, "4"},
			{scheduler.Group{ID: "fat", Services: []scheduler.Service{svc("a", 1, 1.5), svc("b", 1, 1)}}, "cpus"},
		} {
			_, err := p.SubmitGroup(ctx, c.g, "bob")
			if !errors.Is(err, driver.ErrQuotaExceeded) || !strings.Contains(err.Error(), "quota owner bob") || !strings.Contains(err.Error(), c.want) {
				t.Errorf("group %s: %v, want ErrQuotaExceeded naming quota owner bob and %s", c.g.ID, err, c.want)
			}
		}
		// Elastic instances beyond the quota do not make a group impossible.
		one := 1
		elastic := svc("a", 4, 0.1)
		elastic.Essential = &one
		if _, err := p.SubmitGroup(ctx, scheduler.Group{ID: "elastic", Services: []scheduler.Service{elastic}}, "bob"); err != nil {
			t.Fatalf("a group whose essentials fit the quota: %v", err)
		}
		// Another owner is not limited by bob's quota.
		if _, err := p.SubmitGroup(ctx, scheduler.Group{ID: "many", Services: []scheduler.Service{svc("c", 2, 0.1), svc("d", 2, 0.1)}}, "carol"); err != nil {
			t.Fatalf("carol's group: %v", err)
		}
	})
}
