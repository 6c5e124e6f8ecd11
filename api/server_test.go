package api_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/berth-dev/berth/api"
	"github.com/berth-dev/berth/api/apitest"
	"github.com/berth-dev/berth/api/client"
	"github.com/berth-dev/berth/control"
	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/driver/drivertest"
	"github.com/berth-dev/berth/reconciler"
	"github.com/berth-dev/berth/scheduler"
	"github.com/berth-dev/berth/store"
	"github.com/berth-dev/berth/store/bolt"
	"github.com/berth-dev/berth/store/memory"
)

func TestMain(m *testing.M) {
	if os.Getenv(loadEnv) != "" {
		// A child started by BenchmarkSubmitSim1000 to send the load.
		os.Exit(sendLoad())
	}
	if os.Getenv(memberEnv) != "" {
		// A child started by BenchmarkW3EndToEnd/etcd3 to run a member.
		os.Exit(memberProcess())
	}
	goleak.VerifyTestMain(m)
}

// env is a real plane (memory store, sim back-end) behind the API.
type env struct {
	api    *api.Server
	http   *httptest.Server
	client *client.Client
	plane  *control.Plane
	// h serves the API as a caller with the admin token and a JSON body.
	h http.Handler
	// token is the admin token's secret.
	token string
}

// withToken serves h as a caller with token: its bearer token, and a JSON
// content type on every body.
func withToken(h http.Handler, token string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r.Header.Set("Authorization", "Bearer "+token)
		if r.ContentLength != 0 && r.Header.Get("Content-Type") == "" {
			r.Header.Set("Content-Type", "application/json")
		}
		h.ServeHTTP(w, r)
	})
}

// newEnv starts a plane over a sim provider with the given options and the
// API in front of it; everything is stopped at the end of the test.
func newEnv(tb testing.TB, simOpts map[string]any, maxBody int64) *env {
	tb.Helper()
	return newEnvOn(tb, memory.New(memory.Options{}), simOpts, maxBody)
}

// newEnvOn is newEnv over the given store, which it closes at the end.
func newEnvOn(tb testing.TB, st store.Store, simOpts map[string]any, maxBody int64) *env {
	tb.Helper()
	// No rate limit: the fuzzer and the benchmarks send far more than a
	// client would.
	e := apitest.Start(tb, st, simOpts, api.Options{MaxBodySize: maxBody, Rate: -1})
	c, err := client.New(e.HTTP.URL, client.WithToken(e.Token), client.WithNamespace("tester"))
	if err != nil {
		tb.Fatal(err)
	}
	return &env{api: e.API, http: e.HTTP, client: c, plane: e.Plane, h: withToken(e.API, e.Token), token: e.Token}
}

// errorBody is the API's error shape as a test reads it.
type errorBody struct {
	Error struct {
		Code    string `json:"code"`
		Message string `json:"message"`
		Field   string `json:"field"`
	} `json:"error"`
}

func do(t *testing.T, h http.Handler, method, path, body string) (int, errorBody, string) {
	t.Helper()
	req := httptest.NewRequest(method, path, strings.NewReader(body))
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	var eb errorBody
	raw := rec.Body.String()
	if rec.Code >= 400 {
		if err := json.Unmarshal([]byte(raw), &eb); err != nil {
			t.Fatalf("%s %s: status %d with a body that is not the error shape: %q", method, path, rec.Code, raw)
		}
	}
	return rec.Code, eb, raw
}

