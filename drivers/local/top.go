package local

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/internal/procfs"
)

// Top lists the instance's processes from /proc: the members of its
// process group and every process whose environment holds its
// BERTH_INSTANCE_ID (the commands Exec ran and what they started), as
// UID, PID, PPID, STAT, TIME (cpu time used) and CMD. The driver reads
// the processes itself, so any psArgs is ErrUnsupported naming them. An
// instance that is not running is ErrPermanent.
func (d *Driver) Top(ctx context.Context, id, psArgs string) (*driver.Processes, error) {
	if err := d.checkOpen(); err != nil {
		return nil, err
	}
	if psArgs != "" {
		return nil, driver.Errorf(driver.ErrUnsupported, "ps options %q: the local driver reads an instance's processes from /proc and shows its own columns (UID PID PPID STAT TIME CMD); give none", psArgs)
	}
	unlock := d.locks.lock(id)
	rec, li, err := d.refresh(id)
	unlock()
	if err != nil {
		return nil, err
	}
	if !li.alive {
		return nil, driver.Errorf(driver.ErrPermanent, "instance %s is not running", id)
	}
	members, err := groupMembers(rec.Run.PID)
	if err != nil {
		return nil, fmt.Errorf("%w: list the processes of %s: %w", driver.ErrRetryable, id, err)
	}
	pids := make([]int, 0, len(members))
	for _, m := range members {
		pids = append(pids, m.PID)
	}
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil, fmt.Errorf("%w: list the processes of %s: %w", driver.ErrRetryable, id, err)
	}
	kv := envInstanceID + "=" + id
	for _, e := range ents {
		if pid, err := strconv.Atoi(e.Name()); err == nil && !slices.Contains(pids, pid) && hasEnv(pid, kv) {
			pids = append(pids, pid)
		}
	}
	slices.Sort(pids)
	ps := &driver.Processes{Titles: []string{"UID", "PID", "PPID", "STAT", "TIME", "CMD"}, Rows: [][]string{}}
	for _, pid := range pids {
		if row, ok := topRow(pid); ok {
			ps.Rows = append(ps.Rows, row)
		}
	}
	return ps, nil
}

// topRow is one process's row of Top; false when it has ended.
func topRow(pid int) ([]string, bool) {
	dir := "/proc/" + strconv.Itoa(pid)
	b, err := os.ReadFile(dir + "/stat")
	if err != nil {
		return nil, false
	}
	st, err := procfs.ParseStat(pid, b)
	if err != nil || st.State == 'Z' || st.State == 'X' {
		return nil, false
	}
	// The parent is field 4, the first after the state.
	ppid := "?"
	if i := bytes.LastIndexByte(b, ')'); i >= 0 {
		if f := strings.Fields(string(b[i+1:])); len(f) > 1 {
			ppid = f[1]
		}
	}
	uid := "?"
	if fi, err := os.Stat(dir); err == nil {
		if s, ok := fi.Sys().(*syscall.Stat_t); ok {
			uid = strconv.FormatUint(uint64(s.Uid), 10)
		}
	}
	cmd := ""
	if c, err := os.ReadFile(dir + "/cmdline"); err == nil {
		cmd = strings.TrimSpace(strings.ReplaceAll(string(c), "\x00", " "))
	}
	if cmd == "" {
		if c, err := os.ReadFile(dir + "/comm"); err == nil {
			cmd = "[" + strings.TrimSpace(string(c)) + "]"
		}
	}
	cpu := time.Duration(st.Ticks) * time.Second / procfs.UserHZ
	h, m, s := int(cpu.Hours()), int(cpu.Minutes())%60, int(cpu.Seconds())%60
	return []string{uid, strconv.Itoa(pid), ppid, string(st.State), fmt.Sprintf("%02d:%02d:%02d", h, m, s), cmd}, true
}

var _ driver.Topper = (*Driver)(nil)
