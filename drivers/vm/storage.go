package vm

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"time"

	"github.com/digitalocean/go-libvirt"
	"libvirt.org/go/libvirtxml"
)

// Every file of a node, images as well as each guest's overlay, config
// drive and serial logs, is reached through the node's daemon, as a volume
// of a directory storage pool: the driver never opens a host's files
// itself, so a host reached over ssh or TLS needs nothing but its daemon.
// A directory that no pool has as its target gets a transient pool of the
// driver's (named berth-<hash of the path>), made on first use and gone
// when the daemon restarts (then it is made again).

// poolName is the name of the pool the driver makes for dir.
func poolName(dir string) string {
	sum := sha256.Sum256([]byte(dir))
	return "berth-" + hex.EncodeToString(sum[:6])
}

func isLibvirt(err error, code libvirt.ErrorNumber) bool {
	var le libvirt.Error
	return errors.As(err, &le) && libvirt.ErrorNumber(le.Code) == code
}

// dirPool returns the active pool whose target is dir: an existing pool
// (started when it is not), or a transient one the driver makes, with the
// directory when build is set.
func dirPool(lv *libvirt.Libvirt, dir string, build bool) (libvirt.StoragePool, error) {
	p, err := lv.StoragePoolLookupByTargetPath(dir)
	if err == nil {
		if active, err := lv.StoragePoolIsActive(p); err == nil && active == 0 {
			if err := lv.StoragePoolCreate(p, 0); err != nil {
				return p, err
			}
		}
		return p, nil
	}
	if !isLibvirt(err, libvirt.ErrNoStoragePool) {
		return p, err
	}
	x, err := (&libvirtxml.StoragePool{
		Type:   "dir",
		Name:   poolName(dir),
		Target: &libvirtxml.StoragePoolTarget{Path: dir, Permissions: &libvirtxml.StoragePoolTargetPermissions{Mode: "0711"}},
	}).Marshal()
	if err != nil {
		return p, err
	}
	flags := libvirt.StoragePoolCreateNormal
	if build {
		flags = libvirt.StoragePoolCreateWithBuild
	}
	p, err = lv.StoragePoolCreateXML(x, flags)
	if err != nil {
		// Another call made it meanwhile, or is making it: libvirt finds
		// a pool by its target once it is active, by its name as soon as
		// the name is taken (the maker holds it until it is started).
		if p2, err2 := lv.StoragePoolLookupByTargetPath(dir); err2 == nil {
			return p2, nil
		}
		if p2, err2 := lv.StoragePoolLookupByName(poolName(dir)); err2 == nil {
			if active, err3 := lv.StoragePoolIsActive(p2); err3 == nil && active == 1 {
				return p2, nil
			}
		}
		if !build && (isLibvirt(err, libvirt.ErrInternalError) || isLibvirt(err, libvirt.ErrSystemError)) {
			// The directory does not exist: no file is there.
			return p, libvirt.Error{Code: uint32(libvirt.ErrNoStorageVol), Message: "no directory " + dir}
		}
	}
	return p, err
}

// volume returns the volume of the file at path. A file the pool does not
// know yet (made outside libvirt) is found after a refresh of the pool; a
// missing one is libvirt's ErrNoStorageVol.
func volume(lv *libvirt.Libvirt, path string) (libvirt.StorageVol, error) {
	p, err := dirPool(lv, filepath.Dir(path), false)
	if err != nil {
		return libvirt.StorageVol{}, err
	}
	v, err := lv.StorageVolLookupByName(p, filepath.Base(path))
	if isLibvirt(err, libvirt.ErrNoStorageVol) {
		// A refresh fails while the pool has uploads in flight; the
		// second look answers then with what the pool knows.
		_ = lv.StoragePoolRefresh(p, 0)
		v, err = lv.StorageVolLookupByName(p, filepath.Base(path))
	}
	return v, err
}

// fileInfo is what a volume's daemon tells of a file.
type fileInfo struct {
	size     int64
	modified time.Time
}

// statFile returns the size and modification time of the file at path;
// a missing file is ErrNoStorageVol.
func statFile(lv *libvirt.Libvirt, path string) (fileInfo, error) {
	v, err := volume(lv, path)
	if err != nil {
		return fileInfo{}, err
	}
	// GetXMLDesc reads the file afresh: a file removed behind libvirt's
	// back fails here.
	s, err := lv.StorageVolGetXMLDesc(v, 0)
	if err != nil {
		if isLibvirt(err, libvirt.ErrNoStorageVol) || isLibvirt(err, libvirt.ErrSystemError) || isLibvirt(err, libvirt.ErrInternalError) {
			return fileInfo{}, libvirt.Error{Code: uint32(libvirt.ErrNoStorageVol), Message: "no file " + path}
		}
		return fileInfo{}, err
	}
	var x libvirtxml.StorageVolume
	if err := x.Unmarshal(s); err != nil {
		return fileInfo{}, err
	}
	var fi fileInfo
	if x.Capacity != nil {
		fi.size = int64(x.Capacity.Value)
	}
	if x.Physical != nil && x.Physical.Value > 0 {
		fi.size = int64(x.Physical.Value)
	}
	if x.Target != nil && x.Target.Timestamps != nil {
		fi.modified = parseStamp(x.Target.Timestamps.Mtime)
	}
	return fi, nil
}

// parseStamp reads a volume's time stamp, seconds.nanoseconds.
func parseStamp(s string) time.Time {
	var sec, nsec int64
	if n, _ := fmt.Sscanf(s, "%d.%d", &sec, &nsec); n == 0 {
		return time.Time{}
	}
	return time.Unix(sec, nsec)
}