func TestBadInput(t *testing.T) {
	e := newEnv(t, map[string]any{"nodes": 3}, 4096)
	cases := []struct {
		name, method, path, body string
		status                   int
		code, field              string
	}{
		{"malformed JSON", "POST", "/v1/requests", `{"image": "x",`, 400, "invalid", "body"},
		{"not JSON", "POST", "/v1/requests", `image=x`, 400, "invalid", "body"},
		{"empty body", "POST", "/v1/requests", ``, 400, "invalid", "body"},
		{"trailing data", "POST", "/v1/requests", `{"image": "x"} {"image": "y"}`, 400, "invalid", "body"},
		{"array body", "POST", "/v1/requests", `[1, 2]`, 400, "invalid", "body"},
		{"unknown field", "POST", "/v1/requests", `{"image": "x", "imag": "y"}`, 400, "invalid", "imag"},
		{"nested unknown field", "POST", "/v1/requests", `{"image": "x", "ports": [{"container_port": 80, "hostport": 8080}]}`, 400, "invalid", "ports[0].hostport"},
		{"wrong type", "POST", "/v1/requests", `{"image": "x", "count": "3"}`, 400, "invalid", "count"},
		{"wrong nested type", "POST", "/v1/requests", `{"image": "x", "env": {"A": 1}}`, 400, "invalid", "env.A"},
		{"bad cpus", "POST", "/v1/requests", `{"image": "x", "cpus": "lots"}`, 400, "invalid", "cpus"},
		{"bad memory", "POST", "/v1/requests", `{"image": "x", "memory": "12Q"}`, 400, "invalid", "memory"},
		{"negative cpus", "POST", "/v1/requests", `{"image": "x", "cpus": -1}`, 400, "invalid", "cpus"},
		{"negative memory", "POST", "/v1/requests", `{"image": "x", "memory": "-5Mi"}`, 400, "invalid", "memory"},
		{"negative gpus", "POST", "/v1/requests", `{"image": "x", "gpus": -2}`, 400, "invalid", "gpus"},
		{"negative count", "POST", "/v1/requests", `{"image": "x", "count": -3}`, 400, "invalid", "count"},
		{"count above the server's limit", "POST", "/v1/requests", `{"image": "x", "count": 10001}`, 400, "invalid", "count"},
		{"plan count above the limit", "POST", "/v1/plan", `{"image": "x", "count": 1000000}`, 400, "invalid", "count"},
		{"group above the limit", "POST", "/v1/groups", `{"id": "g", "services": [{"image": "x", "id": "a", "count": 6000}, {"image": "x", "id": "b", "count": 6000}]}`, 400, "invalid", "services"},
		{"bad constraint", "POST", "/v1/requests", `{"image": "x", "constraints": ["==ssd"]}`, 400, "invalid", "constraints[0]"},
		{"missing image", "POST", "/v1/requests", `{"cpus": 1}`, 400, "invalid", "image"},
		{"oversized body", "POST", "/v1/requests", `{"image": "` + strings.Repeat("x", 5000) + `"}`, 413, api.CodeTooLarge, ""},
		{"unknown provider", "POST", "/v1/requests", `{"kind": "process", "command": ["true"], "provider": "nope"}`, 400, "invalid", "provider"},
		{"plan negative", "POST", "/v1/plan", `{"image": "x", "memory": -1}`, 400, "invalid", "memory"},
		{"group bad service", "POST", "/v1/groups", `{"id": "g", "services": [{"image": "x", "cpus": -2}]}`, 400, "invalid", "services[0].cpus"},
		{"group unknown field", "POST", "/v1/groups", `{"id": "g", "servces": []}`, 400, "invalid", "servces"},
		{"resize negative", "POST", "/v1/instances/nope/resize", `{"cpus": -1}`, 400, "invalid", "cpus"},
		{"resize unknown field", "POST", "/v1/instances/nope/resize", `{"image": "x"}`, 400, "invalid", "image"},
		{"rename unknown field", "POST", "/v1/instances/nope/rename", `{"nam": "x"}`, 400, "invalid", "nam"},
		{"preload missing image", "POST", "/v1/images/preload", `{"provider": "sim"}`, 400, "invalid", "image"},
		{"bad phase", "GET", "/v1/instances?phase=bogus", ``, 400, "invalid", "phase"},
		{"unknown query parameter", "GET", "/v1/instances?bogus=1", ``, 400, "invalid", "bogus"},
		{"bad tail", "GET", "/v1/instances/x/logs?tail=-1", ``, 400, "invalid", "tail"},
		{"bad grace", "POST", "/v1/instances/x/stop?grace=soon", ``, 400, "invalid", "grace"},
		{"images without provider", "GET", "/v1/images", ``, 400, "invalid", "provider"},
		{"hold without a body", "POST", "/v1/instances/nope/hold", ``, 400, "invalid", "body"},
		{"hold without for", "POST", "/v1/instances/nope/hold", `{}`, 400, "invalid", "for"},
		{"hold for no duration", "POST", "/v1/instances/nope/hold", `{"for": "soon"}`, 400, "invalid", "for"},
		{"hold for zero", "POST", "/v1/instances/nope/hold", `{"for": "0s"}`, 400, "invalid", "for"},
		{"hold for a negative duration", "POST", "/v1/instances/nope/hold", `{"for": "-1h"}`, 400, "invalid", "for"},
		{"hold for more than 30 days", "POST", "/v1/instances/nope/hold", `{"for": "721h"}`, 400, "invalid", "for"},
		{"hold for a number", "POST", "/v1/instances/nope/hold", `{"for": 7200}`, 400, "invalid", "for"},
		{"hold unknown field", "POST", "/v1/instances/nope/hold", `{"for": "2h", "until": "tomorrow"}`, 400, "invalid", "until"},
		{"suspend unknown query parameter", "POST", "/v1/instances/x/suspend?now=1", ``, 400, "invalid", "now"},
		{"bad stream", "GET", "/v1/instances/x/stats?stream=maybe", ``, 400, "invalid", "stream"},
		{"unknown instance", "GET", "/v1/instances/nope", ``, 404, "not_found", ""},
		{"unknown route", "GET", "/v1/nothing", ``, 404, "not_found", ""},
		{"wrong method", "PUT", "/v1/requests", `{}`, 405, api.CodeMethodNotAllowed, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			status, eb, raw := do(t, e.h, c.method, c.path, c.body)
			if status != c.status || eb.Error.Code != c.code || eb.Error.Field != c.field {
				t.Fatalf("got %d %q field %q (%s), want %d %q field %q", status, eb.Error.Code, eb.Error.Field, strings.TrimSpace(raw), c.status, c.code, c.field)
			}
			if eb.Error.Message == "" {
				t.Fatal("empty message")
			}
			if c.field != "" && !strings.Contains(eb.Error.Message, c.field) {
				t.Errorf("message %q does not name the field %q", eb.Error.Message, c.field)
			}
		})
	}
}

