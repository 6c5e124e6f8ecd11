package drivertest

import (
	"bytes"
	"context"
	"errors"
	"io"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berth-dev/berth/driver"
)

// The lines the harness spec writes when it starts.
const (
	helloStdout = "hello stdout"
	helloStderr = "hello stderr"
)

// SyncBuffer is a bytes.Buffer safe for a writer and concurrent readers,
// for tests that read a log stream while it is written.
type SyncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *SyncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// String returns what was written so far.
func (b *SyncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// Reset forgets what was written.
func (b *SyncBuffer) Reset() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.buf.Reset()
}

// poll calls fn every 20 ms until it reports true or ctx ends; it returns
// whether fn ever reported true.
func poll(ctx context.Context, fn func() bool) bool {
	for {
		if fn() {
			return true
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func (s *suite) testImages(t *testing.T) {
	ctx := s.ctx(t)
	il := s.d.(driver.ImageLister)
	for _, node := range s.onlineNodes(t) {
		imgs, err := il.Images(ctx, node)
		if err != nil {
			t.Errorf("Images %s: %v", node, err)
			continue
		}
		for _, im := range imgs {
			if im.Name == "" && im.ID == "" {
				t.Errorf("Images %s: an image with neither name nor id", node)
			}
		}
	}
	if _, err := il.Images(ctx, "drivertest-no-such-node-"+s.run); !errors.Is(err, driver.ErrNotFound) {
		t.Errorf("Images of an unknown node: %v, want ErrNotFound", err)
	}
}

func (s *suite) testLogs(t *testing.T) {
	inst := s.startOne(t, "logs")
	lr := s.d.(driver.LogReader)
	ctx := s.ctx(t)

	var out, errOut *SyncBuffer
	ok := poll(ctx, func() bool {
		out, errOut = new(SyncBuffer), new(SyncBuffer)
		if err := lr.Logs(ctx, inst.ID, driver.LogOptions{Stdout: true, Stderr: true}, out, errOut); err != nil {
			t.Fatalf("Logs: %v", err)
		}
		return strings.Contains(out.String(), helloStdout) && strings.Contains(errOut.String(), helloStderr)
	})
	if !ok {
		t.Fatalf("Logs: stdout %q and stderr %q never held %q and %q", out.String(), errOut.String(), helloStdout, helloStderr)
	}
	if strings.Contains(out.String(), helloStderr) {
		t.Errorf("Logs: stdout holds the stderr line: %q", out.String())
	}
	if strings.Contains(errOut.String(), helloStdout) {
		t.Errorf("Logs: stderr holds the stdout line: %q", errOut.String())
	}

	var onlyOut, none SyncBuffer
	if err := lr.Logs(ctx, inst.ID, driver.LogOptions{Stdout: true}, &onlyOut, &none); err != nil {
		t.Fatalf("Logs stdout only: %v", err)
	}
	if !strings.Contains(onlyOut.String(), helloStdout) || none.String() != "" {
		t.Errorf("Logs stdout only: stdout %q, stderr %q; want the stdout line and no stderr", onlyOut.String(), none.String())
	}

	var tail, tailErr SyncBuffer
	if err := lr.Logs(ctx, inst.ID, driver.LogOptions{Stdout: true, Stderr: true, Tail: 1}, &tail, &tailErr); err != nil {
		t.Fatalf("Logs with Tail 1: %v", err)
	}
	if lines := strings.Count(tail.String(), "\n"); lines > 1 || !strings.Contains(tail.String(), helloStdout) {
		t.Errorf("Logs with Tail 1: stdout %q, want the one last line %q", tail.String(), helloStdout)
	}
	if lines := strings.Count(tailErr.String(), "\n"); lines > 1 || !strings.Contains(tailErr.String(), helloStderr) {
		t.Errorf("Logs with Tail 1: stderr %q, want the one last line %q", tailErr.String(), helloStderr)
	}

	fctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var fout, ferr SyncBuffer
	done := make(chan error, 1)
	go func() {
		done <- lr.Logs(fctx, inst.ID, driver.LogOptions{Stdout: true, Stderr: true, Follow: true}, &fout, &ferr)
	}()
	if !poll(ctx, func() bool { return strings.Contains(fout.String(), helloStdout) }) {
		t.Errorf("Logs with Follow: stdout %q never held %q", fout.String(), helloStdout)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("Logs with Follow after cancel: %v, want nil or context.Canceled", err)
		}
	case <-ctx.Done():
		t.Fatal("Logs with Follow did not return after its context was cancelled")
	}
}

func (s *suite) testStop(t *testing.T) {
	inst := s.startOne(t, "stop")
	ctx := s.ctx(t)
	st := s.d.(driver.Stopper)
	if err := st.Stop(ctx, inst.ID, 10*time.Second); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	got := s.waitState(t, inst.ID, "stopped or exited", is(driver.StateStopped, driver.StateExited))
	if got.ExitCode != nil && *got.ExitCode != 0 {
		t.Errorf("Stop: exit code %d; the harness spec exits 0 on SIGTERM, so a graceful stop ends with 0", *got.ExitCode)
	}
	if err := st.Stop(ctx, inst.ID, 10*time.Second); err != nil {
		t.Errorf("Stop of a stopped instance: %v, want nil", err)
	}
}

// stopIfCan stops the instance id and waits until it is stopped or exited.
// It reports false, doing nothing, when the driver is not a Stopper.
func (s *suite) stopIfCan(t *testing.T, id string) bool {
	t.Helper()
	st, ok := s.d.(driver.Stopper)
	if !ok {
		return false
	}
	if err := st.Stop(s.ctx(t), id, 10*time.Second); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	s.waitState(t, id, "stopped or exited", is(driver.StateStopped, driver.StateExited))
	return true
}

func (s *suite) testStart(t *testing.T) {
	inst := s.startOne(t, "start")
	ctx := s.ctx(t)
	starter := s.d.(driver.Starter)
	if err := starter.Start(ctx, inst.ID); err != nil {
		t.Errorf("Start of a running instance: %v, want nil", err)
	}
	if !s.stopIfCan(t, inst.ID) {
		t.Skip("the driver can start but not stop; nothing more to start")
	}
	if err := starter.Start(ctx, inst.ID); err != nil {
		t.Fatalf("Start after Stop: %v", err)
	}
	s.waitState(t, inst.ID, "running", is(driver.StateRunning))
	if err := starter.Start(ctx, inst.ID); err != nil {
		t.Errorf("Start of a restarted instance: %v, want nil", err)
	}
}

func (s *suite) testRestart(t *testing.T) {
	inst := s.startOne(t, "restart")
	ctx := s.ctx(t)
	if err := s.d.(driver.Restarter).Restart(ctx, inst.ID, 10*time.Second); err != nil {
		t.Fatalf("Restart: %v", err)
	}
	s.waitState(t, inst.ID, "running", is(driver.StateRunning))
	if !s.stopIfCan(t, inst.ID) {
		return
	}
	if err := s.d.(driver.Restarter).Restart(ctx, inst.ID, 10*time.Second); err != nil {
		t.Fatalf("Restart of a stopped instance: %v", err)
	}
	s.waitState(t, inst.ID, "running after Restart of a stopped instance", is(driver.StateRunning))
}

func (s *suite) testKill(t *testing.T) {
	inst := s.startOne(t, "kill")
	ctx := s.ctx(t)
	k := s.d.(driver.Killer)
	if err := k.Kill(ctx, inst.ID, "KILL"); err != nil {
		t.Fatalf("Kill KILL: %v", err)
	}
	s.waitState(t, inst.ID, "stopped or exited", is(driver.StateStopped, driver.StateExited))
	if err := k.Kill(ctx, inst.ID, "KILL"); !errors.Is(err, driver.ErrPermanent) {
		t.Errorf("Kill of an instance that is not running: %v, want ErrPermanent", err)
	}
	if err := k.Kill(ctx, inst.ID, "NOSUCHSIGNAL"); !errors.Is(err, driver.ErrInvalid) {
		t.Errorf("Kill with a bad signal: %v, want ErrInvalid", err)
	}
}

func (s *suite) testResize(t *testing.T) {
	inst := s.startOne(t, "resize")
	ctx := s.ctx(t)
	want := driver.Resources{CPU: 500, Memory: 256 * driver.MiB}
	if inst.Resources.CPU > 0 {
		want.CPU = inst.Resources.CPU + 100
	}
	if inst.Resources.Memory > 0 {
		want.Memory = inst.Resources.Memory + 64*driver.MiB
	}
	err := s.d.(driver.Resizer).Resize(ctx, inst.ID, want)
	if errors.Is(err, driver.ErrUnsupported) {
		t.Skipf("Resize: the back-end cannot resize here: %v", err)
	}
	if err != nil {
		t.Fatalf("Resize to %+v: %v", want, err)
	}
	got, err := s.d.Get(ctx, inst.ID)
	if err != nil {
		t.Fatalf("Get: %v", err)
	}
	if got.Resources.CPU != want.CPU || got.Resources.Memory != want.Memory {
		t.Errorf("after Resize: resources cpus %s memory %s, want cpus %s memory %s",
			got.Resources.CPU, got.Resources.Memory, want.CPU, want.Memory)
	}
	if got.State != driver.StateRunning {
		t.Errorf("after Resize: state %q, want running", got.State)
	}
}

// hasImage reports whether image is present on node, asking the driver's
// ImageLister when it has one and State otherwise.
func (s *suite) hasImage(ctx context.Context, t *testing.T, node, image string) bool {
	t.Helper()
	names := func(list []string) bool {
		return slices.ContainsFunc(list, func(n string) bool { return sameImage(n, image) })
	}
	if il, ok := s.d.(driver.ImageLister); ok {
		imgs, err := il.Images(ctx, node)
		if err != nil {
			t.Fatalf("Images %s: %v", node, err)
		}
		var list []string
		for _, im := range imgs {
			list = append(list, im.Name)
		}
		return names(list)
	}
	st, err := s.d.State(ctx)
	if err != nil {
		t.Fatalf("State: %v", err)
	}
	return names(nodeOf(t, st, node).Images)
}

// sameImage compares image references, reading a missing tag as "latest".
func sameImage(a, b string) bool { return withTag(a) == withTag(b) }

func withTag(ref string) string {
	if strings.Contains(ref, "@") {
		return ref
	}
	if i := strings.LastIndex(ref, ":"); i > strings.LastIndex(ref, "/") {
		return ref
	}
	return ref + ":latest"
}

func (s *suite) testPreload(t *testing.T) {
	img := s.h.PreloadImage
	if img == "" {
		t.Skip("Harness.PreloadImage is empty")
	}
	ctx := s.ctx(t)
	nodes := s.onlineNodes(t)
	absent := 0
	for _, n := range nodes {
		if !s.hasImage(ctx, t, n, img) {
			absent++
		}
	}
	if absent == 0 {
		t.Fatalf("harness: PreloadImage %q is already present on every online node; the test would prove nothing", img)
	}
	var mu sync.Mutex
	var reports []driver.PreloadProgress
	err := s.d.(driver.Preloader).Preload(ctx, img, nil, func(p driver.PreloadProgress) {
		mu.Lock()
		reports = append(reports, p)
		mu.Unlock()
	})
	if err != nil {
		t.Fatalf("Preload %s: %v", img, err)
	}
	for _, n := range nodes {
		if !s.hasImage(ctx, t, n, img) {
			t.Errorf("after Preload: %s is not present on node %s", img, n)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	for _, p := range reports {
		if p.Image != "" && !sameImage(p.Image, img) {
			t.Errorf("Preload progress names image %q, want %q", p.Image, img)
		}
		if p.Err != "" {
			t.Errorf("Preload progress reports an error on %s: %s", p.Node, p.Err)
		}
	}
}

func (s *suite) testSuspend(t *testing.T) {
	inst := s.startOne(t, "suspend")
	ctx := s.ctx(t)
	sus := s.d.(driver.Suspender)
	if err := sus.Suspend(ctx, inst.ID); err != nil {
		t.Fatalf("Suspend: %v", err)
	}
	s.waitState(t, inst.ID, "suspended", is(driver.StateSuspended))
	if err := sus.Suspend(ctx, inst.ID); err != nil {
		t.Errorf("Suspend of a suspended instance: %v, want nil", err)
	}
	if err := sus.Resume(ctx, inst.ID); err != nil {
		t.Fatalf("Resume: %v", err)
	}
	s.waitState(t, inst.ID, "running", is(driver.StateRunning))
	if err := sus.Resume(ctx, inst.ID); !errors.Is(err, driver.ErrNotSuspended) {
		t.Errorf("Resume of a running instance: %v, want ErrNotSuspended", err)
	}
	if !s.stopIfCan(t, inst.ID) {
		return
	}
	if err := sus.Suspend(ctx, inst.ID); !errors.Is(err, driver.ErrPermanent) {
		t.Errorf("Suspend of a stopped instance: %v, want ErrPermanent", err)
	}
}

// testEvents watches the back-end while it creates an instance and expects a
// start or die event for it. Watch gives no sign of when it is subscribed,
// so an instance created before the subscription took effect may go
// unseen; the test then tries again with a new instance, a few times.
func (s *suite) testEvents(t *testing.T) {
	ctx := s.ctx(t)
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var mu sync.Mutex
	var events []driver.Event
	done := make(chan error, 1)
	go func() {
		done <- s.d.(driver.EventWatcher).Watch(wctx, func(e driver.Event) {
			mu.Lock()
			events = append(events, e)
			mu.Unlock()
		})
	}()
	seen := func(id string) bool {
		mu.Lock()
		defer mu.Unlock()
		for _, e := range events {
			if e.Instance == id && (e.Type == driver.EventStart || e.Type == driver.EventDie) {
				return true
			}
		}
		return false
	}
	node := s.onlineNodes(t)[0]
	found := false
	for try := range 3 {
		inst := s.create(t, node, s.spec(s.name("events"+string(rune('a'+try))), nil))
		wait, stop := context.WithTimeout(ctx, s.h.Timeout/4)
		found = poll(wait, func() bool { return seen(inst.ID) })
		stop()
		if found {
			break
		}
	}
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("Watch after cancel: %v, want context.Canceled", err)
		}
	case <-ctx.Done():
		t.Fatal("Watch did not return after its context was cancelled")
	}
	if !found {
		mu.Lock()
		defer mu.Unlock()
		t.Errorf("Watch: no start or die event for the instances created (saw %d events)", len(events))
	}
}

func (s *suite) testUsage(t *testing.T) {
	inst := s.startOne(t, "usage")
	ctx := s.ctx(t)
	u, err := s.d.(driver.UsageReporter).Usage(ctx, inst.ID)
	if err != nil {
		t.Fatalf("Usage: %v", err)
	}
	if u == nil {
		t.Fatal("Usage: nil reading and nil error")
	}
	if u.CPU < 0 || u.Memory < 0 {
		t.Errorf("Usage: negative reading %+v", u)
	}
	if u.Time.IsZero() {
		t.Errorf("Usage: reading without a time: %+v", u)
	}
}

func (s *suite) testConsole(t *testing.T) {
	inst := s.startOne(t, "console")
	if _, err := s.d.(driver.ConsoleReader).Console(s.ctx(t), inst.ID); err != nil {
		t.Fatalf("Console: %v", err)
	}
}

// testExec runs the probe in a running instance: its exit code, its output
// apart on stdout and stderr without a terminal, the environment, the
// working directory, input to its end, a terminal of the size asked for;
// then a command that does not exist, an empty one, and an instance that
// is not running.
func (s *suite) testExec(t *testing.T) {
	if s.h.Exec == nil {
		t.Fatal("drivertest: the driver is a driver.Execer: Harness.Exec must give the probe's command line")
	}
	ex, _ := driver.As[driver.Execer](s.d, driver.CapExec)
	inst := s.startOne(t, "exec")
	ctx := s.ctx(t)
	run := func(what string, opts driver.ExecOptions, stdin string) (int, string, string) {
		t.Helper()
		var in io.Reader
		if stdin != "" {
			in = strings.NewReader(stdin)
		}
		var out, errb SyncBuffer
		code, err := ex.Exec(ctx, inst.ID, opts, in, &out, &errb)
		if err != nil {
			t.Fatalf("Exec %s (%q): %v", what, opts.Cmd, err)
		}
		return code, out.String(), errb.String()
	}
	if code, out, errs := run("exit code and streams", driver.ExecOptions{Cmd: s.h.Exec("out=to stdout", "err=to stderr", "exit=3")}, ""); code != 3 || out != "to stdout\n" || errs != "to stderr\n" {
		t.Errorf("Exec out, err, exit 3: code %d, stdout %q, stderr %q; want 3, %q, %q", code, out, errs, "to stdout\n", "to stderr\n")
	}
	if code, out, errs := run("success", driver.ExecOptions{Cmd: s.h.Exec("out=ok")}, ""); code != 0 || out != "ok\n" {
		t.Errorf("Exec out: code %d, stdout %q, stderr %q; want 0 and ok", code, out, errs)
	}
	const name = "BERTH_DRIVERTEST_EXEC"
	if _, out, errs := run("env", driver.ExecOptions{Cmd: s.h.Exec("env=" + name), Env: []string{name + "=a b=c"}}, ""); out != name+"=a b=c\n" {
		t.Errorf("Exec with env %s=a b=c: stdout %q, stderr %q", name, out, errs)
	}
	if _, out, errs := run("no env", driver.ExecOptions{Cmd: s.h.Exec("env=" + name)}, ""); out != name+" unset\n" {
		t.Errorf("Exec without env: stdout %q, stderr %q; want %s unset", out, errs, name)
	}
	if _, out, errs := run("workdir", driver.ExecOptions{Cmd: s.h.Exec("pwd"), WorkDir: "/proc"}, ""); out != "/proc\n" {
		t.Errorf("Exec in /proc: stdout %q, stderr %q; want /proc", out, errs)
	}
	const input = "line one\nline two\n"
	if code, out, errs := run("stdin", driver.ExecOptions{Cmd: s.h.Exec("cat", "out=end")}, input); code != 0 || out != input+"end\n" {
		t.Errorf("Exec cat with input: code %d, stdout %q, stderr %q; want the input, then end", code, out, errs)
	}
	if _, out, errs := run("no tty", driver.ExecOptions{Cmd: s.h.Exec("tty")}, ""); out != "tty false\n" {
		t.Errorf("Exec tty without a terminal: stdout %q, stderr %q; want tty false", out, errs)
	}
	s.testExecTTY(t, ex, inst.ID)
	code, _, errs := run("missing", driver.ExecOptions{Cmd: []string{"/berth-drivertest-no-such-program"}}, "")
	if code != 126 && code != 127 {
		t.Errorf("Exec of a missing program: code %d, stderr %q; want 126 or 127", code, errs)
	}
	if _, err := ex.Exec(ctx, inst.ID, driver.ExecOptions{}, nil, io.Discard, io.Discard); !errors.Is(err, driver.ErrInvalid) {
		t.Errorf("Exec of no command: %v, want ErrInvalid", err)
	}
	if !s.stopIfCan(t, inst.ID) {
		return
	}
	if _, err := ex.Exec(ctx, inst.ID, driver.ExecOptions{Cmd: s.h.Exec("out=x")}, nil, io.Discard, io.Discard); !errors.Is(err, driver.ErrPermanent) {
		t.Errorf("Exec in a stopped instance: %v, want ErrPermanent", err)
	}
}

// testExecTTY runs the probe on a terminal of 33x101 and, once it reported
// that size, resizes it to 40x120; each line it is sent makes it print its
// terminal's size, and Ctrl-D ends it.
func (s *suite) testExecTTY(t *testing.T, ex driver.Execer, id string) {
	ctx := s.ctx(t)
	pr, pw := io.Pipe()
	defer pw.Close()
	sizes := make(chan driver.TTYSize, 1)
	var out, errb SyncBuffer
	type result struct {
		code int
		err  error
	}
	done := make(chan result, 1)
	go func() {
		opts := driver.ExecOptions{Cmd: s.h.Exec("tty", "err=on the terminal", "sizes"), TTY: true, Size: driver.TTYSize{Rows: 33, Cols: 101}, Resize: sizes}
		code, err := ex.Exec(ctx, id, opts, pr, &out, &errb)
		done <- result{code, err}
	}()
	// A write waits for the driver to read: each is made in a goroutine of
	// its own, which the pipe's close ends.
	send := func(p string) { go func() { _, _ = io.WriteString(pw, p) }() }
	for _, want := range []string{"size 33x101", "size 40x120"} {
		if want == "size 40x120" {
			sizes <- driver.TTYSize{Rows: 40, Cols: 120}
		}
		if !poll(ctx, func() bool { send("\r"); return strings.Contains(out.String(), want) }) {
			t.Fatalf("Exec on a terminal: no %q in stdout %q (stderr %q)", want, out.String(), errb.String())
		}
	}
	send("\x04")
	var r result
	select {
	case r = <-done:
	case <-ctx.Done():
		t.Fatalf("Exec on a terminal did not end after Ctrl-D; stdout %q", out.String())
	}
	if r.err != nil || r.code != 0 || !strings.Contains(out.String(), "tty true") || !strings.Contains(out.String(), "on the terminal") || errb.String() != "" {
		t.Errorf("Exec on a terminal: code %d, err %v, stdout %q, stderr %q; want 0, tty true and the stderr line on stdout", r.code, r.err, out.String(), errb.String())
	}
}

// testAttach attaches to an instance made with Stdin: what it wrote
// before is replayed, what is sent reaches its input and comes back, the
// end of stdin is the end of its input, and Attach returns nil once the
// instance ended. An unknown id is ErrNotFound.
func (s *suite) testAttach(t *testing.T) {
	if s.h.Echo == nil {
		t.Skip("no echoing spec (Harness.Echo is nil)")
	}
	a := s.d.(driver.Attacher)
	sp := s.h.Echo()
	sp.Name, sp.Tags, sp.Stdin = s.name("attach"), s.tags(nil), true
	inst := s.create(t, s.onlineNodes(t)[0], sp)
	ctx := s.ctx(t)
	r, w := io.Pipe()
	defer w.Close()
	var out, errOut SyncBuffer
	done := make(chan error, 1)
	go func() { done <- a.Attach(ctx, inst.ID, driver.AttachOptions{Replay: true}, r, &out, &errOut) }()
	if !poll(ctx, func() bool { return strings.Contains(out.String(), "ready\n") }) {
		t.Fatalf("Attach with Replay: never saw the line written before it, stdout %q", out.String())
	}
	if _, err := w.Write([]byte("ping\n")); err != nil {
		t.Fatalf("write to the attach: %v", err)
	}
	if !poll(ctx, func() bool { return strings.Contains(out.String(), "ping\n") }) {
		t.Fatalf("Attach: the input never came back, stdout %q", out.String())
	}
	w.Close()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Attach after the input's end: %v, want nil (the instance ended)", err)
		}
	case <-ctx.Done():
		t.Fatalf("Attach never returned after the input's end; stdout %q", out.String())
	}
	got := s.waitState(t, inst.ID, "exited", is(driver.StateExited))
	if got.ExitCode != nil && *got.ExitCode != 0 {
		t.Errorf("after the input's end: exit code %d, want 0", *got.ExitCode)
	}
	s.destroy(t, inst.ID)
	if err := a.Attach(ctx, inst.ID, driver.AttachOptions{}, nil, io.Discard, io.Discard); !errors.Is(err, driver.ErrNotFound) {
		t.Errorf("Attach to a deleted instance: %v, want ErrNotFound", err)
	}
}
