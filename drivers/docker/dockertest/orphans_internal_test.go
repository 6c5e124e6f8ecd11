package dockertest

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestKillOrphans runs a stand-in for a runtime shim (a process naming a
// path in the engine's directory) with a child, and a bystander naming
// another directory: killOrphans kills the first two only.
func TestKillOrphans(t *testing.T) {
	dir := t.TempDir()
	other := t.TempDir()
	pidFile := filepath.Join(dir, "child.pid")
	// $0 is the path in dir, as a shim's -address is.
	shim := exec.Command("/bin/sh", "-c", "sleep 60 & echo $! > "+pidFile+"; wait", filepath.Join(dir, "exec/containerd/containerd.sock"))
	bystander := exec.Command("/bin/sh", "-c", "sleep 60", filepath.Join(other, "exec/containerd/containerd.sock"))
	for _, c := range []*exec.Cmd{shim, bystander} {
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
	}
	defer func() {
		_ = bystander.Process.Kill()
		_ = bystander.Wait()
	}()
	var child int
	deadline := time.Now().Add(time.Minute)
	for child == 0 && time.Now().Before(deadline) {
		b, _ := os.ReadFile(pidFile)
		child, _ = strconv.Atoi(strings.TrimSpace(string(b)))
		time.Sleep(10 * time.Millisecond)
	}
	if child == 0 {
		t.Fatal("the stand-in shim did not start its child")
	}

	if n := killOrphans(dir); n != 2 {
		t.Errorf("killOrphans killed %d processes, want the shim and its child", n)
	}
	if err := shim.Wait(); err == nil {
		t.Error("the stand-in shim exited normally; want it killed")
	}
	for time.Now().Before(deadline) && alive(child) {
		time.Sleep(10 * time.Millisecond)
	}
	if alive(child) {
		t.Errorf("the shim's child %d outlives killOrphans", child)
	}
	if !alive(bystander.Process.Pid) {
		t.Error("killOrphans killed a process of another directory")
	}
}

// alive reports whether pid runs (a zombie has ended).
func alive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	i := strings.LastIndexByte(string(b), ')')
	return i > 0 && !strings.HasPrefix(string(b[i+1:]), " Z")
}