func TestErrorsCrossTheWire(t *testing.T) {
	e := newEnv(t, map[string]any{"nodes": 2}, 0)
	ctx := context.Background()
	_, err := e.client.Instance(ctx, "no-such-instance")
	if !errors.Is(err, driver.ErrNotFound) {
		t.Fatalf("Instance: %v, want ErrNotFound", err)
	}
	_, err = e.client.Submit(ctx, scheduler.Request{Spec: driver.Spec{Image: "x", Resources: driver.Resources{CPU: -1}}})
	var fe *driver.FieldError
	if !errors.Is(err, driver.ErrInvalid) || !errors.As(err, &fe) || fe.Path != "cpus" {
		t.Fatalf("Submit: %v, want a FieldError on cpus", err)
	}
	var ae *api.Error
	if !errors.As(err, &ae) || ae.Status != http.StatusBadRequest {
		t.Fatalf("Submit: %v, want an *api.Error with status 400", err)
	}
	if errors.Is(err, driver.ErrNotFound) {
		t.Fatal("an invalid error also matches ErrNotFound")
	}
}

func TestSubmitAnswersWithTheNode(t *testing.T) {
	e := newEnv(t, map[string]any{"nodes": 3, "shape": `{"cpus": 8, "memory": "32000Mi"}`}, 0)
	ctx := context.Background()
	// Citadel's request, as raw JSON.
	ans, err := e.client.SubmitRaw(ctx, json.RawMessage(`{"image": "crosbymichael/redis", "cpus": "0.2", "memory": 512, "type": "service", "id": "redis"}`))
	if err != nil {
		t.Fatal(err)
	}
	if len(ans.Instances) != 1 {
		t.Fatalf("answer: %+v", ans)
	}
	p := ans.Instances[0]
	if p.Node == nil || p.Node.ID == "" || p.Node.CPUs != driver.CPUs(8) || p.Node.Memory != 32000*driver.MiB {
		t.Fatalf("node: %+v", p.Node)
	}
	if p.Instance.Spec.CPU != 200 || p.Instance.Spec.Memory != 512*driver.MiB || p.Instance.Owner != "tester" {
		t.Fatalf("instance: %+v", p.Instance)
	}
	got, err := e.client.Instance(ctx, p.Instance.ID)
	if err != nil || got.ID != p.Instance.ID {
		t.Fatalf("get: %v %+v", err, got)
	}
	list, err := e.client.Instances(ctx, control.Filter{Owner: "tester"})
	if err != nil || len(list) != 1 {
		t.Fatalf("list: %v %d", err, len(list))
	}
	list, err = e.client.Instances(ctx, control.Filter{Owner: "someone-else"})
	if err != nil || len(list) != 0 {
		t.Fatalf("filtered list: %v %d", err, len(list))
	}
	waitPhase(t, e.client, p.Instance.ID, control.Phase("running"))
	if _, err := e.client.Delete(ctx, p.Instance.ID); err != nil {
		t.Fatal(err)
	}
	waitPhase(t, e.client, p.Instance.ID, control.Phase("deleted"))
}

