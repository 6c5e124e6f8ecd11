package integration_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/moby/moby/client"
	"go.uber.org/goleak"

	"github.com/berth-dev/berth/control"
	"github.com/berth-dev/berth/driver"
	_ "github.com/berth-dev/berth/drivers/docker" // registers the docker driver
	"github.com/berth-dev/berth/drivers/docker/dockertest"
	"github.com/berth-dev/berth/drivers/kubernetes/k8stest"
	"github.com/berth-dev/berth/provider"
	"github.com/berth-dev/berth/reconciler"
	"github.com/berth-dev/berth/store/bolt"
)

// The two engines are nodes of one docker provider: "main" is the
// machine's engine, "second" one the tests run, started with the engine
// label disk=ssd.
const (
	provName   = "docker"
	mainNode   = "main"
	secondNode = "second"
)

var (
	helloImage = "berth-test/it-hello:" + dockertest.RandomID()
	mainCli    *client.Client
	second     *dockertest.Engine
)

// quiet discards the plane's logs unless BERTH_TEST_LOG is set.
var quiet = func() *slog.Logger {
	if os.Getenv("BERTH_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.DiscardHandler)
}()

func TestMain(m *testing.M) {
	// The kubernetes test's etcd member runs in a copy of this binary.
	k8stest.ServeEtcdIfAsked()
	os.Exit(runMain(m))
}

func runMain(m *testing.M) int {
	// These tests stop engines and launch many containers: they take the
	// machine's engine for themselves.
	unlock, err := dockertest.LockMainEngine()
	if err != nil {
		fmt.Fprintln(os.Stderr, "integration tests: lock the engine:", err)
		return 1
	}
	defer unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	mainCli, err = dockertest.Connect(ctx, dockertest.MainHost)
	if err != nil {
		fmt.Fprintln(os.Stderr, "integration tests need the machine's engine:", err)
		return 1
	}
	defer mainCli.Close()
	defer dockertest.RemoveImages(context.Background(), mainCli, helloImage)
	if err := dockertest.BuildHello(ctx, mainCli, helloImage); err != nil {
		fmt.Fprintln(os.Stderr, "integration tests: build the test image:", err)
		return 1
	}
	// Two engines are what these tests are about: without the second one
	// they fail rather than skip.
	second, err = dockertest.StartEngine(ctx, dockertest.EngineOptions{Labels: map[string]string{"disk": "ssd"}})
	if err != nil {
		fmt.Fprintln(os.Stderr, "integration tests: start the second engine:", err)
		return 1
	}
	defer second.Destroy()
	if err := dockertest.CopyImage(ctx, mainCli, second.Client, helloImage); err != nil {
		fmt.Fprintln(os.Stderr, "integration tests: load the test image into the second engine:", err)
		return 1
	}
	return m.Run()
}

// env is one test's Berth: a plane over a docker provider spanning both
// engines, with a bbolt store, under a cluster id of its own so that it
// never sees what other tests or other test binaries run on the engines.
type env struct {
	cluster string
	// lists counts the provider's List calls: the sync rounds.
	lists   listCounter
	prov    *provider.Provider
	store   *bolt.Store
	plane   *control.Plane
	metrics *metrics
	// stopPlane stops the plane (once; the test's end does it otherwise).
	stopPlane func(t *testing.T)
}

// setup starts the plane; it is stopped, and every container of its
// cluster removed from both engines, when the test ends, and the test
// fails if it leaves goroutines behind.
func setup(t *testing.T, tune func(*control.Config)) *env {
	t.Helper()
	leakCheck(t)
	return setupNamed(t, "it-"+dockertest.RandomID(), tune)
}

// setupNamed is setup under the cluster name given (two planes may share
// one), without the goroutine check (the caller makes it once).
func setupNamed(t *testing.T, name string, tune func(*control.Config)) *env {
	t.Helper()
	e := &env{cluster: name, metrics: &metrics{}}
	t.Cleanup(func() { e.removeAll(t) })

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	def, err := driver.Lookup("docker")
	if err != nil {
		t.Fatal(err)
	}
	// As a configuration file would give it.
	raw := map[string]any{
		"engines": fmt.Sprintf(`[{"name":%q,"address":%q},{"name":%q,"address":%q}]`,
			mainNode, dockertest.MainHost, secondNode, second.Address()),
		"poll_interval": "200ms", "backoff_min": "50ms", "backoff_max": "500ms",
		"stop_grace": "5s", "pull": false,
	}
	d, err := def.Open(ctx, raw, driver.Env{Provider: provName, Cluster: e.cluster, Logger: quiet})
	if err != nil {
		t.Fatalf("open the docker driver: %v", err)
	}
	e.prov, err = provider.New(d, provider.Config{Name: provName, Logger: quiet, StateTTL: 100 * time.Millisecond, Observer: &e.lists})
	if err != nil {
		_ = d.Close(ctx)
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := e.prov.Close(ctx); err != nil {
			t.Errorf("close the provider: %v", err)
		}
	})
	e.store, err = bolt.Open(filepath.Join(t.TempDir(), "berth.db"), bolt.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := e.store.Close(); err != nil {
			t.Errorf("close the store: %v", err)
		}
	})
	cfg := control.Config{
		Store: e.store, Providers: []*provider.Provider{e.prov}, Cluster: e.cluster,
		Logger: quiet, Metrics: e.metrics,
		SyncInterval: 200 * time.Millisecond, RetryBackoff: 100 * time.Millisecond,
		LaunchTimeout: time.Minute, Workers: 4,
	}
	if tune != nil {
		tune(&cfg)
	}
	e.plane, err = control.New(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.plane.Run(runCtx) }()
	var once sync.Once
	e.stopPlane = func(t *testing.T) {
		once.Do(func() {
			stop()
			if err := <-done; !errors.Is(err, context.Canceled) {
				t.Errorf("Run returned %v, want context.Canceled", err)
			}
		})
	}
	t.Cleanup(func() { e.stopPlane(t) })
	return e
}

