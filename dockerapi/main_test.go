package dockerapi_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/moby/moby/client"
	"go.uber.org/goleak"

	"github.com/berth-dev/berth/auth"
	"github.com/berth-dev/berth/control"
	"github.com/berth-dev/berth/dockerapi"
	"github.com/berth-dev/berth/driver"
	_ "github.com/berth-dev/berth/drivers/docker" // registers the docker driver
	"github.com/berth-dev/berth/drivers/docker/dockertest"
	"github.com/berth-dev/berth/provider"
	"github.com/berth-dev/berth/reconciler"
	"github.com/berth-dev/berth/store/bolt"
	"github.com/berth-dev/berth/store/memory"
)

var (
	helloImage = "berth-test/dockerapi-hello:" + dockertest.RandomID()
	mainCli    *client.Client
)

var quiet = func() *slog.Logger {
	if os.Getenv("BERTH_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.DiscardHandler)
}()

// writeTimeout is the test server's write timeout. A stop within half of
// it is answered once done (docker stop's default grace, 10 s, is), and
// rm waits at most half of it for the removal: shorter, the answers of a
// loaded machine's slow removals were cut by the deadline and reached the
// CLI as a closed connection.
const writeTimeout = 30 * time.Second

func TestMain(m *testing.M) { os.Exit(runMain(m)) }

func runMain(m *testing.M) int {
	// A few containers per test: the machine's engine is shared with the
	// docker driver's tests, in turn with the packages that take it alone.
	unlock, err := dockertest.ShareMainEngine()
	if err != nil {
		fmt.Fprintln(os.Stderr, "lock the engine:", err)
		return 1
	}
	defer unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if _, err := exec.LookPath("docker"); err != nil {
		fmt.Fprintln(os.Stderr, "the dockerapi tests need the docker CLI:", err)
		return 1
	}
	mainCli, err = dockertest.Connect(ctx, dockertest.MainHost)
	if err != nil {
		fmt.Fprintln(os.Stderr, "the dockerapi tests need the machine's engine:", err)
		return 1
	}
	defer mainCli.Close()
	if err := dockertest.BuildHello(ctx, mainCli, helloImage); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer dockertest.RemoveImages(context.Background(), mainCli, helloImage)
	return m.Run()
}

// env is one test's Berth: a plane over a docker provider on the machine's
// engine under a cluster id of its own, the Docker endpoint on a unix
// socket, and a docker CLI environment (DOCKER_HOST, DOCKER_CONFIG with
// the token) of its own.
type env struct {
	cluster string
	plane   *control.Plane
	server  *dockerapi.Server
	sock    string
	tokens  *auth.Tokens
	store   *bolt.Store // the plane's, which keeps the endpoint's networks too
	prov    *provider.Provider
	// token is an operator's of the namespace "team", admin an admin's,
	// reader a reader's of every namespace.
	token, admin, reader string
	config               string // DOCKER_CONFIG with token
}

// newToken makes a token and returns its secret.
func (e *env) newToken(t testing.TB, name string, role auth.Role, ns string) string {
	t.Helper()
	secret, _, err := e.tokens.Create(context.Background(), auth.Spec{Name: name, Role: role, Namespaces: []string{ns}})
	if err != nil {
		t.Fatal(err)
	}
	return secret
}

func setup(t testing.TB) *env {
	t.Helper()
	return setupEngines(t, fmt.Sprintf(`[{"name":"main","address":%q}]`, dockertest.MainHost))
}

// setupEngines is setup with a docker provider over engines (its option's
// JSON).
func setupEngines(t testing.TB, engines string) *env {
	t.Helper()
	return setupStore(t, engines, "", "")
}

// setupStore is setupEngines with the plane's store at the bolt file db
// and the cluster named cluster: a server started again over the store of
// an earlier one, whose cleanups have run, with other engines. Empty, a
// fresh store and a fresh name.
func setupStore(t testing.TB, engines, cluster, db string) *env {
	t.Helper()
	ignore := goleak.IgnoreCurrent()
	if cluster == "" {
		cluster = "dapi-" + dockertest.RandomID()
	}
	if db == "" {
		db = filepath.Join(t.TempDir(), "berth.db")
	}
	e := &env{cluster: cluster}
	t.Cleanup(func() {
		// A test's calls through mainCli leave kept-alive connections
		// that outlive it: they are the package's, not the test's.
		_ = mainCli.Close()
		goleak.VerifyNone(t, ignore)
	})
	t.Cleanup(func() { e.removeAll(t) })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	prov := openProvider(t, engines, e.cluster)
	st, err := bolt.Open(db, bolt.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	e.plane, err = control.New(ctx, control.Config{
		Store: st, Providers: []*provider.Provider{prov}, Cluster: e.cluster, Logger: quiet,
		SyncInterval: 200 * time.Millisecond, RetryBackoff: 100 * time.Millisecond, LaunchTimeout: time.Minute, Workers: 8,
	})
	if err != nil {
		t.Fatal(err)
	}
	runPlane(t, e.plane)

	e.tokens = auth.NewTokens(memory.New(memory.Options{}), nil)
	e.token = e.newToken(t, "ops", auth.RoleOperator, "team")
	e.admin = e.newToken(t, "root", auth.RoleAdmin, auth.AllNamespaces)
	e.reader = e.newToken(t, "viewer", auth.RoleReader, auth.AllNamespaces)
	e.store, e.prov = st, prov
	// The endpoint is told the write timeout its HTTP server has (below),
	// as berth server tells it: the answers it holds back for the engine's
	// timing (stop, rm) come within it.
	e.server = dockerapi.New(e.plane, dockerapi.Options{Authenticator: e.tokens, Logger: quiet, ServerVersion: "test", Store: st, WriteTimeout: writeTimeout})
	e.sock = serveUnix(t, e.server)
	e.config = e.dockerConfig(t, e.token)
	return e
}

// serveUnix serves s on a unix socket of its own until t ends, and
// returns the socket's path.
func serveUnix(t testing.TB, s *dockerapi.Server) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "dapi")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	sock := filepath.Join(dir, "d.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	// A short read timeout and a write timeout (shorter than a server's
	// default) that the streams must lift; TestStreamsOutliveWriteTimeout
	// checks that with a shorter one still.
	hs := &http.Server{Handler: s, ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 2 * time.Second, WriteTimeout: writeTimeout}
	served := make(chan struct{})
	go func() { defer close(served); _ = hs.Serve(ln) }()
	t.Cleanup(func() {
		s.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := hs.Shutdown(ctx); err != nil {
			_ = hs.Close()
		}
		<-served
	})
	return sock
}

// runPlane runs p until t ends.
func runPlane(t testing.TB, p *control.Plane) {
	runCtx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(runCtx) }()
	t.Cleanup(func() {
		stop()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Errorf("Run returned %v, want context.Canceled", err)
		}
	})
}

