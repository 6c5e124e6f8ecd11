package local

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"slices"
	"strings"
	"syscall"

	"github.com/berth-dev/berth/driver"
)

// An instance's files, for StatPath, CopyFrom and CopyTo, are those under
// its working directory: the spec's WorkingDir, else <instance dir>/work
// (which counts as the instance user's own: copies into it are let in,
// whatever its mode; never the host's "/", where a process of a spec with
// a user and no WorkingDir runs).
// A path names a file there, "/" the directory itself ("/etc/x" is
// <working dir>/etc/x). A path with a ".." element, and a symbolic link
// that leads out of the directory, are ErrInvalid: nothing outside is
// read or written. The files are read and written for the instance's
// user: what its owner, group and mode bits (its primary group only) do
// not let that user read or write is ErrInvalid; what is written belongs
// to that user, or with CopyUIDGID to the archive's owners. Regular
// files, directories, symbolic and hard links are copied; other entries
// of an archive are ErrUnsupported.

// archiveRoot opens the working directory of instance id and returns it
// with the credential the instance runs with (nil: the server's own) and
// whether the directory is the one Berth made for it.
func (d *Driver) archiveRoot(id string) (root *os.Root, cred *syscall.Credential, own bool, err error) {
	if err := d.checkOpen(); err != nil {
		return nil, nil, false, err
	}
	unlock := d.locks.lock(id)
	rec, _, err := d.refresh(id)
	unlock()
	if err != nil {
		return nil, nil, false, err
	}
	if cred, err = d.credential(rec.Spec); err != nil {
		return nil, nil, false, err
	}
	dir := rec.Spec.WorkingDir
	if own = dir == ""; own {
		dir = d.workDir(id)
	}
	if root, err = os.OpenRoot(dir); err != nil {
		return nil, nil, false, fileErr(id, "/", err)
	}
	return root, cred, own, nil
}

// relPath maps an instance's path to one relative to its working
// directory, refusing ".." elements.
func relPath(p string) (string, error) {
	if slices.Contains(strings.Split(p, "/"), "..") {
		return "", &driver.FieldError{Path: "path", Reason: fmt.Sprintf("%q: a path with \"..\" is refused", p)}
	}
	rel := strings.TrimPrefix(path.Clean("/"+p), "/")
	if rel == "" {
		rel = "."
	}
	return rel, nil
}

// fileErr classifies an error of the file p of instance id.
func fileErr(id, p string, err error) error {
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return driver.Errorf(driver.ErrNotFound, "Could not find the file %s in instance %s", p, id)
	case strings.Contains(err.Error(), "escapes from parent"):
		return &driver.FieldError{Path: "path", Reason: fmt.Sprintf("%s: a symbolic link leads out of the instance's working directory", p)}
	case errors.Is(err, fs.ErrPermission):
		return &driver.FieldError{Path: "path", Reason: fmt.Sprintf("%s: permission denied", p)}
	}
	return fmt.Errorf("instance %s: %s: %w", id, p, err)
}

// allowed reports whether cred's user may read (bit 4) or write (bit 2)
// the file fi by its owner, group and mode.
func allowed(fi fs.FileInfo, cred *syscall.Credential, bit uint32) bool {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if cred == nil || cred.Uid == 0 || !ok {
		return true // the server's own user: the system checks
	}
	mode := uint32(fi.Mode().Perm())
	switch {
	case st.Uid == cred.Uid:
		return mode>>6&bit != 0
	case st.Gid == cred.Gid:
		return mode>>3&bit != 0
	}
	return mode&bit != 0
}

// statOf describes fi, a symbolic link's target read from root.
func statOf(root *os.Root, rel string, fi fs.FileInfo) driver.PathStat {
	st := driver.PathStat{Name: fi.Name(), Size: fi.Size(), Mode: fi.Mode(), ModTime: fi.ModTime()}
	if rel == "." {
		st.Name = "/"
	}
	if fi.Mode()&fs.ModeSymlink != 0 {
		st.LinkTarget, _ = root.Readlink(rel)
	}
	return st
}

// StatPath describes a file under the instance's working directory.
func (d *Driver) StatPath(ctx context.Context, id, p string) (driver.PathStat, error) {
	rel, err := relPath(p)
	if err != nil {
		return driver.PathStat{}, err
	}
	root, _, _, err := d.archiveRoot(id)
	if err != nil {
		return driver.PathStat{}, err
	}
	defer root.Close()
	fi, err := root.Lstat(rel)
	if err != nil {
		return driver.PathStat{}, fileErr(id, p, err)
	}
	return statOf(root, rel, fi), nil
}

// CopyFrom writes a tar archive of a file or directory under the
// instance's working directory to w, entries named from its base name.
func (d *Driver) CopyFrom(ctx context.Context, id, p string, w io.Writer) (driver.PathStat, error) {
	rel, err := relPath(p)
	if err != nil {
		return driver.PathStat{}, err
	}
	root, cred, _, err := d.archiveRoot(id)
	if err != nil {
		return driver.PathStat{}, err
	}
	defer root.Close()
	fi, err := root.Lstat(rel)
	if err != nil {
		return driver.PathStat{}, fileErr(id, p, err)
	}
	base := path.Base(rel)
	if rel == "." {
		base = "."
	}
	tw := tar.NewWriter(w)
	err = fs.WalkDir(root.FS(), rel, func(name string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		return addEntry(tw, root, cred, name, path.Join(base, strings.TrimPrefix(strings.TrimPrefix(name, rel), "/")))
	})
	if err == nil {
		err = tw.Close()
	}
	if err != nil {
		var fe *driver.FieldError
		if errors.As(err, &fe) || ctx.Err() != nil {
			return driver.PathStat{}, err
		}
		return driver.PathStat{}, fileErr(id, p, err)
	}
	return statOf(root, rel, fi), nil
}

