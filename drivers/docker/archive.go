package docker

import (
	"context"
	"io"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/client"

	"github.com/berth-dev/berth/driver"
)

// StatPath describes a path in the container (the engine's
// ContainerStatPath).
func (d *Driver) StatPath(ctx context.Context, id, path string) (driver.PathStat, error) {
	e, cid, err := d.resolve(id)
	if err != nil {
		return driver.PathStat{}, err
	}
	cctx, cancel := d.callCtx(ctx)
	defer cancel()
	res, err := e.cli.ContainerStatPath(cctx, cid, client.ContainerStatPathOptions{Path: path})
	if err != nil {
		return driver.PathStat{}, d.callErr(ctx, e, err, "stat "+path+" in container "+cid)
	}
	return pathStat(res.Stat), nil
}

// CopyFrom writes the engine's tar archive of path in the container to w
// (the engine's CopyFromContainer). The copy is bounded by ctx only: an
// archive may take longer than one call.
func (d *Driver) CopyFrom(ctx context.Context, id, path string, w io.Writer) (driver.PathStat, error) {
	e, cid, err := d.resolve(id)
	if err != nil {
		return driver.PathStat{}, err
	}
	res, err := e.cli.CopyFromContainer(ctx, cid, client.CopyFromContainerOptions{SourcePath: path})
	if err != nil {
		return driver.PathStat{}, d.callErr(ctx, e, err, "copy "+path+" from container "+cid)
	}
	defer res.Content.Close()
	if _, err := io.Copy(w, res.Content); err != nil {
		if ctx.Err() != nil {
			return driver.PathStat{}, ctx.Err()
		}
		return driver.PathStat{}, classify(err, e, "copy "+path+" from container "+cid)
	}
	return pathStat(res.Stat), nil
}

// CopyTo unpacks the tar archive r into the directory dir of the container
// (the engine's CopyToContainer). The copy is bounded by ctx only.
func (d *Driver) CopyTo(ctx context.Context, id, dir string, r io.Reader, opts driver.CopyToOptions) error {
	e, cid, err := d.resolve(id)
	if err != nil {
		return err
	}
	_, err = e.cli.CopyToContainer(ctx, cid, client.CopyToContainerOptions{
		DestinationPath: dir, Content: r, AllowOverwriteDirWithFile: !opts.NoOverwriteDirNonDir, CopyUIDGID: opts.CopyUIDGID,
	})
	return d.callErr(ctx, e, err, "copy into "+dir+" of container "+cid)
}

func pathStat(s container.PathStat) driver.PathStat {
	return driver.PathStat{Name: s.Name, Size: s.Size, Mode: s.Mode, ModTime: s.Mtime, LinkTarget: s.LinkTarget}
}

// Top lists the container's processes (the engine's ContainerTop, which
// runs ps with psArgs on the engine's host). A container that is not
// running is ErrPermanent.
func (d *Driver) Top(ctx context.Context, id, psArgs string) (*driver.Processes, error) {
	e, cid, err := d.resolve(id)
	if err != nil {
		return nil, err
	}
	var args []string
	if psArgs != "" {
		args = []string{psArgs}
	}
	cctx, cancel := d.callCtx(ctx)
	defer cancel()
	res, err := e.cli.ContainerTop(cctx, cid, client.ContainerTopOptions{Arguments: args})
	if err != nil {
		return nil, d.act(e, err, "list the processes of container "+cid)
	}
	return &driver.Processes{Titles: res.Titles, Rows: res.Processes}, nil
}

// RemoveVolume removes the named volume name from the engine node (the
// engine's VolumeRemove). A volume the engine has not is not an error; one
// a container of the engine uses is ErrPermanent.
func (d *Driver) RemoveVolume(ctx context.Context, node, name string) error {
	e, err := d.engine(node)
	if err != nil {
		return err
	}
	cctx, cancel := d.callCtx(ctx)
	defer cancel()
	_, err = e.cli.VolumeRemove(cctx, name, client.VolumeRemoveOptions{})
	if cerrdefs.IsNotFound(err) {
		return nil
	}
	return d.act(e, err, "remove volume "+name)
}

var (
	_ driver.VolumeRemover = (*Driver)(nil)
	_ driver.Archiver      = (*Driver)(nil)
	_ driver.Topper        = (*Driver)(nil)
)
