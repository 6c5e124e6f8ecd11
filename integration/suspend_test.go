package integration_test

import (
	"context"
	"log/slog"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/moby/moby/client"

	"github.com/berth-dev/berth/api"
	apiclient "github.com/berth-dev/berth/api/client"
	"github.com/berth-dev/berth/auth"
	"github.com/berth-dev/berth/reconciler"
	"github.com/berth-dev/berth/scheduler"
)

// serve puts the REST API in front of e's plane and returns a client with
// an admin token; the server is closed when the test ends.
func (e *env) serve(t *testing.T) *apiclient.Client {
	t.Helper()
	tokens := auth.NewTokens(e.store, nil)
	secret, _, err := tokens.Create(context.Background(), auth.Spec{Name: "it-admin", Role: auth.RoleAdmin})
	if err != nil {
		t.Fatal(err)
	}
	s := api.New(e.plane, api.Options{Tokens: tokens, Logger: quiet, AuditLog: slog.New(slog.DiscardHandler)})
	hs := httptest.NewServer(s)
	t.Cleanup(func() {
		s.CloseStreams()
		hs.Close()
	})
	c, err := apiclient.New(hs.URL, apiclient.WithToken(secret), apiclient.WithNamespace("it"))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestSuspendPausesTheContainer: suspending an instance through the API
// pauses its container (the engine says so), the API shows it suspended
// through sync rounds, resuming runs it again, and a suspended instance is
// deleted with its container.
func TestSuspendPausesTheContainer(t *testing.T) {
	e := setup(t, nil)
	c := e.serve(t)
	ctx := context.Background()
	if _, err := c.Submit(ctx, e.named(scheduler.Request{ID: "nap", Spec: helloSpec()})); err != nil {
		t.Fatal(err)
	}
	in := e.allIn(t, reconciler.Running, 1)[0]
	engine := engines()[in.Node]
	paused := func() (paused, running bool) {
		t.Helper()
		ci, err := engine.ContainerInspect(ctx, containerID(in.BackendID), client.ContainerInspectOptions{})
		if err != nil || ci.Container.State == nil {
			t.Fatalf("inspect the container of %s on %s: %v", in.ID, in.Node, err)
		}
		return ci.Container.State.Paused, ci.Container.State.Running
	}
	phase := func() reconciler.Phase {
		t.Helper()
		got, err := c.Instance(ctx, in.ID)
		if err != nil {
			t.Fatal(err)
		}
		return got.Phase
	}

	got, err := c.Suspend(ctx, in.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.Phase != reconciler.Suspended {
		t.Errorf("suspend answered the instance %s, want suspended", got.Phase)
	}
	if p, _ := paused(); !p {
		t.Fatal("after suspend the engine does not show the container paused")
	}
	e.afterSyncs(t, 2) // the listings show the container paused
	if ph := phase(); ph != reconciler.Suspended {
		t.Fatalf("after sync rounds: %s, want suspended", ph)
	}
	st, err := c.Stats(ctx, in.ID)
	if err != nil || st.Phase != reconciler.Suspended || st.MemoryBytes <= 0 {
		t.Errorf("stats of the paused container: %+v, %v; want suspended, holding memory", st, err)
	}

	if got, err = c.Resume(ctx, in.ID); err != nil || got.Phase != reconciler.Running {
		t.Fatalf("resume: %+v, %v; want running", got, err)
	}
	if p, r := paused(); p || !r {
		t.Fatalf("after resume the engine shows paused %v, running %v; want running", p, r)
	}
	if got, err := c.Resume(ctx, in.ID); err != nil || got.Phase != reconciler.Running {
		t.Errorf("resume of a running instance: %+v, %v; want it running, nothing done", got, err)
	}
	e.afterSyncs(t, 2)
	if ph := phase(); ph != reconciler.Running {
		t.Fatalf("after sync rounds: %s, want running", ph)
	}

	// Paused behind Berth's back: the record follows the engine.
	if _, err := engine.ContainerPause(ctx, containerID(in.BackendID), client.ContainerPauseOptions{}); err != nil {
		t.Fatal(err)
	}
	e.waitFor(t, "the instance seen suspended", func() bool { return phase() == reconciler.Suspended })
	ctxDel, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if _, err := c.Delete(ctxDel, in.ID); err != nil {
		t.Fatal(err)
	}
	e.deleteAll(t)
}
