package local

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"github.com/berth-dev/berth/driver"
)

// cgroupParent is the cgroup under which every instance gets its own.
const cgroupParent = "berth"

// cfsPeriod is the CFS period, in microseconds, against which cpu limits are
// set: a limit of c cpus is a quota of c × cfsPeriod per period.
const cfsPeriod = 100000

// cgroups sets cpu and memory limits through the cgroup file system: cgroup
// v2 when cgroup_root is a v2 mount with the cpu and memory controllers,
// else cgroup v1 when cgroup_root holds cpu and memory hierarchies. Either
// way each instance gets a cgroup of its own under "berth".
type cgroups struct {
	root    string
	version int    // 0 when limits are unavailable
	reason  string // why limits are unavailable
}

func detectCgroups(root string) cgroups {
	if root == "" {
		return cgroups{reason: "option cgroup_root is empty"}
	}
	if b, err := os.ReadFile(filepath.Join(root, "cgroup.controllers")); err == nil {
		have := strings.Fields(string(b))
		if !slices.Contains(have, "cpu") || !slices.Contains(have, "memory") {
			return cgroups{reason: fmt.Sprintf("cgroup v2 at %s lacks the cpu and memory controllers (it has %q)", root, have)}
		}
		parent := filepath.Join(root, cgroupParent)
		if err := os.MkdirAll(parent, 0o755); err != nil {
			return cgroups{reason: fmt.Sprintf("cgroup v2 at %s is not writable: %v", root, err)}
		}
		// Enabling is idempotent; the root may already have them enabled.
		os.WriteFile(filepath.Join(root, "cgroup.subtree_control"), []byte("+cpu +memory"), 0)
		if err := os.WriteFile(filepath.Join(parent, "cgroup.subtree_control"), []byte("+cpu +memory"), 0); err != nil {
			return cgroups{reason: fmt.Sprintf("cannot enable cpu and memory in %s: %v", parent, err)}
		}
		return cgroups{root: root, version: 2}
	}
	cpu, mem := filepath.Join(root, "cpu"), filepath.Join(root, "memory")
	if !exists(filepath.Join(cpu, "cpu.cfs_quota_us")) || !exists(filepath.Join(mem, "memory.limit_in_bytes")) {
		return cgroups{reason: fmt.Sprintf("%s holds neither cgroup v2 with the cpu and memory controllers nor the cgroup v1 cpu and memory hierarchies", root)}
	}
	for _, p := range []string{cpu, mem} {
		if err := os.MkdirAll(filepath.Join(p, cgroupParent), 0o755); err != nil {
			return cgroups{reason: fmt.Sprintf("cgroup v1 at %s is not writable: %v", p, err)}
		}
	}
	return cgroups{root: root, version: 1}
}

func exists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

func (c cgroups) usable() bool { return c.version != 0 }

// mode names the cgroup version in use, for the node's attributes.
func (c cgroups) mode() string {
	switch c.version {
	case 1:
		return "v1"
	case 2:
		return "v2"
	}
	return "none"
}

// dirs returns the cgroup directories of instance id: cpu first, then
// memory (one directory on v2).
func (c cgroups) dirs(id string) []string {
	if c.version == 2 {
		return []string{filepath.Join(c.root, cgroupParent, id)}
	}
	return []string{
		filepath.Join(c.root, "cpu", cgroupParent, id),
		filepath.Join(c.root, "memory", cgroupParent, id),
	}
}

func (c cgroups) unsupported() error {
	return driver.Errorf(driver.ErrUnsupported, "cpu and memory limits are unavailable on this host: %s", c.reason)
}

