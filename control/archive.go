package control

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/provider"
)

// Bounds of a copy in or out of an instance and of a process listing: how
// long a path and ps's options may be, and how many bytes one archive may
// carry either way.
const (
	MaxArchivePath  = 4096
	MaxArchiveBytes = 1 << 30
	MaxTopArgs      = 256
)

// StatPath describes the file at path in the instance ref through its
// provider (driver.Archiver). A path out of bounds (CheckArchivePath) is
// driver.ErrInvalid naming the field; a provider that cannot copy answers
// driver.ErrUnsupported naming the provider and its driver.
func (p *Plane) StatPath(ctx context.Context, ref, path string) (driver.PathStat, error) {
	id, prov, err := p.archiver(ref, path)
	if err != nil {
		return driver.PathStat{}, err
	}
	return prov.StatPath(ctx, id, path)
}

// CopyFrom writes a tar archive of path in the instance ref to w and
// returns path's description, as StatPath checks and refuses. An archive
// of more than MaxArchiveBytes is cut there and the copy fails with
// driver.ErrInvalid: w has then received a truncated archive.
func (p *Plane) CopyFrom(ctx context.Context, ref, path string, w io.Writer) (driver.PathStat, error) {
	id, prov, err := p.archiver(ref, path)
	if err != nil {
		return driver.PathStat{}, err
	}
	return prov.CopyFrom(ctx, id, path, &capWriter{w: w, left: MaxArchiveBytes, path: path})
}

// CopyTo unpacks the tar archive r into the directory dir of the instance
// ref, as StatPath checks and refuses. An archive of more than
// MaxArchiveBytes is driver.ErrInvalid once that much has been read; what
// the back-end unpacked before stays.
func (p *Plane) CopyTo(ctx context.Context, ref, dir string, r io.Reader, opts driver.CopyToOptions) error {
	id, prov, err := p.archiver(ref, dir)
	if err != nil {
		return err
	}
	return prov.CopyTo(ctx, id, dir, &capReader{r: r, left: MaxArchiveBytes}, opts)
}

// Top lists the processes of the running instance ref through its
// provider (driver.Topper), psArgs as ps(1)'s options. Options longer
// than MaxTopArgs or holding a NUL byte are driver.ErrInvalid naming the
// field; a provider that cannot list them answers driver.ErrUnsupported
// naming the provider and its driver.
func (p *Plane) Top(ctx context.Context, ref, psArgs string) (*driver.Processes, error) {
	if len(psArgs) > MaxTopArgs {
		return nil, &driver.FieldError{Path: "ps_args", Reason: fmt.Sprintf("%d bytes: at most %d", len(psArgs), MaxTopArgs)}
	}
	if strings.IndexByte(psArgs, 0) >= 0 {
		return nil, &driver.FieldError{Path: "ps_args", Reason: "holds a NUL byte"}
	}
	in, prov, err := p.verbs.live(ref)
	if err != nil {
		return nil, err
	}
	if !slices.Contains(prov.Capabilities(), driver.CapTop) {
		return nil, driver.Errorf(driver.ErrUnsupported, "provider %q (driver %q) cannot list the processes of an instance (top)", prov.Name(), driverName(prov))
	}
	return prov.Top(ctx, in.BackendID, psArgs)
}

// RemoveVolume removes the named volume name from the node of provider
// providerName where it lives (driver.VolumeRemover): a provider that
// cannot is driver.ErrUnsupported naming it and its driver, a volume an
// instance of the back-end uses is driver.ErrPermanent.
func (p *Plane) RemoveVolume(ctx context.Context, providerName, node, name string) error {
	if err := p.refuse(); err != nil {
		return err
	}
	if name == "" || node == "" {
		return &driver.FieldError{Path: "volume", Reason: "required: a node and a volume name"}
	}
	prov, err := p.verbs.provider(providerName)
	if err != nil {
		return err
	}
	if !slices.Contains(prov.Capabilities(), driver.CapVolumeRemove) {
		return driver.Errorf(driver.ErrUnsupported, "provider %q (driver %q) cannot remove a volume", prov.Name(), driverName(prov))
	}
	return prov.RemoveVolume(ctx, node, name)
}

// archiver checks path and returns the back-end id of the instance ref and
// its provider, which must be able to copy.
func (p *Plane) archiver(ref, path string) (string, *provider.Provider, error) {
	if err := CheckArchivePath(path); err != nil {
		return "", nil, err
	}
	in, prov, err := p.verbs.live(ref)
	if err != nil {
		return "", nil, err
	}
	if !slices.Contains(prov.Capabilities(), driver.CapArchive) {
		return "", nil, driver.Errorf(driver.ErrUnsupported, "provider %q (driver %q) cannot copy files in or out of an instance (docker cp)", prov.Name(), driverName(prov))
	}
	return in.BackendID, prov, nil
}

// CheckArchivePath reports a path that is empty, longer than
// MaxArchivePath or holds a NUL byte, as a *driver.FieldError.
func CheckArchivePath(path string) error {
	switch {
	case path == "":
		return &driver.FieldError{Path: "path", Reason: "required: the path in the instance"}
	case len(path) > MaxArchivePath:
		return &driver.FieldError{Path: "path", Reason: fmt.Sprintf("%d bytes: at most %d", len(path), MaxArchivePath)}
	case strings.IndexByte(path, 0) >= 0:
		return &driver.FieldError{Path: "path", Reason: "holds a NUL byte"}
	}
	return nil
}

// capWriter passes at most left bytes to w, then fails.
type capWriter struct {
	w    io.Writer
	left int64
	path string
}

func (c *capWriter) Write(b []byte) (int, error) {
	if int64(len(b)) > c.left {
		n, _ := c.w.Write(b[:c.left])
		c.left -= int64(n)
		return n, driver.Errorf(driver.ErrInvalid, "the archive of %s is larger than %d bytes, the most a copy carries", c.path, MaxArchiveBytes)
	}
	n, err := c.w.Write(b)
	c.left -= int64(n)
	return n, err
}

// capReader reads at most left bytes of r, then fails.
type capReader struct {
	r    io.Reader
	left int64
}

func (c *capReader) Read(b []byte) (int, error) {
	if c.left <= 0 {
		// One byte more tells a full archive from a longer one.
		var one [1]byte
		if n, _ := c.r.Read(one[:]); n == 0 {
			return 0, io.EOF
		}
		return 0, &driver.FieldError{Path: "archive", Reason: fmt.Sprintf("larger than %d bytes, the most a copy carries", MaxArchiveBytes)}
	}
	if int64(len(b)) > c.left {
		b = b[:c.left]
	}
	n, err := c.r.Read(b)
	c.left -= int64(n)
	return n, err
}
