package web_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/api"
	"github.com/berth-dev/berth/auth"
	"github.com/berth-dev/berth/control"
	"github.com/berth-dev/berth/dockerapi"
	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/driver/drivertest"
	"github.com/berth-dev/berth/drivers/sim"
	"github.com/berth-dev/berth/provider"
	"github.com/berth-dev/berth/reconciler"
	"github.com/berth-dev/berth/scheduler"
	"github.com/berth-dev/berth/store/memory"
	"github.com/berth-dev/berth/web"
)

// surfaces are the three front ends of one running plane, authenticating
// with the same tokens as the server wires them: the REST API, the Docker
// endpoint and the dashboard.
type surfaces struct {
	plane  *control.Plane
	api    http.Handler
	docker http.Handler
	ui     http.Handler
	// secrets by token name.
	secrets map[string]string
	audit   *drivertest.SyncBuffer
}

// newSurfaces runs a plane over a sim back-end with a warm pool of one
// instance, and makes the tokens of the tenancy tests.
func newSurfaces(t *testing.T, tune ...func(*control.Config)) *surfaces {
	t.Helper()
	ctx := context.Background()
	opts := *sim.DefaultOptions()
	opts.Nodes = 2
	opts.Shape = sim.Shape{Resources: driver.Resources{CPU: driver.CPUs(8), Memory: 16 * driver.GiB, Disk: 100 * driver.GiB}}
	sm, err := sim.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	p, err := provider.New(sm, provider.Config{Name: "sim", Logger: quiet, StateTTL: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	st := memory.New(memory.Options{})
	cfg := control.Config{Store: st, Providers: []*provider.Provider{p}, Cluster: "tenancy", Logger: quiet,
		SyncInterval: 20 * time.Millisecond, RetryBackoff: 10 * time.Millisecond,
		Pools: []control.Pool{{Name: "warm", Provider: "sim", MaxInstances: 1, Labels: []control.Label{
			{Name: "small", Spec: driver.Spec{Image: "berth/sim", Resources: driver.Resources{CPU: driver.CPUs(0.1)}}, MinReady: 1},
		}}}}
	for _, f := range tune {
		f(&cfg)
	}
	plane, err := control.New(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	tokens := auth.NewTokens(st, nil)
	s := &surfaces{plane: plane, secrets: map[string]string{}, audit: &drivertest.SyncBuffer{}}
	for _, spec := range []auth.Spec{
		{Name: "admin", Role: auth.RoleAdmin},
		{Name: "op-alice", Role: auth.RoleOperator, Namespaces: []string{"alice"}},
		{Name: "op-mallory", Role: auth.RoleOperator, Namespaces: []string{"mallory"}},
		{Name: "reader-alice", Role: auth.RoleReader, Namespaces: []string{"alice"}},
		{Name: "reader-all", Role: auth.RoleReader, Namespaces: []string{auth.AllNamespaces}},
	} {
		secret, _, err := tokens.Create(ctx, spec)
		if err != nil {
			t.Fatal(err)
		}
		s.secrets[spec.Name] = secret
	}
	auditLog := slog.New(slog.NewTextHandler(s.audit, nil))
	apiServer := api.New(plane, api.Options{Logger: quiet, AuditLog: auditLog, Tokens: tokens})
	ds := dockerapi.New(plane, dockerapi.Options{Authenticator: tokens, Logger: quiet, AuditLog: auditLog})
	ui, err := web.New(plane, web.Options{Logger: quiet, AuditLog: auditLog,
		Authenticator: web.AuthenticatorFunc(func(ctx context.Context, secret string) (web.Identity, error) {
			return tokens.Authenticate(ctx, secret)
		})})
	if err != nil {
		t.Fatal(err)
	}
	s.api, s.docker, s.ui = apiServer, ds, ui
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = plane.Run(runCtx) }()
	t.Cleanup(func() {
		ui.CloseStreams()
		apiServer.CloseStreams()
		ds.Close()
		cancel()
		<-done
		_ = p.Close(ctx)
		_ = st.Close()
	})
	return s
}

// call serves one bearer request of tok's token on h.
func (s *surfaces) call(h http.Handler, method, path, tok string, body any) *httptest.ResponseRecorder {
	var rd *bytes.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	} else {
		rd = bytes.NewReader(nil)
	}
	r := httptest.NewRequest(method, path, rd)
	if body != nil {
		r.Header.Set("Content-Type", "application/json")
	}
	r.Header.Set("Authorization", "Bearer "+s.secrets[tok])
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

// running waits until the instance is running.
func running(t *testing.T, plane *control.Plane, id string) {
	t.Helper()
	eventually(t, "instance "+id+" running", func() bool {
		in, err := plane.Instance(context.Background(), id)
		return err == nil && in.Phase == reconciler.Running
	})
}

// Outcomes of an authorization case.
const (
	allowed   = '+' // the surface does it
	forbidden = 'f' // 403: the token's role does not allow it
	hidden    = 'h' // 404, as for what does not exist
)

// TestAuthorizationIsOneRuleOnEverySurface runs a table of (role, token's
// namespaces, object's namespace, action) through the REST API, the
// Docker endpoint and the dashboard (signed in, with form posts): every
// surface answers each case the same way. The objects are an instance of
// namespace alice, a warm pool instance (the cluster's own: no namespace)
// and a member of alice's group.
func TestAuthorizationIsOneRuleOnEverySurface(t *testing.T) {
	s := newSurfaces(t)
	ctx := context.Background()
	ans, err := s.plane.Submit(ctx, scheduler.Request{Spec: driver.Spec{Name: "web", Image: "berth/sim", Resources: driver.Resources{CPU: driver.CPUs(0.1)}}}, "alice")
	if err != nil {
		t.Fatal(err)
	}
	aliceID := ans.Instances[0].Instance.ID
	g, err := s.plane.SubmitGroup(ctx, scheduler.Group{ID: "g1", Services: []scheduler.Service{
		{Request: scheduler.Request{Spec: driver.Spec{Name: "svc", Image: "berth/sim", Resources: driver.Resources{CPU: driver.CPUs(0.1)}}}},
	}}, "alice")
	if err != nil {
		t.Fatal(err)
	}
	memberID := g.Instances[0].Instance.ID
	var poolID string
	eventually(t, "a warm pool instance", func() bool {
		list, _ := s.plane.Instances(ctx, control.Filter{Pool: "warm"})
		for _, in := range list {
			if in.Owner == "" && in.Phase == reconciler.Running {
				poolID = in.ID
				return true
			}
		}
		return false
	})
	running(t, s.plane, aliceID)
	running(t, s.plane, memberID)

	objects := []struct{ name, id string }{{"alice's instance", aliceID}, {"pool instance", poolID}, {"alice's group member", memberID}}
	actions := []string{"view", "stop"}
	// Per token: the outcome for each object, then each action, in order.
	table := []struct {
		token string
		want  string
	}{
		{"op-mallory", "hhhhhh"},
		{"reader-alice", "+fhf+f"},
		{"reader-all", "+f+f+f"},
		{"op-alice", "++hh++"},
		{"admin", "++++++"},
	}
	for _, tc := range table {
		cookie, csrf := signIn(t, s.ui, s.secrets[tc.token])
		for oi, obj := range objects {
			for ai, act := range actions {
				want := tc.want[oi*len(actions)+ai]
				for _, sf := range []struct {
					name string
					do   func() *httptest.ResponseRecorder
					ok   []int
				}{
					{"REST", func() *httptest.ResponseRecorder {
						if act == "view" {
							return s.call(s.api, http.MethodGet, "/v1/instances/"+obj.id, tc.token, nil)
						}
						return s.call(s.api, http.MethodPost, "/v1/instances/"+obj.id+"/stop", tc.token, nil)
					}, []int{http.StatusOK, http.StatusAccepted}},
					{"Docker", func() *httptest.ResponseRecorder {
						if act == "view" {
							return s.call(s.docker, http.MethodGet, "/containers/"+obj.id+"/json", tc.token, nil)
						}
						return s.call(s.docker, http.MethodPost, "/containers/"+obj.id+"/stop", tc.token, nil)
					}, []int{http.StatusOK, http.StatusNoContent, http.StatusNotModified}},
					{"dashboard", func() *httptest.ResponseRecorder {
						if act == "view" {
							r := httptest.NewRequest(http.MethodGet, "/ui/instances/"+obj.id, nil)
							r.AddCookie(cookie)
							w := httptest.NewRecorder()
							s.ui.ServeHTTP(w, r)
							return w
						}
						return post(s.ui, "/ui/instances/"+obj.id+"/stop", url.Values{"csrf": {csrf}}, []*http.Cookie{cookie})
					}, []int{http.StatusOK, http.StatusSeeOther}},
				} {
					w := sf.do()
					got := byte(0)
					switch {
					case w.Code == http.StatusForbidden:
						got = forbidden
					case w.Code == http.StatusNotFound:
						got = hidden
					case w.Code == sf.ok[0] || w.Code == sf.ok[1] || len(sf.ok) > 2 && w.Code == sf.ok[2]:
						got = allowed
					}
					if got != want {
						t.Errorf("%s: %s %s of %s: status %d (%q), want %q\n%s", sf.name, tc.token, act, obj.name, w.Code, got, want, cut(w.Body.String()))
					}
					if want == hidden {
						// Word for word the answer for what does not exist.
						id := obj.id
						obj.id = "0123456789abcdef"
						none := sf.do()
						obj.id = id
						if got, nothing := strings.ReplaceAll(w.Body.String(), id, "X"), strings.ReplaceAll(none.Body.String(), "0123456789abcdef", "X"); none.Code != w.Code || got != nothing {
							t.Errorf("%s: %s %s of %s: %d %q, unlike the answer for nothing: %d %q", sf.name, tc.token, act, obj.name, w.Code, cut(got), none.Code, cut(nothing))
						}
					}
				}
			}
		}
	}

	// Groups: seen by those who see their members.
	for _, tc := range []struct {
		token string
		see   bool
	}{{"op-mallory", false}, {"reader-alice", true}, {"reader-all", true}, {"op-alice", true}, {"admin", true}} {
		w := s.call(s.api, http.MethodGet, "/v1/groups/g1", tc.token, nil)
		if (w.Code == http.StatusOK) != tc.see || !tc.see && w.Code != http.StatusNotFound {
			t.Errorf("REST: %s gets group g1: %d, want seen %v", tc.token, w.Code, tc.see)
		}
		w = s.call(s.ui, http.MethodGet, "/ui/pending", tc.token, nil)
		if w.Code != http.StatusOK || strings.Contains(w.Body.String(), "Group g1:") != tc.see {
			t.Errorf("dashboard: %s's pending page: %d, shows g1 %v, want %v", tc.token, w.Code, strings.Contains(w.Body.String(), "Group g1:"), tc.see)
		}
	}

	// The dashboard's actions are audit records, as the API's.
	audit := s.audit.String()
	for _, want := range []string{
		"msg=audit method=POST path=/ui/instances/" + poolID + "/stop token=admin",
		"msg=audit method=POST path=/ui/instances/" + poolID + "/stop token=op-mallory",
		"msg=audit method=POST path=/v1/instances/" + poolID + "/stop token=admin",
		"msg=audit method=POST path=/containers/" + poolID + "/stop token=admin",
	} {
		if !strings.Contains(audit, want) {
			t.Errorf("no audit record %q in:\n%s", want, cut(audit))
		}
	}
	if strings.Contains(audit, "instance changed") {
		t.Errorf("the dashboard still logs its own lines:\n%s", cut(audit))
	}
}

// TestNamesPerNamespaceOnEverySurface: mallory may use alice's instance
// name; each namespace's name resolves to its own instance on every
// surface, and no answer names the other namespace's instance.
func TestNamesPerNamespaceOnEverySurface(t *testing.T) {
	s := newSurfaces(t)
	spec := map[string]any{"name": "web", "image": "berth/sim", "cpus": 0.1}
	w := s.call(s.api, http.MethodPost, "/v1/requests", "op-alice", spec)
	if w.Code != http.StatusCreated {
		t.Fatalf("alice's web: %d %s", w.Code, w.Body.String())
	}
	var ans control.Answer
	_ = json.Unmarshal(w.Body.Bytes(), &ans)
	aliceID := ans.Instances[0].Instance.ID
	w = s.call(s.api, http.MethodPost, "/v1/requests", "op-mallory", spec)
	if w.Code != http.StatusCreated {
		t.Fatalf("mallory's web next to alice's: %d %s", w.Code, w.Body.String())
	}
	_ = json.Unmarshal(w.Body.Bytes(), &ans)
	malloryID := ans.Instances[0].Instance.ID
	if w := s.call(s.api, http.MethodPost, "/v1/requests", "op-mallory", spec); w.Code != http.StatusConflict || strings.Contains(w.Body.String(), aliceID) {
		t.Errorf("mallory's second web: %d %s, want 409 naming nothing of alice's", w.Code, w.Body.String())
	}
	// The Docker endpoint's container names are the same names.
	if w := s.call(s.docker, http.MethodPost, "/containers/create?name=web", "op-mallory", map[string]any{"Image": "berth/sim"}); w.Code != http.StatusConflict || strings.Contains(w.Body.String(), aliceID) {
		t.Errorf("docker create web in mallory: %d %s, want 409 naming nothing of alice's", w.Code, w.Body.String())
	}
	if w := s.call(s.docker, http.MethodPost, "/containers/create?name=other", "op-alice", map[string]any{"Image": "berth/sim"}); w.Code != http.StatusCreated {
		t.Errorf("docker create other in alice: %d %s", w.Code, w.Body.String())
	}
	if w := s.call(s.docker, http.MethodPost, "/containers/create?name=other", "op-mallory", map[string]any{"Image": "berth/sim"}); w.Code != http.StatusCreated {
		t.Errorf("docker create other in mallory next to alice's created one: %d %s", w.Code, w.Body.String())
	}
	for tok, id := range map[string]string{"op-alice": aliceID, "op-mallory": malloryID} {
		for _, c := range []struct {
			surface string
			h       http.Handler
			path    string
		}{
			{"REST", s.api, "/v1/instances/web"},
			{"Docker", s.docker, "/containers/web/json"},
			{"dashboard", s.ui, "/ui/instances/web"},
		} {
			w := s.call(c.h, http.MethodGet, c.path, tok, nil)
			other := aliceID
			if id == aliceID {
				other = malloryID
			}
			if w.Code != http.StatusOK || !strings.Contains(w.Body.String(), id) || strings.Contains(w.Body.String(), other) {
				t.Errorf("%s: %s gets web: %d, want its own %s and never %s:\n%s", c.surface, tok, w.Code, id, other, cut(w.Body.String()))
			}
		}
	}
	for _, id := range []string{aliceID, malloryID} {
		running(t, s.plane, id)
	}
}

// TestSubmitRefusesBerthsFieldsAndRoot: the REST API and the Docker
// endpoint refuse Berth's own labels, tags and variables (400) and, from
// an operator, root (403), each naming the field; an admin may ask for
// root.
func TestSubmitRefusesBerthsFieldsAndRoot(t *testing.T) {
	s := newSurfaces(t)
	base := func() map[string]any { return map[string]any{"image": "berth/sim", "cpus": 0.1} }
	for _, c := range []struct {
		key    string
		val    any
		dkey   string // the Docker endpoint's field, "" for none
		dval   any
		status int
		field  string
	}{
		{"tags", map[string]string{"berth.cluster": "x"}, "", nil, http.StatusBadRequest, "tags.berth.cluster"},
		{"labels", map[string]string{"berth.managed": "true"}, "Labels", map[string]string{"berth.managed": "true"}, http.StatusBadRequest, "labels.berth.managed"},
		{"env", map[string]string{"BERTH_INSTANCE_ID": "x"}, "Env", []string{"BERTH_INSTANCE_ID=x"}, http.StatusBadRequest, "env.BERTH_INSTANCE_ID"},
		{"user", "root", "User", "root", http.StatusForbidden, "user"},
		{"user", "0", "User", "0", http.StatusForbidden, "user"},
	} {
		body := base()
		body[c.key] = c.val
		w := s.call(s.api, http.MethodPost, "/v1/requests", "op-alice", body)
		var e struct {
			Error api.Error `json:"error"`
		}
		_ = json.Unmarshal(w.Body.Bytes(), &e)
		if w.Code != c.status || e.Error.Field != c.field {
			t.Errorf("REST: %s %v: %d field %q, want %d naming %s: %s", c.key, c.val, w.Code, e.Error.Field, c.status, c.field, w.Body.String())
		}
		if c.dkey != "" {
			w := s.call(s.docker, http.MethodPost, "/containers/create", "op-alice", map[string]any{"Image": "berth/sim", c.dkey: c.dval})
			if w.Code != c.status || !strings.Contains(w.Body.String(), c.field) {
				t.Errorf("Docker: %s %v: %d %s, want %d naming %s", c.dkey, c.dval, w.Code, w.Body.String(), c.status, c.field)
			}
		}
	}
	body := base()
	body["user"] = "0"
	if w := s.call(s.api, http.MethodPost, "/v1/requests", "admin", body); w.Code != http.StatusCreated {
		t.Errorf("REST: an admin's user 0: %d %s, want 201", w.Code, w.Body.String())
	}
}

// TestDockerEventsShowNoOtherNamespace: a record removed from the store
// names no namespace; the Docker endpoint's event stream says "destroy"
// only of what it has shown, never of another namespace's container.
func TestDockerEventsShowNoOtherNamespace(t *testing.T) {
	s := newSurfaces(t, func(c *control.Config) { c.Retention = 20 * time.Millisecond })
	ctx := context.Background()
	hs := httptest.NewServer(s.docker)
	defer hs.Close()
	req, _ := http.NewRequest(http.MethodGet, hs.URL+"/events", nil)
	req.Header.Set("Authorization", "Bearer "+s.secrets["op-mallory"])
	resp, err := hs.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	lines := make(chan string, 1000)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	defer func() {
		resp.Body.Close()
		for range lines {
		}
	}()

	spec := driver.Spec{Image: "berth/sim", Resources: driver.Resources{CPU: driver.CPUs(0.1)}}
	ans, err := s.plane.Submit(ctx, scheduler.Request{Spec: spec}, "alice")
	if err != nil {
		t.Fatal(err)
	}
	aliceID := ans.Instances[0].Instance.ID
	running(t, s.plane, aliceID)
	if err := s.plane.Delete(ctx, aliceID); err != nil {
		t.Fatal(err)
	}
	eventually(t, "alice's record removed", func() bool {
		_, err := s.plane.Instance(ctx, aliceID)
		return errors.Is(err, driver.ErrNotFound)
	})
	ans, err = s.plane.Submit(ctx, scheduler.Request{Spec: spec}, "mallory")
	if err != nil {
		t.Fatal(err)
	}
	mine := ans.Instances[0].Instance.ID
	timeout := time.After(60 * time.Second)
	for {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatal("the event stream ended")
			}
			if strings.Contains(l, aliceID) {
				t.Fatalf("mallory's event stream shows alice's container: %s", l)
			}
			if strings.Contains(l, mine) {
				return
			}
		case <-timeout:
			t.Fatal("mallory's own container never showed in its event stream")
		}
	}
}
