package ssh

import (
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/berth-dev/berth/driver"
)

// DefaultCgroupParent is the cgroup v2 directory under which the supervisor
// makes each instance's cgroup, <parent>/<cluster id>/<instance id>.
const DefaultCgroupParent = "/sys/fs/cgroup/berth-ssh"

// cgroup2Magic is the f_type statfs reports for a cgroup v2 mount.
const cgroup2Magic = 0x63677270

// cpuPeriod is the cpu.max period, in microseconds.
const cpuPeriod = 100000

// cgroup is an instance's cgroup v2, made with its limits before the
// process starts so that the process is born in it (CLONE_INTO_CGROUP).
// dir is empty and fd -1 when the instance has none.
type cgroup struct {
	dir string
	fd  int
}

// cgroupDir is the cgroup of instance id of cluster under parent.
func cgroupDir(parent, cluster, id string) string {
	return filepath.Join(parent, cluster, id)
}

// checkCgroup makes parent, a cgroup v2 directory with the cpu and memory
// controllers given to its children, unless it is there already, and
// returns why it cannot (nil when it can): limits are then not enforceable
// on this host. Nothing is made when the answer is no.
func checkCgroup(parent string) error {
	if !filepath.IsAbs(parent) || filepath.Clean(parent) != parent {
		return fmt.Errorf("cgroup parent %q: not a clean absolute path", parent)
	}
	// The nearest directory that exists must be a cgroup v2 with the
	// controllers.
	probe := parent
	for probe != "/" {
		if _, err := os.Stat(probe); err == nil {
			break
		}
		probe = filepath.Dir(probe)
	}
	var fs syscall.Statfs_t
	if err := syscall.Statfs(probe, &fs); err != nil {
		return fmt.Errorf("statfs %s: %w", probe, err)
	}
	if fs.Type != cgroup2Magic {
		return fmt.Errorf("%s is not on a cgroup v2 file system (a cgroup v1 or hybrid host)", probe)
	}
	have, err := os.ReadFile(filepath.Join(probe, "cgroup.controllers"))
	if err != nil {
		return fmt.Errorf("cgroup %s: %w", probe, err)
	}
	if f := strings.Fields(string(have)); !slices.Contains(f, "cpu") || !slices.Contains(f, "memory") {
		return fmt.Errorf("cgroup %s has the controllers %q: the cpu and memory controllers are needed (bound to cgroup v1, or not enabled in %s)",
			probe, strings.TrimSpace(string(have)), filepath.Join(filepath.Dir(probe), "cgroup.subtree_control"))
	}
	// Down from there to parent, each level gives them to the next.
	rel, err := filepath.Rel(probe, parent)
	if err != nil {
		return err
	}
	dir := probe
	if rel != "." {
		for part := range strings.SplitSeq(rel, "/") {
			if err := enable(dir); err != nil {
				return err
			}
			dir = filepath.Join(dir, part)
			if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
				return fmt.Errorf("make the cgroup %s: %w", dir, err)
			}
		}
	}
	return enable(parent)
}

// enable writes +cpu +memory to dir's cgroup.subtree_control unless both
// are there.
func enable(dir string) error {
	p := filepath.Join(dir, "cgroup.subtree_control")
	on, err := os.ReadFile(p)
	if err != nil {
		return fmt.Errorf("cgroup %s: %w", dir, err)
	}
	if f := strings.Fields(string(on)); slices.Contains(f, "cpu") && slices.Contains(f, "memory") {
		return nil
	}
	if err := os.WriteFile(p, []byte("+cpu +memory"), 0); err != nil {
		return fmt.Errorf("enable cpu and memory in %s: %w", p, err)
	}
	return nil
}

