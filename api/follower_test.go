package api_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/berth-dev/berth/api"
	"github.com/berth-dev/berth/api/apitest"
	"github.com/berth-dev/berth/auth"
	"github.com/berth-dev/berth/control"
	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/provider"
	"github.com/berth-dev/berth/reconciler"
	"github.com/berth-dev/berth/scheduler"
	"github.com/berth-dev/berth/store/memory"
)

// TestFollowerInstanceIsCurrent: a follower's GET /v1/instances/{ref}
// answers from its copy only the record the store holds now
// (control.Plane.Current); an instance whose copy is behind the store,
// or that the copy does not hold, the leader answers, so that a client
// reads what it just changed through the leader.
func TestFollowerInstanceIsCurrent(t *testing.T) {
	st := memory.New(memory.Options{})
	e := newEnvOn(t, st, map[string]any{"nodes": 1}, 0)
	ctx := context.Background()
	waitPhase := func(id string, want reconciler.Phase) {
		t.Helper()
		deadline := time.Now().Add(time.Minute)
		for {
			in, err := e.plane.Instance(ctx, id)
			if err == nil && in.Phase == want {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: %+v, %v; want %s", id, in, err, want)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	if _, err := e.client.Submit(ctx, scheduler.Request{Spec: driver.Spec{Image: "x"}, ID: "web"}); err != nil {
		t.Fatal(err)
	}
	waitPhase("web", reconciler.Running)

	// The follower's read-only plane loads the store and, not running,
	// follows it no further: its copy stays what it loaded.
	prov := apitest.SimProvider(t, map[string]any{"nodes": 1})
	t.Cleanup(func() { _ = prov.Close(context.Background()) })
	ro, err := control.New(ctx, control.Config{Store: st, Providers: []*provider.Provider{prov}, Cluster: "test", ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	var forwarded atomic.Int64
	leader := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		forwarded.Add(1)
		e.api.ServeHTTP(w, r)
	})
	follower := withToken(api.New(ro, api.Options{Tokens: auth.NewTokens(st, nil), Leader: leader, Rate: -1, AuditLog: slog.New(slog.DiscardHandler)}), e.token)
	// get GETs ref through the follower; an empty wantPhase takes any.
	get := func(ref string, wantStatus int, wantPhase reconciler.Phase, wantForwarded bool) {
		t.Helper()
		before := forwarded.Load()
		rec := httptest.NewRecorder()
		follower.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/v1/instances/"+ref, nil))
		var in control.Instance
		if rec.Code == http.StatusOK {
			if err := json.Unmarshal(rec.Body.Bytes(), &in); err != nil {
				t.Fatal(err)
			}
		}
		if got := forwarded.Load() > before; rec.Code != wantStatus || wantPhase != "" && in.Phase != wantPhase || got != wantForwarded {
			t.Errorf("GET %s through the follower: %d, phase %q, forwarded %t; want %d, %q, forwarded %t", ref, rec.Code, in.Phase, got, wantStatus, wantPhase, wantForwarded)
		}
	}
	get("web", http.StatusOK, reconciler.Running, false)

	if _, err := e.client.Stop(ctx, "web", time.Second); err != nil {
		t.Fatal(err)
	}
	waitPhase("web", reconciler.Stopped)
	if in, err := ro.Instance(ctx, "web"); err != nil || in.Phase != reconciler.Running {
		t.Fatalf("the follower's copy: %+v, %v; want web still running", in, err)
	}
	get("web", http.StatusOK, reconciler.Stopped, true)

	if _, err := e.client.Submit(ctx, scheduler.Request{Spec: driver.Spec{Image: "x"}, ID: "later"}); err != nil {
		t.Fatal(err)
	}
	get("later", http.StatusOK, "", true)
	get("none", http.StatusNotFound, "", true)
}
