package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/berth-dev/berth/api"
	"github.com/berth-dev/berth/api/apitest"
	"github.com/berth-dev/berth/api/client"
	"github.com/berth-dev/berth/auth"
	"github.com/berth-dev/berth/control"
	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/scheduler"
	"github.com/berth-dev/berth/store/memory"
)

// testServer serves the API over a sim back-end with two nodes and a memory
// store and returns its address; the CLI run by berth uses its admin token
// ($BERTH_TOKEN).
func testServer(t *testing.T) string {
	t.Helper()
	return testEnv(t, api.Options{}).HTTP.URL
}

// testEnv is testServer with opts, returning the whole environment.
func testEnv(t *testing.T, opts api.Options) *apitest.Env {
	t.Helper()
	e := apitest.Start(t, memory.New(memory.Options{}), map[string]any{"nodes": 2}, opts)
	t.Setenv(EnvToken, e.Token)
	return e
}

// berth runs the CLI against addr and returns its exit code, stdout and
// stderr.
func berth(t *testing.T, addr string, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	code := run(context.Background(), append([]string{"--addr", addr}, args...), &out, &errb)
	return code, out.String(), errb.String()
}

func TestListAndChangeVerbs(t *testing.T) {
	e := testEnv(t, api.Options{})
	addr := e.HTTP.URL
	ctx := context.Background()
	for _, o := range []struct{ owner, id string }{{"alice", "a1"}, {"alice", "a2"}, {"bob", "b1"}} {
		cl := e.Client(t, e.Token, client.WithNamespace(o.owner))
		if _, err := cl.Submit(ctx, scheduler.Request{Spec: driver.Spec{Image: "x"}, ID: o.id}); err != nil {
			t.Fatal(err)
		}
	}

	code, out, errOut := berth(t, addr, "ps", "--namespace", "alice", "--json")
	if code != 0 {
		t.Fatalf("ps --owner alice --json: exit %d: %s", code, errOut)
	}
	var list []control.Instance
	if err := json.Unmarshal([]byte(out), &list); err != nil {
		t.Fatalf("ps --json: %v: %q", err, out)
	}
	for _, in := range list {
		if in.Owner != "alice" {
			t.Errorf("ps --owner alice lists %s of %q", in.ID, in.Owner)
		}
	}
	if len(list) != 2 {
		t.Errorf("ps --owner alice: %d instances, want 2", len(list))
	}
	if code, out, _ := berth(t, addr, "ps", "--namespace", "nobody", "--json"); code != 0 || strings.TrimSpace(out) != "[]" {
		t.Errorf("ps of an owner with nothing: exit %d %q, want []", code, out)
	}

	code, out, _ = berth(t, addr, "nodes")
	if code != 0 || !strings.HasPrefix(out, "PROVIDER") || strings.Count(out, "\n") != 3 {
		t.Errorf("nodes: exit %d, want a header and two rows:\n%s", code, out)
	}

	code, _, errOut = berth(t, addr, "inspect", "--json", list[0].ID)
	if code != exitUsage {
		t.Errorf("inspect --json: exit %d (%s), want usage error: inspect always prints JSON", code, errOut)
	}

	// One good and one unknown reference: the good one is done and printed,
	// the unknown one reported, and the exit code is not found's.
	code, out, errOut = berth(t, addr, "rm", "b1", "no-such-instance")
	if code != 3 || strings.TrimSpace(out) != "b1" || !strings.Contains(errOut, "no-such-instance") {
		t.Errorf("rm b1 no-such-instance: exit %d, stdout %q, stderr %q; want 3, b1, the unknown one named", code, out, errOut)
	}
}