// addEntry writes the file name of root to tw as the entry as.
func addEntry(tw *tar.Writer, root *os.Root, cred *syscall.Credential, name, as string) error {
	fi, err := root.Lstat(name)
	if err != nil {
		return err
	}
	if !allowed(fi, cred, 4) {
		return &driver.FieldError{Path: "path", Reason: fmt.Sprintf("/%s: the instance's user may not read it", name)}
	}
	link := ""
	if fi.Mode()&fs.ModeSymlink != 0 {
		if link, err = root.Readlink(name); err != nil {
			return err
		}
	}
	hdr, err := tar.FileInfoHeader(fi, link)
	if err != nil {
		return err
	}
	hdr.Name = as
	if fi.IsDir() {
		hdr.Name += "/"
	}
	if err := tw.WriteHeader(hdr); err != nil {
		return err
	}
	if !fi.Mode().IsRegular() {
		return nil
	}
	f, err := root.Open(name)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = io.CopyN(tw, f, hdr.Size)
	return err
}

// CopyTo unpacks a tar archive into a directory under the instance's
// working directory.
func (d *Driver) CopyTo(ctx context.Context, id, dir string, r io.Reader, opts driver.CopyToOptions) error {
	rel, err := relPath(dir)
	if err != nil {
		return err
	}
	root, cred, own, err := d.archiveRoot(id)
	if err != nil {
		return err
	}
	defer root.Close()
	fi, err := root.Stat(rel)
	switch {
	case err != nil:
		return fileErr(id, dir, err)
	case !fi.IsDir():
		return &driver.FieldError{Path: "path", Reason: fmt.Sprintf("%s is not a directory", dir)}
	case !(own && rel == ".") && !allowed(fi, cred, 2):
		return &driver.FieldError{Path: "path", Reason: fmt.Sprintf("%s: the instance's user may not write to it", dir)}
	}
	tr := tar.NewReader(r)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return &driver.FieldError{Path: "archive", Reason: err.Error()}
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := unpack(root, cred, rel, hdr, tr, opts); err != nil {
			var fe *driver.FieldError
			if errors.As(err, &fe) || errors.Is(err, driver.ErrUnsupported) {
				return err
			}
			return fileErr(id, "/"+path.Join(rel, hdr.Name), err)
		}
	}
}

// unpack writes one entry of an archive under dir of root.
func unpack(root *os.Root, cred *syscall.Credential, dir string, hdr *tar.Header, r io.Reader, opts driver.CopyToOptions) error {
	name := path.Clean(hdr.Name)
	if path.IsAbs(name) || name == ".." || strings.HasPrefix(name, "../") {
		return &driver.FieldError{Path: "archive", Reason: fmt.Sprintf("entry %q leaves the directory", hdr.Name)}
	}
	if name == "." {
		if hdr.Typeflag != tar.TypeDir {
			return &driver.FieldError{Path: "archive", Reason: fmt.Sprintf("entry %q would replace the directory copied into", hdr.Name)}
		}
		return nil // the directory copied into is left as it is
	}
	target := path.Join(dir, name)
	if old, err := root.Lstat(target); err == nil {
		if opts.NoOverwriteDirNonDir && old.IsDir() != (hdr.Typeflag == tar.TypeDir) {
			return &driver.FieldError{Path: "archive", Reason: fmt.Sprintf("entry %q would replace a directory with a non-directory or the other way round", hdr.Name)}
		}
		if !old.IsDir() || hdr.Typeflag != tar.TypeDir {
			if err := root.RemoveAll(target); err != nil {
				return err
			}
		}
	}
	if err := root.MkdirAll(path.Dir(target), 0o755); err != nil {
		return err
	}
	mode := fs.FileMode(hdr.Mode).Perm()
	switch hdr.Typeflag {
	case tar.TypeDir:
		if err := root.MkdirAll(target, mode); err != nil {
			return err
		}
	case tar.TypeReg:
		f, err := root.OpenFile(target, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, mode)
		if err != nil {
			return err
		}
		_, err = io.Copy(f, r)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return err
		}
	case tar.TypeSymlink:
		if err := root.Symlink(hdr.Linkname, target); err != nil {
			return err
		}
	case tar.TypeLink:
		src := path.Clean(hdr.Linkname)
		if path.IsAbs(src) || src == ".." || strings.HasPrefix(src, "../") {
			return &driver.FieldError{Path: "archive", Reason: fmt.Sprintf("entry %q links to %q, outside the directory", hdr.Name, hdr.Linkname)}
		}
		if err := root.Link(path.Join(dir, src), target); err != nil {
			return err
		}
	default:
		return driver.Errorf(driver.ErrUnsupported, "archive entry %q of type %q: the local driver copies files, directories and links only", hdr.Name, string(hdr.Typeflag))
	}
	switch {
	case opts.CopyUIDGID:
		return root.Lchown(target, hdr.Uid, hdr.Gid)
	case cred != nil:
		return root.Lchown(target, int(cred.Uid), int(cred.Gid))
	}
	return nil
}

var _ driver.Archiver = (*Driver)(nil)
