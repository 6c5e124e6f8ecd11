package ssh_test

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/driver/drivertest"
	"github.com/berth-dev/berth/drivers/ssh"
)

// waitOutput waits until b holds want.
func waitOutput(t *testing.T, b *drivertest.SyncBuffer, want string) {
	t.Helper()
	deadline := time.Now().Add(testTimeout)
	for !strings.Contains(b.String(), want) {
		if time.Now().After(deadline) {
			t.Fatalf("the output never held %q: %q", want, b.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// attachAsync runs Attach in the background and returns its result's
// channel.
func attachAsync(ctx context.Context, d driver.Driver, id string, opts driver.AttachOptions, stdin io.Reader, stdout, stderr io.Writer) chan error {
	done := make(chan error, 1)
	go func() { done <- d.(driver.Attacher).Attach(ctx, id, opts, stdin, stdout, stderr) }()
	return done
}

func waitAttach(t *testing.T, done chan error) error {
	t.Helper()
	select {
	case err := <-done:
		return err
	case <-time.After(testTimeout):
		t.Fatal("Attach never returned")
		return nil
	}
}

// TestAttach attaches to instances over SSH, on one host: with stdin, on
// a terminal, and follows logs to an instance's end.
func TestAttach(t *testing.T) {
	f := newFleet(t, 1)
	d := f.open(t, nil)
	defer d.Close(context.Background())
	t.Run("stdin", func(t *testing.T) { testAttachStdin(t, d) })
	t.Run("tty", func(t *testing.T) { testAttachTTY(t, d) })
	t.Run("logs-follow", func(t *testing.T) { testLogsFollowToTheEnd(t, d) })
}

// testAttachStdin attaches to an instance made with stdin: the output
// replayed, then live; a detach (the caller's context ends) leaves the
// input open and the instance running; a second attach, from now, sends
// the rest and ends the input: the instance reads end of file and ends,
// and Attach returns nil.
func testAttachStdin(t *testing.T, d driver.Driver) {
	sp := shSpec(`echo ready; echo warn >&2; while read l; do echo "got $l"; done; echo bye`)
	sp.Stdin = true
	in := create(t, d, "h0", sp)

	ctx, cancel := context.WithCancel(ctxT(t))
	r, w := io.Pipe()
	defer w.Close()
	var out, errOut drivertest.SyncBuffer
	done := attachAsync(ctx, d, in.ID, driver.AttachOptions{Replay: true}, r, &out, &errOut)
	waitOutput(t, &out, "ready\n")
	if _, err := w.Write([]byte("one\n")); err != nil {
		t.Fatal(err)
	}
	waitOutput(t, &out, "got one\n")
	waitOutput(t, &errOut, "warn\n")
	cancel()
	if err := waitAttach(t, done); !errors.Is(err, context.Canceled) {
		t.Fatalf("Attach after its context ended: %v, want context.Canceled", err)
	}
	if got, err := d.Get(ctxT(t), in.ID); err != nil || got.State != driver.StateRunning {
		t.Fatalf("after a detach: %+v %v, want running", got, err)
	}

	var out2 drivertest.SyncBuffer
	err := d.(driver.Attacher).Attach(ctxT(t), in.ID, driver.AttachOptions{}, strings.NewReader("two\n"), &out2, nil)
	if err != nil {
		t.Fatalf("second Attach: %v", err)
	}
	if got := out2.String(); got != "got two\nbye\n" {
		t.Errorf("second Attach (no replay): stdout %q, want %q", got, "got two\nbye\n")
	}
	got := waitFor(t, d, in.ID, "exited", func(in *driver.Instance) bool { return in.State == driver.StateExited })
	if got.ExitCode == nil || *got.ExitCode != 0 {
		t.Errorf("after the input's end: exit code %v, want 0", got.ExitCode)
	}
	if err := d.(driver.Attacher).ResizeTTY(ctxT(t), in.ID, driver.TTYSize{Rows: 30, Cols: 100}); !errors.Is(err, driver.ErrInvalid) {
		t.Errorf("ResizeTTY without a terminal: %v, want ErrInvalid", err)
	}
	if err := d.(driver.Attacher).Attach(ctxT(t), in.ID+"0", driver.AttachOptions{}, nil, io.Discard, io.Discard); !errors.Is(err, driver.ErrNotFound) {
		t.Errorf("Attach to no instance: %v, want ErrNotFound", err)
	}
}

// testAttachTTY attaches to an instance on a terminal: ResizeTTY reaches
// it, the end of stdin is the terminal's end of file, and everything comes
// on stdout.
func testAttachTTY(t *testing.T, d driver.Driver) {
	sp := shSpec(`test -t 0 && echo on a tty; stty size; read l; stty size; cat; echo "bye $l" >&2`)
	sp.TTY = true
	for _, need := range driver.SpecFeatures(sp) {
		if !slices.Contains(driver.Features(d), need) {
			t.Fatalf("the driver's features %v lack %s, which a terminal spec needs", driver.Features(d), need)
		}
	}
	in := create(t, d, "h0", sp)
	r, w := io.Pipe()
	defer w.Close()
	var out, errOut drivertest.SyncBuffer
	done := attachAsync(ctxT(t), d, in.ID, driver.AttachOptions{Replay: true}, r, &out, &errOut)
	waitOutput(t, &out, "on a tty\r\n24 80\r\n")
	if err := d.(driver.Attacher).ResizeTTY(ctxT(t), in.ID, driver.TTYSize{Rows: 30, Cols: 100}); err != nil {
		t.Fatalf("ResizeTTY: %v", err)
	}
	if _, err := w.Write([]byte("x\n")); err != nil {
		t.Fatal(err)
	}
	waitOutput(t, &out, "30 100\r\n")
	w.Close()
	if err := waitAttach(t, done); err != nil {
		t.Fatalf("Attach: %v", err)
	}
	if !strings.HasSuffix(out.String(), "bye x\r\n") || errOut.String() != "" {
		t.Errorf("on a terminal: stdout %q, stderr %q; want everything on stdout", out.String(), errOut.String())
	}
}

// TestLimits launches an instance with cpus and memory. On a host with a
// usable cgroup v2, its cgroup holds them (read on the host after launch
// and after Resize) and goes with the instance. On a host without one,
// the create is refused with ErrUnsupported, and with the option limits:
// count it runs but Resize is refused with ErrUnsupported.
func TestLimits(t *testing.T) {
	f := newFleet(t, 1)
	d := f.open(t, nil)
	defer d.Close(context.Background())
	sp := shSpec("sleep 1000")
	sp.Resources = driver.Resources{CPU: 500, Memory: 256 * driver.MiB}
	ctx := ctxT(t)
	op, err := d.Create(ctx, "h0", sp)
	if err == nil {
		var in *driver.Instance
		in, err = driver.Drive(ctx, op)
		if in != nil {
			t.Cleanup(func() {
				if op, err := d.Delete(context.Background(), in.ID); err == nil {
					driver.Drive(context.Background(), op)
				}
			})
		}
	}
	if errors.Is(err, driver.ErrUnsupported) {
		if !strings.Contains(err.Error(), "cannot enforce cpus and memory") {
			t.Errorf("Create with limits on a host without cgroup v2: %v, want it to say why", err)
		}
		if n := nodeStatus(t, d, "h0"); n.Attributes["limits"] != "none" {
			t.Errorf("node attributes %v, want limits none", n.Attributes)
		}
		t.Run("counted", func(t *testing.T) {
			dc := f.open(t, map[string]any{"limits": ssh.LimitsCount})
			defer dc.Close(context.Background())
			in := create(t, dc, "h0", sp)
			if in.Resources.CPU != sp.Resources.CPU || in.Resources.Memory != sp.Resources.Memory {
				t.Errorf("resources %+v, want %+v", in.Resources, sp.Resources)
			}
			if err := dc.(driver.Resizer).Resize(ctxT(t), in.ID, driver.Resources{CPU: 700}); !errors.Is(err, driver.ErrUnsupported) {
				t.Errorf("Resize without a cgroup: %v, want ErrUnsupported", err)
			}
		})
	} else if err != nil {
		t.Fatalf("Create with limits: %v", err)
	}
	t.Run("cgroup2", func(t *testing.T) {
		if errors.Is(err, driver.ErrUnsupported) {
			// Not a package to install: the machine's cgroup layout.
			// cgrouptest.TestSupervisorLimitsInGuest covers them anywhere.
			t.Skipf("this machine cannot enforce limits: %v", err)
		}
		list, lerr := d.List(ctxT(t), nil)
		if lerr != nil || len(list) != 1 {
			t.Fatalf("List: %d instances, %v", len(list), lerr)
		}
		in := list[0]
		cg := filepath.Join(ssh.DefaultCgroupParent, f.cluster, in.ID)
		limits := func() (string, string) {
			c, _ := os.ReadFile(filepath.Join(cg, "cpu.max"))
			m, _ := os.ReadFile(filepath.Join(cg, "memory.max"))
			return strings.TrimSpace(string(c)), strings.TrimSpace(string(m))
		}
		if c, m := limits(); c != "50000 100000" || m != "268435456" {
			t.Errorf("after launch: %s cpu.max %q memory.max %q, want 50000 100000 and 268435456", cg, c, m)
		}
		if err := d.(driver.Resizer).Resize(ctxT(t), in.ID, driver.Resources{CPU: 1500, Memory: 512 * driver.MiB}); err != nil {
			t.Fatalf("Resize: %v", err)
		}
		if c, m := limits(); c != "150000 100000" || m != "536870912" {
			t.Errorf("after Resize: cpu.max %q memory.max %q, want 150000 100000 and 536870912", c, m)
		}
		if got, err := d.Get(ctxT(t), in.ID); err != nil || got.Resources.CPU != 1500 || got.Resources.Memory != 512*driver.MiB {
			t.Errorf("Get after Resize: %+v %v", got, err)
		}
		if n := nodeStatus(t, d, "h0"); n.Attributes["limits"] != "cgroup2" {
			t.Errorf("node attributes %v, want limits cgroup2", n.Attributes)
		}
		op, err := d.Delete(ctxT(t), in.ID)
		if err == nil {
			_, err = driver.Drive(ctxT(t), op)
		}
		if err != nil {
			t.Fatalf("Delete: %v", err)
		}
		if _, err := os.Stat(cg); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("the cgroup after Delete: %v, want it gone", err)
		}
	})
}

// testLogsFollowToTheEnd follows an instance's logs with a tail: the
// lines written after the follow started come, each stream apart, and the
// follow returns nil by itself when the instance ends.
func testLogsFollowToTheEnd(t *testing.T, d driver.Driver) {
	sp := shSpec(`echo zero; echo first; read l; echo "second $l"; echo late >&2`)
	sp.Stdin = true
	in := create(t, d, "h0", sp)
	// The tail is taken once both first lines are there.
	deadline := time.Now().Add(testTimeout)
	for {
		var start strings.Builder
		if err := d.(driver.LogReader).Logs(ctxT(t), in.ID, driver.LogOptions{Stdout: true}, &start, io.Discard); err != nil {
			t.Fatalf("Logs: %v", err)
		}
		if strings.Contains(start.String(), "first\n") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the instance never wrote its first lines: %q", start.String())
		}
	}
	var out, errOut drivertest.SyncBuffer
	done := make(chan error, 1)
	go func() {
		done <- d.(driver.LogReader).Logs(ctxT(t), in.ID, driver.LogOptions{Stdout: true, Stderr: true, Tail: 1, Follow: true}, &out, &errOut)
	}()
	waitOutput(t, &out, "first\n")
	if err := d.(driver.Attacher).Attach(ctxT(t), in.ID, driver.AttachOptions{}, strings.NewReader("x\n"), io.Discard, io.Discard); err != nil {
		t.Fatalf("Attach: %v", err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Logs with Follow: %v, want nil once the instance ended", err)
		}
	case <-time.After(testTimeout):
		t.Fatal("Logs with Follow never returned after the instance ended")
	}
	if out.String() != "first\nsecond x\n" || errOut.String() != "late\n" {
		t.Errorf("Logs with Tail 1 and Follow: stdout %q, stderr %q; want %q and %q", out.String(), errOut.String(), "first\nsecond x\n", "late\n")
	}
}
