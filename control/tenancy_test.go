package control_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"testing/synctest"

	"github.com/berth-dev/berth/control"
	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/reconciler"
	"github.com/berth-dev/berth/store/memory"
)

// TestNamesArePerNamespace: two namespaces each run an instance of the
// same name (the back-end, whose names are global, gets another name for
// the second); a second one in the same namespace is refused naming only
// that namespace's instance; a lookup resolves the name within the
// caller's scope only, and the index is rebuilt from the store.
func TestNamesArePerNamespace(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		_, prov := newSim(t, 2, nil)
		st := memory.New(memory.Options{})
		p, stop := start(t, config(st, prov))
		alice, err := p.Submit(ctx, named("web"), "alice")
		if err != nil {
			t.Fatal(err)
		}
		aliceID := alice.Instances[0].Instance.ID
		waitPhase(t, p, aliceID, reconciler.Running)
		mallory, err := p.Submit(ctx, named("web"), "mallory")
		if err != nil {
			t.Fatalf("mallory's web next to alice's: %v", err)
		}
		malloryID := mallory.Instances[0].Instance.ID
		waitPhase(t, p, malloryID, reconciler.Running)

		_, err = p.Submit(ctx, named("web"), "mallory")
		var fe *driver.FieldError
		if !errors.Is(err, driver.ErrAlreadyExists) || !errors.As(err, &fe) || fe.Path != "name" || strings.Contains(err.Error(), aliceID) || !strings.Contains(err.Error(), malloryID) {
			t.Fatalf("a second web in mallory: %v, want a conflict on name naming %s and never %s", err, malloryID, aliceID)
		}

		check := func(p *control.Plane) {
			t.Helper()
			for _, c := range []struct {
				scope control.Scope
				want  string
			}{
				{control.Scope{Namespaces: []string{"alice"}}, aliceID},
				{control.Scope{Namespaces: []string{"mallory"}}, malloryID},
				{control.Scope{Namespaces: []string{"bob", "mallory"}}, malloryID},
			} {
				in, err := p.Lookup(ctx, "web", c.scope)
				if err != nil || in.ID != c.want {
					t.Errorf("web in %v: %s %v, want %s", c.scope.Namespaces, in.ID, err, c.want)
				}
			}
			if _, err := p.Lookup(ctx, aliceID, control.Scope{Namespaces: []string{"mallory"}}); !errors.Is(err, driver.ErrNotFound) {
				t.Errorf("alice's instance by id from mallory: %v, want not found", err)
			}
			if _, err := p.Lookup(ctx, "web", control.Scope{Namespaces: []string{"bob"}}); !errors.Is(err, driver.ErrNotFound) {
				t.Errorf("web from bob: %v, want not found", err)
			}
			_, err := p.Lookup(ctx, "web", control.Everywhere)
			if !errors.As(err, &fe) || fe.Path != "ref" || !strings.Contains(err.Error(), "alice, mallory") {
				t.Errorf("web everywhere: %v, want a field error on ref naming both namespaces", err)
			}
		}
		check(p)
		stop()

		// Loaded again from the store: the same answers.
		p2, _ := start(t, config(st, prov))
		check(p2)
		if _, err := p2.Submit(ctx, named("web"), "alice"); !errors.Is(err, driver.ErrAlreadyExists) {
			t.Fatalf("a second web in alice after a restart: %v, want a conflict", err)
		}
	})
}
