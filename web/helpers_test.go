package web_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/berth-dev/berth/control"
	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/drivers/sim"
	"github.com/berth-dev/berth/provider"
	"github.com/berth-dev/berth/scheduler"
	"github.com/berth-dev/berth/store/memory"
	"github.com/berth-dev/berth/web"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// tokens is the authenticator of the tests: a fixed set of tokens.
type tokens map[string]web.Identity

func (ts tokens) Authenticate(_ context.Context, tok string) (web.Identity, error) {
	id, ok := ts[tok]
	if !ok {
		return web.Identity{}, errors.New("unknown token")
	}
	return id, nil
}

var testTokens = tokens{
	"admin-secret":    {Name: "admin", Role: web.RoleAdmin},
	"operator-secret": {Name: "ops", Role: web.RoleOperator, Namespaces: []string{"team-a"}},
	"reader-secret":   {Name: "viewer", Role: web.RoleReader, Namespaces: []string{"team-a"}},
	"other-secret":    {Name: "other", Role: web.RoleOperator, Namespaces: []string{"team-b"}},
}

// simPlane returns a control plane over a sim back-end of nodes nodes
// (4 cpus, 8 GiB each) on a memory store; it is not run, so submitted
// instances stay as placed.
func simPlane(tb testing.TB, nodes int) *control.Plane {
	tb.Helper()
	opts := *sim.DefaultOptions()
	opts.Nodes = nodes
	opts.Shape = sim.Shape{Resources: driver.Resources{CPU: driver.CPUs(4), Memory: 8 * driver.GiB, Disk: 100 * driver.GiB}, Labels: map[string]string{"disk": "ssd"}}
	s, err := sim.New(opts)
	if err != nil {
		tb.Fatal(err)
	}
	p, err := provider.New(s, provider.Config{Name: "sim", Logger: quiet})
	if err != nil {
		tb.Fatal(err)
	}
	st := memory.New(memory.Options{})
	tb.Cleanup(func() {
		_ = p.Close(context.Background())
		_ = st.Close()
	})
	plane, err := control.New(context.Background(), control.Config{Store: st, Providers: []*provider.Provider{p}, Cluster: "test", Logger: quiet,
		Quotas: []control.Quota{{Owner: "team-a", Instances: 20_000, CPU: driver.CPUs(1000)}}})
	if err != nil {
		tb.Fatal(err)
	}
	return plane
}

// submit places count sim instances of request id for owner.
func submit(tb testing.TB, plane *control.Plane, owner, id string, count int, tune func(*scheduler.Request)) {
	tb.Helper()
	req := scheduler.Request{ID: id, Count: count, Spec: driver.Spec{Image: "berth/sim",
		Resources: driver.Resources{CPU: driver.CPUs(0.01), Memory: driver.MiB}}}
	if tune != nil {
		tune(&req)
	}
	if _, err := plane.Submit(context.Background(), req, owner); err != nil {
		tb.Fatal(err)
	}
}

// newWeb returns the dashboard over plane with the test tokens.
func newWeb(tb testing.TB, plane *control.Plane, tune func(*web.Options)) *web.Server {
	tb.Helper()
	opts := web.Options{Authenticator: testTokens, Logger: quiet}
	if tune != nil {
		tune(&opts)
	}
	s, err := web.New(plane, opts)
	if err != nil {
		tb.Fatal(err)
	}
	return s
}

// get serves a GET of path with a bearer token (none when tok is "").
func get(s http.Handler, path, tok string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(http.MethodGet, path, nil)
	if tok != "" {
		r.Header.Set("Authorization", "Bearer "+tok)
	}
	w := httptest.NewRecorder()
	s.ServeHTTP(w, r)
	return w
}

// wantBody fails unless the response has status and every want.
func wantBody(tb testing.TB, w *httptest.ResponseRecorder, status int, wants ...string) string {
	tb.Helper()
	body := w.Body.String()
	if w.Code != status {
		tb.Fatalf("status %d, want %d; body:\n%s", w.Code, status, cut(body))
	}
	for _, want := range wants {
		if !strings.Contains(body, want) {
			tb.Errorf("body lacks %q:\n%s", want, cut(body))
		}
	}
	return body
}

func cut(s string) string {
	if len(s) > 4000 {
		return s[:4000] + "…"
	}
	return s
}

// eventually polls cond until it holds or the time is up.
func eventually(tb testing.TB, what string, cond func() bool) {
	tb.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			tb.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
