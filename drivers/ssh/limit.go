package ssh

import (
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"github.com/berth-dev/berth/driver"
)

// cgroupRoot is where the supervisor looks for cgroup v2.
const cgroupRoot = "/sys/fs/cgroup"

// cgroup is an instance's cgroup v2, made with its limits before the
// process starts so that the process is born in it (CLONE_INTO_CGROUP).
// dir is empty and fd -1 when the host has no usable cgroup v2 with the
// cpu and memory controllers: the limits are then only counted.
type cgroup struct {
	dir string
	fd  int
}

// limit makes the cgroup of instance id with r's cpu and memory limits.
func limit(id string, r driver.Resources) cgroup {
	none := cgroup{fd: -1}
	if r.CPU <= 0 && r.Memory <= 0 {
		return none
	}
	b, err := os.ReadFile(filepath.Join(cgroupRoot, "cgroup.controllers"))
	if err != nil {
		return none
	}
	if have := strings.Fields(string(b)); !slices.Contains(have, "cpu") || !slices.Contains(have, "memory") {
		return none
	}
	parent := filepath.Join(cgroupRoot, "berth-ssh")
	if os.MkdirAll(parent, 0o755) != nil {
		return none
	}
	os.WriteFile(filepath.Join(cgroupRoot, "cgroup.subtree_control"), []byte("+cpu +memory"), 0)
	if os.WriteFile(filepath.Join(parent, "cgroup.subtree_control"), []byte("+cpu +memory"), 0) != nil {
		return none
	}
	dir := filepath.Join(parent, id)
	if os.Mkdir(dir, 0o755) != nil {
		return none
	}
	cg := cgroup{dir: dir, fd: -1}
	ok := true
	if r.CPU > 0 {
		const period = 100000
		quota := max(int64(r.CPU)*period/1000, 1000)
		ok = os.WriteFile(filepath.Join(dir, "cpu.max"), []byte(strconv.FormatInt(quota, 10)+" "+strconv.Itoa(period)), 0) == nil
	}
	if ok && r.Memory > 0 {
		ok = os.WriteFile(filepath.Join(dir, "memory.max"), []byte(strconv.FormatInt(int64(r.Memory), 10)), 0) == nil
	}
	if ok {
		cg.fd, err = syscall.Open(dir, syscall.O_DIRECTORY|syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
		ok = err == nil
	}
	if !ok {
		cg.remove()
		return none
	}
	return cg
}

func (c cgroup) close() {
	if c.fd >= 0 {
		syscall.Close(c.fd)
	}
}

func (c cgroup) remove() {
	if c.dir != "" {
		os.Remove(c.dir)
	}
}

func signalIgnore(sigs ...os.Signal) { signal.Ignore(sigs...) }
