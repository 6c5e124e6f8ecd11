// Package dockertest sets up real Docker Engines for tests, with no image
// registry: it builds a FROM scratch image around the static program in
// ./hello, copies images between engines (save → load), and runs extra
// engines of the tests' own, each a dockerd in a network namespace of its
// own with its own socket, data root, exec root and pid file.
//
// It never touches what it did not make: containers are removed by label,
// images by the tag they were built with.
package dockertest

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/moby/moby/client"
)

// MainHost is the address of the machine's own engine.
const MainHost = "unix:///var/run/docker.sock"

// helloPkg is the import path of the program inside the test image.
const helloPkg = "github.com/berth-dev/berth/drivers/docker/dockertest/hello"

// ErrUnavailable is returned by StartEngine when this machine cannot run a
// second engine (no dockerd, not root, no unshare); the error says which.
// Any other error from StartEngine is a failure of the setup.
var ErrUnavailable = errors.New("dockertest: a second engine cannot run here")

// RandomID returns 8 random hex digits, for tags and names unique to a run.
func RandomID() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// Connect returns a client of the engine at host, with the API version
// negotiated, after checking that the engine answers.
func Connect(ctx context.Context, host string) (*client.Client, error) {
	cli, err := client.New(client.WithHost(host))
	if err != nil {
		return nil, err
	}
	if _, err := cli.Ping(ctx, client.PingOptions{NegotiateAPIVersion: true}); err != nil {
		cli.Close()
		return nil, fmt.Errorf("the Docker Engine at %s does not answer: %w", host, err)
	}
	return cli, nil
}

// BuildHello compiles ./hello statically (CGO_ENABLED=0) and builds, on the
// engine of cli, one FROM scratch image per tag with it as entrypoint. The
// go command must run inside the module, as a test does.
func BuildHello(ctx context.Context, cli *client.Client, tags ...string) error {
	return buildHello(ctx, cli, "", tags)
}

// BuildHealthChecked builds the image of BuildHello with a health check,
// tagged tag: every second the engine runs "/hello health", which fails
// when the container's environment sets HELLO_UNHEALTHY=1.
func BuildHealthChecked(ctx context.Context, cli *client.Client, tag string) error {
	return buildHello(ctx, cli, `HEALTHCHECK --interval=1s --timeout=5s --retries=1 CMD ["/hello", "health"]`+"\n", []string{tag})
}