// makeCgroup makes the cgroup of rec under parent (which checkCgroup
// accepted) with rec's limits, and opens it for CLONE_INTO_CGROUP.
func makeCgroup(parent string, rec *record) (cgroup, error) {
	none := cgroup{fd: -1}
	if err := checkCgroup(parent); err != nil {
		return none, err
	}
	cl := filepath.Join(parent, rec.Cluster)
	cg := cgroup{dir: cgroupDir(parent, rec.Cluster, rec.ID), fd: -1}
	// The cluster's cgroup goes with its last instance's: one removed
	// between the two mkdirs is made again.
	for try := 0; ; try++ {
		if err := os.Mkdir(cl, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			return none, fmt.Errorf("make the cgroup %s: %w", cl, err)
		}
		if err := enable(cl); err != nil && (try == 2 || !errors.Is(err, os.ErrNotExist)) {
			return none, err
		}
		err := os.Mkdir(cg.dir, 0o755)
		if err == nil || errors.Is(err, os.ErrExist) {
			break
		}
		if try == 2 || !errors.Is(err, os.ErrNotExist) {
			return none, fmt.Errorf("make the cgroup %s: %w", cg.dir, err)
		}
	}
	if err := setLimits(cg.dir, rec.Resources); err != nil {
		removeCgroup(cg.dir)
		return none, err
	}
	fd, err := syscall.Open(cg.dir, syscall.O_DIRECTORY|syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
	if err != nil {
		removeCgroup(cg.dir)
		return none, fmt.Errorf("open the cgroup %s: %w", cg.dir, err)
	}
	cg.fd = fd
	return cg, nil
}

// cpuMax is what cpu.max holds for cpu: a quota per period, or max.
func cpuMax(cpu driver.MilliCPU) string {
	if cpu <= 0 {
		return "max " + strconv.Itoa(cpuPeriod)
	}
	quota := max(int64(cpu)*cpuPeriod/1000, 1000)
	return strconv.FormatInt(quota, 10) + " " + strconv.Itoa(cpuPeriod)
}

// memoryMax is what memory.max holds for m: bytes, or max.
func memoryMax(m driver.Bytes) string {
	if m <= 0 {
		return "max"
	}
	return strconv.FormatInt(int64(m), 10)
}

// swapMax is what memory.swap.max holds for a memory limit m: none of the
// host's swap with a limit (memory is what the process has, resident or
// not), the host's settings without one.
func swapMax(m driver.Bytes) string {
	if m <= 0 {
		return "max"
	}
	return "0"
}

// setLimits writes r's cpu and memory to the cgroup dir: cpu.max,
// memory.max and memory.swap.max (no limit where r has none). A kernel
// without swap accounting has no memory.swap.max: its swap is not
// counted in any cgroup, and nothing is written there.
func setLimits(dir string, r driver.Resources) error {
	if err := os.WriteFile(filepath.Join(dir, "cpu.max"), []byte(cpuMax(r.CPU)), 0); err != nil {
		return fmt.Errorf("cgroup %s: cpu.max: %w", dir, err)
	}
	// Swap first: a lower memory.max reclaims at once, and must not push
	// the process's pages out to swap on the way.
	if err := os.WriteFile(filepath.Join(dir, "memory.swap.max"), []byte(swapMax(r.Memory)), 0); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("cgroup %s: memory.swap.max: %w", dir, err)
	}
	if err := os.WriteFile(filepath.Join(dir, "memory.max"), []byte(memoryMax(r.Memory)), 0); err != nil {
		return fmt.Errorf("cgroup %s: memory.max: %w", dir, err)
	}
	return nil
}

func (c cgroup) close() {
	if c.fd >= 0 {
		syscall.Close(c.fd)
	}
}

// removeCgroup kills what is left in the cgroup dir (cgroup.kill), waits a
// little for it to empty, and removes it; then its cluster's cgroup when
// that is empty. What cannot be removed is left: a later delete tries
// again.
func removeCgroup(dir string) {
	if dir == "" {
		return
	}
	if _, err := os.Stat(dir); err != nil {
		return
	}
	os.WriteFile(filepath.Join(dir, "cgroup.kill"), []byte("1"), 0)
	for range 100 {
		if err := os.Remove(dir); err == nil || errors.Is(err, os.ErrNotExist) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	os.Remove(filepath.Dir(dir)) // the cluster's, when it was the last
}

// signalsCaught makes this process survive sigs, which are caught and
// dropped. They are not ignored: an ignored signal stays ignored in the
// processes this one starts (the instance's, an exec's), a caught one is
// theirs to handle again.
func signalsCaught(sigs ...os.Signal) { signal.Notify(make(chan os.Signal, 1), sigs...) }

// supResize sets the cpu (millicpus) and memory (bytes) limits of dir's
// instance, a zero leaving one as it is: in its cgroup (or its unit's
// properties) when it runs, and in its record, for the next start and for
// what List shows.
func supResize(dir, cpuText, memText string) error {
	cpu, err1 := strconv.ParseInt(cpuText, 10, 64)
	mem, err2 := strconv.ParseInt(memText, 10, 64)
	if err1 != nil || err2 != nil || cpu < 0 || mem < 0 {
		return coded(exitUsage, "resize %s %s: want millicpus and bytes, 0 or more", cpuText, memText)
	}
	var rec record
	if err := readJSON(filepath.Join(dir, fileRecord), &rec); err != nil {
		return err
	}
	r := rec.Resources
	if cpu > 0 {
		r.CPU = driver.MilliCPU(cpu)
	}
	if mem > 0 {
		r.Memory = driver.Bytes(mem)
	}
	if rec.CgroupParent == "" && !rec.Systemd {
		return coded(exitUnsupported, "the instance has no cgroup: its limits cannot change")
	}
	rs, ok, err := running(dir)
	if err != nil {
		return err
	}
	switch {
	case rec.Systemd && ok:
		unit, err := unitName(rec.Cluster, rec.ID)
		if err != nil {
			return err
		}
		if err := systemctl(append([]string{"set-property", "--runtime", unit}, unitLimits(r)...)...); err != nil {
			return err
		}
	case rec.Systemd:
		// Not running: the next start's unit has them.
	case ok && rs.Cgroup == "" && rs.NoCgroup != "":
		return coded(exitUnsupported, "the instance runs without a cgroup: %s", rs.NoCgroup)
	case ok && rs.Cgroup == "":
		return coded(exitUnsupported, "the instance runs without a cgroup: restart it to have one")
	case ok:
		if err := setLimits(rs.Cgroup, r); err != nil {
			return err
		}
	default:
		// Not running: the limits apply at the next start, which must be
		// able to set them.
		if err := checkCgroup(rec.CgroupParent); err != nil {
			return codedError{exitUnsupported, err}
		}
	}
	rec.Resources = r
	return writeJSON(filepath.Join(dir, fileRecord), rec)
}