// listCounter counts a provider's List calls.
type listCounter struct{ n atomic.Int64 }

func (c *listCounter) Call(_, op string, _ time.Duration, _ error) {
	if op == "list" {
		c.n.Add(1)
	}
}
func (c *listCounter) BreakerChanged(string, string, string) {}

// leakCheck fails the test if goroutines it started outlive it; it runs
// after every other cleanup.
func leakCheck(t *testing.T) {
	ignore := goleak.IgnoreCurrent()
	t.Cleanup(func() {
		// The tests' own clients keep idle connections; they are not Berth's.
		mainCli.Close()
		second.Client.Close()
		goleak.VerifyNone(t, ignore)
	})
}

// removeAll removes every container of e's cluster (by its name, unique
// per test) from both engines,
// restarting the second engine first if a failed test left it stopped.
func (e *env) removeAll(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if !second.Running() {
		if err := second.Start(ctx); err != nil {
			t.Errorf("cleanup: restart the second engine: %v", err)
		}
	}
	for name, c := range engines() {
		if n, err := dockertest.RemoveByLabel(ctx, c, driver.TagClusterName, e.cluster); err != nil {
			t.Errorf("cleanup on %s: %v", name, err)
		} else if n > 0 && !t.Failed() {
			t.Errorf("cleanup: %d containers of cluster %s were left on %s", n, e.cluster, name)
		}
	}
}

// deleteRaw removes the containers of e's cluster id from both engines,
// behind Berth's back (for a plane that is stopped for good).
func (e *env) deleteRaw(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for name, c := range engines() {
		if _, err := dockertest.RemoveByLabel(ctx, c, driver.TagCluster, e.plane.ClusterID()); err != nil {
			t.Errorf("remove on %s: %v", name, err)
		}
	}
}

// engines returns a client of each engine, by node name.
func engines() map[string]*client.Client {
	return map[string]*client.Client{mainNode: mainCli, secondNode: second.Client}
}

// raw lists the containers of e's cluster on the engine of c, straight
// from the Engine API: container id → the instance id it is labelled with.
func (e *env) raw(t *testing.T, c *client.Client) map[string]string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	list, err := c.ContainerList(ctx, client.ContainerListOptions{All: true, Filters: make(client.Filters).Add("label", driver.TagCluster+"="+e.plane.ClusterID())})
	if err != nil {
		t.Fatalf("list containers: %v", err)
	}
	out := map[string]string{}
	for _, ct := range list.Items {
		out[ct.ID] = ct.Labels[driver.TagInstance]
	}
	return out
}

