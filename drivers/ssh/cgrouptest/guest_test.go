package cgrouptest_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/drivers/vm/vmtest"
	"github.com/berth-dev/berth/internal/testdeps"
)

// guestScript is the init of the guest TestSupervisorLimitsInGuest boots:
// a cgroup v2 on /sys/fs/cgroup, as on a host with the unified hierarchy,
// and the supervisor run as the driver runs it over SSH. Every line the
// test reads starts with "@".
const guestScript = `#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
mount -t cgroup2 cgroup2 /sys/fs/cgroup
S="/supervise ssh-supervise"
D=/var/berth/c/c1/n.0123456789abcdef
CG=/sys/fs/cgroup/berth-ssh/c1/n.0123456789abcdef
mkdir -p $D
cp /record.json $D/record.json
$S cgroup /sys/fs/cgroup/berth-ssh 2>&1 | sed 's/^/@check-says /'
echo "@check $?"
$S start $D >/dev/null 2>/tmp/err; echo "@start $?"; sed 's/^/@start-says /' /tmp/err
echo "@launch $(cat $CG/cpu.max) | $(cat $CG/memory.max) | $(cat $CG/memory.swap.max)"
echo "@pid $(cat $CG/cgroup.procs | tr '\n' ' ')| $(sed 's/.*"pid":\([0-9]*\).*/\1/' $D/state.json)"
mkfifo /tmp/in
$S exec $D </tmp/in >/tmp/out 2>/tmp/err & X=$!
exec 3>/tmp/in
cat /exec.req >&3
wait $X; echo "@exec $?"; sed 's/^/@exec-says /' /tmp/err
exec 3>&-
echo "@exec-cgroup $(grep -a -o '0::/[-a-z0-9/.]*' /tmp/out)"
$S resize $D 1500 536870912 2>/tmp/err; echo "@resize $?"; sed 's/^/@resize-says /' /tmp/err
echo "@resized $(cat $CG/cpu.max) | $(cat $CG/memory.max) | $(cat $CG/memory.swap.max)"
$S delete $D 0s; echo "@delete $?"
if [ -e $CG ]; then echo "@cgroup left"; else echo "@cgroup gone"; fi
D2=/var/berth/c/c1/n.00000000000000ff
mkdir -p $D2
cp /record2.json $D2/record.json
$S start $D2 >/dev/null 2>/tmp/err; echo "@start2 $?"; sed 's/^/@start2-says /' /tmp/err
for i in $(seq 1 600); do [ -e $D2/exit.json ] && break; sleep 0.1; done
echo "@oom $(sed 's/.*"code":\([0-9]*\).*/\1/' $D2/exit.json)"
echo "@end"
poweroff -f
`

// record is the part of an instance's record.json the test writes (the
// supervisor's own type is drivers/ssh's).
type record struct {
	ID           string            `json:"id"`
	Node         string            `json:"node"`
	Cluster      string            `json:"cluster"`
	Tags         map[string]string `json:"tags"`
	Created      time.Time         `json:"created"`
	Argv         []string          `json:"argv"`
	Resources    driver.Resources  `json:"resources"`
	CgroupParent string            `json:"cgroup_parent"`
}

