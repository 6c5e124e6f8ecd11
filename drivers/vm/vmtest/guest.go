// Package vmtest builds the tiny guest the vm driver's tests boot: the
// host's packaged Linux kernel (its image taken out of the compressed
// bzImage, booted at its PVH entry point) and an initramfs holding busybox and an init
// that reads the config drive, writes the config files, sets up QEMU's
// user-mode network when there is one, says "ready" on its console
// (ttyS0), runs the user data as a script with its output on ttyS1 and
// ttyS2, powers off on the ACPI power button, and idles.
package vmtest

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// Guest is a built guest: a kernel and an initrd to boot directly.
type Guest struct {
	// Kernel is the packaged kernel's uncompressed ELF image (booted at
	// its PVH entry point), or the packaged bzImage itself when that
	// image cannot be taken out.
	Kernel string
	// Compressed says why Kernel is the bzImage (which the guest
	// decompresses, under TCG slowly), or is empty.
	Compressed string
	Initrd     string
	Cmdline    string
}

// Cmdline is the kernel command line of the guest. no_timer_check skips the
// kernel's check that the IO-APIC timer ticks during a short busy wait: a
// guest emulated by TCG on a loaded host misses those ticks and panics at
// boot ("IO-APIC + timer doesn't work"), as virtualised guests generally
// may, which is why cloud images boot with it too.
const Cmdline = "console=ttyS0 quiet loglevel=1 panic=-1 rdinit=/init no_timer_check"

// modules are what the init loads: the virtio disks, network and balloon,
// FAT.
// evdev and button turn the ACPI power button into an input event for acpid, so
// that a stop is a clean power-off.
var modules = []string{"virtio_pci", "virtio_blk", "virtio_net", "virtio_balloon", "vfat", "nls_cp437", "nls_ascii", "evdev", "button"}

const initScript = `#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
while read m; do insmod /lib/modules/$m 2>/dev/null; done < /lib/modules/load
mkdir -p /mnt/cidata
found=
for i in $(seq 1 100); do
	for dev in /dev/vd?; do
		[ -b "$dev" ] || continue
		if mount -t vfat -o ro "$dev" /mnt/cidata 2>/dev/null; then
			if [ -f /mnt/cidata/meta-data ]; then found=$dev; break 2; fi
			umount /mnt/cidata
		fi
	done
	sleep 0.1
done
if [ -n "$found" ]; then
	while read mode name path; do
		[ -n "$path" ] || continue
		mkdir -p "$(dirname "$path")"
		cp "/mnt/cidata/$name" "$path"
		chmod "$mode" "$path"
	done < /mnt/cidata/berth-files
fi
mkdir -p /etc/acpi/PWRF /var/run /var/log
printf '#!/bin/sh\necho powering off > /dev/ttyS0\npoweroff -f\n' > /etc/acpi/PWRF/00000080
chmod 755 /etc/acpi/PWRF/00000080
acpid -c /etc/acpi -l /dev/null
ip link set lo up
if [ -e /sys/class/net/eth0 ]; then
	# QEMU's user-mode network: the guest is 10.0.2.15, the host 10.0.2.2.
	ip addr add 10.0.2.15/24 dev eth0
	ip link set eth0 up
	ip route add default via 10.0.2.2
fi
echo ready > /dev/ttyS0
if [ -n "$found" ] && [ -s /mnt/cidata/user-data ]; then
	sh /mnt/cidata/user-data > /dev/ttyS1 2> /dev/ttyS2 &
fi
while true; do sleep 3600; done
`

