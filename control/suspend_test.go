package control_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/driver/drivertest"
	"github.com/berth-dev/berth/provider"
	"github.com/berth-dev/berth/reconciler"
	"github.com/berth-dev/berth/store/memory"
)

// TestSuspendAndResume: a suspended instance is suspended in the back-end
// and in its record, stays so through sync rounds whatever its restart
// policy, refuses hold, and runs again once resumed; a stop resumes it
// first.
func TestSuspendAndResume(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, prov := newSim(t, 1, nil)
		p, _ := start(t, config(memory.New(memory.Options{}), prov))
		ctx := context.Background()
		r := req("app", 1)
		r.RestartPolicy = driver.RestartPolicy{Name: "always"}
		if _, err := p.Submit(ctx, r, ""); err != nil {
			t.Fatal(err)
		}
		in := waitPhase(t, p, "app", reconciler.Running)

		if err := p.Suspend(ctx, "app"); err != nil {
			t.Fatal(err)
		}
		if ph := phaseOf(t, p, "app"); ph != reconciler.Suspended {
			t.Fatalf("after Suspend: %s, want suspended", ph)
		}
		if got, err := s.Get(ctx, in.BackendID); err != nil || got.State != driver.StateSuspended {
			t.Fatalf("the back-end shows %+v (%v), want it suspended", got, err)
		}
		if err := p.Suspend(ctx, "app"); err != nil {
			t.Errorf("Suspend of a suspended instance: %v, want nothing done", err)
		}
		// Sync rounds (every 20 ms) see it paused: nothing counts it lost,
		// failed or to be restarted.
		time.Sleep(200 * time.Millisecond)
		got, err := p.Instance(ctx, "app")
		if err != nil || got.Phase != reconciler.Suspended || got.Incarnation != 0 || got.BackendID != in.BackendID {
			t.Fatalf("after sync rounds: %s, incarnation %d, back-end %q (%v); want suspended, the same copy", got.Phase, got.Incarnation, got.BackendID, err)
		}
		if err := p.Hold(ctx, "app", time.Now().Add(time.Hour)); !errors.Is(err, driver.ErrInvalid) {
			t.Errorf("Hold of a suspended instance: %v, want invalid", err)
		}

		if err := p.Resume(ctx, "app"); err != nil {
			t.Fatal(err)
		}
		if ph := phaseOf(t, p, "app"); ph != reconciler.Running {
			t.Fatalf("after Resume: %s, want running", ph)
		}
		if got, err := s.Get(ctx, in.BackendID); err != nil || got.State != driver.StateRunning {
			t.Fatalf("the back-end shows %+v (%v), want it running", got, err)
		}
		if err := p.Resume(ctx, "app"); err != nil {
			t.Errorf("Resume of a running instance: %v, want nothing done", err)
		}

		// Paused and resumed behind the plane's back: the record follows.
		if err := s.Suspend(ctx, in.BackendID); err != nil {
			t.Fatal(err)
		}
		waitPhase(t, p, "app", reconciler.Suspended)
		if err := s.Resume(ctx, in.BackendID); err != nil {
			t.Fatal(err)
		}
		waitPhase(t, p, "app", reconciler.Running)

		// A stop of a suspended instance resumes it, then stops it.
		if err := p.Suspend(ctx, "app"); err != nil {
			t.Fatal(err)
		}
		if err := p.Stop(ctx, "app", 0); err != nil {
			t.Fatal(err)
		}
		if got, err := s.Get(ctx, in.BackendID); err != nil || got.State != driver.StateStopped {
			t.Fatalf("the back-end shows %+v (%v), want it stopped", got, err)
		}
		before, _ := p.Instance(ctx, "app")
		if err := p.Suspend(ctx, "app"); err != nil {
			t.Errorf("Suspend of a stopped instance: %v, want nothing done", err)
		}
		if after, _ := p.Instance(ctx, "app"); after.Revision != before.Revision {
			t.Errorf("Suspend of a stopped instance changed it: %s", after.Phase)
		}
		if err := p.Resume(ctx, "app"); !errors.Is(err, driver.ErrNotSuspended) {
			t.Errorf("Resume of a stopped instance: %v, want not suspended", err)
		}
		for _, verb := range []func(context.Context, string) error{p.Suspend, p.Resume} {
			if err := verb(ctx, "nosuch"); !errors.Is(err, driver.ErrNotFound) {
				t.Errorf("of an unknown instance: %v, want not found", err)
			}
		}
	})
}

// TestSuspendAndUsageNeedTheCapability: a provider whose driver can
// neither suspend nor measure refuses both by name, and the instance is
// left running.
func TestSuspendAndUsageNeedTheCapability(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, _ := newSim(t, 1, nil)
		prov, err := provider.New(drivertest.Bare(s), provider.Config{Name: "plain", Logger: quiet, StateTTL: time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		p, _ := start(t, config(memory.New(memory.Options{}), prov))
		ctx := context.Background()
		if _, err := p.Submit(ctx, req("app", 1), ""); err != nil {
			t.Fatal(err)
		}
		waitPhase(t, p, "app", reconciler.Running)
		err = p.Suspend(ctx, "app")
		if !errors.Is(err, driver.ErrUnsupported) || !strings.Contains(err.Error(), `"plain"`) || !strings.Contains(err.Error(), "suspend") {
			t.Errorf("Suspend on a provider that cannot: %v, want unsupported naming the provider", err)
		}
		if ph := phaseOf(t, p, "app"); ph != reconciler.Running {
			t.Errorf("after a refused suspend: %s, want running", ph)
		}
		_, err = p.Usage(ctx, "app")
		if !errors.Is(err, driver.ErrUnsupported) || !strings.Contains(err.Error(), `"plain"`) {
			t.Errorf("Usage on a provider that cannot measure: %v, want unsupported naming the provider", err)
		}
	})
}