// TestPsPages lists 5 instances from a server whose pages hold 2: ps lists
// them all, ps --limit one page and where the next one starts.
func TestPsPages(t *testing.T) {
	e := testEnv(t, api.Options{PageSize: 2})
	addr := e.HTTP.URL
	cl := e.Client(t, "")
	if _, err := cl.Submit(context.Background(), scheduler.Request{Spec: driver.Spec{Image: "x"}, ID: "web", Count: 5}); err != nil {
		t.Fatal(err)
	}
	psJSON := func(args ...string) ([]string, string) {
		t.Helper()
		code, out, errOut := berth(t, addr, append([]string{"ps", "--json"}, args...)...)
		if code != 0 {
			t.Fatalf("ps %v: exit %d: %s", args, code, errOut)
		}
		var list []control.Instance
		if err := json.Unmarshal([]byte(out), &list); err != nil {
			t.Fatalf("ps %v: %v: %q", args, err, out)
		}
		ids := make([]string, len(list))
		for i, in := range list {
			ids[i] = in.ID
		}
		slices.Sort(ids)
		return ids, errOut
	}
	all, errOut := psJSON()
	if want := []string{"web-0", "web-1", "web-2", "web-3", "web-4"}; !slices.Equal(all, want) || errOut != "" {
		t.Fatalf("ps over pages of 2: %v (stderr %q), want %v", all, errOut, want)
	}
	page, errOut := psJSON("--limit", "3")
	if !slices.Equal(page, all[:3]) || !strings.Contains(errOut, "--after web-2") {
		t.Fatalf("ps --limit 3: %v, stderr %q; want %v and --after web-2", page, errOut, all[:3])
	}
	page, errOut = psJSON("--limit", "3", "--after", "web-2")
	if !slices.Equal(page, all[3:]) || errOut != "" {
		t.Fatalf("ps --limit 3 --after web-2: %v, stderr %q; want %v and nothing more", page, errOut, all[3:])
	}
	if code, _, errOut := berth(t, addr, "ps", "--limit", "-1"); code != 4 || !strings.Contains(errOut, "limit") {
		t.Fatalf("ps --limit -1: exit %d %q, want 4 naming limit", code, errOut)
	}
}

// TestContexts: a context names a server and its token; commands use the
// current one, --context another, and --addr beats both.
func TestContexts(t *testing.T) {
	e := testEnv(t, api.Options{})
	t.Setenv(EnvToken, "")
	t.Setenv(EnvAddr, "")
	t.Setenv("XDG_CONFIG_HOME", t.TempDir())
	t.Setenv("XDG_DATA_HOME", t.TempDir()) // no local admin token to find
	reader := e.NewToken(t, "viewer", auth.RoleReader, "team")
	dir := t.TempDir()
	write := func(name, secret string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(secret+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	cli := func(args ...string) (int, string, string) {
		var out, errb bytes.Buffer
		code := run(context.Background(), args, &out, &errb)
		return code, out.String(), errb.String()
	}
	if code, _, errOut := cli("context", "add", "admin", "--addr", e.HTTP.URL, "--token-file", write("admin", e.Token)); code != 0 {
		t.Fatalf("context add: %d %s", code, errOut)
	}
	if code, _, errOut := cli("context", "add", "viewer", "--addr", e.HTTP.URL, "--token-file", write("viewer", reader)); code != 0 {
		t.Fatalf("context add: %d %s", code, errOut)
	}
	fi, err := os.Stat(filepath.Join(os.Getenv("XDG_CONFIG_HOME"), "berth", "contexts.yaml"))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("contexts file: %v %v, want mode 0600", fi, err)
	}
	// The first context added is the current one: an admin.
	if code, out, errOut := cli("token", "list"); code != 0 || !strings.Contains(out, "viewer") {
		t.Fatalf("token list with the admin context: %d %q %s", code, out, errOut)
	}
	// --context viewer: a reader may not list tokens.
	if code, _, _ := cli("--context", "viewer", "token", "list"); code == 0 {
		t.Fatalf("a reader's context listed tokens")
	}
	if code, _, errOut := cli("context", "use", "viewer"); code != 0 {
		t.Fatalf("context use: %d %s", code, errOut)
	}
	if code, _, _ := cli("token", "list"); code == 0 {
		t.Fatalf("after context use viewer, token list still works")
	}
	// --addr beats the context's address (a wrong one: unreachable).
	if code, _, _ := cli("--addr", "http://127.0.0.1:1", "ps"); code != exitUnavailable {
		t.Errorf("--addr to a closed port: exit %d, want %d", code, exitUnavailable)
	}
	if code, out, _ := cli("context", "ls"); code != 0 || strings.Contains(out, e.Token) || strings.Contains(out, reader) || !strings.Contains(out, "*") {
		t.Errorf("context ls shows a token or no current context: %q", out)
	}
	if code, _, _ := cli("--context", "nope", "ps"); code != exitUsage {
		t.Errorf("--context nope: exit %d, want usage", code)
	}
}

func TestWhy(t *testing.T) {
	e := testEnv(t, api.Options{})
	cl := e.Client(t, "")
	if _, err := cl.Submit(context.Background(), scheduler.Request{ID: "w", Spec: driver.Spec{Image: "x"}}); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := berth(t, e.HTTP.URL, "why", "w")
	if code != 0 || !strings.HasPrefix(out, "w is ") {
		t.Fatalf("why w: exit %d %q %s", code, out, errOut)
	}
	if code, _, _ := berth(t, e.HTTP.URL, "why", "nosuch"); code != exitNotFound {
		t.Errorf("why of an unknown instance: exit %d, want %d", code, exitNotFound)
	}
}
