package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berth-dev/berth/api"
	"github.com/berth-dev/berth/api/apitest"
	"github.com/berth-dev/berth/api/client"
	"github.com/berth-dev/berth/auth"
	"github.com/berth-dev/berth/control"
	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/reconciler"
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
	if err := driver.UnmarshalOutput([]byte(out), &list); err != nil {
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
		if err := driver.UnmarshalOutput([]byte(out), &list); err != nil {
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

// TestSuspendHoldAndStatsVerbs runs the verbs against a server and checks
// what they print and their exit codes.
func TestSuspendHoldAndStatsVerbs(t *testing.T) {
	e := testEnv(t, api.Options{})
	addr := e.HTTP.URL
	if _, err := e.Client(t, "").Submit(context.Background(), scheduler.Request{ID: "web", Spec: driver.Spec{Image: "x", Resources: driver.Resources{Memory: 64 * driver.MiB}}}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "web to run", func() bool {
		in, err := e.Plane.Instance(context.Background(), "web")
		return err == nil && in.Phase == reconciler.Running
	})
	phase := func() reconciler.Phase {
		in, err := e.Plane.Instance(context.Background(), "web")
		if err != nil {
			t.Fatal(err)
		}
		return in.Phase
	}
	for _, c := range []struct {
		args  []string
		code  int
		phase reconciler.Phase
	}{
		{[]string{"suspend", "web"}, exitOK, reconciler.Suspended},
		{[]string{"pause", "web"}, exitOK, reconciler.Suspended},
		{[]string{"resume", "web"}, exitOK, reconciler.Running},
		{[]string{"resume", "web"}, exitOK, reconciler.Running}, // resumed already
		{[]string{"unpause", "web"}, exitOK, reconciler.Running},
		{[]string{"stop", "web"}, exitOK, reconciler.Stopped},
		{[]string{"resume", "web"}, exitConflict, reconciler.Stopped}, // not suspended: start it
		{[]string{"start", "web"}, exitOK, reconciler.Running},
		{[]string{"suspend", "nosuch"}, exitNotFound, reconciler.Running},
		{[]string{"hold", "web", "--for", "0s"}, exitInvalid, reconciler.Running},
		{[]string{"hold", "web", "--for", "1000h"}, exitInvalid, reconciler.Running},
		{[]string{"hold", "nosuch", "--for", "2h"}, exitNotFound, reconciler.Running},
		{[]string{"hold", "web", "--for", "2h"}, exitOK, reconciler.Held},
		{[]string{"suspend", "web"}, exitInvalid, reconciler.Held},
	} {
		code, out, errOut := berth(t, addr, c.args...)
		if code != c.code {
			t.Errorf("berth %v: exit %d (%s), want %d", c.args, code, errOut, c.code)
		}
		if code == exitOK && strings.TrimSpace(out) != "web" {
			t.Errorf("berth %v: printed %q, want the reference", c.args, out)
		}
		if got := phase(); got != c.phase {
			t.Errorf("after berth %v: web is %s, want %s", c.args, got, c.phase)
		}
	}
	code, out, errOut := berth(t, addr, "ps", "--phase", "held", "-q")
	if code != exitOK || strings.TrimSpace(out) != "web" {
		t.Errorf("ps --phase held: exit %d %q %s", code, out, errOut)
	}

	code, out, errOut = berth(t, addr, "stats", "--no-stream", "--json", "web")
	var st api.Stats
	if code != exitOK || json.Unmarshal([]byte(out), &st) != nil || st.ID != "web" || st.MemoryLimitBytes != int64(64*driver.MiB) || st.Time.IsZero() {
		t.Errorf("stats --no-stream --json: exit %d %q %s", code, out, errOut)
	}
	code, out, errOut = berth(t, addr, "stats", "--no-stream", "web")
	if lines := strings.Split(strings.TrimSpace(out), "\n"); code != exitOK || len(lines) != 2 || !strings.HasPrefix(lines[0], "NAME") || !strings.HasPrefix(lines[1], "web ") {
		t.Errorf("stats --no-stream: exit %d, want a header and a row:\n%s%s", code, out, errOut)
	}
	if code, _, _ := berth(t, addr, "stats", "--no-stream", "nosuch"); code != exitNotFound {
		t.Errorf("stats of an unknown instance: exit %d, want %d", code, exitNotFound)
	}
	// A stream ends with the command's context: two rows, then Ctrl-C.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	w := &rowsThenCancel{rows: 3, cancel: cancel}
	var errb bytes.Buffer
	if code := run(ctx, []string{"--addr", addr, "stats", "web"}, w, &errb); code != exitOK || w.n < 3 {
		t.Errorf("stats, interrupted: exit %d after %d lines (%s), want 0 after a header and two rows", code, w.n, errb.String())
	}
}

// TestVerbsOnABackEndThatCannotExit6: suspend and stats on a back-end
// without the capability exit 6, naming the provider.
func TestVerbsOnABackEndThatCannotExit6(t *testing.T) {
	e := apitest.StartBare(t, memory.New(memory.Options{}), map[string]any{"nodes": 1}, api.Options{})
	t.Setenv(EnvToken, e.Token)
	if _, err := e.Client(t, "").Submit(context.Background(), scheduler.Request{ID: "web", Spec: driver.Spec{Image: "x"}}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "web to run", func() bool {
		in, err := e.Plane.Instance(context.Background(), "web")
		return err == nil && in.Phase == reconciler.Running
	})
	for _, args := range [][]string{{"suspend", "web"}, {"stats", "--no-stream", "web"}, {"stats", "web"}, {"attach", "web"}, {"exec", "web", "--", "ls"}} {
		if code, _, errOut := berth(t, e.HTTP.URL, args...); code != exitUnsupported || !strings.Contains(errOut, `"plain"`) {
			t.Errorf("berth %v: exit %d %q, want %d naming the provider", args, code, errOut, exitUnsupported)
		}
	}
}

// TestRunInteractiveNeedsAnAttacher: run -i and -t on a back-end that
// cannot attach are refused at submit, naming the field; -i does not go
// with --count.
func TestRunInteractiveNeedsAnAttacher(t *testing.T) {
	addr := testServer(t)
	for _, tc := range []struct{ flag, field string }{{"-i", "stdin"}, {"-t", "tty"}, {"-it", "stdin"}} {
		code, _, errOut := berth(t, addr, "run", tc.flag, "--rm", "x", "--", "cat")
		if code != exitUnsupported || !strings.Contains(errOut, tc.field+": no provider can run this") {
			t.Errorf("run %s: exit %d %q, want %d naming %s", tc.flag, code, errOut, exitUnsupported, tc.field)
		}
	}
	if code, _, errOut := berth(t, addr, "run", "-i", "--count", "2", "x"); code != exitUsage {
		t.Errorf("run -i --count 2: exit %d %q, want %d", code, errOut, exitUsage)
	}
	if code, _, _ := berth(t, addr, "attach", "nosuch"); code != exitNotFound {
		t.Errorf("attach to an unknown instance: exit %d, want %d", code, exitNotFound)
	}
}

// rowsThenCancel counts the lines written to it and cancels once it has
// seen rows of them.
type rowsThenCancel struct {
	mu     sync.Mutex
	n      int
	rows   int
	cancel context.CancelFunc
}

func (w *rowsThenCancel) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.n += bytes.Count(p, []byte("\n"))
	if w.n >= w.rows {
		w.cancel()
	}
	return len(p), nil
}

// waitFor polls cond until it holds; the limit only guards against a hung
// test.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestRunPoolLabel(t *testing.T) {
	e := apitest.StartWith(t, memory.New(memory.Options{}), map[string]any{"nodes": 2}, api.Options{}, func(c *control.Config) {
		c.Pools = []control.Pool{{Name: "ci", Provider: c.Providers[0].Name(), Labels: []control.Label{
			{Name: "sleeper", Spec: driver.Spec{Image: "sleeper:1", Resources: driver.Resources{CPU: driver.CPUs(0.25)}}},
		}}}
	})
	t.Setenv(EnvToken, e.Token)
	addr := e.HTTP.URL
	code, out, errOut := berth(t, addr, "run", "--pool", "ci", "--label", "sleeper", "--count", "2", "--name", "job")
	if code != 0 || strings.Count(out, "job.sleeper-") != 2 {
		t.Fatalf("run --pool: exit %d, out %q, err %q", code, out, errOut)
	}
	list, err := e.Client(t, e.Token).Instances(context.Background(), control.Filter{Group: "job"})
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 2 {
		t.Fatalf("group job holds %d instances, want 2", len(list))
	}
	for _, in := range list {
		if in.Phase != reconciler.Running || in.Spec == nil || in.Spec.Image != "sleeper:1" {
			t.Fatalf("%s: %s, spec %+v", in.ID, in.Phase, in.Spec)
		}
	}
	for _, tc := range []struct {
		args []string
		code int
	}{
		{[]string{"run", "--pool", "ci", "--label", "waker"}, 4},              // refused by the server: invalid
		{[]string{"run", "--pool", "ci", "--label", "sleeper", "busybox"}, 2}, // an image with --pool
		{[]string{"run", "--pool", "ci", "--label", "sleeper", "--cpus", "1"}, 2},
		{[]string{"run", "--pool", "ci"}, 2},
		{[]string{"run", "--pool", "ci", "--label", "a=b"}, 2},
	} {
		if code, _, errOut := berth(t, addr, tc.args...); code != tc.code || errOut == "" {
			t.Errorf("%v: exit %d (%q), want %d with a message", tc.args, code, errOut, tc.code)
		}
	}
}

