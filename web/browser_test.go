package web_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/berth-dev/berth/api"
	"github.com/berth-dev/berth/api/client"
	"github.com/berth-dev/berth/auth"
	"github.com/berth-dev/berth/control"
	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/drivers/local"
	"github.com/berth-dev/berth/internal/testdeps"
	"github.com/berth-dev/berth/provider"
	"github.com/berth-dev/berth/scheduler"
	"github.com/berth-dev/berth/store/bolt"
	"github.com/berth-dev/berth/web"
)

// browserPath finds Debian's headless Chromium. Without it the test skips,
// naming the package, or fails under testdeps.EnvRequireAll (.ci/run).
func browserPath(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium-headless-shell", "/usr/lib/chromium/chromium-headless-shell"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	testdeps.Need(t, testdeps.Missing("Chromium headless shell for the browser tests", "chromium-headless-shell"))
	return ""
}

// realServer is a Berth server as `berth server` wires it: a bbolt store,
// the local back-end running real processes, the control plane running,
// the API under /v1 and the dashboard under /ui/.
type realServer struct {
	URL    string
	Client *client.Client // speaks as namespace team-a
	Plane  *control.Plane
}

// startReal starts the server; with options, they change the plane's
// configuration before it starts.
func startReal(t *testing.T, options ...func(*control.Config)) *realServer {
	t.Helper()
	ctx := context.Background()
	dir := t.TempDir()
	opts := local.DefaultOptions()
	opts.DataDir = filepath.Join(dir, "local")
	opts.NodeName = "host"
	opts.StopGrace = time.Second
	opts.PollInterval = 20 * time.Millisecond
	opts.CgroupRoot = ""
	opts.AllowRoot = true // the tests run as root
	cluster := fmt.Sprintf("webtest-%d", rand.Uint64())
	d, err := local.Open(ctx, opts, driver.Env{Provider: "local", Cluster: cluster, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	p, err := provider.New(d, provider.Config{Name: "local", Logger: quiet, StateTTL: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	st, err := bolt.Open(filepath.Join(dir, "berth.db"), bolt.Options{})
	if err != nil {
		t.Fatal(err)
	}
	cfg := control.Config{Store: st, Providers: []*provider.Provider{p}, Cluster: cluster, Logger: quiet,
		SyncInterval: 50 * time.Millisecond, RetryBackoff: 20 * time.Millisecond,
		Quotas: []control.Quota{{Owner: "team-a", Instances: 50}}}
	for _, o := range options {
		o(&cfg)
	}
	plane, err := control.New(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ui, err := web.New(plane, web.Options{Authenticator: testTokens, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	apiTokens := auth.NewTokens(st, nil)
	apiSecret, _, err := apiTokens.Create(ctx, auth.Spec{Name: "ops", Role: auth.RoleOperator, Namespaces: []string{"team-a"}})
	if err != nil {
		t.Fatal(err)
	}
	apiServer := api.New(plane, api.Options{Logger: quiet, AuditLog: quiet, Tokens: apiTokens})
	mux := http.NewServeMux()
	mux.Handle(web.Prefix, ui)
	mux.Handle("/", apiServer)
	hs := httptest.NewServer(mux)
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{}, 2)
	go func() { _ = plane.Run(runCtx); done <- struct{}{} }()
	go func() { _ = ui.Run(runCtx); done <- struct{}{} }()
	t.Cleanup(func() {
		// Delete what the test started, then stop.
		list, _ := plane.Instances(ctx, control.Filter{})
		for _, in := range list {
			_ = plane.Delete(ctx, in.ID)
		}
		eventuallyQuiet(plane)
		ui.CloseStreams()
		apiServer.CloseStreams()
		hs.Close()
		cancel()
		<-done
		<-done
		_ = p.Close(ctx)
		_ = st.Close()
	})
	cl, err := client.New(hs.URL, client.WithToken(apiSecret))
	if err != nil {
		t.Fatal(err)
	}
	return &realServer{URL: hs.URL, Client: cl, Plane: plane}
}

// eventuallyQuiet waits a while for every instance to be deleted.
func eventuallyQuiet(plane *control.Plane) {
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		list, _ := plane.Instances(context.Background(), control.Filter{})
		if len(list) == 0 {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// browse starts a headless browser for the test. On failure the test
// saves a screenshot of the page to testdata/out/<test>.png.
func browse(t *testing.T) context.Context {
	t.Helper()
	path := browserPath(t)
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(path), chromedp.NoSandbox,
		chromedp.WindowSize(1280, 1000), chromedp.Flag("disable-gpu", true))
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelCtx := chromedp.NewContext(actx)
	ctx, cancelTime := context.WithTimeout(ctx, 3*time.Minute)
	if err := chromedp.Do(ctx); err != nil {
		cancelTime()
		cancelCtx()
		cancelAlloc()
		t.Fatalf("starting %s: %v", path, err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			screenshot(t, ctx, filepath.Join("testdata", "out", strings.ReplaceAll(t.Name(), "/", "_")+".png"))
		}
		cancelTime()
		cancelCtx()
		cancelAlloc()
	})
	return ctx
}

// screenshot saves the whole page as a PNG at path.
func screenshot(t *testing.T, ctx context.Context, path string) {
	sctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	png, err := chromedp.Run(sctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Logf("screenshot: %v", err)
		return
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Logf("screenshot: %v", err)
		return
	}
	if err := os.WriteFile(path, png, 0o644); err != nil {
		t.Logf("screenshot: %v", err)
		return
	}
	abs, _ := filepath.Abs(path)
	t.Logf("screenshot saved: %s", abs)
}

// run runs browser actions, failing the test with what step failed.
func run(t *testing.T, ctx context.Context, what string, actions ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	if err := chromedp.Do(ctx, actions...); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// waitText waits until the text of the element sel contains want.
func waitText(t *testing.T, ctx context.Context, sel, want string) {
	t.Helper()
	var got string
	deadline := time.Now().Add(90 * time.Second)
	for {
		got = ""
		wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		got, _ = chromedp.Run(wctx, chromedp.Evaluate[string](fmt.Sprintf(`(document.querySelector(%q) || {}).textContent || ""`, sel)))
		cancel()
		if strings.Contains(got, want) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s never showed %q; it shows %q", sel, want, cut(got))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// evaluate runs a script in the page and returns its value.
func evaluate[T any](t *testing.T, ctx context.Context, expr string, opts ...chromedp.EvaluateOption) T {
	t.Helper()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](expr, opts...))
	if err != nil {
		t.Fatalf("evaluating %s: %v", expr, err)
	}
	return v
}

func signInBrowser(t *testing.T, ctx context.Context, base, tok string) {
	t.Helper()
	run(t, ctx, "sign in",
		chromedp.Navigate(base+"/ui/instances"), // redirected to the sign-in page
		chromedp.WaitVisible(`#token`),
		chromedp.SendKeys(`#token`, tok),
		chromedp.Submit(`#token`),
		chromedp.WaitVisible(`#f-ns`),
	)
}

// TestBrowserInstanceLifecycle signs in, watches a `berth run` instance
// appear on the instances page without a reload, opens it, sees its log
// lines stream, stops it and sees the phase change.
func TestBrowserInstanceLifecycle(t *testing.T) {
	// Use measured often, so that the pictures show it.
	srv := startReal(t, func(c *control.Config) { c.UsageInterval = 500 * time.Millisecond })
	ctx := browse(t)
	signInBrowser(t, ctx, srv.URL, "operator-secret")
	waitText(t, ctx, "#live-status", "on")
	// A mark that a reload would wipe.
	evaluate[int](t, ctx, `window.berthMark = 42`)

	id := fmt.Sprintf("hello-%d", rand.Uint32())
	// What `berth run --name ID -- sh -c ...` submits.
	ans, err := srv.Client.Submit(context.Background(), scheduler.Request{ID: id, Spec: driver.Spec{Name: id, Kind: driver.KindProcess,
		Entrypoint: []string{"/bin/sh", "-c", `i=0; while :; do echo "log line $i"; i=$((i+1)); sleep 0.3; done`},
		Env:        map[string]string{"API_KEY": "do-not-show-me"},
		Resources:  driver.Resources{CPU: driver.CPUs(0.1), Memory: 16 * driver.MiB}}})
	if err != nil {
		t.Fatal(err)
	}
	id = ans.Instances[0].Instance.ID // an operator's id is stored in its namespace (team-a_...)
	waitText(t, ctx, "#live-instances", id)
	if mark := evaluate[int](t, ctx, `window.berthMark || 0`); mark != 42 {
		t.Fatal("the instances page was reloaded; it should update in place")
	}
	waitText(t, ctx, `tr[data-id="`+id+`"]`, "running")
	if os.Getenv("BERTH_UPDATE_SCREENSHOTS") == "1" {
		screenshot(t, ctx, filepath.Join("testdata", "out", "instances.png"))
	}

	run(t, ctx, "open the instance", chromedp.Click(`a[href="/ui/instances/`+id+`"]`), chromedp.WaitVisible(`#logs`))
	waitText(t, ctx, "#phase", "running")
	waitText(t, ctx, "#logs", "log line 1")
	waitText(t, ctx, "#logs", "log line 4") // more lines follow without a reload
	body := evaluate[string](t, ctx, `document.body.innerText`)
	if strings.Contains(body, "do-not-show-me") || !strings.Contains(body, "API_KEY") {
		t.Errorf("the instance page shows an env value, or not the variable:\n%s", cut(body))
	}
	if os.Getenv("BERTH_UPDATE_SCREENSHOTS") == "1" {
		// The README's pictures, taken while the instance runs.
		screenshot(t, ctx, filepath.Join("..", "docs", "dashboard-instance.png"))
		run(t, ctx, "open the overview", chromedp.Navigate(srv.URL+"/ui/"), chromedp.WaitVisible(`#totals-h`))
		waitText(t, ctx, "#live-status", "on")
		screenshot(t, ctx, filepath.Join("..", "docs", "dashboard-overview.png"))
		run(t, ctx, "open the instance again", chromedp.Navigate(srv.URL+"/ui/instances/"+id), chromedp.WaitVisible(`#act-stop`))
	}

	run(t, ctx, "press stop", chromedp.Click(`#act-stop`), chromedp.WaitVisible(`#phase`))
	waitText(t, ctx, "#phase", "stopped")
	waitText(t, ctx, "#live-instance", "stopping") // the history shows the way there
}

// TestBrowserPendingReason: the pending page says why an instance waits.
// (A constraint no node can ever meet is refused at submit: this one asks
// for more memory than is free now.)
func TestBrowserPendingReason(t *testing.T) {
	srv := startReal(t)
	ctx := browse(t)
	id := fmt.Sprintf("nowhere-%d", rand.Uint32())
	ns, err := srv.Plane.Nodes(context.Background())
	if err != nil || len(ns) != 1 {
		t.Fatalf("nodes: %v %v", ns, err)
	}
	// One instance holds a little of the node; the next asks for all of it.
	small := driver.Resources{CPU: driver.CPUs(0.1), Memory: 16 * driver.MiB}
	if _, err := srv.Client.Submit(context.Background(), scheduler.Request{ID: id + "-first",
		Spec: driver.Spec{Kind: driver.KindProcess, Entrypoint: []string{"/bin/sleep", "60"}, Resources: small}}); err != nil {
		t.Fatal(err)
	}
	_, err = srv.Client.Submit(context.Background(), scheduler.Request{ID: id,
		Spec: driver.Spec{Kind: driver.KindProcess, Entrypoint: []string{"/bin/true"}, Resources: driver.Resources{CPU: ns[0].Capacity.CPU, Memory: 16 * driver.MiB}}})
	if err != nil {
		t.Fatal(err)
	}
	signInBrowser(t, ctx, srv.URL, "operator-secret")
	run(t, ctx, "open the pending page", chromedp.Navigate(srv.URL+"/ui/pending"), chromedp.WaitVisible(`#why-h`))
	waitText(t, ctx, "#live-pending", "not enough cpu")
	waitText(t, ctx, "#live-pending", id)
	if os.Getenv("BERTH_UPDATE_SCREENSHOTS") == "1" {
		screenshot(t, ctx, filepath.Join("testdata", "out", "pending.png"))
	}
}

// TestBrowserRefusesPostWithoutCSRF: a signed-in browser's post without
// the form's CSRF token is refused, and with it accepted.
func TestBrowserRefusesPostWithoutCSRF(t *testing.T) {
	srv := startReal(t)
	ctx := browse(t)
	id := fmt.Sprintf("sleeper-%d", rand.Uint32())
	_, err := srv.Client.Submit(context.Background(), scheduler.Request{ID: id,
		Spec: driver.Spec{Kind: driver.KindProcess, Entrypoint: []string{"/bin/sleep", "60"}, Resources: driver.Resources{CPU: driver.CPUs(0.1), Memory: 16 * driver.MiB}}})
	if err != nil {
		t.Fatal(err)
	}
	signInBrowser(t, ctx, srv.URL, "operator-secret")
	post := func(body string) int {
		return evaluate[int](t, ctx, fmt.Sprintf(`fetch("/ui/instances/%s/restart", {method: "POST", credentials: "same-origin",
			headers: {"Content-Type": "application/x-www-form-urlencoded"}, body: %q, redirect: "manual"}).then(r => r.status)`, id, body),
			chromedp.EvalAwaitPromise)
	}
	if got := post(""); got != http.StatusForbidden {
		t.Errorf("a post without the CSRF token: status %d, want 403", got)
	}
	if got := post("csrf=made-up"); got != http.StatusForbidden {
		t.Errorf("a post with a made-up CSRF token: status %d, want 403", got)
	}
	run(t, ctx, "open the instance", chromedp.Navigate(srv.URL+"/ui/instances/"+id), chromedp.WaitVisible(`#act-restart`))
	csrf := evaluate[string](t, ctx, `document.querySelector('input[name=csrf]').value`)
	// With the token the dashboard lets the post through (the redirect of
	// an accepted action, or the plane's answer: not the CSRF refusal).
	if got := post("csrf=" + csrf); got == http.StatusForbidden {
		t.Errorf("a post with the form's CSRF token was refused")
	}
}

// TestBrowserWhatIf runs a built-in workload through the simulator from
// the page, comparing two strategies, and sees the figures and the chart.
func TestBrowserWhatIf(t *testing.T) {
	srv := startReal(t)
	ctx := browse(t)
	signInBrowser(t, ctx, srv.URL, "operator-secret")
	run(t, ctx, "run a what-if",
		chromedp.Navigate(srv.URL+"/ui/whatif"),
		chromedp.WaitVisible(`#nodes`),
		chromedp.Click(`#src-w2`),
		chromedp.SetValue(`#nodes`, "200"),
		chromedp.Click(`#st-binpack`),
		chromedp.Click(`#st-spread`),
		chromedp.Submit(`#nodes`),
		chromedp.WaitVisible(`#res-h`),
	)
	waitText(t, ctx, "#main", "placements/s")
	if n := evaluate[int](t, ctx, `document.querySelectorAll("svg.chart rect").length`); n < 6 {
		t.Errorf("the charts have %d bars, want at least 6", n)
	}
	res := evaluate[string](t, ctx, `document.querySelector("#res-h").parentElement.innerText`)
	for _, want := range []string{"as in the workload", "binpack", "spread", "1000"} {
		if !strings.Contains(res, want) {
			t.Errorf("the results lack %q:\n%s", want, res)
		}
	}
	if os.Getenv("BERTH_UPDATE_SCREENSHOTS") == "1" {
		screenshot(t, ctx, filepath.Join("testdata", "out", "whatif.png"))
	}
}

// waitTrue waits until the script expr is true in the page.
func waitTrue(t *testing.T, ctx context.Context, what, expr string) {
	t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	for {
		wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		ok, _ := chromedp.Run(wctx, chromedp.Evaluate[bool](expr))
		cancel()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("never saw %s (%s)", what, expr)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestBrowserUsageCharts: an instance idles, then burns cpu, then idles
// again. Its page draws its hour of cpu and memory, used against
// reserved, and the cpu chart moves up without a reload as its use grows;
// the overview draws the node's and the cluster's, and they come down
// when the burning stops. The instances table shows the process's
// program. Idling blocks (a read of a FIFO, then a sleep), so that even on
// a loaded machine, where the burning gets a small share of a cpu, the
// two differ plainly.
func TestBrowserUsageCharts(t *testing.T) {
	srv := startReal(t, func(c *control.Config) { c.UsageInterval = 200 * time.Millisecond })
	ctx := browse(t)
	dir := t.TempDir()
	burn, start := filepath.Join(dir, "burn"), filepath.Join(dir, "start")
	if err := syscall.Mkfifo(start, 0o600); err != nil {
		t.Fatal(err)
	}
	id := fmt.Sprintf("burner-%d", rand.Uint32())
	// Wait for a line on the FIFO, burn while the file exists, then sleep.
	script := fmt.Sprintf(`read go < %s; while [ -e %s ]; do :; done; exec sleep 600`, start, burn)
	ans, err := srv.Client.Submit(context.Background(), scheduler.Request{ID: id, Spec: driver.Spec{Name: id, Kind: driver.KindProcess,
		Entrypoint: []string{"/bin/sh", "-c", script},
		Resources:  driver.Resources{CPU: driver.CPUs(0.5), Memory: 64 * driver.MiB}}})
	if err != nil {
		t.Fatal(err)
	}
	id = ans.Instances[0].Instance.ID // an operator's id is stored in its namespace (team-a_...)
	// burning is the millicpus above which the instance is taken to burn:
	// idle, it uses none.
	const burning = 20
	signInBrowser(t, ctx, srv.URL, "operator-secret")
	waitText(t, ctx, `tr[data-id="`+id+`"]`, "/bin/sh -c")

	cpu := `document.querySelector('svg.hour[data-resource="cpus"]')`
	run(t, ctx, "open the instance", chromedp.Navigate(srv.URL+"/ui/instances/"+id), chromedp.WaitVisible(`#use-h`))
	waitText(t, ctx, "#live-status", "on")
	waitTrue(t, ctx, "the instance's charts drawn with two points", cpu+` && Number(`+cpu+`.dataset.points) >= 2 && `+
		`document.querySelector('svg.hour[data-resource="memory"] polyline.use') !== null`)
	if r := evaluate[string](t, ctx, cpu+`.dataset.reserved`); r != "500" {
		t.Errorf("the cpu chart's reservation: %q millicpus, want 500", r)
	}
	if used := evaluate[int](t, ctx, `Number(`+cpu+`.dataset.used)`); used >= burning {
		t.Fatalf("the idle instance is drawn using %d millicpus", used)
	}
	before := evaluate[string](t, ctx, cpu+`.querySelector("polyline.use").getAttribute("points")`)
	evaluate[int](t, ctx, `window.berthMark = 7`)

	if err := os.WriteFile(burn, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	startBurning(t, start)
	waitTrue(t, ctx, "the cpu chart move up as the instance burns", fmt.Sprintf(`Number(%s.dataset.used) >= %d`, cpu, burning))
	if after := evaluate[string](t, ctx, cpu+`.querySelector("polyline.use").getAttribute("points")`); after == before {
		t.Error("the cpu line did not move")
	}
	if mark := evaluate[int](t, ctx, `window.berthMark || 0`); mark != 7 {
		t.Fatal("the instance page was reloaded; its charts should update in place")
	}
	if os.Getenv("BERTH_UPDATE_SCREENSHOTS") == "1" {
		screenshot(t, ctx, filepath.Join("testdata", "out", "usage-instance.png"))
	}

	run(t, ctx, "open the overview", chromedp.Navigate(srv.URL+"/ui/"), chromedp.WaitVisible(`#totals-h`))
	waitText(t, ctx, "#live-status", "on")
	cluster := `document.querySelector('#live-overview section[aria-labelledby="totals-h"] svg.hour[data-resource="cpus"]')`
	node := `document.querySelector('td.hours svg.hour[data-resource="cpus"]')`
	waitTrue(t, ctx, "the cluster's and the node's cpu charts up",
		fmt.Sprintf(`%[1]s && %[2]s && Number(%[1]s.dataset.used) >= %[3]d && Number(%[2]s.dataset.used) >= %[3]d`, cluster, node, burning))
	if os.Getenv("BERTH_UPDATE_SCREENSHOTS") == "1" {
		screenshot(t, ctx, filepath.Join("testdata", "out", "usage-overview.png"))
	}
	evaluate[int](t, ctx, `window.berthMark = 8`)
	if err := os.Remove(burn); err != nil {
		t.Fatal(err)
	}
	waitTrue(t, ctx, "the cluster's cpu chart come down when the burning stops", fmt.Sprintf(`Number(%s.dataset.used) < %d`, cluster, burning))
	if mark := evaluate[int](t, ctx, `window.berthMark || 0`); mark != 8 {
		t.Fatal("the overview was reloaded; its charts should update in place")
	}
}

// startBurning writes a line to the FIFO the instance waits on. The open
// does not block: until the instance has opened its end it fails, and is
// tried again for a while.
func startBurning(t *testing.T, fifo string) {
	t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	for {
		f, err := os.OpenFile(fifo, os.O_WRONLY|syscall.O_NONBLOCK, 0)
		if err == nil {
			_, err = f.WriteString("go\n")
			f.Close()
			if err != nil {
				t.Fatal(err)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the instance never read its FIFO: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
