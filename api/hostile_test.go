package api_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/api"
	"github.com/berth-dev/berth/api/apitest"
	"github.com/berth-dev/berth/auth"
	"github.com/berth-dev/berth/control"
	"github.com/berth-dev/berth/store"
	"github.com/berth-dev/berth/store/bolt"
)

// serveOn serves the API over real HTTP on loopback, on the bolt store at
// path, for the length of fn: the server, its plane and the store are
// closed when fn returns. It fails the test if the server does not start.
func serveOn(t *testing.T, path string, fn func(t *testing.T, e *apitest.Env, st store.Store)) {
	t.Helper()
	t.Run("serve", func(t *testing.T) {
		st, err := bolt.Open(path, bolt.Options{})
		if err != nil {
			t.Fatal(err)
		}
		e := apitest.Start(t, st, map[string]any{"nodes": 3}, api.Options{Rate: -1})
		fn(t, e, st)
	})
}

// post sends body to path with token over the loopback connection of c.
// It returns the status, the error shape and whether an answer came at
// all; the minute it waits only guards against a hung test.
func post(t *testing.T, c *http.Client, e *apitest.Env, method, path, token, body string) (int, errorBody, bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, e.HTTP.URL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.Do(req)
	if err != nil {
		t.Logf("%s %s %q: no answer: %v", method, path, body, err)
		return 0, errorBody{}, false
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Logf("%s %s %q: answer cut: %v", method, path, body, err)
		return resp.StatusCode, errorBody{}, false
	}
	var eb errorBody
	if resp.StatusCode >= 400 {
		_ = json.Unmarshal(raw, &eb)
	}
	return resp.StatusCode, eb, true
}

// A priority the store cannot hold is 400 naming the field; the server
// answers on (every instance route), keeps nothing of it, and a server
// restarts on the same data. A record of bad bytes in the store does not
// stop the restart: berth doctor's route lists it, for admins only.
func TestHugePriority(t *testing.T) {
	path := filepath.Join(t.TempDir(), "berth.db")
	c := &http.Client{Transport: &http.Transport{}}
	defer c.CloseIdleConnections()
	bad := control.PrefixInstances + "mangled"
	serveOn(t, path, func(t *testing.T, e *apitest.Env, st store.Store) {
		status, eb, ok := post(t, c, e, "POST", "/v1/requests", e.Token, `{"kind":"process","command":["sleep","300"],"priority":4611686018427387904}`)
		if !ok || status != http.StatusBadRequest || eb.Error.Field != "priority" || !strings.Contains(eb.Error.Message, "out of range") {
			t.Fatalf("huge priority: answered %v, %d %+v; want 400 naming priority as out of range", ok, status, eb)
		}
		for _, route := range []string{"/v1/instances", "/v1/instances/nothing", "/v1/quotas", "/v1/nodes"} {
			if status, _, ok := post(t, c, e, "GET", route, e.Token, ""); !ok || status >= 500 {
				t.Errorf("GET %s after the refusal: answered %v, %d", route, ok, status)
			}
		}
		if status, _, ok := post(t, c, e, "POST", "/v1/requests", e.Token, `{"id":"fine","kind":"process","command":["sleep","300"],"priority":7}`); !ok || status != http.StatusCreated {
			t.Fatalf("a good request after the refusal: %v %d", ok, status)
		}
		if _, err := st.Txn(context.Background(), nil, []store.Op{store.Put(bad, []byte("\x01\x07\xff\xff"))}); err != nil {
			t.Fatal(err)
		}
	})
	serveOn(t, path, func(t *testing.T, e *apitest.Env, st store.Store) {
		if status, _, ok := post(t, c, e, "GET", "/v1/instances/fine", e.Token, ""); !ok || status != http.StatusOK {
			t.Errorf("the good instance after the restart: %v %d", ok, status)
		}
		ctx := context.Background()
		d, err := e.Client(t, "").Doctor(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(d.Quarantined) != 1 || d.Quarantined[0].Key != bad || d.Quarantined[0].Reason == "" {
			t.Errorf("doctor: %+v, want %s listed with its reason", d.Quarantined, bad)
		}
		op := e.NewToken(t, "op", auth.RoleOperator, "alice")
		if status, _, ok := post(t, c, e, "GET", "/v1/doctor", op, ""); !ok || status != http.StatusForbidden {
			t.Errorf("doctor with an operator's token: %v %d, want 403", ok, status)
		}
	})
}

// corpus reads the fuzz corpus files under dirs (Go's "go test fuzz v1"
// files of one string each).
func corpus(t *testing.T, dirs ...string) []string {
	t.Helper()
	var out []string
	for _, dir := range dirs {
		files, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range files {
			b, err := os.ReadFile(filepath.Join(dir, f.Name()))
			if err != nil {
				t.Fatal(err)
			}
			lines := strings.Split(strings.TrimSpace(string(b)), "\n")
			if len(lines) != 2 || lines[0] != "go test fuzz v1" {
				t.Fatalf("%s/%s: not a corpus file of one value", dir, f.Name())
			}
			v, ok := strings.CutPrefix(lines[1], "string(")
			v, ok2 := strings.CutSuffix(v, ")")
			s, err := strconv.Unquote(v)
			if !ok || !ok2 || err != nil {
				t.Fatalf("%s/%s: not one string: %q", dir, f.Name(), lines[1])
			}
			out = append(out, s)
		}
	}
	return out
}

// TestHostileCorpus sends the fuzz corpora of the submit and group
// endpoints to a server over real HTTP on loopback, on a data directory
// of its own, each body to every route that takes one: every request is
// answered, none with a 5xx; then a server restarts on that data.
func TestHostileCorpus(t *testing.T) {
	path := filepath.Join(t.TempDir(), "berth.db")
	c := &http.Client{Transport: &http.Transport{}}
	defer c.CloseIdleConnections()
	bodies := corpus(t, "testdata/fuzz/FuzzSubmit", "testdata/fuzz/FuzzGroup")
	var sent, unanswered, failed int
	classes := map[int]int{}  // answers by status class: 2 for 2xx...
	codes := map[string]int{} // error answers by code
	serveOn(t, path, func(t *testing.T, e *apitest.Env, st store.Store) {
		for _, body := range bodies {
			for _, route := range []string{"/v1/requests", "/v1/plan", "/v1/groups"} {
				sent++
				status, eb, ok := post(t, c, e, "POST", route, e.Token, body)
				classes[status/100]++
				if eb.Error.Code != "" {
					codes[eb.Error.Code]++
				}
				switch {
				case !ok:
					unanswered++
				case status >= 500:
					failed++
					t.Errorf("POST %s %q: %d %+v", route, body, status, eb)
				}
			}
		}
		if status, _, ok := post(t, c, e, "GET", "/v1/instances", e.Token, ""); !ok || status != http.StatusOK {
			t.Errorf("GET /v1/instances after the corpus: %v %d", ok, status)
		}
	})
	restarted := false
	serveOn(t, path, func(t *testing.T, e *apitest.Env, st store.Store) {
		status, _, ok := post(t, c, e, "GET", "/v1/instances", e.Token, "")
		restarted = ok && status == http.StatusOK
	})
	t.Logf("hostile corpus: %d bodies, %d requests, %d unanswered, %d answered 5xx (2xx %d, 4xx %d: %v), restart ok: %v",
		len(bodies), sent, unanswered, failed, classes[2], classes[4], codes, restarted)
	if unanswered > 0 || failed > 0 || !restarted {
		t.Errorf("%d unanswered, %d 5xx, restart ok %v: want 0, 0, true", unanswered, failed, restarted)
	}
}