// TestSupervisorLimitsInGuest runs the supervisor in a small guest whose
// kernel (the host's packaged one) has cgroup v2 with the cpu and memory
// controllers, which a cgroup v1 or hybrid host cannot give: the instance
// is born in its cgroup with the spec's cpu.max and memory.max and no swap
// (memory.swap.max 0), an exec runs in that cgroup too, a resize changes
// them, and the cgroup goes with the instance; an instance that takes
// more memory than its memory.max is killed.
func TestSupervisorLimitsInGuest(t *testing.T) {
	qemu, err := exec.LookPath("qemu-system-x86_64")
	if err != nil {
		testdeps.Need(t, testdeps.Missing("qemu-system-x86_64", "qemu-system-x86"))
	}
	kernel, err := vmtest.Kernel()
	testdeps.Need(t, err)
	if _, err := os.Stat("/bin/busybox"); err != nil {
		testdeps.Need(t, testdeps.Missing("/bin/busybox", "busybox-static"))
	}
	dir := t.TempDir()
	// A static supervisor: the guest has no C library.
	bin := filepath.Join(dir, "supervise")
	build := exec.Command("go", "build", "-o", bin, "../testdata/supervise")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build the supervisor: %v: %s", err, out)
	}
	rec := record{ID: "n.0123456789abcdef", Node: "n", Cluster: "c1", Tags: map[string]string{"berth.managed": "true"},
		Created: time.Now(), Argv: []string{"/bin/sleep", "1000"}, CgroupParent: "/sys/fs/cgroup/berth-ssh",
		Resources: driver.Resources{CPU: 500, Memory: 256 * driver.MiB}}
	recJSON, _ := json.Marshal(rec)
	// An instance that takes more memory than it is given: dd reads 128
	// MiB into one buffer, under a memory.max of 64 MiB.
	rec2 := rec
	rec2.ID, rec2.Resources = "n.00000000000000ff", driver.Resources{Memory: 64 * driver.MiB}
	rec2.Argv = []string{"/bin/dd", "if=/dev/zero", "of=/dev/null", "bs=128M", "count=1"}
	rec2JSON, _ := json.Marshal(rec2)
	// An exec of cat /proc/self/cgroup: its request frame, as the driver
	// sends it (the supervisor's frames: a type, a 4-byte length, then
	// that many bytes).
	execReq := []byte(`{"cmd":["/bin/cat","/proc/self/cgroup"]}`)
	execReq = append(binary.BigEndian.AppendUint32([]byte{'q'}, uint32(len(execReq))), execReq...)
	var a vmtest.Archive
	for _, d := range []string{"bin", "dev", "proc", "sys", "tmp", "var"} {
		a.Dir(d)
	}
	a.CharDev("dev/console", 5, 1)
	for _, f := range []struct {
		name, from string
	}{{"bin/busybox", "/bin/busybox"}, {"supervise", bin}} {
		b, err := os.ReadFile(f.from)
		if err != nil {
			t.Fatal(err)
		}
		a.File(f.name, 0o755, b)
	}
	a.File("init", 0o755, []byte(guestScript))
	a.File("record.json", 0o600, recJSON)
	a.File("record2.json", 0o600, rec2JSON)
	a.File("exec.req", 0o600, execReq)
	initrd := filepath.Join(dir, "initrd.cpio")
	if err := os.WriteFile(initrd, a.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	// KVM only with the processor's virtualization flags: a /dev/kvm
	// without them hangs guests (see drivers/vm's tests).
	accel := "tcg"
	if cpu, _ := os.ReadFile("/proc/cpuinfo"); bytes.Contains(cpu, []byte(" vmx")) || bytes.Contains(cpu, []byte(" svm")) {
		if _, err := os.Stat("/dev/kvm"); err == nil {
			accel = "kvm"
		}
	}
	cmd := exec.CommandContext(ctx, qemu, "-machine", "accel="+accel, "-m", "512", "-nodefaults", "-display", "none",
		"-serial", "stdio", "-no-reboot", "-kernel", kernel, "-initrd", initrd, "-append", vmtest.Cmdline)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	var says []string
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if !strings.HasPrefix(line, "@") {
			continue
		}
		key, val, _ := strings.Cut(line[1:], " ")
		if strings.HasSuffix(key, "-says") {
			says = append(says, line)
			continue
		}
		got[key] = val
		if key == "end" {
			break
		}
	}
	cancel()
	cmd.Wait()
	t.Logf("the guest said %v", got)
	if _, ok := got["end"]; !ok {
		t.Fatalf("the guest never finished its script: %v %v", got, says)
	}
	want := map[string]string{
		"check":  "0",
		"start":  "0",
		"launch": "50000 100000 | 268435456 | 0",
		"exec":   "0",
		// Born in the instance's cgroup (CLONE_INTO_CGROUP).
		"exec-cgroup": "0::/berth-ssh/c1/n.0123456789abcdef",
		"resize":      "0",
		"resized":     "150000 100000 | 536870912 | 0",
		"delete":      "0",
		"cgroup":      "gone",
		"start2":      "0",
		"oom":         "137", // KILLed by the kernel's OOM killer
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s: %q, want %q", k, got[k], v)
		}
	}
	if procs, pid, _ := strings.Cut(got["pid"], "| "); strings.TrimSpace(procs) != pid || pid == "" {
		t.Errorf("the cgroup's processes %q, want the instance's pid %q alone", procs, pid)
	}
	if t.Failed() {
		t.Log(fmt.Sprint(says))
	}
}
