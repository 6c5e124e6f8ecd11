package control_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"testing/synctest"

	"github.com/berth-dev/berth/auth"
	"github.com/berth-dev/berth/control"
	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/reconciler"
	"github.com/berth-dev/berth/scheduler"
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

// TestReservedFieldsAndRunAs: a submission may not set Berth's own labels,
// tags or variables, while Berth still tags what it launches; a caller
// that is not an admin runs non-root only unless its namespace's policy
// says otherwise.
func TestReservedFieldsAndRunAs(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		_, prov := newSim(t, 2, nil)
		cfg := config(memory.New(memory.Options{}), prov)
		cfg.RunAs = []control.RunAs{{Namespace: "ops", Users: []string{"root", "app"}}, {Namespace: "web", Users: []string{"app"}, Groups: []string{"app"}}}
		p, _ := start(t, cfg)
		operator := func(ns string) context.Context {
			return auth.NewContext(context.Background(), auth.Identity{Name: "op", Role: auth.RoleOperator, Namespaces: []string{ns}})
		}
		admin := auth.NewContext(context.Background(), auth.Identity{Name: "admin", Role: auth.RoleAdmin})

		for _, c := range []struct {
			tune  func(*driver.Spec)
			field string
		}{
			{func(s *driver.Spec) { s.Tags = map[string]string{driver.TagCluster: "x"} }, "tags.berth.cluster"},
			{func(s *driver.Spec) { s.Labels = map[string]string{driver.TagInstance: "x"} }, "labels.berth.instance"},
			{func(s *driver.Spec) { s.Labels = map[string]string{"berth/managed": "true"} }, "labels.berth/managed"},
			{func(s *driver.Spec) { s.Env = map[string]string{"BERTH_INSTANCE_ID": "x"} }, "env.BERTH_INSTANCE_ID"},
		} {
			r := req("", 1)
			r.ID = ""
			c.tune(&r.Spec)
			for _, ctx := range []context.Context{admin, context.Background()} {
				_, err := p.Submit(ctx, r, "alice")
				var fe *driver.FieldError
				if !errors.As(err, &fe) || fe.Path != c.field {
					t.Errorf("submit with %s: %v, want a field error on it", c.field, err)
				}
			}
			g := scheduler.Group{ID: "g-" + strings.NewReplacer(".", "-", "/", "-", "_", "-").Replace(strings.ToLower(c.field)), Services: []scheduler.Service{{Request: r}}}
			g.Services[0].Name = "svc"
			_, err := p.SubmitGroup(admin, g, "alice")
			var fe *driver.FieldError
			if !errors.As(err, &fe) || fe.Path != "services[0]."+c.field {
				t.Errorf("group with %s: %v, want a field error on services[0].%s", c.field, err, c.field)
			}
		}
		// Berth's own tags are still written on what it launches.
		ans, err := p.Submit(operator("alice"), req("", 1), "alice")
		if err != nil {
			t.Fatal(err)
		}
		id := ans.Instances[0].Instance.ID
		waitPhase(t, p, id, reconciler.Running)
		if got := tagged(t, prov, map[string]string{driver.TagInstance: id, driver.TagManaged: "true"}); len(got) != 1 {
			t.Errorf("%d back-end resources tagged as instance %s, want 1", len(got), id)
		}

		for _, c := range []struct {
			ctx         context.Context
			ns          string
			user, group string
			field       string // "" allowed
		}{
			{operator("alice"), "alice", "root", "", "user"},
			{operator("alice"), "alice", "0", "", "user"},
			{operator("alice"), "alice", "000", "", "user"},
			{operator("alice"), "alice", "app", "0", "group"},
			{operator("alice"), "alice", "app", "", ""},
			{operator("alice"), "alice", "", "", ""},
			{operator("ops"), "ops", "root", "", ""},
			{operator("ops"), "ops", "other", "", "user"},
			{operator("web"), "web", "app", "app", ""},
			{operator("web"), "web", "app", "wheel", "group"},
			{admin, "alice", "root", "", ""},
			{context.Background(), "alice", "0", "", ""},
		} {
			r := req("", 1)
			r.ID = ""
			r.Spec.User, r.Spec.Group = c.user, c.group
			_, err := p.Submit(c.ctx, r, c.ns)
			var fe *driver.FieldError
			switch {
			case c.field == "" && err != nil:
				t.Errorf("user %q group %q in %s: %v, want it accepted", c.user, c.group, c.ns, err)
			case c.field != "" && (!errors.Is(err, auth.ErrForbidden) || !errors.As(err, &fe) || fe.Path != c.field):
				t.Errorf("user %q group %q in %s: %v, want forbidden naming %s", c.user, c.group, c.ns, err, c.field)
			}
		}
	})
}