// openProvider opens a docker provider over engines (its option's JSON)
// for the cluster named cluster, closed when t ends.
func openProvider(t testing.TB, engines, cluster string) *provider.Provider {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	def, err := driver.Lookup("docker")
	if err != nil {
		t.Fatal(err)
	}
	raw := map[string]any{
		"engines":       engines,
		"poll_interval": "200ms", "backoff_min": "50ms", "backoff_max": "500ms",
		"stop_grace": "5s", "pull": false, "sweep_interval": "200ms",
	}
	d, err := def.Open(ctx, raw, driver.Env{Provider: "docker", Cluster: cluster, Logger: quiet})
	if err != nil {
		t.Fatalf("open the docker driver: %v", err)
	}
	prov, err := provider.New(d, provider.Config{Name: "docker", Logger: quiet, StateTTL: 100 * time.Millisecond})
	if err != nil {
		_ = d.Close(ctx)
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := prov.Close(ctx); err != nil {
			t.Errorf("close the provider: %v", err)
		}
	})
	return prov
}

// dockerConfig writes a DOCKER_CONFIG directory whose config.json sends
// token.
func (e *env) dockerConfig(t testing.TB, token string) string {
	dir := t.TempDir()
	cfg := `{"HttpHeaders": {"Authorization": "Bearer ` + token + `"}}`
	if token == "" {
		cfg = `{}`
	}
	if err := os.WriteFile(filepath.Join(dir, "config.json"), []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	return dir
}

// docker runs the docker CLI against e's endpoint and returns its stdout,
// stderr and exit code.
func (e *env) docker(t testing.TB, args ...string) (string, string, int) {
	t.Helper()
	return e.dockerWith(t, e.config, args...)
}

func (e *env) dockerWith(t testing.TB, config string, args ...string) (string, string, int) {
	t.Helper()
	return dockerAt(t, "unix://"+e.sock, config, args...)
}

// dockerAt runs the docker CLI against the engine API at host (a
// DOCKER_HOST) with the DOCKER_CONFIG directory config.
func dockerAt(t testing.TB, host, config string, args ...string) (string, string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "docker", args...)
	cmd.Env = append(cleanEnv(), "DOCKER_HOST="+host, "DOCKER_CONFIG="+config)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("docker %v: %v", args, err)
	}
	return out.String(), errb.String(), code
}

