package ssh

import (
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/berth-dev/berth/driver"
)

// supervisedWith is supervised with the record changed by edit first; it
// returns the directory and the start's exit code and output.
func supervisedWith(t *testing.T, script string, edit func(*record)) (string, int, string) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "i1")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	rec := record{ID: "n.0123456789abcdef", Node: "n", Cluster: "c" + strings.ReplaceAll(t.Name(), "/", "-"), Tags: map[string]string{"berth.managed": "true"},
		Created: time.Now(), Argv: []string{"/bin/sh", "-c", script}}
	edit(&rec)
	b, _ := json.Marshal(rec)
	if err := os.WriteFile(filepath.Join(dir, fileRecord), b, 0o600); err != nil {
		t.Fatal(err)
	}
	code, out := sup(t, "start", dir)
	t.Cleanup(func() { sup(t, "delete", dir, "0s") })
	return dir, code, out
}

// syncBuffer is a buffer written by one goroutine and read by another.
type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
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

// attaching runs supAttach in the background; the caller writes frames to
// the returned writer and closes it to detach.
type attaching struct {
	out, err syncBuffer
	in       *io.PipeWriter
	done     chan error
}

func attach(t *testing.T, dir, mode string) *attaching {
	t.Helper()
	r, w := io.Pipe()
	a := &attaching{in: w, done: make(chan error, 1)}
	go func() { a.done <- supAttach(dir, mode, r, &a.out, &a.err) }()
	t.Cleanup(func() { w.Close() })
	return a
}

func (a *attaching) send(t *testing.T, s string) {
	t.Helper()
	if err := writeFrame(a.in, frameData, []byte(s)); err != nil {
		t.Fatal(err)
	}
}

