package vm

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/digitalocean/go-libvirt"

	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/drivers/vm/vmtest"
)

// BenchmarkLaunch20 launches 20 test guests, 4 at a time, each until it
// writes its ready line, twice: straight through libvirt (the domain XML
// the driver would write, the config drive written to the storage
// directory, define, start, the console file read every 100 ms) and
// through the driver (Create, driven to its end). It reports both times
// and their ratio; it asserts nothing about them. The two take turns at
// going first. Run it alone:
//
//	go test -run '^$' -bench Launch20 -benchtime 1x ./drivers/vm
func BenchmarkLaunch20(b *testing.B) {
	const total, parallel = 20, 4
	dir, err := os.MkdirTemp("", "berth-vm-bench-")
	if err != nil {
		b.Fatal(err)
	}
	defer os.RemoveAll(dir)
	if err := os.Chmod(dir, 0o755); err != nil {
		b.Fatal(err)
	}
	home, _ := os.UserHomeDir()
	g, err := vmtest.Build(filepath.Join(home, ".cache", "berth", "vm-guest"))
	if err != nil {
		b.Fatal(err)
	}
	initrd := filepath.Join(dir, "initrd.cpio")
	data, err := os.ReadFile(g.Initrd)
	if err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(initrd, data, 0o644); err != nil {
		b.Fatal(err)
	}
	kernel := g.Kernel
	if g.Compressed == "" {
		// The image is in the cache, which the QEMU user may not read.
		kernel = filepath.Join(dir, "vmlinux")
		if err := os.Link(g.Kernel, kernel); err != nil {
			data, err := os.ReadFile(g.Kernel)
			if err != nil {
				b.Fatal(err)
			}
			if err := os.WriteFile(kernel, data, 0o644); err != nil {
				b.Fatal(err)
			}
		}
	} else {
		b.Log(g.Compressed)
	}
	o := *DefaultOptions()
	o.StorageDir = filepath.Join(dir, "instances")
	o.Network = "none"
	o.DomainType = "qemu"
	o.BootTimeout = 5 * time.Minute
	o.CPUOvercommit = 16 // the 20 guests stay until the end of the batch
	o.Images = map[string]Image{"guest": {ImageFiles: ImageFiles{Kernel: kernel, Initrd: initrd}, Cmdline: g.Cmdline}}
	d, err := New(context.Background(), o, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer d.Close(context.Background())
	n := d.nodes[0]
	ctx := context.Background()
	defer d.call(ctx, n, "drop pools", func(lv *libvirt.Libvirt) error {
		for _, p := range []string{dir, o.StorageDir} {
			if pool, err := lv.StoragePoolLookupByTargetPath(p); err == nil {
				_ = lv.StoragePoolDestroy(pool)
			}
		}
		return nil
	})
	spec := func(name string) *driver.Spec {
		return &driver.Spec{Name: name, Kind: driver.KindVM, Image: "guest", UserData: "echo hello\n",
			Resources: driver.Resources{CPU: 500, Memory: 96 * driver.MiB},
			Tags:      map[string]string{driver.TagManaged: "true", driver.TagCluster: "bench"}}
	}
	// run launches total guests, parallel at a time, and returns how long
	// it took; the guests are removed afterwards, untimed.
	run := func(launch func(i int) error, remove func(i int)) time.Duration {
		sem := make(chan struct{}, parallel)
		var wg sync.WaitGroup
		errs := make(chan error, total)
		start := time.Now()
		for i := range total {
			wg.Add(1)
			sem <- struct{}{}
			go func() {
				defer wg.Done()
				defer func() { <-sem }()
				if err := launch(i); err != nil {
					errs <- err
				}
			}()
		}
		wg.Wait()
		took := time.Since(start)
		for i := range total {
			remove(i)
		}
		close(errs)
		for err := range errs {
			b.Fatal(err)
		}
		return took
	}
	for iter := 0; iter < b.N; iter++ {
		// Straight through libvirt.
		lv, err := n.conn(ctx)
		if err != nil {
			b.Fatal(err)
		}
		if err := os.MkdirAll(o.StorageDir, 0o755); err != nil {
			b.Fatal(err)
		}
		plans := make([]*plan, total)
		viaLibvirt := func() time.Duration {
			return run(func(i int) error {
				sp := spec(fmt.Sprintf("bench-direct-%d-%d", iter, i))
				p, x, err := d.prepare(n, o.Images["guest"], sp)
				if err != nil {
					return err
				}
				plans[i] = p
				img, err := configDriveImage(uuidString(p.uuid), sp)
				if err != nil {
					return err
				}
				if err := os.WriteFile(p.path(configDrive), img, 0o644); err != nil {
					return err
				}
				dom, err := lv.DomainDefineXMLFlags(x, 0)
				if err != nil {
					return err
				}
				if err := lv.DomainCreate(dom); err != nil {
					return err
				}
				deadline := time.Now().Add(o.BootTimeout)
				for time.Now().Before(deadline) {
					if b, _ := os.ReadFile(p.path(consoleLog)); hasLine(b, "ready") {
						return nil
					}
					time.Sleep(readyPoll)
				}
				return fmt.Errorf("%s: no ready line", sp.Name)
			}, func(i int) {
				if p := plans[i]; p != nil {
					dom := libvirt.Domain{Name: p.domName, UUID: p.uuid}
					_ = lv.DomainDestroy(dom)
					_ = lv.DomainUndefine(dom)
					for _, f := range instanceFiles {
						os.Remove(p.path(f))
					}
				}
			})
		}

		// Through the driver.
		ids := make([]string, total)
		viaDriver := func() time.Duration {
			return run(func(i int) error {
				op, err := d.Create(ctx, "local", spec(fmt.Sprintf("bench-berth-%d-%d", iter, i)))
				if err != nil {
					return err
				}
				inst, err := driver.Drive(ctx, op)
				if err != nil {
					return err
				}
				ids[i] = inst.ID
				return nil
			}, func(i int) {
				if ids[i] == "" {
					return
				}
				if op, err := d.Delete(ctx, ids[i]); err == nil {
					_, _ = driver.Drive(ctx, op)
				}
			})
		}
		// Each goes first every other time: the first batch boots on a
		// colder host.
		var direct, berth time.Duration
		if iter%2 == 0 {
			direct, berth = viaLibvirt(), viaDriver()
		} else {
			berth, direct = viaDriver(), viaLibvirt()
		}
		b.ReportMetric(direct.Seconds(), "s-direct")
		b.ReportMetric(berth.Seconds(), "s-berth")
		b.ReportMetric(berth.Seconds()/direct.Seconds(), "ratio")
		b.Logf("round %d: 20 guests, 4 at a time: %s straight through libvirt, %s through the driver (ratio %.2f)", iter, direct.Round(time.Millisecond), berth.Round(time.Millisecond), berth.Seconds()/direct.Seconds())
	}
}