// TestProvidersShowSchedulerCounts: berth providers prints the
// scheduler's counts under the table, and --json the list alone.
func TestProvidersShowSchedulerCounts(t *testing.T) {
	addr := testServer(t)
	code, out, errOut := berth(t, addr, "providers")
	if code != 0 || !strings.Contains(out, "schedulers: 1, placements committed: 0, conflicts: 0") {
		t.Fatalf("providers: exit %d, %q %q", code, out, errOut)
	}
	code, out, _ = berth(t, addr, "providers", "--json")
	var list []control.ProviderView
	if err := driver.UnmarshalOutput([]byte(out), &list); code != 0 || err != nil || len(list) != 1 {
		t.Fatalf("providers --json: exit %d, %v: %q", code, err, out)
	}
}

// TestServerRefusesBadSchedulers: --schedulers out of range is invalid
// (exit 4) naming the key, before the server opens anything.
func TestServerRefusesBadSchedulers(t *testing.T) {
	for _, k := range []string{"-1", "65"} {
		var out, errb bytes.Buffer
		code := run(context.Background(), []string{"server", "--dev", "--data-dir", t.TempDir(), "--schedulers", k}, &out, &errb)
		if code != 4 || !strings.Contains(errb.String(), "schedulers") {
			t.Errorf("--schedulers %s: exit %d, %q; want 4 naming schedulers", k, code, errb.String())
		}
	}
}

