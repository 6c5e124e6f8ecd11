package control_test

import (
	"context"
	"errors"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/drivers/local"
	"github.com/berth-dev/berth/internal/procfs"
	"github.com/berth-dev/berth/provider"
	"github.com/berth-dev/berth/reconciler"
	"github.com/berth-dev/berth/scheduler"
	"github.com/berth-dev/berth/store/memory"
)

// newLocal opens the local back-end on a fresh data directory.
func newLocal(t *testing.T, dir string) *provider.Provider {
	t.Helper()
	opts := local.DefaultOptions()
	opts.DataDir = dir
	opts.NodeName = "host"
	opts.StopGrace = time.Second
	opts.PollInterval = 20 * time.Millisecond
	opts.CgroupRoot = ""
	opts.AllowRoot = true // the tests run as root
	d, err := local.Open(context.Background(), opts, driver.Env{Provider: "local", Cluster: "test", Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	p, err := provider.New(d, provider.Config{Name: "local", Logger: quiet, StateTTL: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close(context.Background()) })
	return p
}

// TestLocalProcessesRunLogAndEnd runs real processes: one that prints and
// keeps running (its pid recorded in a file), which is stopped, started and
// deleted, and the crash case: a new Plane on the same store and back-end
// adopts the running process rather than starting a second one.
//
// It runs on the real clock, not in a synctest bubble like the other
// tests of the plane: its processes are real, and the bubble's clock would
// not move while the test waits for them in system calls. Its waits are
// waitFor polls for what the processes do, and one sleep, commented.
func TestLocalProcessesRunLogAndEnd(t *testing.T) {
	dir := t.TempDir()
	prov := newLocal(t, dir+"/local")
	st := memory.New(memory.Options{})
	ctx := context.Background()
	pidFile := dir + "/pids"
	r := scheduler.Request{ID: "echo", Spec: driver.Spec{
		Kind:       driver.KindProcess,
		Entrypoint: []string{"/bin/sh", "-c", `echo hello from berth; echo $$ >> ` + pidFile + `; exec sleep 60`},
		Resources:  driver.Resources{CPU: driver.CPUs(0.1), Memory: 16 * driver.MiB},
	}}
	p1, stop1 := start(t, config(st, prov))
	if _, err := p1.Submit(ctx, r, "me"); err != nil {
		t.Fatal(err)
	}
	waitPhase(t, p1, "echo", reconciler.Running)
	var out strings.Builder
	waitFor(t, "the output in the logs", func() bool {
		out.Reset()
		_ = p1.Logs(ctx, "echo", driver.LogOptions{Stdout: true}, &out, &out)
		return strings.Contains(out.String(), "hello from berth")
	})
	pids := func() []int {
		b, _ := os.ReadFile(pidFile)
		var out []int
		for _, f := range strings.Fields(string(b)) {
			n, _ := strconv.Atoi(f)
			out = append(out, n)
		}
		return out
	}
	waitFor(t, "the pid file", func() bool { return len(pids()) == 1 })
	pid := pids()[0]
	if !procfs.Running(pid) {
		t.Fatalf("process %d is not running", pid)
	}

	// A crash of the control plane: the new one adopts, no second process.
	stop1()
	p2, _ := start(t, config(st, prov))
	in := waitPhase(t, p2, "echo", reconciler.Running)
	// Let a few sync rounds (every 20 ms) pass, so that a second process,
	// had the new plane started one, would be running now: a slow machine
	// can only make this check see fewer rounds, never fail it falsely.
	time.Sleep(100 * time.Millisecond)
	if got := pids(); len(got) != 1 {
		t.Fatalf("processes started: %v, want exactly one", got)
	}
	if in2, _ := p2.Instance(ctx, "echo"); in2.BackendID != in.BackendID {
		t.Fatalf("backend id changed from %s to %s", in.BackendID, in2.BackendID)
	}

	if err := p2.Stop(ctx, "echo", time.Second); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the process to end", func() bool { return !procfs.Running(pid) })
	if err := p2.Delete(ctx, "echo"); err != nil {
		t.Fatal(err)
	}
	waitPhase(t, p2, "echo", reconciler.Deleted)
	left, err := prov.List(ctx, map[string]string{driver.TagInstance: "echo"})
	if err != nil || len(left) != 0 {
		t.Fatalf("back-end still holds %v (%v)", left, err)
	}
	// A stop is satisfied already; a start can never apply.
	if err := p2.Stop(ctx, "echo", 0); err != nil {
		t.Fatalf("stop of a deleted instance: %v, want nothing done", err)
	}
	if err := p2.Start(ctx, "echo"); !errors.Is(err, driver.ErrInvalid) || !strings.Contains(err.Error(), "deleted") {
		t.Fatalf("start of a deleted instance: %v, want invalid naming the phase", err)
	}
}

// cpuTicks reads the cpu time (utime + stime, in clock ticks) process pid
// has used, and its state letter.
func cpuTicks(t *testing.T, pid int) (uint64, byte) {
	t.Helper()
	st, err := procfs.ReadStat(pid)
	if err != nil {
		t.Fatal(err)
	}
	return st.Ticks, st.State
}

// TestLocalSuspendStopsTheCPU suspends a real busy loop: it uses no cpu
// while suspended, as /proc and the plane's usage both show, and uses cpu
// again once resumed. Real processes: the real clock (see
// TestLocalProcessesRunLogAndEnd).
func TestLocalSuspendStopsTheCPU(t *testing.T) {
	dir := t.TempDir()
	prov := newLocal(t, dir+"/local")
	ctx := context.Background()
	pidFile := dir + "/pid"
	r := scheduler.Request{ID: "spin", Spec: driver.Spec{
		Kind:       driver.KindProcess,
		Entrypoint: []string{"/bin/sh", "-c", `echo $$ > ` + pidFile + `; while :; do :; done`},
		Resources:  driver.Resources{CPU: driver.CPUs(0.1), Memory: 16 * driver.MiB},
	}}
	p, _ := start(t, config(memory.New(memory.Options{}), prov))
	if _, err := p.Submit(ctx, r, "me"); err != nil {
		t.Fatal(err)
	}
	waitPhase(t, p, "spin", reconciler.Running)
	var pid int
	waitFor(t, "the pid file", func() bool {
		b, _ := os.ReadFile(pidFile)
		pid, _ = strconv.Atoi(strings.TrimSpace(string(b)))
		return pid > 0
	})
	consumes := func(what string) {
		t.Helper()
		from, _ := cpuTicks(t, pid)
		waitFor(t, what, func() bool {
			now, _ := cpuTicks(t, pid)
			return now > from
		})
	}
	consumes("the loop to use cpu")

	if err := p.Suspend(ctx, "spin"); err != nil {
		t.Fatal(err)
	}
	if ph := phaseOf(t, p, "spin"); ph != reconciler.Suspended {
		t.Fatalf("after Suspend: %s, want suspended", ph)
	}
	before, state := cpuTicks(t, pid)
	if state != 'T' {
		t.Fatalf("suspended process in state %c, want T (stopped)", state)
	}
	// Long enough for a running loop to use many ticks (100 a second); a
	// slow machine can only make the check see fewer, never fail it.
	time.Sleep(300 * time.Millisecond)
	if after, _ := cpuTicks(t, pid); after != before {
		t.Fatalf("the suspended loop used %d ticks of cpu", after-before)
	}
	waitFor(t, "the plane to measure no cpu", func() bool {
		u, err := p.Usage(ctx, "spin")
		return err == nil && u.CPU == 0 && u.Memory > 0
	})
	if ph := phaseOf(t, p, "spin"); ph != reconciler.Suspended {
		t.Fatalf("after sync rounds: %s, want suspended", ph)
	}

	if err := p.Resume(ctx, "spin"); err != nil {
		t.Fatal(err)
	}
	if ph := phaseOf(t, p, "spin"); ph != reconciler.Running {
		t.Fatalf("after Resume: %s, want running", ph)
	}
	consumes("the resumed loop to use cpu")
	waitFor(t, "the plane to measure cpu", func() bool {
		u, err := p.Usage(ctx, "spin")
		return err == nil && u.CPU > 0
	})

	if err := p.Delete(ctx, "spin"); err != nil {
		t.Fatal(err)
	}
	waitPhase(t, p, "spin", reconciler.Deleted)
	waitFor(t, "the loop to end", func() bool { return !procfs.Running(pid) })
}
