package docker

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/api/types/network"
	"github.com/moby/moby/client"

	"github.com/berth-dev/berth/driver"
)

// Berth's networks. A network a spec names that the engine lacks is made
// by the create that needs it, when the spec carries its cluster's tag
// (every spec the plane sends does): a bridge of that name, labelled with
// the spec's tags but the instance's, so that it is known as Berth's and
// whose. It is removed when its last container is: by the Delete of that
// container, or by Sweep when a container went behind Berth's back. A
// network the engine has is joined as it is, unless it is another Berth
// cluster's. Without the cluster's tag a missing network is the create's
// error: nobody could tell later whose the network is.
//
// The engine protects nothing here: it removes a network a created (not
// started) container names, and makes two networks of one name when asked
// twice. So on each engine the making, joining and removing of networks
// take engine.netMu, and a container joins its networks, from the lookup
// to the connect, under it.

// networkTags are the labels of a network made for spec's tags: Berth's
// own tags but the instance's, which a shared network has none of.
func networkTags(tags map[string]string) map[string]string {
	out := map[string]string{driver.TagManaged: "true"}
	for _, k := range []string{driver.TagCluster, driver.TagClusterName, driver.TagProvider} {
		if v, ok := tags[k]; ok {
			out[k] = v
		}
	}
	return out
}

// ensureNetwork makes sure network name exists on e for a container
// tagged tags, making it when it is missing and tags carry a cluster.
// e.netMu is held.
func (d *Driver) ensureNetwork(ctx context.Context, e *engine, name string, tags map[string]string) error {
	res, err := e.cli.NetworkList(ctx, client.NetworkListOptions{Filters: make(client.Filters).Add("name", name)})
	if err != nil {
		return d.callErr(ctx, e, err, "list networks named "+name)
	}
	for _, n := range res.Items {
		if n.Name != name {
			continue // the filter matches parts of names
		}
		if owner := n.Labels[driver.TagCluster]; n.Labels[driver.TagManaged] == "true" && owner != tags[driver.TagCluster] {
			return fmt.Errorf("%w: engine %s: network %s is Berth cluster %s's (%s); a container joins its own cluster's networks", driver.ErrPermanent, e.cfg.Name, name, owner, n.Labels[driver.TagClusterName])
		}
		return nil
	}
	if tags[driver.TagCluster] == "" {
		return fmt.Errorf("%w: engine %s: network %s not found (a network is made only for a cluster's instance)", driver.ErrPermanent, e.cfg.Name, name)
	}
	_, err = e.cli.NetworkCreate(ctx, name, client.NetworkCreateOptions{Driver: "bridge", Labels: networkTags(tags)})
	if err != nil {
		return d.callErr(ctx, e, err, "create network "+name)
	}
	d.log.Info("network created", "engine", e.cfg.Name, "network", name)
	return nil
}

// ensureNetworks makes sure each of spec's networks exists on e (see
// ensureNetwork). e.netMu is held.
func (d *Driver) ensureNetworks(ctx context.Context, e *engine, spec *driver.Spec) error {
	for _, n := range spec.Networks {
		if err := d.ensureNetwork(ctx, e, n, spec.Tags); err != nil {
			return err
		}
	}
	return nil
}

// connectExtra connects container cid to spec's networks after the first,
// with spec's aliases. e.netMu is held.
func (d *Driver) connectExtra(ctx context.Context, e *engine, cid string, spec *driver.Spec, what string) error {
	for _, n := range extraNetworks(spec) {
		_, err := e.cli.NetworkConnect(ctx, n, client.NetworkConnectOptions{Container: cid,
			EndpointConfig: &network.EndpointSettings{Aliases: slices.Clone(spec.NetworkAliases)}})
		if err != nil {
			return d.laterStep(ctx, err, e, "connect "+what+" to network "+n)
		}
	}
	return nil
}

// releaseNetworks removes those of the networks names on e that cluster
// made and no container is on (created and stopped ones count). Failures
// are logged, not returned: what is left, Sweep removes later.
func (d *Driver) releaseNetworks(ctx context.Context, e *engine, names []string, cluster string) {
	if len(names) == 0 || cluster == "" {
		return
	}
	e.netMu.Lock()
	defer e.netMu.Unlock()
	for _, name := range names {
		res, err := e.cli.NetworkInspect(ctx, name, client.NetworkInspectOptions{})
		if err != nil {
			if !cerrdefs.IsNotFound(err) {
				d.log.Warn("release network", "engine", e.cfg.Name, "network", name, "err", err)
			}
			continue
		}
		n := res.Network
		if n.Labels[driver.TagManaged] != "true" || n.Labels[driver.TagCluster] != cluster {
			continue
		}
		if err := d.removeUnused(ctx, e, n.Name, n.ID); err != nil {
			d.log.Warn("release network", "engine", e.cfg.Name, "network", name, "err", err)
		}
	}
}