// waitOut waits until the attach's stdout holds want.
func (a *attaching) waitOut(t *testing.T, want string) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !strings.Contains(a.out.String(), want) {
		if time.Now().After(deadline) {
			t.Fatalf("the output never held %q: %q", want, a.out.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// wait waits for the attach to return.
func (a *attaching) wait(t *testing.T) error {
	t.Helper()
	select {
	case err := <-a.done:
		return err
	case <-time.After(time.Minute):
		t.Fatalf("the attach never returned; stdout %q", a.out.String())
		return nil
	}
}

// TestSupervisorAttachStdin sends input to an instance made with stdin,
// detaches (the input stays open), attaches again from now and ends the
// input: the instance reads end of file and ends, and the attach with it.
func TestSupervisorAttachStdin(t *testing.T) {
	dir, code, out := supervisedWith(t, `echo ready; echo warn >&2; while read l; do echo "got $l"; done; echo bye`,
		func(r *record) { r.Stdin = true })
	if code != 0 {
		t.Fatalf("start: exit code %d: %s", code, out)
	}
	a := attach(t, dir, "replay")
	a.waitOut(t, "ready\n")
	a.send(t, "one\n")
	a.waitOut(t, "got one\n")
	a.in.Close() // a detach
	if err := a.wait(t); err != nil {
		t.Fatalf("attach: %v", err)
	}
	if !strings.Contains(a.err.String(), "warn\n") {
		t.Errorf("stderr %q, want warn", a.err.String())
	}
	if st := statusOf(t, dir); st.Phase != "running" {
		t.Fatalf("after a detach: %s, want running (the input open)", st.Phase)
	}

	b := attach(t, dir, "new")
	b.send(t, "two\n")
	if err := writeFrame(b.in, frameEOF, nil); err != nil {
		t.Fatal(err)
	}
	if err := b.wait(t); err != nil {
		t.Fatalf("second attach: %v", err)
	}
	if got := b.out.String(); got != "got two\nbye\n" {
		t.Errorf("second attach (from now): stdout %q, want %q", got, "got two\nbye\n")
	}
	if st := waitPhase(t, dir, "exited"); st.ExitCode == nil || *st.ExitCode != 0 {
		t.Errorf("after the input's end: %+v, want exit code 0", st)
	}

	// Attaching to an instance that ended replays and returns.
	c := attach(t, dir, "replay")
	if err := c.wait(t); err != nil {
		t.Fatalf("attach after the end: %v", err)
	}
	if got := c.out.String(); got != "ready\ngot one\ngot two\nbye\n" {
		t.Errorf("replay after the end: %q", got)
	}
	if code, msg := sup(t, "resize-tty", dir, "30", "100"); code != exitInvalid {
		t.Errorf("resize-tty of an instance without a terminal: exit code %d (%s), want %d", code, msg, exitInvalid)
	}
}

// TestSupervisorAttachTTY runs an instance on a terminal: it is a
// terminal, a resize reaches it, the end of the input is the terminal's
// end-of-file character.
func TestSupervisorAttachTTY(t *testing.T) {
	dir, code, out := supervisedWith(t, `test -t 0 && test -t 1 && echo on a tty; stty size; read l; stty size; cat; echo "bye $l"`,
		func(r *record) { r.TTY = true })
	if code != 0 {
		t.Fatalf("start: exit code %d: %s", code, out)
	}
	a := attach(t, dir, "replay")
	a.waitOut(t, "on a tty\r\n24 80\r\n")
	if code, msg := sup(t, "resize-tty", dir, "30", "100"); code != 0 {
		t.Fatalf("resize-tty: exit code %d: %s", code, msg)
	}
	a.send(t, "x\n")
	a.waitOut(t, "30 100\r\n")
	if err := writeFrame(a.in, frameEOF, nil); err != nil {
		t.Fatal(err)
	}
	if err := a.wait(t); err != nil {
		t.Fatalf("attach: %v", err)
	}
	if got := a.out.String(); !strings.HasSuffix(got, "bye x\r\n") {
		t.Errorf("stdout %q, want it to end with the instance's last line", got)
	}
	if b, err := os.ReadFile(filepath.Join(dir, fileStdout)); err != nil || !strings.Contains(string(b), "bye x") {
		t.Errorf("stdout.log %q (%v): the terminal's output belongs there", b, err)
	}
	if _, err := os.Stat(filepath.Join(dir, fileAttach)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the attach socket after the end: %v, want it gone", err)
	}
}

// TestSupervisorLimits starts instances with cpu and memory under a cgroup
// parent: where this host has a usable cgroup v2 the limits are in the
// instance's cgroup, change with resize and go with the instance; where it
// has not, the start is refused unless the limits are only counted, and a
// resize is refused.
func TestSupervisorLimits(t *testing.T) {
	parent := filepath.Join(filepath.Dir(DefaultCgroupParent), "berth-ssh-test")
	why := checkCgroup(parent)
	t.Cleanup(func() { os.Remove(parent) })
	lim := driver.Resources{CPU: 500, Memory: 256 * driver.MiB}
	// A hybrid host's cgroup v2 has no cpu and memory controllers: said
	// so, and nothing is made there.
	if unified := "/sys/fs/cgroup/unified"; why != nil && isCgroup2(unified) {
		p := filepath.Join(unified, "berth-ssh-test")
		if err := checkCgroup(p); err == nil || !strings.Contains(err.Error(), "cpu and memory controllers are needed") {
			t.Errorf("a cgroup v2 without the controllers: %v, want it to say so", err)
		}
		if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s after the check: %v, want nothing made", p, err)
			os.Remove(p)
		}
	}
	if why != nil {
		t.Logf("no cgroup v2 here: %v", why)
		_, code, out := supervisedWith(t, "sleep 1000", func(r *record) { r.CgroupParent, r.Resources = parent, lim })
		if code != exitUnsupported || !strings.Contains(out, "cannot be enforced") {
			t.Errorf("start with limits: exit code %d (%s), want %d", code, out, exitUnsupported)
		}
		dir, code, out := supervisedWith(t, "sleep 1000", func(r *record) { r.CgroupParent, r.Resources, r.CountLimits = parent, lim, true })
		if code != 0 {
			t.Fatalf("start with limits counted: exit code %d: %s", code, out)
		}
		if code, out := sup(t, "resize", dir, "700", "0"); code != exitUnsupported || !strings.Contains(out, "without a cgroup") {
			t.Errorf("resize: exit code %d (%s), want %d", code, out, exitUnsupported)
		}
	}
	t.Run("cgroup2", func(t *testing.T) {
		if why != nil {
			// Not a package to install: the machine's cgroup layout.
			// cgrouptest.TestSupervisorLimitsInGuest covers them anywhere.
			t.Skipf("no usable cgroup v2 here: %v", why)
		}
		dir, code, out := supervisedWith(t, "sleep 1000", func(r *record) { r.CgroupParent, r.Resources = parent, lim })
		if code != 0 {
			t.Fatalf("start: exit code %d: %s", code, out)
		}
		cg := cgroupDir(parent, "c"+strings.ReplaceAll(t.Name(), "/", "-"), "n.0123456789abcdef")
		readLimits := func() (string, string) {
			c, _ := os.ReadFile(filepath.Join(cg, "cpu.max"))
			m, _ := os.ReadFile(filepath.Join(cg, "memory.max"))
			return strings.TrimSpace(string(c)), strings.TrimSpace(string(m))
		}
		if c, m := readLimits(); c != "50000 100000" || m != "268435456" {
			t.Errorf("after start: cpu.max %q memory.max %q", c, m)
		}
		st := statusOf(t, dir)
		if procs, _ := os.ReadFile(filepath.Join(cg, "cgroup.procs")); !slices.Contains(strings.Fields(string(procs)), strconv.Itoa(st.PID)) {
			t.Errorf("cgroup.procs %q, want pid %d", procs, st.PID)
		}
		if code, out := sup(t, "resize", dir, "1500", "0"); code != 0 {
			t.Fatalf("resize: exit code %d: %s", code, out)
		}
		if c, m := readLimits(); c != "150000 100000" || m != "268435456" {
			t.Errorf("after resize: cpu.max %q memory.max %q", c, m)
		}
		if got := statusOf(t, dir).Resources; got.CPU != 1500 || got.Memory != lim.Memory {
			t.Errorf("after resize: resources %+v", got)
		}
		if code, out := sup(t, "delete", dir, "0s"); code != 0 {
			t.Fatalf("delete: exit code %d: %s", code, out)
		}
		if _, err := os.Stat(cg); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("the cgroup after delete: %v, want it gone", err)
		}
	})
}

func isCgroup2(p string) bool {
	var fs syscall.Statfs_t
	return syscall.Statfs(p, &fs) == nil && fs.Type == cgroup2Magic
}
