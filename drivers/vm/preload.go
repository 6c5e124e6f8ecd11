package vm

import (
	"context"
	"fmt"

	"github.com/digitalocean/go-libvirt"

	"github.com/berth-dev/berth/driver"
)

// Preload copies the files of image to each of nodes (every node when
// nodes is empty) that lacks them, at the paths the image has there, from
// a node that has them: the bytes flow from one daemon's storage volume
// download to the other's upload, through the driver. A node that has
// every file is reported "present"; a copy cut short is removed, so a
// file is present only whole. The copy is bounded by ctx alone.
func (d *Driver) Preload(ctx context.Context, image string, nodes []string, progress func(driver.PreloadProgress)) error {
	im, ok := d.opts.Images[image]
	if !ok {
		return driver.Errorf(driver.ErrPermanent, "vm: image %q is not registered (register it under the option images)", image)
	}
	report := func(p driver.PreloadProgress) {
		if progress != nil {
			p.Image = image
			progress(p)
		}
	}
	var targets []*node
	for _, name := range nodes {
		n, err := d.node(name)
		if err != nil {
			return err
		}
		targets = append(targets, n)
	}
	if len(nodes) == 0 {
		targets = d.nodes
	}
	for _, t := range targets {
		if err := d.preloadOn(ctx, im, image, t, report); err != nil {
			report(driver.PreloadProgress{Node: t.cfg.Name, Status: "failed", Err: err.Error()})
			return err
		}
	}
	return nil
}

// preloadOn copies to node t the files of im it lacks.
func (d *Driver) preloadOn(ctx context.Context, im Image, image string, t *node, report func(driver.PreloadProgress)) error {
	want := im.files(t.cfg.Name)
	copied := false
	for _, kind := range []string{"disk", "kernel", "initrd"} {
		path := want.path(kind)
		if path == "" {
			continue
		}
		var missing bool
		err := d.call(ctx, t, "look for "+path, func(lv *libvirt.Libvirt) error {
			_, err := statFile(lv, path)
			missing = isLibvirt(err, libvirt.ErrNoStorageVol)
			if missing {
				return nil
			}
			return err
		})
		if err != nil {
			return err
		}
		if !missing {
			continue
		}
		src, from, err := d.source(ctx, im, t, kind)
		if err != nil {
			return err
		}
		report(driver.PreloadProgress{Node: t.cfg.Name, Status: "copying"})
		err = d.callLong(ctx, t, "upload "+path, func(dst *libvirt.Libvirt) error {
			return d.callLong(ctx, src, "download "+from, func(sl *libvirt.Libvirt) error {
				return copyFile(ctx, src, sl, dst, from, path, func(done, total int64) {
					report(driver.PreloadProgress{Node: t.cfg.Name, Status: "copying", Current: done, Total: total})
				})
			})
		})
		if err != nil {
			return fmt.Errorf("vm: preload %s on node %s: copy %s from node %s: %w", image, t.cfg.Name, from, src.cfg.Name, err)
		}
		copied = true
	}
	if copied {
		report(driver.PreloadProgress{Node: t.cfg.Name, Status: "done"})
	} else {
		report(driver.PreloadProgress{Node: t.cfg.Name, Status: "present"})
	}
	return nil
}

// source is a node other than t that has the image's file of kind, and
// its path there.
func (d *Driver) source(ctx context.Context, im Image, t *node, kind string) (*node, string, error) {
	for _, n := range d.nodes {
		if n == t {
			continue
		}
		path := im.files(n.cfg.Name).path(kind)
		if path == "" {
			continue
		}
		err := d.call(ctx, n, "look for "+path, func(lv *libvirt.Libvirt) error {
			_, err := statFile(lv, path)
			return err
		})
		if err == nil {
			return n, path, nil
		}
	}
	return nil, "", driver.Errorf(driver.ErrPermanent, "vm: preload on node %s: no other node has the image's %s", t.cfg.Name, kind)
}

// path is the file of kind: disk, kernel or initrd.
func (f ImageFiles) path(kind string) string {
	switch kind {
	case "disk":
		return f.Disk
	case "kernel":
		return f.Kernel
	case "initrd":
		return f.Initrd
	}
	return ""
}

var _ driver.Preloader = (*Driver)(nil)
