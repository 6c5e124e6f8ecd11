package procfs_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/procfs"
)

// TestReadStat reads a real process whose command name holds spaces and
// parentheses, as it sleeps, is stopped and has ended.
func TestReadStat(t *testing.T) {
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		t.Fatal(err)
	}
	// Copied by another process: see e2e's copyProgram.
	odd := filepath.Join(t.TempDir(), "a) b (c")
	if out, err := exec.Command("install", "-m", "0755", sleep, odd).CombinedOutput(); err != nil {
		t.Fatalf("install: %v: %s", err, out)
	}
	cmd := exec.Command(odd, "60")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid := cmd.Process.Pid
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })

	state := func(want byte) procfs.Stat {
		t.Helper()
		var st procfs.Stat
		for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
			if st, err = procfs.ReadStat(pid); err == nil && st.State == want {
				return st
			}
		}
		t.Fatalf("process %d: %+v, %v; want state %c", pid, st, err, want)
		return st
	}
	st := state('S')
	if st.PID != pid || st.PGRP != pid || st.StartTicks == 0 || st.RSSPages <= 0 || st.Ended() || !procfs.Running(pid) {
		t.Errorf("a sleeping process (pid %d): %+v, running %t", pid, st, procfs.Running(pid))
	}
	if g, err := procfs.Group(pid); err != nil || len(g) != 1 || g[0].PID != pid {
		t.Errorf("the group of the process: %+v, %v; want the process alone", g, err)
	}
	if err := cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	state('T')
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	if st := state('Z'); !st.Ended() || procfs.Running(pid) {
		t.Errorf("a zombie: %+v, running %t; want ended", st, procfs.Running(pid))
	}
	_ = cmd.Wait()
	if _, err := procfs.ReadStat(pid); !os.IsNotExist(err) {
		t.Errorf("a reaped process: %v, want it not to exist", err)
	}
	if procfs.Running(0) || procfs.Running(-1) {
		t.Error("pids 0 and -1 run")
	}

	if id := procfs.BootID(); len(id) != 36 {
		t.Errorf("BootID = %q, want a UUID", id)
	}
	busy, total, err := procfs.HostTicks()
	if err != nil || busy == 0 || total < busy {
		t.Errorf("HostTicks = %d, %d, %v", busy, total, err)
	}
}
