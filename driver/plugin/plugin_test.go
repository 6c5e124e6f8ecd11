package plugin_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/driver/drivertest"
	"github.com/berth-dev/berth/driver/plugin"
	"github.com/berth-dev/berth/driver/plugin/plugintest"
	_ "github.com/berth-dev/berth/drivers/plugin"
	"github.com/berth-dev/berth/drivers/sim"
	"github.com/berth-dev/berth/internal/procfs"
	"github.com/berth-dev/berth/provider"
)

// The plugin binaries the tests run, built once by TestMain.
var bins struct{ sim, local, badProto, echo string }

// TestMain builds the example plugins from their own module, in a
// temporary directory whose go.mod points at this module.
func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "berth-plugin-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := 1
	if err := build(dir); err != nil {
		fmt.Fprintln(os.Stderr, "building the example plugins:", err)
	} else {
		code = m.Run()
	}
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

func build(dir string) error {
	_, file, _, _ := runtime.Caller(0)
	root, err := filepath.Abs(filepath.Join(filepath.Dir(file), "..", ".."))
	if err != nil {
		return err
	}
	bins.sim, bins.local, bins.badProto, bins.echo = filepath.Join(dir, "sim"), filepath.Join(dir, "local"), filepath.Join(dir, "badproto"), filepath.Join(dir, "echo")
	for pkg, out := range map[string]string{"./sim": bins.sim, "./local": bins.local} {
		if err := plugintest.BuildExample(root, pkg, out); err != nil {
			return err
		}
	}
	for pkg, out := range map[string]string{"./driver/plugin/testdata/badproto": bins.badProto, "./driver/plugin/testdata/echo": bins.echo} {
		cmd := exec.Command("go", "build", "-o", out, pkg)
		cmd.Dir = root
		if b, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("go build %s: %v\n%s", pkg, err, b)
		}
	}
	return nil
}

func sum(t testing.TB, path string) string {
	t.Helper()
	s, err := plugin.Checksum(path)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func simOptions() map[string]any {
	return map[string]any{
		"nodes":         3,
		"strict_images": true,
		"shape":         map[string]any{"cpus": 4, "memory": "8Gi", "images": []any{"sim/hello:1"}},
	}
}

func openSim(t testing.TB, opts map[string]any, cfg plugin.Config) *plugin.Driver {
	t.Helper()
	cfg.Path, cfg.SHA256, cfg.Options = bins.sim, sum(t, bins.sim), opts
	if cfg.Env.DataDir == "" {
		cfg.Env.DataDir = t.TempDir()
	}
	h, err := plugin.Open(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// TestConformance runs the driver conformance suite against the sim
// served out of process.
func TestConformance(t *testing.T) {
	drivertest.Run(t, drivertest.Harness{
		Open: func(t *testing.T) driver.Driver { return openSim(t, simOptions(), plugin.Config{}) },
		Spec: func() *driver.Spec {
			return &driver.Spec{
				Image:     "sim/hello:1",
				Resources: driver.Resources{CPU: driver.CPUs(0.1), Memory: 64 * driver.MiB},
				Env:       map[string]string{sim.EnvStdout: "hello stdout", sim.EnvStderr: "hello stderr"},
			}
		},
		MissingImage: func() *driver.Spec {
			return &driver.Spec{Image: "sim/missing:1", Resources: driver.Resources{CPU: driver.CPUs(0.1)}}
		},
		PreloadImage: "sim/preload:1",
		Timeout:      30 * time.Second,
	})
}

func TestWrongChecksumRefused(t *testing.T) {
	_, err := plugin.Open(context.Background(), plugin.Config{Path: bins.sim, SHA256: strings.Repeat("0", 64), Env: driver.Env{DataDir: t.TempDir()}})
	var fe *driver.FieldError
	if !errors.As(err, &fe) || fe.Path != "sha256" || !strings.Contains(err.Error(), bins.sim) {
		t.Fatalf("Open with a wrong checksum = %v; want a field error for sha256 naming the binary", err)
	}
}

func TestWrongHandshakeRefused(t *testing.T) {
	for _, c := range []struct{ name, path, want string }{
		{"protocol", bins.badProto, "speaks plugin protocol 2"},
		{"not-a-plugin", "/bin/true", "exited before its handshake"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := plugin.Open(context.Background(), plugin.Config{Path: c.path, SHA256: sum(t, c.path), Env: driver.Env{DataDir: t.TempDir()}})
			if !errors.Is(err, driver.ErrInvalid) || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), c.path) {
				t.Fatalf("Open(%s) = %v; want ErrInvalid naming it and saying %q", c.path, err, c.want)
			}
		})
	}
}

