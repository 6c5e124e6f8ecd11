package docker

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/client"

	"github.com/berth-dev/berth/driver"
)

// The images the tests use. There is no registry: TestMain builds them from
// a static Go program on the machine's engine. The tag is unique to the run,
// so that other test binaries sharing the engine cannot remove them.
var (
	imageTag     = randomID()
	helloImage   = "berth-test/docker-hello:" + imageTag
	preloadImage = "berth-test/docker-preload:" + imageTag // built on the main engine only
)

var (
	mainCli *client.Client // the machine's engine, for checks behind the driver's back
	second  *dockerd       // a second engine of the tests' own; nil when it cannot run
	// secondWhy says why there is no second engine.
	secondWhy string
)

func TestMain(m *testing.M) {
	os.Exit(runMain(m))
}

func runMain(m *testing.M) int {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var err error
	mainCli, err = client.New(client.WithHost(DefaultHost))
	if err != nil {
		fmt.Fprintln(os.Stderr, "docker tests:", err)
		return 1
	}
	defer mainCli.Close()
	if _, err := mainCli.Ping(ctx, client.PingOptions{NegotiateAPIVersion: true}); err != nil {
		fmt.Fprintf(os.Stderr, "docker tests need the Docker Engine at %s: %v\n", DefaultHost, err)
		return 1
	}
	if err := buildTestImages(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "docker tests: build the test images:", err)
		return 1
	}
	defer func() {
		for _, im := range []string{helloImage, preloadImage} {
			_, _ = mainCli.ImageRemove(context.Background(), im, client.ImageRemoveOptions{Force: true, PruneChildren: true})
		}
	}()
	second, secondWhy = startSecond(ctx)
	if second != nil {
		defer second.destroy()
		if err := copyImageRaw(ctx, mainCli, second.cli, helloImage); err != nil {
			fmt.Fprintln(os.Stderr, "docker tests: load the test image into the second engine:", err)
			return 1
		}
	} else {
		fmt.Fprintln(os.Stderr, "docker tests: no second engine:", secondWhy)
	}
	return m.Run()
}

// buildTestImages compiles testdata/hello statically and builds the two
// FROM scratch images around it through the Engine API.
func buildTestImages(ctx context.Context) error {
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
	cmd := exec.CommandContext(ctx, goBin, "build", "-trimpath", "-ldflags=-s -w", "-o", bin, "./testdata/hello")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build testdata/hello: %v\n%s", err, out)
	}
	prog, err := os.ReadFile(bin)
	if err != nil {
		return err
	}
	for _, tag := range []string{helloImage, preloadImage} {
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		dockerfile := "FROM scratch\nCOPY hello /hello\nLABEL berth.test.image=" + tag + "\nENTRYPOINT [\"/hello\"]\n"
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
		res, err := mainCli.ImageBuild(ctx, &buf, client.ImageBuildOptions{Tags: []string{tag}, Remove: true, ForceRemove: true})
		if err != nil {
			return fmt.Errorf("build %s: %w", tag, err)
		}
		out, err := io.ReadAll(res.Body)
		res.Body.Close()
		if err != nil {
			return fmt.Errorf("build %s: %w", tag, err)
		}
		if bytes.Contains(out, []byte(`"errorDetail"`)) {
			return fmt.Errorf("build %s: %s", tag, out)
		}
		if _, err := mainCli.ImageInspect(ctx, tag); err != nil {
			return fmt.Errorf("build %s: the image is missing after the build: %w\n%s", tag, err, out)
		}
	}
	return nil
}