func waitPhase(t *testing.T, c *client.Client, id string, want control.Phase) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var last control.Phase
	for ctx.Err() == nil {
		in, err := c.Instance(ctx, id)
		if err == nil {
			if in.Phase == want {
				return
			}
			last = in.Phase
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("instance %s stayed %s, want %s", id, last, want)
}

func TestReadEndpoints(t *testing.T) {
	e := newEnv(t, map[string]any{"nodes": 4}, 0)
	ctx := context.Background()
	nodes, err := e.client.Nodes(ctx, "")
	if err != nil || len(nodes) != 4 {
		t.Fatalf("nodes: %v %d", err, len(nodes))
	}
	if nodes, err = e.client.Nodes(ctx, "other"); err != nil || len(nodes) != 0 {
		t.Fatalf("nodes of another provider: %v %d", err, len(nodes))
	}
	provs, err := e.client.Providers(ctx)
	if err != nil || len(provs) != 1 || provs[0].Name != "sim" || provs[0].Health.Breaker == "" {
		t.Fatalf("providers: %v %+v", err, provs)
	}
	drivers, err := e.client.Drivers(ctx)
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, d := range drivers {
		if d.Name == "sim" && len(d.Options) > 0 {
			found = true
		}
	}
	if !found {
		t.Fatalf("drivers: %+v", drivers)
	}
	if _, err := e.client.Quotas(ctx); err != nil {
		t.Fatal(err)
	}
	if adv, err := e.client.Advice(ctx, control.Filter{}); err != nil || adv.Instances == nil || adv.Groups == nil {
		t.Fatalf("advice: %+v %v", adv, err)
	}
	if _, err := e.client.Advice(ctx, control.Filter{Phases: []control.Phase{control.Phase("running")}}); err != nil {
		t.Fatalf("advice ignores the phase filter: %v", err)
	}
	if _, err := e.client.Advice(ctx, control.Filter{Limit: api.MaxPageSize + 1}); !drivertest.HasField(err, "limit") {
		t.Fatalf("advice beyond the largest page: %v, want an error naming limit", err)
	}

	plan, err := e.client.Plan(ctx, scheduler.Request{Spec: driver.Spec{Image: "x", Resources: driver.Resources{CPU: driver.CPUs(1)}}, Count: 2})
	if err != nil || len(plan.Placements) != 2 {
		t.Fatalf("plan: %v %+v", err, plan)
	}
	plan, err = e.client.Plan(ctx, scheduler.Request{Spec: driver.Spec{Image: "x", Resources: driver.Resources{CPU: driver.CPUs(10000)}}})
	if err != nil || plan.Unplaced != 1 || len(plan.Reasons) == 0 {
		t.Fatalf("plan too big: %v %+v", err, plan)
	}
	list, err := e.client.Instances(ctx, control.Filter{})
	if err != nil || len(list) != 0 {
		t.Fatalf("plan stored something: %v %d", err, len(list))
	}
	if st, err := e.client.Scheduler(ctx); err != nil || st.Schedulers != 1 || st.Committed != 0 || st.Nodes != 4 {
		t.Fatalf("scheduler: %v %+v, want 1 scheduler, nothing committed, 4 nodes", err, st)
	}
	if _, err := e.client.Submit(ctx, scheduler.Request{ID: "counted", Spec: driver.Spec{Image: "x"}}); err != nil {
		t.Fatal(err)
	}
	if st, err := e.client.Scheduler(ctx); err != nil || st.Committed != 1 || st.Conflicts != 0 || st.Instances != 1 {
		t.Fatalf("scheduler after a submission: %v %+v, want 1 placement and 1 instance", err, st)
	}
}

func TestEventsStream(t *testing.T) {
	e := newEnv(t, map[string]any{"nodes": 2}, 0)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var mu sync.Mutex
	seen := map[string]bool{}
	got := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- e.client.Events(ctx, 0, func(ev control.Event) {
			mu.Lock()
			defer mu.Unlock()
			if ev.Instance != nil && ev.Revision > 0 && !seen[ev.Instance.ID] {
				seen[ev.Instance.ID] = true
				if ev.Instance.ID == "watched" {
					close(got)
				}
			}
		})
	}()
	// The stream is open once the server has flushed its headers; submit
	// until the event arrives (the first submission may precede the watch).
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	submitted := false
	for !submitted {
		select {
		case <-got:
			submitted = true
		case <-tick.C:
			_, err := e.client.Submit(ctx, scheduler.Request{Spec: driver.Spec{Image: "x"}, ID: "watched"})
			if err != nil && !errors.Is(err, driver.ErrAlreadyExists) {
				t.Fatal(err)
			}
		case <-time.After(20 * time.Second):
			t.Fatal("no event for the submitted instance")
		}
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("Events returned %v, want context.Canceled", err)
	}
}

