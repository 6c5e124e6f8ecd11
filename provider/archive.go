package provider

import (
	"context"
	"io"

	"github.com/berth-dev/berth/driver"
)

// StatPath describes a path in an instance (driver.Archiver). It spends one
// read and is bounded by CallTimeout.
// Fallback: ErrUnsupported.
func (p *Provider) StatPath(ctx context.Context, id, path string) (driver.PathStat, error) {
	a, ok := driver.As[driver.Archiver](p.d, driver.CapArchive)
	if !ok {
		return driver.PathStat{}, p.unsupported("stat-path", "the driver cannot copy files in and out of instances", "instance", id)
	}
	return call(ctx, p, callOpts{op: "stat-path", budget: readBudget, timed: true, attrs: []any{"instance", id}},
		func(ctx context.Context) (driver.PathStat, error) { return a.StatPath(ctx, id, path) })
}

// CopyFrom writes a tar archive of a path in an instance to w
// (driver.Archiver). It spends one read and is not bounded by CallTimeout,
// as Logs with Follow: the archive takes as long as it takes; ctx bounds it.
// Fallback: ErrUnsupported.
func (p *Provider) CopyFrom(ctx context.Context, id, path string, w io.Writer) (driver.PathStat, error) {
	a, ok := driver.As[driver.Archiver](p.d, driver.CapArchive)
	if !ok {
		return driver.PathStat{}, p.unsupported("copy-from", "the driver cannot copy files in and out of instances", "instance", id)
	}
	return call(ctx, p, callOpts{op: "copy-from", budget: readBudget, long: true, attrs: []any{"instance", id}},
		func(ctx context.Context) (driver.PathStat, error) { return a.CopyFrom(ctx, id, path, w) })
}

// CopyTo unpacks the tar archive r into a directory of an instance
// (driver.Archiver). It spends one change and is bounded by ctx only.
// Fallback: ErrUnsupported.
func (p *Provider) CopyTo(ctx context.Context, id, dir string, r io.Reader, opts driver.CopyToOptions) error {
	a, ok := driver.As[driver.Archiver](p.d, driver.CapArchive)
	if !ok {
		return p.unsupported("copy-to", "the driver cannot copy files in and out of instances", "instance", id)
	}
	_, err := call(ctx, p, callOpts{op: "copy-to", budget: writeBudget, long: true, attrs: []any{"instance", id}},
		func(ctx context.Context) (struct{}, error) { return struct{}{}, a.CopyTo(ctx, id, dir, r, opts) })
	return err
}

// Top lists the processes of an instance (driver.Topper). It spends one
// read and is bounded by CallTimeout.
// Fallback: ErrUnsupported.
func (p *Provider) Top(ctx context.Context, id, psArgs string) (*driver.Processes, error) {
	t, ok := driver.As[driver.Topper](p.d, driver.CapTop)
	if !ok {
		return nil, p.unsupported("top", "the driver cannot list the processes of instances", "instance", id)
	}
	return call(ctx, p, callOpts{op: "top", budget: readBudget, timed: true, attrs: []any{"instance", id}},
		func(ctx context.Context) (*driver.Processes, error) { return t.Top(ctx, id, psArgs) })
}

// RemoveVolume removes the named volume name from node
// (driver.VolumeRemover). It spends one change and is bounded by
// CallTimeout.
// Fallback: ErrUnsupported.
func (p *Provider) RemoveVolume(ctx context.Context, node, name string) error {
	v, ok := driver.As[driver.VolumeRemover](p.d, driver.CapVolumeRemove)
	if !ok {
		return p.unsupported("remove-volume", "the driver cannot remove volumes", "node", node, "volume", name)
	}
	_, err := call(ctx, p, callOpts{op: "remove-volume", budget: writeBudget, timed: true, attrs: []any{"node", node, "volume", name}},
		func(ctx context.Context) (struct{}, error) { return struct{}{}, v.RemoveVolume(ctx, node, name) })
	return err
}

// ConnectNetwork puts the instance id on the back-end's network name with
// aliases (driver.NetworkConnector). It spends one change and is bounded
// by CallTimeout.
// Fallback: ErrUnsupported.
func (p *Provider) ConnectNetwork(ctx context.Context, id, name string, aliases []string) error {
	c, ok := driver.As[driver.NetworkConnector](p.d, driver.CapNetworkConnect)
	if !ok {
		return p.unsupported("connect-network", "the driver cannot connect an instance to a network", "instance", id, "network", name)
	}
	_, err := call(ctx, p, callOpts{op: "connect-network", budget: writeBudget, timed: true, attrs: []any{"instance", id, "network", name}},
		func(ctx context.Context) (struct{}, error) {
			return struct{}{}, c.ConnectNetwork(ctx, id, name, aliases)
		})
	return err
}

// DisconnectNetwork takes the instance id off the back-end's network name
// (driver.NetworkConnector). It spends one change and is bounded by
// CallTimeout.
// Fallback: ErrUnsupported.
func (p *Provider) DisconnectNetwork(ctx context.Context, id, name string) error {
	c, ok := driver.As[driver.NetworkConnector](p.d, driver.CapNetworkConnect)
	if !ok {
		return p.unsupported("disconnect-network", "the driver cannot disconnect an instance from a network", "instance", id, "network", name)
	}
	_, err := call(ctx, p, callOpts{op: "disconnect-network", budget: writeBudget, timed: true, attrs: []any{"instance", id, "network", name}},
		func(ctx context.Context) (struct{}, error) { return struct{}{}, c.DisconnectNetwork(ctx, id, name) })
	return err
}

// Rename gives the back-end resource of instance id the name name
// (driver.Renamer). It spends one change and is bounded by CallTimeout.
// Fallback: ErrUnsupported.
func (p *Provider) Rename(ctx context.Context, id, name string) error {
	r, ok := driver.As[driver.Renamer](p.d, driver.CapRename)
	if !ok {
		return p.unsupported("rename", "the driver cannot rename an instance's resource", "instance", id)
	}
	_, err := call(ctx, p, callOpts{op: "rename", budget: writeBudget, timed: true, attrs: []any{"instance", id, "name", name}},
		func(ctx context.Context) (struct{}, error) { return struct{}{}, r.Rename(ctx, id, name) })
	return err
}