// volumeXML describes a file to make: raw or qcow2, of capacity bytes,
// readable by all (the guest's own files are given to the QEMU user by
// libvirt when the guest starts), over backing when it is set.
func volumeXML(name, format string, capacity int64, backing *ImageFiles) (string, error) {
	v := &libvirtxml.StorageVolume{
		Name:     name,
		Capacity: &libvirtxml.StorageVolumeSize{Value: uint64(capacity), Unit: "bytes"},
		Target: &libvirtxml.StorageVolumeTarget{
			Format:      &libvirtxml.StorageVolumeTargetFormat{Type: format},
			Permissions: &libvirtxml.StorageVolumeTargetPermissions{Mode: "0644"},
		},
	}
	if backing != nil {
		bf := backing.Format
		if bf == "" {
			bf = "qcow2"
		}
		v.BackingStore = &libvirtxml.StorageVolumeBackingStore{Path: backing.Disk, Format: &libvirtxml.StorageVolumeTargetFormat{Type: bf}}
		if capacity == 0 {
			v.Capacity = nil
		}
	}
	return v.Marshal()
}

// makeFile makes the file at path in its directory's pool (making both
// when needed) and writes data into it, when data is not nil.
func makeFile(lv *libvirt.Libvirt, path, format string, capacity int64, backing *ImageFiles, data []byte) error {
	p, err := dirPool(lv, filepath.Dir(path), true)
	if err != nil {
		return err
	}
	x, err := volumeXML(filepath.Base(path), format, capacity, backing)
	if err != nil {
		return err
	}
	v, err := lv.StorageVolCreateXML(p, x, 0)
	if err != nil {
		return err
	}
	if len(data) > 0 {
		if err := lv.StorageVolUpload(v, bytes.NewReader(data), 0, uint64(len(data)), 0); err != nil {
			return err
		}
	}
	return nil
}

// readFile reads the file at path from offset from to its end and keeps
// the first limit bytes of what it read (the last limit bytes of the file
// when from is negative). It returns them and the offset that follows
// them. A missing file reads as empty.
func readFile(ctx context.Context, n *node, lv *libvirt.Libvirt, path string, from, limit int64) ([]byte, int64, error) {
	v, err := volume(lv, path)
	if isLibvirt(err, libvirt.ErrNoStorageVol) {
		return nil, 0, nil
	}
	if err != nil {
		return nil, 0, err
	}
	w := &capped{limit: limit, tail: from < 0}
	if from < 0 {
		// The size libvirt knows is a hint only: what was written since
		// is read too.
		_, size, _, err := lv.StorageVolGetInfo(v)
		if err != nil {
			return nil, 0, err
		}
		from = max(int64(size)-limit, 0)
	}
	if err := n.download(ctx, v, uint64(from), 0, w); err != nil {
		return nil, from, err
	}
	if w.tail {
		if int64(len(w.b)) > limit {
			w.b = w.b[int64(len(w.b))-limit:]
		}
		return w.b, from + w.total, nil
	}
	return w.b, from + int64(len(w.b)), nil
}

// capped keeps the first limit bytes written to it, or with tail set the
// last ones (and at most twice limit meanwhile).
type capped struct {
	b     []byte
	limit int64
	total int64
	tail  bool
}

func (c *capped) Write(p []byte) (int, error) {
	c.total += int64(len(p))
	switch {
	case c.tail:
		c.b = append(c.b, p...)
		if int64(len(c.b)) > 2*c.limit {
			c.b = append([]byte(nil), c.b[int64(len(c.b))-c.limit:]...)
		}
	case int64(len(c.b)) < c.limit:
		c.b = append(c.b, p[:min(int64(len(p)), c.limit-int64(len(c.b)))]...)
	}
	return len(p), nil
}

// removeFile deletes the file at path; a missing one is not an error.
func removeFile(lv *libvirt.Libvirt, path string) error {
	v, err := volume(lv, path)
	if err == nil {
		err = lv.StorageVolDelete(v, 0)
	}
	if isLibvirt(err, libvirt.ErrNoStorageVol) {
		return nil
	}
	return err
}

// copyFile streams the file at from on one daemon into a new file at to on
// another (or the same), through the driver; a copy cut short is removed.
// report is told of the bytes copied so far.
func copyFile(ctx context.Context, sn *node, src, dst *libvirt.Libvirt, from, to string, report func(done, total int64)) error {
	sv, err := volume(src, from)
	if err != nil {
		return err
	}
	_, size, _, err := src.StorageVolGetInfo(sv)
	if err != nil {
		return err
	}
	if err := makeFile(dst, to, "raw", int64(size), nil, nil); err != nil {
		return err
	}
	dv, err := volume(dst, to)
	if err != nil {
		return err
	}
	pr, pw := io.Pipe()
	down := make(chan error, 1)
	go func() {
		err := sn.download(ctx, sv, 0, size, &progressWriter{w: pw, total: int64(size), report: report})
		pw.CloseWithError(err)
		down <- err
	}()
	err = dst.StorageVolUpload(dv, pr, 0, size, 0)
	pr.CloseWithError(errors.New("upload over"))
	if derr := <-down; err == nil {
		err = derr
	}
	if err != nil {
		_ = dst.StorageVolDelete(dv, 0)
	}
	return err
}

// progressWriter counts what passes and reports it every 16 MiB.
type progressWriter struct {
	w           io.Writer
	done, total int64
	last        int64
	report      func(done, total int64)
}

func (p *progressWriter) Write(b []byte) (int, error) {
	n, err := p.w.Write(b)
	p.done += int64(n)
	if p.report != nil && (p.done-p.last >= 16<<20 || p.done == p.total) {
		p.last = p.done
		p.report(p.done, p.total)
	}
	return n, err
}
