package vm_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/digitalocean/go-libvirt"
	"github.com/digitalocean/go-libvirt/socket/dialers"

	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/drivers/vm"
	"github.com/berth-dev/berth/drivers/vm/vmtest"
	"github.com/berth-dev/berth/internal/testdeps"
)

var (
	guestOnce sync.Once
	guest     *vmtest.Guest
	guestErr  error
)

// cacheDir is where the test guest is built once.
func cacheDir() string {
	if d := os.Getenv("BERTH_CACHE"); d != "" {
		return filepath.Join(d, "vm-guest")
	}
	home, _ := os.UserHomeDir()
	return filepath.Join(home, ".cache", "berth", "vm-guest")
}

// options returns options for the local libvirt daemon with the test guest
// registered as image "guest", in a fresh storage directory the QEMU user
// can read. Without a libvirt daemon the test fails, saying how to get one.
func options(t *testing.T) vm.Options {
	t.Helper()
	if _, err := os.Stat(vm.DefaultSocket); err != nil {
		testdeps.Need(t, fmt.Errorf("no libvirt daemon (%v): apt-get install libvirt-daemon-system qemu-system-x86 qemu-utils busybox-static linux-image-amd64, and start libvirtd (.ci/run does)", err))
	}
	guestOnce.Do(func() { guest, guestErr = vmtest.Build(cacheDir()) })
	if guestErr != nil {
		t.Fatal(guestErr)
	}
	dir, err := os.MkdirTemp("", "berth-vm-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		os.RemoveAll(dir)
		dropPools(t, dir, filepath.Join(dir, "instances"))
	})
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	// The cache may be where the QEMU user cannot read (a home directory).
	initrd, kernel := filepath.Join(dir, "initrd.cpio"), filepath.Join(dir, "vmlinux")
	copyFile(t, guest.Initrd, initrd)
	if guest.Compressed != "" {
		t.Log(guest.Compressed)
		kernel = guest.Kernel
	} else {
		linkOrCopy(t, guest.Kernel, kernel)
	}
	o := *vm.DefaultOptions()
	o.StorageDir = filepath.Join(dir, "instances")
	o.Network = "none"
	if !kvmWorks() {
		o.DomainType = "qemu"
	}
	// A liveness bound: guests beside each other on a loaded machine boot slowly.
	o.BootTimeout = 4 * time.Minute
	o.MemoryHeadroom = 2
	// The tests run up to four guests at once, and other work on the
	// machine may have guests of its own: capacity is not what they test.
	o.CPUOvercommit = 4
	o.Images = map[string]vm.Image{"guest": {ImageFiles: vm.ImageFiles{Kernel: kernel, Initrd: initrd}, Cmdline: guest.Cmdline}}
	o.Flavors = map[string]vm.Flavor{"tiny": {CPU: 500, Memory: 96 * driver.MiB}}
	return o
}

// kvmWorks reports whether hardware virtualization is there: /dev/kvm and
// the processor's vmx or svm flag (a /dev/kvm without them hangs guests).
func kvmWorks() bool {
	if _, err := os.Stat("/dev/kvm"); err != nil {
		return false
	}
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return false
	}
	return bytes.Contains(b, []byte(" vmx")) || bytes.Contains(b, []byte(" svm"))
}

// linkOrCopy makes to a hard link of from, or a copy where it cannot.
func linkOrCopy(t *testing.T, from, to string) {
	t.Helper()
	if os.Link(from, to) != nil {
		copyFile(t, from, to)
	}
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	in, err := os.Open(from)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := os.OpenFile(to, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
}

// open opens a driver that is closed when the test ends, after the
// cleanups registered later (the deletes of its instances).
func open(t *testing.T, o vm.Options) *vm.Driver {
	t.Helper()
	d, err := vm.New(context.Background(), o, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close(context.Background()) })
	return d
}

// helloSpec is a guest that writes "hello stdout" and "hello stderr".
func helloSpec() *driver.Spec {
	return &driver.Spec{
		Kind:     driver.KindVM,
		Image:    "guest",
		Flavor:   "tiny",
		UserData: "echo hello stdout\necho hello stderr >&2\n",
	}
}

// uniq makes a name no earlier run used, so that a run cut short leaves
// nothing that could stand in a later run's way.
func uniq(name string) string {
	var b [3]byte
	_, _ = rand.Read(b[:])
	return fmt.Sprintf("%s-%x", name, b)
}

// dropPools stops the driver's transient storage pools of dirs, which
// the test removes.
func dropPools(t *testing.T, dirs ...string) {
	c, err := net.Dial("unix", vm.DefaultSocket)
	if err != nil {
		t.Errorf("drop pools: %v", err)
		return
	}
	lv := libvirt.NewWithDialer(dialers.NewAlreadyConnected(c))
	if err := lv.ConnectToURI(libvirt.QEMUSystem); err != nil {
		c.Close()
		t.Errorf("drop pools: %v", err)
		return
	}
	defer lv.Disconnect()
	for _, dir := range dirs {
		p, err := lv.StoragePoolLookupByTargetPath(dir)
		if err != nil || !strings.HasPrefix(p.Name, "berth-") {
			continue
		}
		if err := lv.StoragePoolDestroy(p); err != nil {
			t.Errorf("drop pool of %s: %v", dir, err)
		}
	}
}