func TestLogsAndPreloadStreams(t *testing.T) {
	e := newEnv(t, map[string]any{"nodes": 2}, 0)
	ctx := context.Background()
	// Unknown instance: a normal error response, not a stream.
	err := e.client.Logs(ctx, "nope", driver.LogOptions{}, io.Discard, io.Discard)
	if !errors.Is(err, driver.ErrNotFound) {
		t.Fatalf("logs of unknown instance: %v", err)
	}
	var steps []driver.PreloadProgress
	err = e.client.Preload(ctx, "sim", "busybox:latest", nil, func(p driver.PreloadProgress) { steps = append(steps, p) })
	if err != nil && !errors.Is(err, driver.ErrUnsupported) {
		t.Fatalf("preload: %v", err)
	}
	err = e.client.Preload(ctx, "no-such-provider", "busybox:latest", nil, nil)
	if !errors.Is(err, driver.ErrNotFound) && !errors.Is(err, driver.ErrInvalid) {
		t.Fatalf("preload on unknown provider: %v", err)
	}
}

func TestCloseStreamsEndsFollowers(t *testing.T) {
	e := newEnv(t, map[string]any{"nodes": 1}, 0)
	ctx := context.Background()
	if _, err := e.client.Submit(ctx, scheduler.Request{Spec: driver.Spec{Image: "x"}, ID: "before"}); err != nil {
		t.Fatal(err)
	}
	// Replaying from revision 1 delivers the submission's events at once:
	// the first one proves the server is streaming to this follower.
	live := make(chan struct{})
	var once sync.Once
	done := make(chan error, 1)
	go func() {
		done <- e.client.Events(ctx, 1, func(control.Event) { once.Do(func() { close(live) }) })
	}()
	select {
	case <-live:
	case err := <-done:
		t.Fatalf("Events ended before CloseStreams: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("no event replayed from revision 1")
	}
	e.api.CloseStreams()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Events after CloseStreams: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("CloseStreams did not end the event stream")
	}
}

func TestOversizedBodyThroughTheClient(t *testing.T) {
	e := newEnv(t, map[string]any{"nodes": 1}, 1024)
	_, err := e.client.SubmitRaw(context.Background(), json.RawMessage(`{"image": "`+strings.Repeat("y", 2048)+`"}`))
	var ae *api.Error
	if !errors.As(err, &ae) || ae.Status != http.StatusRequestEntityTooLarge {
		t.Fatalf("got %v, want 413", err)
	}
}