func TestOptionsCheckedByThePlugin(t *testing.T) {
	_, err := plugin.Open(context.Background(), plugin.Config{Path: bins.sim, SHA256: sum(t, bins.sim),
		Options: map[string]any{"nodes": "many", "bogus": 1}, Env: driver.Env{DataDir: t.TempDir()}})
	var es driver.FieldErrors
	if !errors.As(err, &es) {
		t.Fatalf("Open with bad options = %v; want field errors", err)
	}
	paths := map[string]bool{}
	for _, fe := range es {
		paths[fe.Path] = true
	}
	if !paths["options.nodes"] || !paths["options.bogus"] {
		t.Fatalf("field errors %v; want options.nodes and options.bogus", es)
	}
}

func TestInfoAndErrors(t *testing.T) {
	h := openSim(t, simOptions(), plugin.Config{})
	defer h.Close(context.Background())
	info := h.Info()
	if info.Name != "sim" || info.Version != "1.0.0" || len(info.Options) == 0 || !h.Has(driver.CapLogs) {
		t.Fatalf("Info = %+v; want sim 1.0.0 with its options and logs", info)
	}
	_, err := h.Get(context.Background(), "no-such-id")
	if !errors.Is(err, driver.ErrNotFound) {
		t.Fatalf("Get of an unknown id = %v; want ErrNotFound through the wire", err)
	}
	_, err = h.Create(context.Background(), "node-0", &driver.Spec{Image: "sim/hello:1", Resources: driver.Resources{CPU: -1}})
	if !errors.Is(err, driver.ErrInvalid) {
		op := err
		t.Fatalf("Create of a bad spec = %v; want ErrInvalid", op)
	}
}

// TestReattach: a server that goes away without closing its plugin finds
// it running when it starts again, with its instances.
func TestReattach(t *testing.T) {
	dir := t.TempDir()
	h := openSim(t, simOptions(), plugin.Config{Env: driver.Env{DataDir: dir}})
	pid := h.Pid()
	ctx := context.Background()
	st, err := h.State(ctx)
	if err != nil {
		t.Fatal(err)
	}
	op, err := h.Create(ctx, st.Nodes[0].Name, &driver.Spec{Name: "kept", Image: "sim/hello:1", Tags: map[string]string{driver.TagManaged: "true"}})
	if err != nil {
		t.Fatal(err)
	}
	inst, err := driver.Drive(ctx, op)
	if err != nil {
		t.Fatal(err)
	}
	plugin.Abandon(h) // the server dies: the plugin lives on

	h2 := openSim(t, simOptions(), plugin.Config{Env: driver.Env{DataDir: dir}})
	defer h2.Close(ctx)
	if h2.Pid() != pid {
		t.Fatalf("after a restart the plugin is process %d, want the same %d", h2.Pid(), pid)
	}
	got, err := h2.Get(ctx, inst.ID)
	if err != nil || got.Name != "kept" {
		t.Fatalf("Get after reattaching = %v, %v; want the instance made before", got, err)
	}
}

