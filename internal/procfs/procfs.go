// Package procfs reads what Berth needs of Linux's /proc: a process's
// state and CPU time, and the CPU time of the whole machine.
package procfs

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// UserHZ is the unit of the tick counts in /proc (USER_HZ), which Linux
// fixes at 100 for user space on every architecture Berth runs on.
const UserHZ = 100

// Stat is what Berth reads from /proc/<pid>/stat.
type Stat struct {
	PID        int
	State      byte // R, S, D, T, t, Z, X, I ...
	PGRP       int
	Ticks      uint64 // utime + stime
	StartTicks uint64 // start time after boot, in clock ticks
	RSSPages   int64
}

// ReadStat reads /proc/<pid>/stat. A process that does not exist gives an
// error wrapping os.ErrNotExist.
func ReadStat(pid int) (Stat, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return Stat{}, err
	}
	return ParseStat(pid, b)
}

// ParseStat parses the text of /proc/<pid>/stat. The command name sits in
// parentheses and may itself hold spaces and parentheses, so the fields are
// counted from the last ')'.
func ParseStat(pid int, b []byte) (Stat, error) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return Stat{}, fmt.Errorf("/proc/%d/stat: malformed", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	// f[0] is field 3 (state); field n is f[n-3].
	if len(f) < 22 {
		return Stat{}, fmt.Errorf("/proc/%d/stat: %d fields, want at least 24", pid, len(f)+2)
	}
	num := func(n int) uint64 {
		v, _ := strconv.ParseUint(f[n-3], 10, 64)
		return v
	}
	pgrp, _ := strconv.Atoi(f[5-3])
	rss, _ := strconv.ParseInt(f[24-3], 10, 64)
	return Stat{
		PID:        pid,
		State:      f[0][0],
		PGRP:       pgrp,
		Ticks:      num(14) + num(15),
		StartTicks: num(22),
		RSSPages:   rss,
	}, nil
}

// Group returns every process whose process group is pgid, those that
// have ended but are not reaped yet (Stat.Ended) included.
func Group(pgid int) ([]Stat, error) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	var out []Stat
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		st, err := ReadStat(pid)
		if err != nil || st.PGRP != pgid {
			continue
		}
		out = append(out, st)
	}
	return out, nil
}

// HostTicks returns the busy and total clock ticks of all CPUs from
// /proc/stat: busy is every tick but idle and I/O wait.
func HostTicks() (busy, total uint64, err error) {
	f, err := os.Open("/proc/stat")
	if err != nil {
		return 0, 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	if !sc.Scan() {
		return 0, 0, errors.New("/proc/stat: empty")
	}
	fs := strings.Fields(sc.Text())
	if len(fs) < 5 || fs[0] != "cpu" {
		return 0, 0, errors.New("/proc/stat: no cpu line")
	}
	for i, s := range fs[1:] {
		v, _ := strconv.ParseUint(s, 10, 64)
		total += v
		if i != 3 && i != 4 { // idle and iowait
			busy += v
		}
	}
	return busy, total, nil
}

// Ended reports whether the process has ended: a zombie (Z) waiting to be
// reaped, or dead (X).
func (s Stat) Ended() bool { return s.State == 'Z' || s.State == 'X' }

// Running reports whether process pid exists and has not ended.
func Running(pid int) bool {
	if pid <= 0 {
		return false
	}
	st, err := ReadStat(pid)
	return err == nil && !st.Ended()
}

// BootID returns the kernel's id of this boot, which tells a process id
// of this boot from the same number of an earlier one, or "".
func BootID() string {
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}