// TestChangesAnswerAccepted checks that changes to a live instance, resize
// included, answer 202 with the instance, and that a kill without a signal
// sends DefaultSignal.
func TestChangesAnswerAccepted(t *testing.T) {
	e := newEnv(t, map[string]any{"nodes": 1}, 0)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := e.client.Submit(ctx, scheduler.Request{Spec: driver.Spec{Image: "x"}, ID: "web"}); err != nil {
		t.Fatal(err)
	}
	waitPhase := func(want reconciler.Phase) {
		t.Helper()
		for {
			in, err := e.client.Instance(ctx, "web")
			if err == nil && in.Phase == want {
				return
			}
			select {
			case <-ctx.Done():
				t.Fatalf("instance never %s (last %+v, %v)", want, in, err)
			case <-time.After(10 * time.Millisecond):
			}
		}
	}
	waitPhase(reconciler.Running)
	for _, c := range []struct{ path, body string }{
		{"/v1/instances/web/resize", `{"cpus": 0.5}`},
		{"/v1/instances/web/restart", ``},
		{"/v1/instances/web/kill", ``},
	} {
		if status, eb, raw := do(t, e.h, "POST", c.path, c.body); status != http.StatusAccepted {
			t.Errorf("POST %s: %d %q (%s), want 202", c.path, status, eb.Error.Code, raw)
		}
	}
	in, err := e.client.Instance(ctx, "web")
	if err != nil {
		t.Fatal(err)
	}
	if in.Spec.CPU != 500 {
		t.Errorf("after resize: cpus %s, want 0.5", in.Spec.CPU)
	}
	// The sim back-end cannot rename its instances: refused by name, and
	// the name stays.
	if status, eb, raw := do(t, e.h, "POST", "/v1/instances/web/rename", `{"name": "web2"}`); status != http.StatusUnprocessableEntity || eb.Error.Code != "unsupported" || !strings.Contains(eb.Error.Message, "cannot rename") {
		t.Errorf("rename of a sim instance: %d %q (%s), want 422 unsupported saying it cannot rename", status, eb.Error.Code, raw)
	}
	if status, eb, _ := do(t, e.h, "POST", "/v1/instances/web/rename", `{"name": "bad/name"}`); status != http.StatusBadRequest || eb.Error.Code != "invalid" {
		t.Errorf("rename to a bad name: %d %q, want 400 invalid", status, eb.Error.Code)
	}
	// The sim's instance keeps running after a signal it handles; only a
	// KILL (or TERM) ends it, after which a signal cannot be delivered.
	status, eb, _ := do(t, e.h, "POST", "/v1/instances/web/kill?signal=USR1", ``)
	if status != http.StatusUnprocessableEntity || eb.Error.Code != "permanent" {
		t.Errorf("kill after a kill without a signal: %d %q, want 422 permanent (the first kill sent KILL)", status, eb.Error.Code)
	}
}

// TestEventsFromBeforeTheHistory asks for events older than the history the
// server keeps (it starts at the store's revision when the store is
// opened): the answer is the compacted error, which the client matches to
// store.ErrCompacted, and following from now works.
func TestEventsFromBeforeTheHistory(t *testing.T) {
	path := filepath.Join(t.TempDir(), "berth.db")
	st, err := bolt.Open(path, bolt.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		if _, err := st.Txn(context.Background(), nil, []store.Op{store.Put(fmt.Sprintf("/other/%d", i), []byte("x"))}); err != nil {
			t.Fatal(err)
		}
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	if st, err = bolt.Open(path, bolt.Options{}); err != nil {
		t.Fatal(err)
	}
	e := newEnvOn(t, st, map[string]any{"nodes": 1}, 0)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	err = e.client.Events(ctx, 2, func(control.Event) {})
	var ae *api.Error
	if !errors.Is(err, store.ErrCompacted) || !errors.As(err, &ae) || ae.Code != api.CodeCompacted || !strings.Contains(ae.Message, "since revision 2") {
		t.Fatalf("events since revision 2 after a reopen at 5: %v, want the compacted error naming the revision", err)
	}
	short, stop := context.WithTimeout(ctx, 200*time.Millisecond)
	defer stop()
	if err := e.client.Events(short, 0, func(control.Event) {}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("events from now: %v, want the stream to run until the deadline", err)
	}
}
