package control_test

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"testing/synctest"

	"github.com/berth-dev/berth/auth"
	"github.com/berth-dev/berth/control"
	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/driver/drivertest"
	"github.com/berth-dev/berth/reconciler"
	"github.com/berth-dev/berth/scheduler"
	"github.com/berth-dev/berth/store/memory"
)

// TestExecLocal runs commands in a real process's instance through the
// plane and the local provider: exit code, output, input, environment.
func TestExecLocal(t *testing.T) {
	dir := t.TempDir()
	prov := newLocal(t, dir+"/local")
	p, _ := start(t, config(memory.New(memory.Options{}), prov))
	ctx := context.Background()
	r := scheduler.Request{ID: "svc", Spec: driver.Spec{
		Kind: driver.KindProcess, Entrypoint: []string{"/bin/sh", "-c", "exec sleep 60"},
		Env: map[string]string{"FROM_SPEC": "spec"},
	}}
	if _, err := p.Submit(ctx, r, "me"); err != nil {
		t.Fatal(err)
	}
	waitPhase(t, p, "svc", reconciler.Running)
	if err := p.CanExec("svc"); err != nil {
		t.Fatalf("CanExec on the local provider: %v", err)
	}
	var out, errb bytes.Buffer
	code, err := p.Exec(ctx, "svc", driver.ExecOptions{
		Cmd: []string{"/bin/sh", "-c", `cat; echo "$FROM_SPEC $FROM_EXEC"; echo oops >&2; exit 7`},
		Env: []string{"FROM_EXEC=exec"},
	}, strings.NewReader("input\n"), &out, &errb)
	if err != nil || code != 7 || out.String() != "input\nspec exec\n" || errb.String() != "oops\n" {
		t.Fatalf("Exec = %d, %v, stdout %q, stderr %q; want 7, the input, both variables and oops apart", code, err, out.String(), errb.String())
	}
}

// TestExecRefusals: a provider without the capability is named with its
// driver; options out of bounds name the field; an unknown instance is
// not found.
func TestExecRefusals(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		_, prov := newSim(t, 1, nil)
		p, _ := start(t, config(memory.New(memory.Options{}), prov))
		ctx := context.Background()
		if _, err := p.Submit(ctx, req("app", 1), ""); err != nil {
			t.Fatal(err)
		}
		waitPhase(t, p, "app", reconciler.Running)
		var out bytes.Buffer
		want := `provider "` + prov.Name() + `" (driver "sim") cannot exec`
		if _, err := p.Exec(ctx, "app", driver.ExecOptions{Cmd: []string{"ls"}}, nil, &out, &out); !errors.Is(err, driver.ErrUnsupported) || !strings.Contains(err.Error(), want) {
			t.Errorf("exec on a provider that cannot: %v, want unsupported saying %q", err, want)
		}
		if err := p.CanExec("app"); !errors.Is(err, driver.ErrUnsupported) || !strings.Contains(err.Error(), want) {
			t.Errorf("CanExec on a provider that cannot: %v", err)
		}
		// The namespace's run-as policy binds an exec's user as it binds
		// a spec's: an operator may not exec as root, an admin may.
		if _, err := p.Submit(ctx, req("mine", 1), "alice"); err != nil {
			t.Fatal(err)
		}
		waitPhase(t, p, "mine", reconciler.Running)
		op := auth.NewContext(ctx, auth.Identity{Name: "op", Role: auth.RoleOperator, Namespaces: []string{"alice"}})
		for _, u := range []string{"root", "0", "0:0", "nobody:root"} {
			if _, err := p.Exec(op, "mine", driver.ExecOptions{Cmd: []string{"ls"}, User: u}, nil, &out, &out); !errors.Is(err, auth.ErrForbidden) {
				t.Errorf("an operator's exec as %q: %v, want forbidden", u, err)
			}
		}
		admin := auth.NewContext(ctx, auth.Identity{Name: "root", Role: auth.RoleAdmin, Namespaces: []string{auth.AllNamespaces}})
		if _, err := p.Exec(admin, "mine", driver.ExecOptions{Cmd: []string{"ls"}, User: "root"}, nil, &out, &out); !errors.Is(err, driver.ErrUnsupported) {
			t.Errorf("an admin's exec as root: %v, want it to reach the provider (which cannot exec)", err)
		}
		if _, err := p.Exec(ctx, "nosuch", driver.ExecOptions{Cmd: []string{"ls"}}, nil, &out, &out); !errors.Is(err, driver.ErrNotFound) {
			t.Errorf("exec in an unknown instance: %v", err)
		}
		for _, tc := range []struct {
			field string
			opts  driver.ExecOptions
		}{
			{"cmd", driver.ExecOptions{}},
			{"cmd", driver.ExecOptions{Cmd: make([]string, control.MaxExecWords+1)}},
			{"cmd", driver.ExecOptions{Cmd: []string{strings.Repeat("x", control.MaxExecBytes+1)}}},
			{"cmd[1]", driver.ExecOptions{Cmd: []string{"ls", "a\x00b"}}},
			{"env", driver.ExecOptions{Cmd: []string{"ls"}, Env: make([]string, control.MaxExecEnv+1)}},
			{"env[0]", driver.ExecOptions{Cmd: []string{"ls"}, Env: []string{"NOVALUE"}}},
			{"user", driver.ExecOptions{Cmd: []string{"ls"}, User: strings.Repeat("u", control.MaxExecUser+1)}},
			{"workdir", driver.ExecOptions{Cmd: []string{"ls"}, WorkDir: strings.Repeat("d", control.MaxExecWorkDir+1)}},
		} {
			if tc.field == "cmd" && len(tc.opts.Cmd) > 1 {
				tc.opts.Cmd[0] = "ls"
			}
			if tc.field == "env" {
				for i := range tc.opts.Env {
					tc.opts.Env[i] = "A=1"
				}
			}
			if _, err := p.Exec(ctx, "app", tc.opts, nil, &out, &out); !errors.Is(err, driver.ErrInvalid) || !drivertest.HasField(err, tc.field) {
				t.Errorf("exec with a bad %s: %v, want invalid naming it", tc.field, err)
			}
		}
	})
}
