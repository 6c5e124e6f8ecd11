package vm_test

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/driver/drivertest"
	"github.com/berth-dev/berth/drivers/vm"
)

// TestConformance runs the suite on two nodes that are this machine's
// daemon, one over its unix socket and one through sshd. The image
// "preload" is on the first only (the second has it at a path that does
// not exist yet), for the suite's Preload to copy.
func TestConformance(t *testing.T) {
	o := options(t)
	h := startSSHD(t)
	o.Nodes = []vm.NodeConfig{
		{Name: "local"},
		{Name: "remote", URI: "qemu+ssh://root@" + h.addr + "/system", SSHKey: h.key, KnownHosts: h.knownHosts},
	}
	g := o.Images["guest"]
	preloaded := filepath.Join(filepath.Dir(o.StorageDir), "preloaded")
	t.Cleanup(func() { dropPools(t, preloaded) })
	o.Images["preload"] = vm.Image{ImageFiles: g.ImageFiles, Cmdline: g.Cmdline, Nodes: map[string]vm.ImageFiles{
		"remote": {Kernel: g.Kernel, Initrd: filepath.Join(preloaded, "initrd.cpio")},
	}}
	drivertest.Run(t, drivertest.Harness{
		Open: func(t *testing.T) driver.Driver { return open(t, o) },
		Spec: helloSpec,
		MissingImage: func() *driver.Spec {
			sp := helloSpec()
			sp.Image = "missing"
			return sp
		},
		PreloadImage: "preload",
		Parallel:     2,
		Timeout:      3 * time.Minute,
	})
}