// TestReattachOtherOptions: a plugin left running with other options is
// ended and started anew.
func TestReattachOtherOptions(t *testing.T) {
	dir := t.TempDir()
	h := openSim(t, simOptions(), plugin.Config{Env: driver.Env{DataDir: dir}})
	pid := h.Pid()
	plugin.Abandon(h)
	opts := simOptions()
	opts["nodes"] = 2
	h2 := openSim(t, opts, plugin.Config{Env: driver.Env{DataDir: dir}})
	defer h2.Close(context.Background())
	if h2.Pid() == pid {
		t.Fatal("the plugin opened with other options was reattached to")
	}
	if procfs.Running(pid) {
		t.Fatalf("the plugin left running with other options (pid %d) still runs", pid)
	}
	st, err := h2.State(context.Background())
	if err != nil || len(st.Nodes) != 2 {
		t.Fatalf("State = %v, %v; want the 2 nodes of the new options", st, err)
	}
}

// waitRestart waits until the plugin runs as a process other than old.
func waitRestart(t *testing.T, h *plugin.Driver, old int) int {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		if p := h.Pid(); p != 0 && p != old {
			return p
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("the plugin was not restarted (still %d)", old)
	return 0
}

func stopProcess(pid int, sig syscall.Signal) { _ = syscall.Kill(pid, sig) }

// TestKillDuringLaunches kills the local plugin with SIGKILL while
// processes are being launched through it. Each launch that failed is
// looked up by name and made again only if absent, as the reconciler does:
// in the end every instance runs once, a copy whose create was cut short
// is failed and removed as the leak collector removes it (never a second
// running copy), and after the deletes no process is left.
func TestKillDuringLaunches(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	h, err := plugin.Open(ctx, plugin.Config{Path: bins.local, SHA256: sum(t, bins.local),
		Options: map[string]any{"data_dir": filepath.Join(dir, "local"), "allow_root": os.Geteuid() == 0},
		Env:     driver.Env{DataDir: dir}, MinBackoff: 50 * time.Millisecond, PingInterval: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close(ctx)
	const n = 12
	token := fmt.Sprintf("%d.%d", 4000+time.Now().UnixNano()%1000, os.Getpid())
	tags := map[string]string{driver.TagManaged: "true", driver.TagCluster: "kill-test"}
	spec := func(i int) *driver.Spec {
		return &driver.Spec{Name: fmt.Sprintf("k%d", i), Kind: driver.KindProcess, Entrypoint: []string{"/bin/sleep", token}, Tags: tags}
	}
	launchOne := func(i int) (*driver.Instance, error) {
		op, err := h.Create(ctx, "", spec(i))
		if err != nil {
			return nil, err
		}
		return driver.Drive(ctx, op)
	}
	launch := func(i int) error {
		_, err := launchOne(i)
		return err
	}
	// Half the launches start; once one has ended the plugin is killed
	// while the others run, and the second half starts at once.
	results := make(chan error, n)
	old := h.Pid()
	for i := range n / 2 {
		go func() { results <- launch(i) }()
	}
	first := <-results
	stopProcess(old, syscall.SIGKILL)
	for i := n / 2; i < n; i++ {
		go func() { results <- launch(i) }()
	}
	failed := 0
	for i := range n {
		err := first
		if i > 0 {
			err = <-results
		}
		if err != nil {
			if !errors.Is(err, driver.ErrRetryable) && !errors.Is(err, driver.ErrTimeout) {
				t.Errorf("a launch failed with %v; want ErrRetryable or ErrTimeout", err)
			}
			failed++
		}
	}
	t.Logf("%d of %d launches failed with the plugin", failed, n)
	waitRestart(t, h, old)
	// Recover as the reconciler does: look each one up, make it if
	// absent, replace it if its create was cut short. kept holds the id
	// each name ends with, as its record would.
	kept := map[string]bool{}
	for i := range n {
		for {
			inst, err := h.Find(ctx, spec(i).Name)
			if err == nil && inst.State == driver.StateFailed {
				t.Logf("%s: %s: replaced", inst.Name, inst.Message)
				op, derr := h.Delete(ctx, inst.ID)
				if derr == nil {
					_, derr = driver.Drive(ctx, op)
				}
				if derr != nil && !errors.Is(derr, driver.ErrNotFound) {
					t.Fatalf("deleting the failed %s: %v", inst.Name, derr)
				}
				continue
			}
			if err == nil {
				kept[inst.ID] = true
				break
			}
			if errors.Is(err, driver.ErrNotFound) {
				var made *driver.Instance
				if made, err = launchOne(i); err == nil {
					kept[made.ID] = true
					break
				}
			}
			if !errors.Is(err, driver.ErrRetryable) && !errors.Is(err, driver.ErrTimeout) && !errors.Is(err, driver.ErrAlreadyExists) {
				t.Fatalf("recovering k%d: %v", i, err)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	list, err := h.List(ctx, tags)
	if err != nil {
		t.Fatal(err)
	}
	// A copy no name kept is what the leak collector removes: it must be
	// one whose create was cut short, never a second running copy.
	var leaks []*driver.Instance
	list = slices.DeleteFunc(list, func(inst *driver.Instance) bool {
		if kept[inst.ID] {
			return false
		}
		leaks = append(leaks, inst)
		return true
	})
	for _, inst := range leaks {
		if inst.State != driver.StateFailed {
			t.Errorf("%s (%s) is %s and no name kept it: a duplicate", inst.Name, inst.ID, inst.State)
		}
		t.Logf("%s (%s): %s: removed as a leak", inst.Name, inst.ID, inst.Message)
		op, derr := h.Delete(ctx, inst.ID)
		if derr == nil {
			_, derr = driver.Drive(ctx, op)
		}
		if derr != nil && !errors.Is(derr, driver.ErrNotFound) {
			t.Fatalf("deleting the leaked %s: %v", inst.Name, derr)
		}
	}
	names := map[string]int{}
	for _, inst := range list {
		names[inst.Name]++
	}
	for _, inst := range list {
		if inst.State != driver.StateRunning {
			t.Errorf("%s is %s (%s); want running", inst.Name, inst.State, inst.Message)
		}
	}
	if len(list) != n || len(names) != n {
		t.Fatalf("after recovery %d instances, %d names (%v); want %d, each once", len(list), len(names), names, n)
	}
	if got := processes(token); got != n {
		for _, inst := range list {
			t.Logf("%s: %s %s %v", inst.Name, inst.State, inst.Message, inst.ExitCode)
		}
		t.Fatalf("%d processes run; want %d", got, n)
	}
	for _, inst := range list {
		op, err := h.Delete(ctx, inst.ID)
		if err == nil {
			_, err = driver.Drive(ctx, op)
		}
		if err != nil && !errors.Is(err, driver.ErrNotFound) {
			t.Fatalf("delete %s: %v", inst.Name, err)
		}
	}
	if got := processes(token); got != 0 {
		t.Fatalf("%d processes left after the deletes; want none", got)
	}
}

// processes counts the processes whose command line holds token.
func processes(token string) int {
	n := 0
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && strings.Contains(string(b), token) && !strings.Contains(string(b), "zombie") {
			if st, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat")); err == nil && !strings.Contains(string(st), ") Z") {
				n++
			}
		}
	}
	return n
}

// TestHangOpensBreaker stops the plugin (SIGSTOP): calls through the
// provider time out and open its circuit breaker; the host finds the
// plugin does not answer, kills it and starts it again, and calls succeed
// once more.
func TestHangOpensBreaker(t *testing.T) {
	ctx := context.Background()
	h := openSim(t, simOptions(), plugin.Config{PingInterval: 100 * time.Millisecond, PingTimeout: 200 * time.Millisecond, PingFailures: 2, MinBackoff: 50 * time.Millisecond})
	p, err := provider.New(h, provider.Config{Name: "plug", CallTimeout: 200 * time.Millisecond, BreakerFailures: 2, BreakerOpenFor: 200 * time.Millisecond, StateTTL: time.Nanosecond})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close(ctx)
	if _, err := p.State(ctx); err != nil {
		t.Fatal(err)
	}
	old := h.Pid()
	stopProcess(old, syscall.SIGSTOP)
	opened := false
	for i := 0; i < 50 && !opened; i++ {
		_, _ = p.List(ctx, nil)
		opened = p.Health().Breaker == "open"
	}
	if !opened {
		t.Fatalf("breaker %+v after calls to a hung plugin; want open", p.Health())
	}
	waitRestart(t, h, old)
	deadline := time.Now().Add(time.Minute)
	for {
		_, err := p.List(ctx, nil)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("List after the restart: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestAttach sends input through the plugin's Attacher and reads both
// output streams back; a missing instance and a bad terminal size come
// back as the driver's errors.
func TestAttach(t *testing.T) {
	ctx := context.Background()
	h, err := plugin.Open(ctx, plugin.Config{Path: bins.echo, SHA256: sum(t, bins.echo), Options: simOptions(), Env: driver.Env{DataDir: t.TempDir()}})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close(ctx)
	if !h.Has(driver.CapAttach) || !slices.Contains(driver.Features(h), driver.CapTTY) {
		t.Fatalf("capabilities %v, features %v; want attach and tty", driver.Capabilities(h), driver.Features(h))
	}
	if !h.SharedBackend() || !slices.Contains(driver.Capabilities(h), driver.CapShared) {
		t.Fatalf("capabilities %v: the plugin's driver says its back-end is shared", driver.Capabilities(h))
	}
	var stdout, stderr drivertest.SyncBuffer
	if err := h.Attach(ctx, "echo", driver.AttachOptions{}, strings.NewReader("hello plugin"), &stdout, &stderr); err != nil {
		t.Fatal(err)
	}
	if stdout.String() != "HELLO PLUGIN" || stderr.String() != "12 bytes" {
		t.Fatalf("attach gave %q and %q", stdout.String(), stderr.String())
	}
	if err := h.Attach(ctx, "other", driver.AttachOptions{}, nil, &stdout, &stderr); !errors.Is(err, driver.ErrNotFound) {
		t.Fatalf("attach to a missing instance = %v; want ErrNotFound", err)
	}
	var fe *driver.FieldError
	if err := h.ResizeTTY(ctx, "echo", driver.TTYSize{}); !errors.As(err, &fe) || fe.Path != "rows" {
		t.Fatalf("ResizeTTY to 0 rows = %v; want a field error for rows", err)
	}
	// The sim has no Attacher of its own: through its plugin it has none.
	s := openSim(t, simOptions(), plugin.Config{})
	defer s.Close(ctx)
	if _, ok := driver.As[driver.Attacher](s, driver.CapAttach); ok || slices.Contains(driver.Features(s), driver.CapTTY) {
		t.Fatalf("the sim's plugin has attach (%v, %v)", driver.Capabilities(s), driver.Features(s))
	}
	if s.SharedBackend() || slices.Contains(driver.Capabilities(s), driver.CapShared) {
		t.Fatalf("the sim's plugin says its back-end is shared (%v)", driver.Capabilities(s))
	}
}

// TestConfigChecksOptionNames: the driver "plugin" asks the plugin, when
// the configuration is decoded, which options it declares.
func TestConfigChecksOptionNames(t *testing.T) {
	def, err := driver.Lookup("plugin")
	if err != nil {
		t.Fatal(err)
	}
	raw := map[string]any{"path": bins.sim, "sha256": sum(t, bins.sim), "options": map[string]any{"nodes": 3, "bogus": 1}}
	_, err = def.Decode(raw)
	var es driver.FieldErrors
	if !errors.As(err, &es) || len(es) != 1 || es[0].Path != "options.bogus" || !strings.Contains(es[0].Reason, "nodes") {
		t.Fatalf("Decode with an option the plugin does not declare = %v; want one error for options.bogus listing what it declares", err)
	}
	delete(raw["options"].(map[string]any), "bogus")
	if _, err := def.Decode(raw); err != nil {
		t.Fatalf("Decode with the plugin's own options: %v", err)
	}
}

// afterLog records the back-off of each restart the host logs.
type afterLog struct {
	mu    sync.Mutex
	after []time.Duration
}

func (l *afterLog) Enabled(context.Context, slog.Level) bool { return true }
func (l *afterLog) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l *afterLog) WithGroup(string) slog.Handler            { return l }
func (l *afterLog) Handle(_ context.Context, r slog.Record) error {
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "after" {
			l.mu.Lock()
			l.after = append(l.after, a.Value.Duration())
			l.mu.Unlock()
		}
		return true
	})
	return nil
}

// TestRestartBackoff kills the plugin each time it comes back: the wait
// before each restart doubles.
func TestRestartBackoff(t *testing.T) {
	log := &afterLog{}
	h := openSim(t, simOptions(), plugin.Config{MinBackoff: 20 * time.Millisecond, MaxBackoff: 80 * time.Millisecond, Env: driver.Env{Logger: slog.New(log)}})
	defer h.Close(context.Background())
	pid := h.Pid()
	for range 4 {
		stopProcess(pid, syscall.SIGKILL)
		pid = waitRestart(t, h, pid)
	}
	log.mu.Lock()
	defer log.mu.Unlock()
	want := []time.Duration{20 * time.Millisecond, 40 * time.Millisecond, 80 * time.Millisecond, 80 * time.Millisecond}
	if !slices.Equal(log.after, want) {
		t.Fatalf("restarts after %v; want %v", log.after, want)
	}
	if _, err := h.State(context.Background()); err != nil {
		t.Fatalf("State after the restarts: %v", err)
	}
}

// TestCloseHungPlugin: Close of a driver whose plugin hangs returns by
// its context's end, and the plugin is gone.
func TestCloseHungPlugin(t *testing.T) {
	h := openSim(t, simOptions(), plugin.Config{PingInterval: time.Hour})
	pid := h.Pid()
	stopProcess(pid, syscall.SIGSTOP)
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	_ = h.Close(ctx)
	if procfs.Running(pid) {
		t.Fatalf("the hung plugin (pid %d) still runs after Close", pid)
	}
}

// lineLogs records the lines the host logs as a plugin's output.
type lineLogs struct {
	mu    sync.Mutex
	lines []string
}

func (l *lineLogs) Enabled(context.Context, slog.Level) bool { return true }
func (l *lineLogs) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l *lineLogs) WithGroup(string) slog.Handler            { return l }
func (l *lineLogs) Handle(_ context.Context, r slog.Record) error {
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "line" {
			l.mu.Lock()
			l.lines = append(l.lines, r.Message+": "+a.Value.String())
			l.mu.Unlock()
		}
		return true
	})
	return nil
}

// TestStdoutNoise: the local example prints a line to stdout before its
// handshake; the host skips it, logs it, and talks to the plugin.
func TestStdoutNoise(t *testing.T) {
	ctx := context.Background()
	logs := &lineLogs{}
	h, err := plugin.Open(ctx, plugin.Config{Path: bins.local, SHA256: sum(t, bins.local),
		Options: map[string]any{"data_dir": filepath.Join(t.TempDir(), "local")},
		Env:     driver.Env{DataDir: t.TempDir(), Logger: slog.New(logs)}})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close(ctx)
	if _, err := h.State(ctx); err != nil {
		t.Fatal(err)
	}
	logs.mu.Lock()
	defer logs.mu.Unlock()
	if !slices.Contains(logs.lines, "plugin stdout: local plugin starting") {
		t.Fatalf("the plugin's noise was not logged: %q", logs.lines)
	}
}
