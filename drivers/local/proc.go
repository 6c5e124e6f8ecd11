package local

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/berth-dev/berth/internal/procfs"
)

// stateName describes a /proc state letter, for Instance.RawState.
func stateName(s byte) string {
	switch s {
	case 'R':
		return "running"
	case 'S':
		return "sleeping"
	case 'D':
		return "disk-sleep"
	case 'T':
		return "stopped"
	case 't':
		return "tracing-stop"
	case 'Z':
		return "zombie"
	case 'X':
		return "dead"
	case 'I':
		return "idle"
	}
	return string(s)
}

// groupMembers returns every live process whose process group is pgid.
func groupMembers(pgid int) ([]procfs.Stat, error) {
	all, err := procfs.Group(pgid)
	return slices.DeleteFunc(all, procfs.Stat.Ended), err
}

// stragglers returns the live members of process group pgid whose
// environment holds kv ("BERTH_INSTANCE_ID=..."): the processes an instance
// left behind when its leader ended. The environment check keeps a group
// that merely reuses the number from being taken for the instance's.
func stragglers(pgid int, kv string) ([]int, error) {
	members, err := groupMembers(pgid)
	if err != nil {
		return nil, err
	}
	var out []int
	for _, m := range members {
		if hasEnv(m.PID, kv) {
			out = append(out, m.PID)
		}
	}
	return out, nil
}

// hasEnv reports whether the environment of pid holds the entry kv.
func hasEnv(pid int, kv string) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/environ")
	if err != nil {
		return false
	}
	want := []byte(kv)
	for entry := range bytes.SplitSeq(b, []byte{0}) {
		if bytes.Equal(entry, want) {
			return true
		}
	}
	return false
}

// findByEnv returns the pid of a process group leader whose environment
// holds the entry kv ("BERTH_INSTANCE_ID=..."), or 0. It finds a process
// whose start was never recorded because Berth stopped between starting it
// and writing its pid.
func findByEnv(kv string) int {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return 0
	}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || !hasEnv(pid, kv) {
			continue
		}
		if st, err := procfs.ReadStat(pid); err == nil && st.PGRP == pid {
			return pid
		}
	}
	return 0
}

// meminfo returns MemTotal and MemAvailable in bytes.
func meminfo() (total, avail int64, err error) {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0, 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		fs := strings.Fields(v)
		if len(fs) == 0 {
			continue
		}
		n, _ := strconv.ParseInt(fs[0], 10, 64)
		switch k {
		case "MemTotal":
			total = n * 1024
		case "MemAvailable":
			avail = n * 1024
		}
	}
	if total == 0 {
		return 0, 0, errors.New("/proc/meminfo: no MemTotal")
	}
	return total, avail, sc.Err()
}

// sleep waits for d or until ctx ends, returning ctx's error then.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// signals maps signal names without the SIG prefix to their numbers.
var signals = map[string]syscall.Signal{
	"HUP": syscall.SIGHUP, "INT": syscall.SIGINT, "QUIT": syscall.SIGQUIT,
	"ILL": syscall.SIGILL, "TRAP": syscall.SIGTRAP, "ABRT": syscall.SIGABRT,
	"BUS": syscall.SIGBUS, "FPE": syscall.SIGFPE, "KILL": syscall.SIGKILL,
	"USR1": syscall.SIGUSR1, "SEGV": syscall.SIGSEGV, "USR2": syscall.SIGUSR2,
	"PIPE": syscall.SIGPIPE, "ALRM": syscall.SIGALRM, "TERM": syscall.SIGTERM,
	"CHLD": syscall.SIGCHLD, "CONT": syscall.SIGCONT, "STOP": syscall.SIGSTOP,
	"TSTP": syscall.SIGTSTP, "TTIN": syscall.SIGTTIN, "TTOU": syscall.SIGTTOU,
	"URG": syscall.SIGURG, "XCPU": syscall.SIGXCPU, "XFSZ": syscall.SIGXFSZ,
	"VTALRM": syscall.SIGVTALRM, "PROF": syscall.SIGPROF, "WINCH": syscall.SIGWINCH,
	"IO": syscall.SIGIO, "PWR": syscall.SIGPWR, "SYS": syscall.SIGSYS,
}

// parseSignal reads "TERM", "SIGTERM", "sigterm" or "15".
func parseSignal(s string) (syscall.Signal, bool) {
	t := strings.ToUpper(strings.TrimSpace(s))
	if n, err := strconv.Atoi(t); err == nil {
		if n < 1 || n > 64 {
			return 0, false
		}
		return syscall.Signal(n), true
	}
	sig, ok := signals[strings.TrimPrefix(t, "SIG")]
	return sig, ok
}