// removeUnused removes network name (id) from e unless a container, in
// any state, is on it. e.netMu is held.
func (d *Driver) removeUnused(ctx context.Context, e *engine, name, id string) error {
	// The filter takes a created container by the network's name only: it
	// has no endpoint, so no network id, yet.
	list, err := e.cli.ContainerList(ctx, client.ContainerListOptions{All: true, Limit: 1, Filters: make(client.Filters).Add("network", name)})
	if err != nil {
		return d.callErr(ctx, e, err, "list the containers of network "+name)
	}
	if len(list.Items) > 0 {
		return nil
	}
	_, err = e.cli.NetworkRemove(ctx, id, client.NetworkRemoveOptions{})
	if err != nil && !cerrdefs.IsNotFound(err) {
		return d.callErr(ctx, e, err, "remove network "+name)
	}
	if err == nil {
		d.log.Info("network removed", "engine", e.cfg.Name, "network", name)
	}
	return nil
}

// Sweep removes, on every engine that is online and was not swept in the
// last sweep_interval, the networks Berth made that carry all of tags and
// that no container is on. Another cluster's networks, and networks Berth
// did not make, are never touched. The engines it could not sweep are
// named in the error.
func (d *Driver) Sweep(ctx context.Context, tags map[string]string) error {
	f := make(client.Filters).Add("label", driver.TagManaged+"=true")
	for k, v := range tags {
		f = f.Add("label", k+"="+v)
	}
	var errs []error
	for _, e := range d.engines {
		if st, _, _ := e.snapshot(); st == driver.NodeOffline {
			continue
		}
		if err := d.sweepEngine(ctx, e, f); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func (d *Driver) sweepEngine(ctx context.Context, e *engine, f client.Filters) error {
	e.netMu.Lock()
	defer e.netMu.Unlock()
	if time.Since(e.sweptAt) < d.opts.SweepInterval {
		return nil
	}
	res, err := e.cli.NetworkList(ctx, client.NetworkListOptions{Filters: f})
	if err != nil {
		return d.callErr(ctx, e, err, "list Berth's networks")
	}
	e.sweptAt = time.Now()
	var failed []string
	for _, n := range res.Items {
		if err := d.removeUnused(ctx, e, n.Name, n.ID); err != nil {
			failed = append(failed, err.Error())
		}
	}
	if len(failed) > 0 {
		return fmt.Errorf("engine %s: sweep networks: %s", e.cfg.Name, strings.Join(failed, "; "))
	}
	return nil
}

var _ driver.Sweeper = (*Driver)(nil)

// ConnectNetwork connects the container id to network name on its engine
// (the engine's NetworkConnect) with aliases, making the network first as
// a create does, for the cluster the container's tags name. A container
// on the network already is left as it is.
func (d *Driver) ConnectNetwork(ctx context.Context, id, name string, aliases []string) error {
	e, cid, err := d.resolve(id)
	if err != nil {
		return err
	}
	cctx, cancel := d.callCtx(ctx)
	defer cancel()
	ci, err := e.cli.ContainerInspect(cctx, cid, client.ContainerInspectOptions{})
	if err != nil {
		return d.act(e, err, "inspect container "+cid)
	}
	if ns := ci.Container.NetworkSettings; ns != nil && ns.Networks[name] != nil {
		return nil
	}
	var labels map[string]string
	if ci.Container.Config != nil {
		labels = ci.Container.Config.Labels
	}
	e.netMu.Lock()
	defer e.netMu.Unlock()
	if err := d.ensureNetwork(cctx, e, name, labels); err != nil {
		return err
	}
	_, err = e.cli.NetworkConnect(cctx, name, client.NetworkConnectOptions{Container: cid,
		EndpointConfig: &network.EndpointSettings{Aliases: slices.Clone(aliases)}})
	return d.act(e, err, "connect container "+cid+" to network "+name)
}

// DisconnectNetwork disconnects the container id from network name on its
// engine (the engine's NetworkDisconnect), and removes the network when
// Berth's cluster made it and no container is left on it.
func (d *Driver) DisconnectNetwork(ctx context.Context, id, name string) error {
	e, cid, err := d.resolve(id)
	if err != nil {
		return err
	}
	cctx, cancel := d.callCtx(ctx)
	defer cancel()
	ci, err := e.cli.ContainerInspect(cctx, cid, client.ContainerInspectOptions{})
	if err != nil {
		return d.act(e, err, "inspect container "+cid)
	}
	if ns := ci.Container.NetworkSettings; ns == nil || ns.Networks[name] == nil {
		return nil
	}
	_, err = e.cli.NetworkDisconnect(cctx, name, client.NetworkDisconnectOptions{Container: cid})
	if err != nil && !cerrdefs.IsNotFound(err) {
		return d.act(e, err, "disconnect container "+cid+" from network "+name)
	}
	if ci.Container.Config != nil {
		d.releaseNetworks(cctx, e, []string{name}, ci.Container.Config.Labels[driver.TagCluster])
	}
	return nil
}

var _ driver.NetworkConnector = (*Driver)(nil)