// must runs docker and fails the test unless it exits 0.
func (e *env) must(t testing.TB, args ...string) string {
	t.Helper()
	out, errs, code := e.docker(t, args...)
	if code != 0 {
		t.Fatalf("docker %s: exit %d\nstdout: %s\nstderr: %s", strings.Join(args, " "), code, out, errs)
	}
	return out
}

// cleanEnv is the environment without DOCKER_* variables.
func cleanEnv() []string {
	var out []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "DOCKER_") {
			out = append(out, kv)
		}
	}
	return out
}

// removeAll removes every container of e's cluster from the engine.
func (e *env) removeAll(t testing.TB) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// The plane tags what it makes with the cluster's name and its id (not
	// known here); a create in flight when the plane stopped is found by
	// the name.
	for _, key := range []string{driver.TagCluster, driver.TagClusterName} {
		if _, err := removeByLabel(ctx, key, e.cluster); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	}
	// The networks the back-end made for the cluster's containers.
	cli, err := dockertest.Connect(ctx, dockertest.MainHost)
	if err != nil {
		t.Errorf("cleanup: %v", err)
		return
	}
	defer cli.Close()
	res, err := cli.NetworkList(ctx, client.NetworkListOptions{Filters: make(client.Filters).Add("label", driver.TagClusterName+"="+e.cluster)})
	if err != nil {
		t.Errorf("cleanup: %v", err)
		return
	}
	for _, n := range res.Items {
		if _, err := cli.NetworkRemove(ctx, n.ID, client.NetworkRemoveOptions{}); err != nil {
			t.Errorf("cleanup: remove network %s: %v", n.Name, err)
		}
	}
}

// start runs docker in the background, its stdout collected.
func (e *env) start(t *testing.T, args ...string) (*exec.Cmd, *syncBuffer) {
	t.Helper()
	cmd := exec.Command("docker", args...)
	cmd.Env = append(cleanEnv(), "DOCKER_HOST=unix://"+e.sock, "DOCKER_CONFIG="+e.config)
	out := &syncBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	// Give the stream time to be opened before what it should see.
	deadline := time.Now().Add(30 * time.Second)
	for e.server.OpenStreams() == 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	return cmd, out
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// waitPhase waits until the instance ref is in one of phases.
func (e *env) waitPhase(t *testing.T, ref string, phases ...reconciler.Phase) control.Instance {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		in, err := e.plane.Instance(context.Background(), ref)
		if err == nil && slices.Contains(phases, in.Phase) {
			return in
		}
		if time.Now().After(deadline) {
			t.Fatalf("instance %s: %+v %v; want a phase in %v", ref, in, err, phases)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// waitGone waits until the instance id is deleted.
func (e *env) waitGone(t *testing.T, id string) {
	t.Helper()
	e.waitPhase(t, id, reconciler.Deleted)
}

// removeByLabel removes the engine's containers labelled k=v through a
// client of its own, closed after, so that no idle connection outlives it.
func removeByLabel(ctx context.Context, k, v string) (int, error) {
	cli, err := dockertest.Connect(ctx, dockertest.MainHost)
	if err != nil {
		return 0, err
	}
	defer cli.Close()
	return dockertest.RemoveByLabel(ctx, cli, k, v)
}

func sleep() { time.Sleep(50 * time.Millisecond) }

// waitFor polls cond every 50 ms until it holds or a minute passes.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		sleep()
	}
}