// apply sets the non-zero limits of r on instance id's cgroup, creating it,
// and moves every process of the group pgid into it (pgid 0 moves none).
func (c cgroups) apply(id string, pgid int, r driver.Resources) error {
	if !c.usable() {
		return c.unsupported()
	}
	dirs := c.dirs(id)
	for _, d := range dirs {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return fmt.Errorf("cgroup of %s: %w", id, err)
		}
	}
	cpuDir, memDir := dirs[0], dirs[len(dirs)-1]
	if r.CPU > 0 {
		quota := max(int64(r.CPU)*cfsPeriod/1000, 1000)
		var err error
		if c.version == 2 {
			err = write(cpuDir, "cpu.max", fmt.Sprintf("%d %d", quota, cfsPeriod))
		} else if err = write(cpuDir, "cpu.cfs_period_us", strconv.Itoa(cfsPeriod)); err == nil {
			err = write(cpuDir, "cpu.cfs_quota_us", strconv.FormatInt(quota, 10))
		}
		if err != nil {
			return err
		}
	}
	if r.Memory > 0 {
		file := "memory.limit_in_bytes"
		if c.version == 2 {
			file = "memory.max"
		}
		if err := write(memDir, file, strconv.FormatInt(int64(r.Memory), 10)); err != nil {
			if errors.Is(err, syscall.EBUSY) {
				return driver.Errorf(driver.ErrPermanent, "memory %s: the instance uses more than that now", r.Memory)
			}
			return err
		}
	}
	if pgid == 0 {
		return nil
	}
	members, err := groupMembers(pgid)
	if err != nil {
		return err
	}
	for _, m := range members {
		for _, d := range dirs {
			if err := write(d, "cgroup.procs", strconv.Itoa(m.PID)); err != nil && !errors.Is(err, syscall.ESRCH) {
				return err
			}
		}
	}
	return nil
}

// limits reads back the cpu and memory limits of instance id; zero means
// no limit.
func (c cgroups) limits(id string) (driver.MilliCPU, driver.Bytes, error) {
	if !c.usable() {
		return 0, 0, c.unsupported()
	}
	dirs := c.dirs(id)
	cpuDir, memDir := dirs[0], dirs[len(dirs)-1]
	var cpu driver.MilliCPU
	var mem driver.Bytes
	if c.version == 2 {
		b, err := os.ReadFile(filepath.Join(cpuDir, "cpu.max"))
		if err != nil {
			return 0, 0, err
		}
		f := strings.Fields(string(b))
		if len(f) == 2 && f[0] != "max" {
			q, _ := strconv.ParseInt(f[0], 10, 64)
			p, _ := strconv.ParseInt(f[1], 10, 64)
			if p > 0 {
				cpu = driver.MilliCPU(q * 1000 / p)
			}
		}
		b, err = os.ReadFile(filepath.Join(memDir, "memory.max"))
		if err != nil {
			return 0, 0, err
		}
		if s := strings.TrimSpace(string(b)); s != "max" {
			n, _ := strconv.ParseInt(s, 10, 64)
			mem = driver.Bytes(n)
		}
		return cpu, mem, nil
	}
	q, err := readInt(cpuDir, "cpu.cfs_quota_us")
	if err != nil {
		return 0, 0, err
	}
	p, err := readInt(cpuDir, "cpu.cfs_period_us")
	if err != nil {
		return 0, 0, err
	}
	if q > 0 && p > 0 {
		cpu = driver.MilliCPU(q * 1000 / p)
	}
	m, err := readInt(memDir, "memory.limit_in_bytes")
	if err != nil {
		return 0, 0, err
	}
	if m < 1<<62 { // v1 writes a huge number for "no limit"
		mem = driver.Bytes(m)
	}
	return cpu, mem, nil
}

// remove deletes instance id's cgroups; they must hold no process.
func (c cgroups) remove(id string) {
	if !c.usable() {
		return
	}
	for _, d := range c.dirs(id) {
		os.Remove(d)
	}
}

// contains reports whether pid is in instance id's cgroup.
func (c cgroups) contains(id string, pid int) bool {
	if !c.usable() {
		return false
	}
	b, err := os.ReadFile(filepath.Join(c.dirs(id)[0], "cgroup.procs"))
	if err != nil {
		return false
	}
	return slices.Contains(strings.Fields(string(b)), strconv.Itoa(pid))
}

func write(dir, file, val string) error {
	if err := os.WriteFile(filepath.Join(dir, file), []byte(val), 0); err != nil {
		return fmt.Errorf("cgroup %s: %w", filepath.Join(dir, file), err)
	}
	return nil
}

func readInt(dir, file string) (int64, error) {
	b, err := os.ReadFile(filepath.Join(dir, file))
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
}