// copyImageRaw copies image between engines without the driver (test setup).
func copyImageRaw(ctx context.Context, from, to *client.Client, image string) error {
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

// dockerd is a Docker Engine the tests run themselves, in its own network
// namespace, with its own socket, data root, exec root and pid file, no
// iptables and no bridge, and the vfs storage driver (which works anywhere).
type dockerd struct {
	bin     string
	unshare string
	dir     string
	sock    string
	cli     *client.Client
	cmd     *exec.Cmd
}

// startSecond starts a second engine, or says why it cannot.
func startSecond(ctx context.Context) (*dockerd, string) {
	bin, err := exec.LookPath("dockerd")
	if err != nil {
		return nil, "dockerd is not installed: " + err.Error()
	}
	if os.Geteuid() != 0 {
		return nil, "dockerd needs root and the tests do not run as root"
	}
	// dockerd with --bridge=none deletes the host's docker0 (it takes it for
	// a stale bridge of its own), breaking the machine's engine: the second
	// engine runs in a network namespace of its own.
	unshare, err := exec.LookPath("unshare")
	if err != nil {
		return nil, "unshare (util-linux) is needed to give the second dockerd its own network namespace: " + err.Error()
	}
	// A short path: unix socket paths are limited to 108 bytes.
	dir, err := os.MkdirTemp("/tmp", "berth-dd-")
	if err != nil {
		return nil, err.Error()
	}
	d := &dockerd{bin: bin, unshare: unshare, dir: dir, sock: filepath.Join(dir, "docker.sock")}
	if err := os.WriteFile(filepath.Join(dir, "daemon.json"), []byte("{}\n"), 0o644); err != nil {
		os.RemoveAll(dir)
		return nil, err.Error()
	}
	cli, err := client.New(client.WithHost("unix://" + d.sock))
	if err != nil {
		os.RemoveAll(dir)
		return nil, err.Error()
	}
	d.cli = cli
	if err := d.start(ctx); err != nil {
		d.destroy()
		return nil, err.Error()
	}
	return d, ""
}

func (d *dockerd) address() string { return "unix://" + d.sock }

// start runs dockerd and waits until it answers.
func (d *dockerd) start(ctx context.Context) error {
	logf, err := os.OpenFile(filepath.Join(d.dir, "dockerd.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close()
	d.cmd = exec.Command(d.unshare, "--net", "--", d.bin,
		"--config-file", filepath.Join(d.dir, "daemon.json"),
		"--host", d.address(),
		"--data-root", filepath.Join(d.dir, "data"),
		"--exec-root", filepath.Join(d.dir, "exec"),
		"--pidfile", filepath.Join(d.dir, "docker.pid"),
		"--iptables=false", "--ip-masq=false", "--bridge=none",
		"--storage-driver=vfs",
	)
	d.cmd.Stdout, d.cmd.Stderr = logf, logf
	d.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := d.cmd.Start(); err != nil {
		return fmt.Errorf("start dockerd: %w", err)
	}
	deadline := time.Now().Add(90 * time.Second)
	for {
		pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		_, err := d.cli.Ping(pctx, client.PingOptions{NegotiateAPIVersion: true})
		cancel()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			d.stop()
			log, _ := os.ReadFile(filepath.Join(d.dir, "dockerd.log"))
			return fmt.Errorf("dockerd did not answer within 90s: %v\n%s", err, tail(log, 2000))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// stop shuts dockerd down (SIGTERM, then SIGKILL after a minute) and waits
// for it to exit.
func (d *dockerd) stop() {
	if d.cmd == nil || d.cmd.Process == nil {
		return
	}
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { _ = d.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(time.Minute):
		_ = syscall.Kill(-d.cmd.Process.Pid, syscall.SIGKILL)
		<-done
	}
	d.cmd = nil
}

// destroy stops dockerd and removes its directories.
func (d *dockerd) destroy() {
	if d.cmd != nil {
		// Remove what a failed test may have left, so nothing outlives the run.
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		if list, err := d.cli.ContainerList(ctx, client.ContainerListOptions{All: true}); err == nil {
			for _, c := range list.Items {
				_, _ = d.cli.ContainerRemove(ctx, c.ID, client.ContainerRemoveOptions{Force: true, RemoveVolumes: true})
			}
		}
		cancel()
	}
	d.stop()
	d.cli.Close()
	if err := os.RemoveAll(d.dir); err != nil {
		fmt.Fprintln(os.Stderr, "docker tests: remove the second engine's directory:", err)
	}
}

func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}

func randomID() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// removeByLabel removes every container on c carrying label k=v (test
// cleanup, behind the driver's back) and reports how many there were.
func removeByLabel(t *testing.T, c *client.Client, k, v string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	list, err := c.ContainerList(ctx, client.ContainerListOptions{All: true, Filters: make(client.Filters).Add("label", k+"="+v)})
	if err != nil {
		t.Errorf("cleanup: list containers: %v", err)
		return 0
	}
	for _, ct := range list.Items {
		if _, err := c.ContainerRemove(ctx, ct.ID, client.ContainerRemoveOptions{Force: true, RemoveVolumes: true}); err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("cleanup: remove %s: %v", ct.ID, err)
		}
	}
	return len(list.Items)
}

func jsonMarshal(v any) ([]byte, error) { return json.Marshal(v) }

func configWithLabels(labels map[string]string) *container.Config {
	return &container.Config{Labels: labels}
}

// syncBuffer is a bytes.Buffer safe for a writer and concurrent readers.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func (b *syncBuffer) Reset() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.buf.Reset()
}

// syncEvents collects the events a watcher reports.
type syncEvents struct {
	mu  sync.Mutex
	evs []driver.Event
}

func (s *syncEvents) add(e driver.Event) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.evs = append(s.evs, e)
}

func (s *syncEvents) list() []driver.Event {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.evs)
}

func (s *syncEvents) has(instance string, typ driver.EventType) bool {
	for _, e := range s.list() {
		if e.Instance == instance && e.Type == typ {
			return true
		}
	}
	return false
}

// wait polls cond until it holds, failing the test after a minute (a
// liveness bound, not a timing assertion).
func wait(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within a minute")
		}
		time.Sleep(20 * time.Millisecond)
	}
}