// buildHello compiles the hello program and builds it into an image under
// each tag, with extra appended to the Dockerfile.
func buildHello(ctx context.Context, cli *client.Client, extra string, tags []string) error {
	dir, err := os.MkdirTemp("", "berth-hello-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	goBin, err := exec.LookPath("go")
	if err != nil {
		goBin = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	bin := filepath.Join(dir, "hello")
	cmd := exec.CommandContext(ctx, goBin, "build", "-trimpath", "-ldflags=-s -w", "-o", bin, helloPkg)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build %s: %v\n%s", helloPkg, err, out)
	}
	prog, err := os.ReadFile(bin)
	if err != nil {
		return err
	}
	for _, tag := range tags {
		if err := buildImage(ctx, cli, tag, prog, extra); err != nil {
			return fmt.Errorf("build %s: %w", tag, err)
		}
	}
	return nil
}

func buildImage(ctx context.Context, cli *client.Client, tag string, prog []byte, extra string) error {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	dockerfile := "FROM scratch\nCOPY hello /hello\nLABEL berth.test.image=" + tag + "\nENTRYPOINT [\"/hello\"]\n" + extra
	for _, f := range []struct {
		name string
		mode int64
		data []byte
	}{{"Dockerfile", 0o644, []byte(dockerfile)}, {"hello", 0o755, prog}} {
		if err := tw.WriteHeader(&tar.Header{Name: f.name, Mode: f.mode, Size: int64(len(f.data)), ModTime: time.Now()}); err != nil {
			return err
		}
		if _, err := tw.Write(f.data); err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	res, err := cli.ImageBuild(ctx, &buf, client.ImageBuildOptions{Tags: []string{tag}, Remove: true, ForceRemove: true})
	if err != nil {
		return err
	}
	out, err := io.ReadAll(res.Body)
	res.Body.Close()
	if err != nil {
		return err
	}
	if bytes.Contains(out, []byte(`"errorDetail"`)) {
		return fmt.Errorf("%s", out)
	}
	if _, err := cli.ImageInspect(ctx, tag); err != nil {
		return fmt.Errorf("the image is missing after the build: %w\n%s", err, out)
	}
	return nil
}

// CopyImage copies image from one engine to another (save → load), behind
// any driver's back.
func CopyImage(ctx context.Context, from, to *client.Client, image string) error {
	rc, err := from.ImageSave(ctx, []string{image})
	if err != nil {
		return err
	}
	defer rc.Close()
	res, err := to.ImageLoad(ctx, rc, client.ImageLoadWithQuiet(true))
	if err != nil {
		return err
	}
	defer res.Close()
	if _, err := io.Copy(io.Discard, res); err != nil {
		return err
	}
	_, err = to.ImageInspect(ctx, image)
	return err
}

// RemoveImages removes the images (by tag) from the engine of cli,
// ignoring those already gone.
func RemoveImages(ctx context.Context, cli *client.Client, images ...string) {
	for _, im := range images {
		_, _ = cli.ImageRemove(ctx, im, client.ImageRemoveOptions{Force: true, PruneChildren: true})
	}
}

// RemoveByLabel removes every container on the engine of cli carrying label
// k=v, running or not, and returns how many there were.
func RemoveByLabel(ctx context.Context, cli *client.Client, k, v string) (int, error) {
	list, err := cli.ContainerList(ctx, client.ContainerListOptions{All: true, Filters: make(client.Filters).Add("label", k+"="+v)})
	if err != nil {
		return 0, fmt.Errorf("list containers with %s=%s: %w", k, v, err)
	}
	var errs []error
	for _, c := range list.Items {
		if _, err := cli.ContainerRemove(ctx, c.ID, client.ContainerRemoveOptions{Force: true, RemoveVolumes: true}); err != nil {
			errs = append(errs, fmt.Errorf("remove %s: %w", c.ID, err))
		}
	}
	return len(list.Items), errors.Join(errs...)
}

// EngineOptions configures an engine started by StartEngine.
type EngineOptions struct {
	// Labels are the engine's own labels (dockerd --label k=v), reported
	// by its info.
	Labels map[string]string
}

// Engine is a dockerd the tests run themselves, in its own network
// namespace (dockerd with --bridge=none deletes the host's docker0, taking
// it for a stale bridge of its own: it must never run in the host's
// namespace), with its own socket, data root, exec root and pid file, no
// iptables, no bridge and the vfs storage driver, which works anywhere.
// Start and Stop may be called many times; Destroy ends it for good.
type Engine struct {
	// Client talks to the engine while it runs.
	Client *client.Client

	bin, unshare, dir, sock string
	labels                  map[string]string

	mu  sync.Mutex
	cmd *exec.Cmd
}

// StartEngine starts a new engine and waits until it answers. It returns
// an error wrapping ErrUnavailable when this machine cannot run one.
func StartEngine(ctx context.Context, opts EngineOptions) (*Engine, error) {
	bin, err := exec.LookPath("dockerd")
	if err != nil {
		return nil, fmt.Errorf("%w: dockerd is not installed: %w", ErrUnavailable, err)
	}
	if os.Geteuid() != 0 {
		return nil, fmt.Errorf("%w: dockerd needs root and the tests do not run as root", ErrUnavailable)
	}
	unshare, err := exec.LookPath("unshare")
	if err != nil {
		return nil, fmt.Errorf("%w: unshare (util-linux) is needed to give dockerd its own network namespace: %w", ErrUnavailable, err)
	}
	// A short path: unix socket paths are limited to 108 bytes.
	dir, err := os.MkdirTemp("/tmp", "berth-dd-")
	if err != nil {
		return nil, err
	}
	e := &Engine{bin: bin, unshare: unshare, dir: dir, sock: filepath.Join(dir, "docker.sock"), labels: maps.Clone(opts.Labels)}
	if err := os.WriteFile(filepath.Join(dir, "daemon.json"), []byte("{}\n"), 0o644); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	cli, err := client.New(client.WithHost(e.Address()))
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	e.Client = cli
	if err := e.Start(ctx); err != nil {
		e.Destroy()
		return nil, err
	}
	return e, nil
}

// Address is the engine's address, unix:///path/docker.sock.
func (e *Engine) Address() string { return "unix://" + e.sock }

// Running reports whether the engine's dockerd was started and not
// stopped since.
func (e *Engine) Running() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.cmd != nil
}

// Start runs dockerd unless it runs already, and waits until it answers or
// ctx ends (at most 90s).
func (e *Engine) Start(ctx context.Context) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.cmd != nil {
		return nil
	}
	logf, err := os.OpenFile(filepath.Join(e.dir, "dockerd.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close()
	args := []string{"--net", "--", e.bin,
		"--config-file", filepath.Join(e.dir, "daemon.json"),
		"--host", e.Address(),
		"--data-root", filepath.Join(e.dir, "data"),
		"--exec-root", filepath.Join(e.dir, "exec"),
		"--pidfile", filepath.Join(e.dir, "docker.pid"),
		"--iptables=false", "--ip-masq=false", "--bridge=none",
		"--storage-driver=vfs",
	}
	for _, k := range slices.Sorted(maps.Keys(e.labels)) {
		args = append(args, "--label", k+"="+e.labels[k])
	}
	cmd := exec.Command(e.unshare, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start dockerd: %w", err)
	}
	e.cmd = cmd
	deadline := time.Now().Add(90 * time.Second)
	for {
		pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		_, err := e.Client.Ping(pctx, client.PingOptions{NegotiateAPIVersion: true})
		cancel()
		if err == nil {
			return nil
		}
		if ctx.Err() != nil || time.Now().After(deadline) {
			e.stopLocked()
			return fmt.Errorf("dockerd did not answer: %v\n%s", err, e.Log(2000))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Stop shuts dockerd down as an operator would (SIGTERM: the engine stops
// its containers first; SIGKILL after a minute) and waits for it to exit.
func (e *Engine) Stop() {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.stopLocked()
}

func (e *Engine) stopLocked() {
	if e.cmd == nil {
		return
	}
	cmd := e.cmd
	e.cmd = nil
	_ = cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(time.Minute):
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-done
	}
}

// Destroy removes every container of the engine, stops it, kills every
// process it left behind, unmounts what it left mounted and removes its
// directories; it reports what it could not do on stderr.
func (e *Engine) Destroy() {
	if e.Running() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		if list, err := e.Client.ContainerList(ctx, client.ContainerListOptions{All: true}); err == nil {
			for _, c := range list.Items {
				_, _ = e.Client.ContainerRemove(ctx, c.ID, client.ContainerRemoveOptions{Force: true, RemoveVolumes: true})
			}
		}
		cancel()
	}
	e.Stop()
	e.Client.Close()
	if n := killOrphans(e.dir); n > 0 {
		fmt.Fprintf(os.Stderr, "dockertest: killed %d processes the engine left behind\n", n)
	}
	unmountUnder(e.dir)
	if err := os.RemoveAll(e.dir); err != nil {
		fmt.Fprintln(os.Stderr, "dockertest: remove the engine's directory:", err)
	}
}

// unmountUnder detaches every mount below dir, deepest first.
func unmountUnder(dir string) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return
	}
	var points []string
	for _, line := range strings.Split(string(b), "\n") {
		// id parent major:minor root mountpoint ...
		if f := strings.Fields(line); len(f) > 4 && strings.HasPrefix(f[4], dir+"/") {
			points = append(points, f[4])
		}
	}
	slices.SortFunc(points, func(a, b string) int { return len(b) - len(a) })
	for _, p := range points {
		if err := syscall.Unmount(p, syscall.MNT_DETACH); err != nil {
			fmt.Fprintf(os.Stderr, "dockertest: unmount %s: %v\n", p, err)
		}
	}
}

// killOrphans kills what a stopped engine left running under dir: the
// runtime shims of containers whose start was cut short by the engine's
// shutdown (they name the engine's containerd socket in dir), with their
// children. It returns how many processes it killed.
func killOrphans(dir string) int {
	procs, _ := filepath.Glob("/proc/[0-9]*")
	parent := map[int]int{}
	var shims []int
	for _, p := range procs {
		pid, err := strconv.Atoi(filepath.Base(p))
		if err != nil || pid == os.Getpid() {
			continue
		}
		if stat, err := os.ReadFile(p + "/stat"); err == nil {
			// pid (comm) state ppid ...: comm may hold spaces, so read
			// after its closing parenthesis.
			if i := bytes.LastIndexByte(stat, ')'); i > 0 {
				if f := strings.Fields(string(stat[i+1:])); len(f) > 1 {
					parent[pid], _ = strconv.Atoi(f[1])
				}
			}
		}
		cmdline, err := os.ReadFile(p + "/cmdline")
		if err == nil && bytes.Contains(cmdline, []byte(dir+"/")) {
			shims = append(shims, pid)
		}
	}
	n := 0
	for _, shim := range shims {
		// The shim first, so that it cannot act on its children's end;
		// they are known by the pids read before.
		if syscall.Kill(shim, syscall.SIGKILL) == nil {
			n++
		}
		for pid, pp := range parent {
			if pp == shim && syscall.Kill(pid, syscall.SIGKILL) == nil {
				n++
			}
		}
	}
	return n
}

// Log returns the end of the engine's log, at most n bytes.
func (e *Engine) Log(n int) string {
	b, _ := os.ReadFile(filepath.Join(e.dir, "dockerd.log"))
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}

// LockMainEngine waits until no other test process uses the machine's
// engine through LockMainEngine or ShareMainEngine, then holds it alone
// until unlock is called: the tests that launch hundreds of containers or
// stop engines (each package runs in its own process, several at once)
// take turns instead of slowing each other past their time limits. The
// lock is a file lock, released by the system if the process dies.
func LockMainEngine() (unlock func(), err error) { return lockFile(mainEngineLock, syscall.LOCK_EX) }

// ShareMainEngine is LockMainEngine for the packages that load the engine
// moderately (a few containers at a time, each test its own): they share
// it with each other, and take turns with those that hold it alone.
func ShareMainEngine() (unlock func(), err error) { return lockFile(mainEngineLock, syscall.LOCK_SH) }

// mainEngineLock is the file every test process locks for the machine's
// engine.
var mainEngineLock = filepath.Join(os.TempDir(), "berth-test-main-engine.lock")

// lockFile waits for the lock how (syscall.LOCK_EX or LOCK_SH) on the file
// at path, creating it.
func lockFile(path string, how int) (unlock func(), err error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), how); err != nil {
		f.Close()
		return nil, err
	}
	return func() {
		_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		f.Close()
	}, nil
}