// Build makes the guest in dir (kept between runs: it is built once) from
// the newest kernel in /boot and busybox-static. It fails, saying what to
// install, when either is missing. Files in dir may be unreadable to the
// QEMU user (a home directory): the caller copies them where it can read
// them.
func Build(dir string) (*Guest, error) {
	kernel, err := Kernel()
	if err != nil {
		return nil, err
	}
	version := strings.TrimPrefix(filepath.Base(kernel), "vmlinuz-")
	busybox := "/bin/busybox"
	if _, err := os.Stat(busybox); err != nil {
		return nil, errors.New("vmtest: no /bin/busybox (apt-get install busybox-static)")
	}
	sum := sha256.Sum256([]byte(initScript + strings.Join(modules, ",")))
	g := &Guest{Kernel: kernel, Initrd: filepath.Join(dir, fmt.Sprintf("initrd-%s-%x.cpio", version, sum[:4])), Cmdline: Cmdline}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	if g.Kernel, err = uncompressed(kernel, dir); err != nil {
		g.Compressed = fmt.Sprintf("vmtest: booting the compressed %s: %v", kernel, err)
	}
	if _, err := os.Stat(g.Initrd); err == nil {
		return g, nil
	}
	var a cpio
	for _, d := range []string{"bin", "dev", "proc", "sys", "mnt", "lib", "lib/modules", "etc", "tmp"} {
		a.add(d, 0o40755, nil)
	}
	a.addNode("dev/console", 0o20600, 5, 1)
	bb, err := os.ReadFile(busybox)
	if err != nil {
		return nil, err
	}
	a.add("bin/busybox", 0o100755, bb)
	a.add("init", 0o100755, []byte(initScript))
	order, err := moduleOrder("/lib/modules/"+version, modules)
	if err != nil {
		return nil, err
	}
	var load []string
	for _, m := range order {
		b, err := os.ReadFile(filepath.Join("/lib/modules", version, m))
		if err != nil {
			return nil, fmt.Errorf("vmtest: %w (the modules of kernel %s)", err, version)
		}
		base := filepath.Base(m)
		a.add("lib/modules/"+base, 0o100644, b)
		load = append(load, base)
	}
	a.add("lib/modules/load", 0o100644, []byte(strings.Join(load, "\n")+"\n"))
	tmp := g.Initrd + ".tmp"
	if err := os.WriteFile(tmp, a.close(), 0o644); err != nil {
		return nil, err
	}
	return g, os.Rename(tmp, g.Initrd)
}

// moduleOrder returns the module files of names with their dependencies,
// each after what it needs, from modules.dep.
func moduleOrder(dir string, names []string) ([]string, error) {
	b, err := os.ReadFile(filepath.Join(dir, "modules.dep"))
	if err != nil {
		return nil, fmt.Errorf("vmtest: %w", err)
	}
	deps := map[string][]string{}
	byName := map[string]string{}
	for _, line := range strings.Split(string(b), "\n") {
		file, rest, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		deps[file] = strings.Fields(rest)
		name := strings.TrimSuffix(filepath.Base(file), ".ko")
		byName[strings.ReplaceAll(name, "-", "_")] = file
	}
	var out []string
	seen := map[string]bool{}
	var visit func(f string)
	visit = func(f string) {
		if seen[f] {
			return
		}
		seen[f] = true
		for _, dep := range deps[f] {
			visit(dep)
		}
		out = append(out, f)
	}
	for _, n := range names {
		f, ok := byName[n]
		if !ok {
			continue // built into the kernel
		}
		visit(f)
	}
	return out, nil
}

// cpio writes a newc archive.
type cpio struct {
	buf bytes.Buffer
	ino int
}

func (c *cpio) header(name string, mode uint32, size, major, minor int) {
	c.ino++
	fmt.Fprintf(&c.buf, "070701%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X",
		c.ino, mode, 0, 0, 1, 0, size, 0, 0, major, minor, len(name)+1, 0)
	c.buf.WriteString(name)
	c.buf.WriteByte(0)
	c.pad()
}

func (c *cpio) pad() {
	for c.buf.Len()%4 != 0 {
		c.buf.WriteByte(0)
	}
}

func (c *cpio) add(name string, mode uint32, data []byte) {
	c.header(name, mode, len(data), 0, 0)
	c.buf.Write(data)
	c.pad()
}

func (c *cpio) addNode(name string, mode uint32, major, minor int) {
	c.header(name, mode, 0, major, minor)
}

func (c *cpio) close() []byte {
	c.header("TRAILER!!!", 0, 0, 0, 0)
	return c.buf.Bytes()
}

// Archive is a newc cpio archive, for an initramfs of a test's own.
type Archive struct{ c cpio }

// Dir adds the directory name (no leading slash).
func (a *Archive) Dir(name string) { a.c.add(name, 0o40755, nil) }

// File adds the regular file name with permission bits perm.
func (a *Archive) File(name string, perm uint32, data []byte) {
	a.c.add(name, 0o100000|perm&0o7777, data)
}

// CharDev adds the character device name.
func (a *Archive) CharDev(name string, major, minor int) { a.c.addNode(name, 0o20600, major, minor) }

// Bytes ends the archive and returns it.
func (a *Archive) Bytes() []byte { return a.c.close() }

// Kernel returns the newest kernel in /boot, or an error saying what to
// install.
func Kernel() (string, error) {
	kernels, _ := filepath.Glob("/boot/vmlinuz-*")
	if len(kernels) == 0 {
		return "", errors.New("vmtest: no kernel in /boot (apt-get install linux-image-amd64)")
	}
	sort.Strings(kernels)
	return kernels[len(kernels)-1], nil
}
