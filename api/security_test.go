package api_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/api"
	"github.com/berth-dev/berth/api/apitest"
	"github.com/berth-dev/berth/api/client"
	"github.com/berth-dev/berth/auth"
	"github.com/berth-dev/berth/control"
	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/scheduler"
	"github.com/berth-dev/berth/store/memory"
)

// send makes one request to the real HTTP server with the given headers
// and returns the status and the error body.
func send(t *testing.T, e *apitest.Env, method, path, body string, headers map[string]string) (int, errorBody) {
	t.Helper()
	req, err := http.NewRequest(method, e.HTTP.URL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range headers {
		if k == "Host" {
			req.Host = v
			continue
		}
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var eb errorBody
	if resp.StatusCode >= 400 {
		if err := json.Unmarshal(raw, &eb); err != nil {
			t.Fatalf("%s %s: %d with a body that is not the error shape: %q", method, path, resp.StatusCode, raw)
		}
	}
	return resp.StatusCode, eb
}

func bearer(tok string) map[string]string {
	return map[string]string{"Authorization": "Bearer " + tok, "Content-Type": "application/json"}
}

func with(h map[string]string, k, v string) map[string]string {
	out := map[string]string{k: v}
	for hk, hv := range h {
		if hk != k {
			out[hk] = hv
		}
	}
	return out
}

// TestEveryRouteNeedsAToken: without a token, or with a wrong, revoked or
// expired one, every route but health answers 401; health answers 200.
func TestEveryRouteNeedsAToken(t *testing.T) {
	e := apitest.Start(t, memory.New(memory.Options{}), map[string]any{"nodes": 1}, api.Options{})
	// Every route the server registers, by its own list: a new route is
	// covered without editing this test.
	type route struct{ method, path string }
	var routes []route
	for _, r := range e.API.Routes() {
		method, path, _ := strings.Cut(r.Pattern, " ")
		if r.Permission == auth.Public {
			if r.Pattern != "GET /v1/health" {
				t.Errorf("%s needs no token: only the health check may", r.Pattern)
			}
			continue
		}
		routes = append(routes, route{method, regexp.MustCompile(`\{[a-z]+\}`).ReplaceAllString(path, "x")})
	}
	if len(routes) < 20 {
		t.Fatalf("only %d routes need a token: %v", len(routes), routes)
	}
	revoked := e.NewToken(t, "gone", auth.RoleAdmin)
	if _, err := e.Tokens.Revoke(context.Background(), "gone"); err != nil {
		t.Fatal(err)
	}
	expired, _, err := e.Tokens.Create(context.Background(), auth.Spec{Name: "brief", Role: auth.RoleAdmin, TTL: time.Nanosecond})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Millisecond) // past its expiry
	for _, r := range routes {
		for name, h := range map[string]map[string]string{
			"none": {}, "wrong": bearer("berth_not-a-token"), "revoked": bearer(revoked), "expired": bearer(expired),
			"basic": {"Authorization": "Basic YWRtaW46YWRtaW4="},
		} {
			if status, eb := send(t, e, r.method, r.path, "", h); status != http.StatusUnauthorized || eb.Error.Code != api.CodeUnauthenticated {
				t.Errorf("%s %s with %s token: %d %q, want 401 unauthenticated", r.method, r.path, name, status, eb.Error.Code)
			}
		}
	}
	if status, _ := send(t, e, "GET", "/v1/health", "", nil); status != http.StatusOK {
		t.Errorf("health without a token: %d, want 200", status)
	}
}

// TestRolesAndTenants: alice and bob operate in their own namespaces and
// see nothing of each other's; a reader reads; only admins manage tokens.
func TestRolesAndTenants(t *testing.T) {
	e := apitest.Start(t, memory.New(memory.Options{}), map[string]any{"nodes": 2}, api.Options{})
	ctx := context.Background()
	alice := e.NewToken(t, "alice", auth.RoleOperator, "alice")
	bob := e.NewToken(t, "bob", auth.RoleOperator, "bob")
	reader := e.NewToken(t, "auditor", auth.RoleReader, "bob")
	ac, bc, rc := e.Client(t, alice), e.Client(t, bob), e.Client(t, reader)

	secret := "s3cret-value"
	if _, err := bc.Submit(ctx, scheduler.Request{ID: "bobs", Spec: driver.Spec{Image: "x", Env: map[string]string{"API_KEY": secret}, UserData: secret,
		ConfigFiles: []driver.ConfigFile{{Path: "/etc/app.conf", Content: secret}}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := ac.Submit(ctx, scheduler.Request{ID: "alices", Spec: driver.Spec{Image: "x"}}); err != nil {
		t.Fatal(err)
	}
	// The self-declared owner header of old is ignored: the namespace is
	// the token's.
	if status, eb := send(t, e, "POST", "/v1/requests", `{"id": "sneaky", "image": "x"}`, with(bearer(alice), "X-Berth-Owner", "bob")); status != http.StatusCreated {
		t.Fatalf("alice's submission with a foreign owner header: %d %+v", status, eb)
	}
	if in, err := e.Plane.Instance(ctx, "sneaky"); err != nil || in.Owner != "alice" {
		t.Fatalf("sneaky: owner %q (%v), want alice", in.Owner, err)
	}
	// Naming another namespace is refused, naming the field.
	if status, eb := send(t, e, "POST", "/v1/requests?namespace=bob", `{"image": "x"}`, bearer(alice)); status != http.StatusBadRequest || eb.Error.Field != "namespace" {
		t.Errorf("alice submitting into bob's namespace: %d %+v, want 400 naming namespace", status, eb)
	}

	// alice sees only hers, and nothing of bob's: 404, as for what does
	// not exist.
	list, err := ac.Instances(ctx, control.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	for _, in := range list {
		if in.Owner != "alice" {
			t.Errorf("alice lists %s of %q", in.ID, in.Owner)
		}
	}
	if l, err := ac.Instances(ctx, control.Filter{Owner: "bob"}); err != nil || len(l) != 0 {
		t.Errorf("alice listing bob's namespace: %d instances, %v; want none", len(l), err)
	}
	for _, r := range []struct{ method, path, body string }{
		{"GET", "/v1/instances/bobs", ""}, {"GET", "/v1/instances/bobs/logs", ""},
		{"POST", "/v1/instances/bobs/stop", ""}, {"POST", "/v1/instances/bobs/start", ""},
		{"POST", "/v1/instances/bobs/restart", ""}, {"POST", "/v1/instances/bobs/kill", ""},
		{"POST", "/v1/instances/bobs/resize", `{"cpus": 1}`}, {"DELETE", "/v1/instances/bobs", ""},
		{"POST", "/v1/instances/bobs/rename", `{"name": "alices"}`},
		{"POST", "/v1/instances/bobs/suspend", ""}, {"POST", "/v1/instances/bobs/resume", ""},
		{"POST", "/v1/instances/bobs/hold", `{"for": "1h"}`}, {"GET", "/v1/instances/bobs/stats", ""},
		{"GET", "/v1/instances/bobs/stats?stream=false", ""},
	} {
		status, eb := send(t, e, r.method, r.path, r.body, bearer(alice))
		if status != http.StatusNotFound || eb.Error.Message != `not found: instance "bobs"` {
			t.Errorf("alice: %s %s: %d %+v, want 404 as for an unknown instance", r.method, r.path, status, eb)
		}
	}
	if in, err := e.Plane.Instance(ctx, "bobs"); err != nil || in.Phase.Terminal() {
		t.Fatalf("bob's instance after alice's attempts: %+v %v", in, err)
	}

	// Secrets are write-only: answers show their size and digest.
	in, err := rc.Instance(ctx, "bobs")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(in)
	if strings.Contains(string(b), secret) {
		t.Fatalf("the instance as the API shows it holds the secret: %s", b)
	}
	want := driver.SecretDigest(secret)
	if in.Spec.Env["API_KEY"] != want || in.Spec.UserData != want || in.Spec.ConfigFiles[0].Content != want {
		t.Errorf("secrets shown as %q, %q, %q; want %q", in.Spec.Env["API_KEY"], in.Spec.UserData, in.Spec.ConfigFiles[0].Content, want)
	}
	if list, err := rc.Instances(ctx, control.Filter{}); err != nil || len(list) != 1 || strings.Contains(fmt.Sprint(list[0].Spec), secret) {
		t.Errorf("reader's list: %d instances (%v), want bob's one without its secrets", len(list), err)
	}

	// The reader reads but may not act; nobody but an admin manages tokens.
	if _, err := rc.Submit(ctx, scheduler.Request{Spec: driver.Spec{Image: "x"}}); !isStatus(err, http.StatusForbidden) {
		t.Errorf("reader submitting: %v, want 403", err)
	}
	if _, err := rc.Stop(ctx, "bobs", 0); !isStatus(err, http.StatusForbidden) {
		t.Errorf("reader stopping: %v, want 403", err)
	}
	for _, c := range []*client.Client{ac, rc} {
		if _, err := c.Tokens(ctx); !isStatus(err, http.StatusForbidden) {
			t.Errorf("an operator or reader listing tokens: %v, want 403", err)
		}
	}
	if _, err := ac.CreateToken(ctx, api.TokenRequest{Name: "mine", Role: auth.RoleAdmin}); !isStatus(err, http.StatusForbidden) {
		t.Errorf("an operator making an admin token: %v, want 403", err)
	}

	// Events carry only what the caller may see, redacted: bob and alice
	// each submit one more, and alice follows the stream from before.
	mine, err := ac.Instance(ctx, "alices")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := bc.Submit(ctx, scheduler.Request{ID: "bobs-2", Spec: driver.Spec{Image: "x", Env: map[string]string{"K": secret}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := ac.Submit(ctx, scheduler.Request{ID: "alices-2", Spec: driver.Spec{Image: "x"}}); err != nil {
		t.Fatal(err)
	}
	evCtx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	var seen []string
	_ = ac.Events(evCtx, mine.Revision, func(ev control.Event) {
		if ev.Instance == nil {
			return
		}
		seen = append(seen, ev.Instance.Owner)
		if strings.Contains(fmt.Sprint(ev.Instance.Spec), secret) {
			t.Errorf("an event holds a secret")
		}
		if ev.Instance.Name == "alices-2" {
			cancel()
		}
	})
	if !slices.Contains(seen, "alice") {
		t.Errorf("alice's event stream showed none of her instances")
	}
	for _, o := range seen {
		if o != "alice" {
			t.Errorf("alice's event stream shows an instance of %q", o)
		}
	}
}

// TestIDsPerNamespace: alice and bob may choose the same request and group
// ids; each answer names only the caller's own objects, each finds its
// own by the id it chose, and a repeated id is refused naming only the
// caller's own request.
func TestIDsPerNamespace(t *testing.T) {
	e := apitest.Start(t, memory.New(memory.Options{}), map[string]any{"nodes": 2}, api.Options{})
	ctx := context.Background()
	alice := e.NewToken(t, "alice", auth.RoleOperator, "alice")
	bob := e.NewToken(t, "bob", auth.RoleOperator, "bob")
	ac, bc := e.Client(t, alice), e.Client(t, bob)

	a, err := ac.Submit(ctx, scheduler.Request{ID: "web", Spec: driver.Spec{Image: "x"}})
	if err != nil {
		t.Fatal(err)
	}
	b, err := bc.Submit(ctx, scheduler.Request{ID: "web", Spec: driver.Spec{Image: "x"}})
	if err != nil {
		t.Fatalf("bob choosing the id alice chose: %v", err)
	}
	if a.Request == b.Request || strings.Contains(b.Request, "alice") || strings.Contains(a.Request, "bob") {
		t.Fatalf("requests %q and %q", a.Request, b.Request)
	}
	for _, c := range []struct {
		cl    *client.Client
		owner string
	}{{ac, "alice"}, {bc, "bob"}} {
		in, err := c.cl.Instance(ctx, "web")
		if err != nil || in.Owner != c.owner || in.Name != "web" {
			t.Errorf("%s's instance web: %+v %v", c.owner, in, err)
		}
	}
	// The same id again: refused, naming the caller's request only.
	status, eb := send(t, e, "POST", "/v1/requests", `{"id": "web", "image": "x"}`, bearer(bob))
	if status != http.StatusConflict || strings.Contains(eb.Error.Message, "alice") || !strings.Contains(eb.Error.Message, b.Request) {
		t.Errorf("bob's repeated id: %d %+v, want 409 naming %s only", status, eb, b.Request)
	}
	// NAMESPACE_ID is the form of the namespaces' ids: an admin may not
	// choose one of another namespace's.
	if status, eb := send(t, e, "POST", "/v1/requests", `{"id": "alice_web", "image": "x"}`, bearer(e.Token)); status != http.StatusBadRequest || eb.Error.Field != "id" {
		t.Errorf("an id of alice's in the default namespace: %d %+v, want 400 naming id", status, eb)
	}

	// Groups: the same.
	g := `{"id": "shop", "services": [{"name": "db", "image": "x"}]}`
	for _, tok := range []string{alice, bob} {
		if status, eb := send(t, e, "POST", "/v1/groups", g, bearer(tok)); status != http.StatusCreated {
			t.Fatalf("group shop: %d %+v", status, eb)
		}
	}
	for _, c := range []struct {
		tok, owner string
	}{{alice, "alice"}, {bob, "bob"}} {
		req, _ := http.NewRequest("GET", e.HTTP.URL+"/v1/groups/shop", nil)
		req.Header.Set("Authorization", "Bearer "+c.tok)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var st control.GroupStatus
		err = json.NewDecoder(resp.Body).Decode(&st)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || err != nil || !strings.HasPrefix(st.ID, c.owner+"_") {
			t.Errorf("%s's group shop: %d %+v %v", c.owner, resp.StatusCode, st, err)
		}
	}
}

// TestQuotaPerNamespaceCannotBeDodged: alice's quota holds whatever header
// she sends.
func TestQuotaPerNamespaceCannotBeDodged(t *testing.T) {
	st := memory.New(memory.Options{})
	e := apitest.StartWith(t, st, map[string]any{"nodes": 2}, api.Options{}, func(c *control.Config) {
		c.Quotas = []control.Quota{{Owner: "alice", Instances: 2}}
	})
	alice := e.NewToken(t, "alice", auth.RoleOperator, "alice")
	for i, h := range []map[string]string{bearer(alice), with(bearer(alice), "X-Berth-Owner", "other"), with(bearer(alice), "X-Berth-Owner", "")} {
		status, eb := send(t, e, "POST", "/v1/requests", `{"image": "x", "count": 2}`, h)
		if i == 0 && status != http.StatusCreated {
			t.Fatalf("first 2: %d %+v", status, eb)
		}
	}
	list, err := e.Plane.Instances(context.Background(), control.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	running := 0
	for _, in := range list {
		if in.Owner != "alice" {
			t.Errorf("%s landed in namespace %q", in.ID, in.Owner)
		}
		if in.Node != "" {
			running++
		}
	}
	if running > 2 {
		t.Fatalf("alice holds %d placed instances under a quota of 2", running)
	}
}

// TestBrowserAttacksRefused: a cross-site request (foreign Origin, a
// text/plain body a form can send) and a DNS-rebinding Host are refused
// before anything runs.
func TestBrowserAttacksRefused(t *testing.T) {
	e := apitest.Start(t, memory.New(memory.Options{}), map[string]any{"nodes": 1}, api.Options{LoopbackOnly: true, AllowedOrigins: []string{"https://berth.example.com"}})
	tok := bearer(e.Token)
	cases := []struct {
		name    string
		headers map[string]string
		status  int
		code    string
	}{
		{"cross-site text/plain", map[string]string{"Origin": "http://evil.example", "Content-Type": "text/plain"}, http.StatusForbidden, api.CodeBadOrigin},
		{"cross-site with a token", with(tok, "Origin", "http://evil.example"), http.StatusForbidden, api.CodeBadOrigin},
		{"text/plain body", with(tok, "Content-Type", "text/plain"), http.StatusUnsupportedMediaType, api.CodeMediaType},
		{"form body", with(tok, "Content-Type", "application/x-www-form-urlencoded"), http.StatusUnsupportedMediaType, api.CodeMediaType},
		{"rebinding host", with(tok, "Host", "evil.example:7480"), http.StatusMisdirectedRequest, api.CodeBadHost},
		{"rebinding host without a port", with(tok, "Host", "attacker.example"), http.StatusMisdirectedRequest, api.CodeBadHost},
	}
	for _, c := range cases {
		status, eb := send(t, e, "POST", "/v1/requests", `{"image": "x", "id": "csrf"}`, c.headers)
		if status != c.status || eb.Error.Code != c.code {
			t.Errorf("%s: %d %q, want %d %q", c.name, status, eb.Error.Code, c.status, c.code)
		}
	}
	if _, err := e.Plane.Instance(context.Background(), "csrf"); !errors.Is(err, driver.ErrNotFound) {
		t.Fatalf("a refused request ran: %v", err)
	}
	// The allowed origin and loopback host names are served.
	for _, h := range []map[string]string{with(tok, "Origin", "https://berth.example.com"), with(tok, "Host", "localhost:7480"), with(tok, "Host", "[::1]:7480")} {
		if status, eb := send(t, e, "GET", "/v1/instances", "", h); status != http.StatusOK {
			t.Errorf("%v: %d %+v, want 200", h, status, eb)
		}
	}
}

// TestStrictInput: what encoding/json lets through is refused, naming the
// field; a truncated body is a 400 naming the offset, never a 500.
func TestStrictInput(t *testing.T) {
	e := apitest.Start(t, memory.New(memory.Options{}), map[string]any{"nodes": 1}, api.Options{})
	tok := bearer(e.Token)
	cases := []struct{ name, body, field, reason string }{
		{"case-folded key", `{"Image": "x"}`, "Image", "unknown field"},
		{"duplicate key", `{"image": "x", "image": "y"}`, "image", "twice"},
		{"truncated", `{"image": "x", "env": {"A": "b`, "body", "byte 30"},
		{"malformed", `{"image": "x",, }`, "body", "byte 14"},
		{"NUL in env", `{"image": "x", "env": {"A": "a\u0000b"}}`, "env.A", "NUL"},
		{"NUL in args", `{"kind": "process", "command": ["sh", "-c", "a\u0000b"]}`, "command[2]", "NUL"},
		{"config path /.", `{"image": "x", "config_files": [{"path": "/.", "content": "a"}]}`, "config_files[0].path", "clean"},
		{"config path unclean", `{"image": "x", "config_files": [{"path": "/etc//a", "content": "a"}]}`, "config_files[0].path", "clean"},
		{"config paths overlap", `{"image": "x", "config_files": [{"path": "/a", "content": "a"}, {"path": "/a/b", "content": "b"}]}`, "config_files[1].path", "overlap"},
		{"label value too large", `{"image": "x", "labels": {"k": "` + strings.Repeat("v", driver.MaxLabelValue+1) + `"}}`, "labels.k", "at most"},
	}
	for _, c := range cases {
		status, eb := send(t, e, "POST", "/v1/requests", c.body, tok)
		if status != http.StatusBadRequest || eb.Error.Field != c.field || !strings.Contains(eb.Error.Message, c.reason) {
			t.Errorf("%s: %d field %q %q, want 400 naming %q with %q", c.name, status, eb.Error.Field, eb.Error.Message, c.field, c.reason)
		}
	}
}

// TestAmplificationRefusedBeforeAllocation: a small body asking for many
// copies of a large spec is refused before the server keeps any of it, and
// the server's heap does not grow by what it asked for.
func TestAmplificationRefusedBeforeAllocation(t *testing.T) {
	e := apitest.Start(t, memory.New(memory.Options{}), map[string]any{"nodes": 4}, api.Options{MaxBodySize: 2 << 20})
	label := strings.Repeat("x", 900_000)
	big := fmt.Sprintf(`{"image": "x", "count": 1000, "env": {"BIG": %q}}`, label)
	var before runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	status, eb := send(t, e, "POST", "/v1/requests", big, bearer(e.Token))
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	if status != http.StatusBadRequest || (eb.Error.Field != "count" && eb.Error.Field != "env") {
		t.Fatalf("1,000 × 900 kB: %d %+v, want 400 naming count or env", status, eb)
	}
	// 1,000 copies would be 900 MB; the request itself is under 1 MB and
	// decoding it a few times that. 64 MiB is a generous bound.
	if grew := int64(after.TotalAlloc) - int64(before.TotalAlloc); grew > 64<<20 {
		t.Errorf("the refused request allocated %d MiB", grew>>20)
	}
	if list, _ := e.Plane.Instances(context.Background(), control.Filter{All: true}); len(list) != 0 {
		t.Errorf("%d instances kept after the refusal", len(list))
	}
}

// TestRateAndStreamLimits: a token past its rate is told to wait; one
// past its open streams is refused.
func TestRateAndStreamLimits(t *testing.T) {
	e := apitest.Start(t, memory.New(memory.Options{}), map[string]any{"nodes": 1}, api.Options{Rate: 0.001, Burst: 2, MaxStreams: 1})
	tok := bearer(e.Token)
	var last int
	var retry string
	for range 3 {
		req, _ := http.NewRequest("GET", e.HTTP.URL+"/v1/nodes", nil)
		req.Header.Set("Authorization", tok["Authorization"])
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		last, retry = resp.StatusCode, resp.Header.Get("Retry-After")
	}
	if last != http.StatusTooManyRequests || retry == "" {
		t.Fatalf("third request past a burst of 2: %d, Retry-After %q; want 429 with Retry-After", last, retry)
	}

	e2 := apitest.Start(t, memory.New(memory.Options{}), map[string]any{"nodes": 1}, api.Options{MaxStreams: 1})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", e2.HTTP.URL+"/v1/events", nil)
	req.Header.Set("Authorization", "Bearer "+e2.Token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("first stream: %v %v", resp, err)
	}
	defer resp.Body.Close()
	if status, eb := send(t, e2, "GET", "/v1/events", "", bearer(e2.Token)); status != http.StatusTooManyRequests {
		t.Fatalf("second stream of a token allowed one: %d %+v, want 429", status, eb)
	}
}

// TestTokenLifecycle: an admin makes a token (its secret shown once), it
// works, it is listed without secrets, and once revoked it is refused.
func TestTokenLifecycle(t *testing.T) {
	e := apitest.Start(t, memory.New(memory.Options{}), map[string]any{"nodes": 1}, api.Options{})
	ctx := context.Background()
	admin := e.Client(t, "")
	nt, err := admin.CreateToken(ctx, api.TokenRequest{Name: "ci", Role: auth.RoleOperator, Namespaces: []string{"ci"}, Expires: "1h"})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(nt.Token, "berth_") || nt.Expires.IsZero() {
		t.Fatalf("new token: %+v", nt)
	}
	ci := e.Client(t, nt.Token)
	if id, err := ci.WhoAmI(ctx); err != nil || id.Name != "ci" || id.Role != auth.RoleOperator {
		t.Fatalf("whoami: %+v %v", id, err)
	}
	list, err := admin.Tokens(ctx)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(list)
	if strings.Contains(string(b), nt.Token) || strings.Contains(string(b), auth.Digest(nt.Token)) {
		t.Fatalf("the token list shows a secret or its digest: %s", b)
	}
	if _, err := admin.CreateToken(ctx, api.TokenRequest{Name: "ci", Role: auth.RoleReader, Namespaces: []string{"x"}}); !errors.Is(err, driver.ErrAlreadyExists) {
		t.Errorf("a second token named ci: %v, want already exists", err)
	}
	for _, bad := range []api.TokenRequest{{Name: "Bad Name", Role: auth.RoleReader, Namespaces: []string{"x"}}, {Name: "n", Role: "root"}, {Name: "n", Role: auth.RoleOperator}, {Name: "n", Role: auth.RoleOperator, Namespaces: []string{"../x"}}} {
		if _, err := admin.CreateToken(ctx, bad); !errors.Is(err, driver.ErrInvalid) {
			t.Errorf("token %+v: %v, want invalid", bad, err)
		}
	}
	if _, err := admin.RevokeToken(ctx, "ci"); err != nil {
		t.Fatal(err)
	}
	if _, err := ci.WhoAmI(ctx); !isStatus(err, http.StatusUnauthorized) {
		t.Fatalf("a revoked token: %v, want 401", err)
	}
}

func isStatus(err error, status int) bool {
	var ae *api.Error
	return errors.As(err, &ae) && ae.Status == status
}
