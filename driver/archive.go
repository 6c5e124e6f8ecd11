package driver

import (
	"context"
	"io"
	"io/fs"
	"time"
)

// Archiver copies files into and out of an instance, as docker cp does.
// Paths are absolute in the instance's file system (a driver whose
// instances have none of their own says what they are relative to, and
// refuses a path that leaves it with ErrInvalid naming the field "path").
// A path that does not exist is ErrNotFound; an instance with no file
// system to read (not created yet, removed) is ErrPermanent.
//
// StatPath describes the file at path without following a last symbolic
// link.
//
// CopyFrom writes a tar archive of path to w: the file, or the directory
// and everything under it, named in the archive by path's last element.
// It returns path's description (as StatPath) once the archive is written.
//
// CopyTo unpacks the tar archive read from r into the directory dir, which
// must exist (ErrNotFound otherwise; a file that is not a directory is
// ErrInvalid). Entries that would leave dir are ErrInvalid. With
// opts.NoOverwriteDirNonDir, replacing a directory with a non-directory or
// the other way round is ErrInvalid. The files belong to the instance's
// user unless opts.CopyUIDGID keeps the archive's owners.
//
// Fallback: ErrUnsupported.
type Archiver interface {
	StatPath(ctx context.Context, id, path string) (PathStat, error)
	CopyFrom(ctx context.Context, id, path string, w io.Writer) (PathStat, error)
	CopyTo(ctx context.Context, id, dir string, r io.Reader, opts CopyToOptions) error
}

// PathStat describes a file in an instance.
type PathStat struct {
	// Name is the file's base name.
	Name string `json:"name"`
	Size int64  `json:"size"`
	// Mode holds the file's type and permission bits.
	Mode    fs.FileMode `json:"mode"`
	ModTime time.Time   `json:"mtime"`
	// LinkTarget is where a symbolic link points, "" for other files.
	LinkTarget string `json:"linkTarget"`
}

// CopyToOptions qualify a CopyTo.
type CopyToOptions struct {
	// NoOverwriteDirNonDir refuses to replace a directory with a
	// non-directory and the other way round.
	NoOverwriteDirNonDir bool
	// CopyUIDGID keeps the owners the archive gives its entries.
	CopyUIDGID bool
}

// Topper lists the processes running in an instance, as docker top does.
//
// Top returns the column titles and one row per process of the running
// instance id. psArgs are options of ps(1) choosing the columns ("" for
// the back-end's default); a driver that reads the processes itself
// rather than running ps refuses options it does not implement with
// ErrUnsupported naming them. An instance that is not running is
// ErrPermanent.
//
// Fallback: ErrUnsupported.
type Topper interface {
	Top(ctx context.Context, id, psArgs string) (*Processes, error)
}

// Processes are an instance's processes as Top lists them: the titles of
// the columns and one row of values per process.
type Processes struct {
	Titles []string   `json:"titles"`
	Rows   [][]string `json:"rows"`
}