// containerID returns the engine's container id of a docker back-end id
// ("<engine>/<container id>").
func containerID(backendID string) string {
	_, id, _ := strings.Cut(backendID, "/")
	return id
}

// instances returns every instance of the plane that is not deleted.
func (e *env) instances(t *testing.T) []control.Instance {
	t.Helper()
	ins, err := e.plane.Instances(context.Background(), control.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	return ins
}

// waitFor polls cond until it holds. The limit only guards against a hung
// test; it is never what the test measures.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	if !poll(cond) {
		t.Fatalf("timed out waiting for %s", what)
	}
}

// waitFor is waitFor that shows the plane's instances when it times out.
func (e *env) waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	if poll(cond) {
		return
	}
	var b strings.Builder
	for _, in := range e.instances(t) {
		fmt.Fprintf(&b, "\n  %s: %s on %q, stale %v, exclude %v: %s", in.ID, in.Phase, in.Node, in.Stale, in.Exclude, in.Message)
	}
	t.Fatalf("timed out waiting for %s; the instances:%s", what, b.String())
}

func poll(cond func() bool) bool {
	deadline := time.Now().Add(2 * time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(50 * time.Millisecond)
	}
	return true
}

// allIn waits until every instance of the plane is in phase want, failing
// at once when one fails; it returns them.
func (e *env) allIn(t *testing.T, want reconciler.Phase, n int) []control.Instance {
	t.Helper()
	var ins []control.Instance
	e.waitFor(t, fmt.Sprintf("%d instances %s", n, want), func() bool {
		ins = e.instances(t)
		for _, in := range ins {
			if in.Phase == reconciler.Failed && want != reconciler.Failed {
				t.Fatalf("instance %s failed: %s", in.ID, in.Message)
			}
		}
		return len(ins) == n && !slices.ContainsFunc(ins, func(in control.Instance) bool { return in.Phase != want })
	})
	return ins
}

// deleteAll deletes every instance through the plane and waits until they
// are deleted and neither engine holds a container of the cluster.
func (e *env) deleteAll(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	for _, in := range e.instances(t) {
		if err := e.plane.Delete(ctx, in.ID); err != nil {
			t.Fatalf("delete %s: %v", in.ID, err)
		}
	}
	e.waitFor(t, "every instance deleted", func() bool { return len(e.instances(t)) == 0 })
	for name, c := range engines() {
		if left := e.raw(t, c); len(left) != 0 {
			t.Errorf("%s still holds %d containers of the cluster after every instance was deleted: %v", name, len(left), left)
		}
	}
}

// metrics counts what the plane reports.
type metrics struct {
	mu       sync.Mutex
	syncs    int            // sync rounds (one QueueDepth report each)
	leaks    map[string]int // leaked resources deleted, by provider
	launches int
	failed   []string // failed create attempts
}

func (m *metrics) Scheduled(time.Duration, bool) {}
func (m *metrics) QueueDepth(int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.syncs++
}
func (m *metrics) Launched(_ string, err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.launches++
	if err != nil {
		m.failed = append(m.failed, err.Error())
	}
}
func (m *metrics) QuotaUse(control.QuotaUse) {}
func (m *metrics) Conflicts(int)             {}
func (m *metrics) LeakFound(provider string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.leaks == nil {
		m.leaks = map[string]int{}
	}
	m.leaks[provider]++
}

func (m *metrics) syncRounds() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.syncs
}

func (m *metrics) leaksFound(provider string) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.leaks[provider]
}

func (m *metrics) failedLaunches() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.failed)
}

// afterSyncs waits until the plane has run n more sync rounds.
func (e *env) afterSyncs(t *testing.T, n int) {
	t.Helper()
	from := e.metrics.syncRounds()
	waitFor(t, fmt.Sprintf("%d sync rounds", n), func() bool { return e.metrics.syncRounds() >= from+n })
}