// TestDriversListsPlugins: `berth drivers` shows a plugin's driver with
// its version, binary and provider, and its options without flags.
func TestDriversListsPlugins(t *testing.T) {
	e := testEnv(t, api.Options{Plugins: func() []api.DriverInfo {
		return []api.DriverInfo{{Name: "ours", Summary: "our cloud", Version: "2.1.0", Plugin: "/opt/ours", Provider: "north",
			Options: []driver.Option{{Name: "region", Type: "string", Help: "where"}}}}
	}})
	code, out, errOut := berth(t, e.HTTP.URL, "drivers")
	if code != 0 || !strings.Contains(out, "ours 2.1.0 (plugin /opt/ours, provider north): our cloud") || !strings.Contains(out, "region") || strings.Contains(out, "--ours-region") {
		t.Fatalf("drivers: exit %d, %q %q", code, out, errOut)
	}
	if !strings.Contains(out, "--sim-nodes") {
		t.Fatalf("drivers lost the registered drivers: %q", out)
	}
}

// TestRunWaits: run returns once every instance runs, with a progress
// line on stderr; once they have all failed it exits non-zero naming
// each; --no-wait returns at placement.
func TestRunWaits(t *testing.T) {
	addr := testServer(t)
	code, _, errOut := berth(t, addr, "run", "--name", "ok", "--count", "2", "x")
	if code != 0 || !strings.Contains(errOut, "2/2 running") {
		t.Fatalf("run --count 2: exit %d, stderr %q; want 0 and a progress line 2/2 running", code, errOut)
	}

	e := apitest.Start(t, memory.New(memory.Options{}), map[string]any{"nodes": 1, "fail_permanent": 1}, api.Options{})
	t.Setenv(EnvToken, e.Token)
	code, out, _ := berth(t, e.HTTP.URL, "run", "--no-wait", "--name", "later", "x")
	if code != 0 || !strings.Contains(out, "later") {
		t.Fatalf("run --no-wait: exit %d, stdout %q; want 0 and the placed instance", code, out)
	}
	code, _, errOut = berth(t, e.HTTP.URL, "run", "--name", "bad", "--count", "2", "x")
	if code == 0 || strings.Count(errOut, " failed: ") != 2 {
		t.Fatalf("run of instances that fail: exit %d, stderr %q; want non-zero naming each", code, errOut)
	}
	if !strings.Contains(errOut, "0/2 running") {
		t.Errorf("run of instances that fail: stderr %q, want a progress line", errOut)
	}
}
