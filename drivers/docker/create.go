package docker

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"path"
	"slices"
	"strconv"
	"strings"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/network"
	"github.com/moby/moby/client"

	"github.com/berth-dev/berth/driver"
)

// Create validates spec, maps it onto a container and returns an operation
// that creates the container (with Berth's tags as labels, so a crash at
// any later point leaves it findable by List) on its networks, made first
// when the engine lacks them (networks.go), connects the extra networks,
// copies config files and user data in, starts it and inspects it for the
// real port mapping. Each of these is one step of the operation; making
// the networks, the create and the connects are one.
//
// Create fails at once with ErrInvalid for a bad spec, ErrUnsupported for a
// kind other than container or a field the engine cannot honour, ErrNotFound
// for an unknown node, ErrRetryable when the engine is offline and
// ErrInsufficientCapacity when it is draining or the spec asks for more cpus
// or memory than the engine has.
func (d *Driver) Create(ctx context.Context, node string, spec *driver.Spec) (driver.Operation, error) {
	if err := spec.Validate(); err != nil {
		return nil, err
	}
	if err := unsupported(spec); err != nil {
		return nil, err
	}
	e, err := d.engine(node)
	if err != nil {
		return nil, err
	}
	opts, files, err := d.containerOptions(spec)
	if err != nil {
		return nil, err
	}
	st, reason, info := e.snapshot()
	switch st {
	case driver.NodeOffline:
		return nil, driver.Errorf(driver.ErrRetryable, "engine %s is offline (%s)", e.cfg.Name, reason)
	case driver.NodeDraining:
		return nil, driver.Errorf(driver.ErrInsufficientCapacity, "engine %s is draining", e.cfg.Name)
	}
	if info != nil {
		if spec.CPU > driver.MilliCPU(info.NCPU)*1000 {
			return nil, driver.Errorf(driver.ErrInsufficientCapacity, "engine %s has %d cpus; the spec asks for %s", e.cfg.Name, info.NCPU, spec.CPU)
		}
		if spec.Memory > driver.Bytes(info.MemTotal) {
			return nil, driver.Errorf(driver.ErrInsufficientCapacity, "engine %s has %s of memory; the spec asks for %s", e.cfg.Name, driver.Bytes(info.MemTotal), spec.Memory)
		}
	}

	var cid string // set by the create step, read by the later ones
	what := "container"
	if spec.Name != "" {
		what = "container " + spec.Name
	}
	steps := []step{{name: "create", call: func(ctx context.Context) (*driver.Instance, error) {
		id, err := d.createContainer(ctx, e, opts, spec, what)
		cid = id
		if err != nil {
			return nil, err
		}
		labels, tags := splitLabels(opts.Config.Labels)
		return &driver.Instance{ID: instanceID(e, cid), Name: spec.Name, Node: e.cfg.Name, Kind: driver.KindContainer,
			Image: spec.Image, State: driver.StateCreating, Resources: spec.Resources, Labels: labels, Tags: tags}, nil
	}}}
	if files != nil {
		steps = append(steps, step{name: "copy files", call: func(ctx context.Context) (*driver.Instance, error) {
			_, err := e.cli.CopyToContainer(ctx, cid, client.CopyToContainerOptions{DestinationPath: "/", Content: bytes.NewReader(files)})
			return nil, d.laterStep(ctx, err, e, "copy config files into "+what)
		}})
	}
	steps = append(steps,
		step{name: "start", call: func(ctx context.Context) (*driver.Instance, error) {
			_, err := e.cli.ContainerStart(ctx, cid, client.ContainerStartOptions{})
			return nil, d.laterStep(ctx, err, e, "start "+what)
		}},
		step{name: "inspect", call: func(ctx context.Context) (*driver.Instance, error) {
			return d.inspect(ctx, e, cid)
		}},
	)
	m := d.newMachine(ctx, e, "create "+what, steps...)
	m.cleanup = func(ctx context.Context, failure error) error {
		defer d.releaseNetworks(ctx, e, spec.Networks, spec.Tags[driver.TagCluster])
		if cid == "" {
			if isTimeout(failure) {
				// The create itself may have happened; its id is unknown.
				return driver.Errorf(driver.ErrTimeout, "engine %s: create %s: the container may exist; List finds it by its tags", e.cfg.Name, what)
			}
			return nil // the create was refused: nothing was made
		}
		_, err := e.cli.ContainerRemove(ctx, cid, client.ContainerRemoveOptions{Force: true, RemoveVolumes: true})
		if cerrdefs.IsNotFound(err) {
			err = nil
		}
		return d.callErr(ctx, e, err, "remove "+what)
	}
	return m, nil
}

// createContainer creates the container of opts and spec on e and joins
// it to spec's networks: under the engine's network lock, from the
// networks' lookup to the last connect (see networks.go). It returns the
// container's id as soon as there is one, with or without an error.
func (d *Driver) createContainer(ctx context.Context, e *engine, opts client.ContainerCreateOptions, spec *driver.Spec, what string) (string, error) {
	joins := spec.NetworkMode == "" && len(spec.Networks) > 0
	if joins {
		e.netMu.Lock()
		defer e.netMu.Unlock()
		if err := d.ensureNetworks(ctx, e, spec); err != nil {
			return "", err
		}
	}
	res, err := e.cli.ContainerCreate(ctx, opts)
	if err != nil {
		switch {
		case cerrdefs.IsNotFound(err) && !client.IsErrConnectionFailed(err):
			// The image, or a network or volume driver the spec names.
			if _, ierr := e.cli.ImageInspect(ctx, spec.Image); cerrdefs.IsNotFound(ierr) {
				return "", missingImage(err, e, spec.Image)
			}
			return "", fmt.Errorf("%w: engine %s: create %s: %w", driver.ErrPermanent, e.cfg.Name, what, err)
		case cerrdefs.IsConflict(err):
			return "", fmt.Errorf("%w: engine %s: a container named %q exists: %w", driver.ErrAlreadyExists, e.cfg.Name, spec.Name, err)
		}
		return "", d.callErr(ctx, e, err, "create "+what)
	}
	if joins {
		return res.ID, d.connectExtra(ctx, e, res.ID, spec, what)
	}
	return res.ID, nil
}

// laterStep classifies the failure of a create step after the container
// exists. Not found then means something the spec names is missing (a
// network, a volume driver) or the container was removed meanwhile: the
// spec cannot succeed as it is, so it is ErrPermanent.
func (d *Driver) laterStep(ctx context.Context, err error, e *engine, what string) error {
	if cerrdefs.IsNotFound(err) && !client.IsErrConnectionFailed(err) {
		return fmt.Errorf("%w: engine %s: %s: %w", driver.ErrPermanent, e.cfg.Name, what, err)
	}
	return d.callErr(ctx, e, err, what)
}

// unsupported rejects the spec fields a Docker Engine cannot honour.
func unsupported(spec *driver.Spec) error {
	var why []string
	if k := spec.KindOrDefault(); k != driver.KindContainer {
		why = append(why, fmt.Sprintf("kind %q (only containers)", k))
	}
	if spec.Flavor != "" {
		why = append(why, "flavor (engines have no named sizes; give cpus and memory)")
	}
	if spec.Disk != 0 {
		why = append(why, "disk (the engine does not limit disk)")
	}
	if spec.GPUs != 0 {
		why = append(why, "gpus")
	}
	if len(spec.Other) > 0 {
		why = append(why, "other resources")
	}
	if len(spec.SecurityGroups) > 0 {
		why = append(why, "security_groups")
	}
	if len(why) == 0 {
		return nil
	}
	return driver.Errorf(driver.ErrUnsupported, "docker: %s", strings.Join(why, "; "))
}

// extraNetworks are the networks after the first, which API 1.41 cannot
// attach at create and the create operation connects before the start.
func extraNetworks(spec *driver.Spec) []string {
	if spec.NetworkMode != "" || len(spec.Networks) < 2 {
		return nil
	}
	return spec.Networks[1:]
}

// containerOptions maps spec onto the create call, and builds the tar of
// files to copy in (nil when there are none).
func (d *Driver) containerOptions(spec *driver.Spec) (client.ContainerCreateOptions, []byte, error) {
	var es driver.FieldErrors
	labels := map[string]string{}
	for k, v := range spec.Labels {
		if strings.HasPrefix(k, "berth.") {
			es.Add("labels."+k, "the prefix \"berth.\" is reserved for Berth's tags")
		} else if _, dup := spec.Tags[k]; dup {
			es.Add("labels."+k, "%q is also a tag", k)
		}
		labels[k] = v
	}
	for k, v := range spec.Tags {
		if k == labelTagKeys {
			es.Add("tags."+k, "reserved")
		}
		labels[k] = v
	}
	labels[driver.TagManaged] = "true"
	labels[labelTagKeys] = tagKeys(spec.Tags)

	cfg := &container.Config{
		Image:      spec.Image,
		Entrypoint: spec.Entrypoint,
		Cmd:        spec.Command,
		WorkingDir: spec.WorkingDir,
		Hostname:   spec.Hostname,
		Domainname: spec.Domainname,
		Labels:     labels,
		// As docker run -i makes it: input open until the first attach
		// that forwards it ends.
		OpenStdin: spec.Stdin,
		StdinOnce: spec.Stdin,
		Tty:       spec.TTY,
	}
	for _, k := range slices.Sorted(maps.Keys(spec.Env)) {
		cfg.Env = append(cfg.Env, k+"="+spec.Env[k])
	}
	// The engine runs the container as user[:group] (the image's user
	// when empty).
	cfg.User = spec.User
	if spec.Group != "" {
		cfg.User += ":" + spec.Group
	}
	hc := &container.HostConfig{
		Resources: container.Resources{
			NanoCPUs:          int64(spec.CPU) * 1_000_000,
			CpusetCpus:        spec.Cpuset,
			Memory:            int64(spec.Memory),
			MemoryReservation: int64(spec.MemoryReservation),
		},
		RestartPolicy: container.RestartPolicy{Name: container.RestartPolicyMode(spec.RestartPolicy.Name), MaximumRetryCount: spec.RestartPolicy.MaxRetries},
	}
	if spec.Memory > 0 {
		hc.MemorySwap = int64(spec.Memory) // no swap beyond the limit
	}
	for i, p := range spec.Ports {
		proto := p.Protocol
		if proto == "" {
			proto = "tcp"
		}
		port, ok := network.PortFrom(uint16(p.ContainerPort), network.IPProtocol(proto))
		if !ok {
			es.Add(fmt.Sprintf("ports[%d]", i), "%d/%s: not a valid port", p.ContainerPort, proto)
			continue
		}
		if cfg.ExposedPorts == nil {
			cfg.ExposedPorts = network.PortSet{}
			hc.PortBindings = network.PortMap{}
		}
		cfg.ExposedPorts[port] = struct{}{}
		b := network.PortBinding{}
		switch {
		case p.HostIP != "":
			ip, err := netip.ParseAddr(p.HostIP)
			if err != nil {
				es.Add(fmt.Sprintf("ports[%d].host_ip", i), "%q: not an IP address", p.HostIP)
			}
			b.HostIP = ip
		case !p.Publish:
			b.HostIP = netip.MustParseAddr("127.0.0.1") // reachable on the engine's host only
		}
		if p.HostPort > 0 {
			b.HostPort = strconv.Itoa(p.HostPort)
		}
		hc.PortBindings[port] = append(hc.PortBindings[port], b)
	}
	for _, v := range spec.Volumes {
		b := v.Source + ":" + v.Target
		if v.ReadOnly {
			b += ":ro"
		}
		hc.Binds = append(hc.Binds, b)
	}
	var nc *network.NetworkingConfig
	switch {
	case spec.NetworkMode != "":
		hc.NetworkMode = container.NetworkMode(spec.NetworkMode)
	case len(spec.Networks) > 0:
		hc.NetworkMode = container.NetworkMode(spec.Networks[0])
		nc = &network.NetworkingConfig{EndpointsConfig: map[string]*network.EndpointSettings{spec.Networks[0]: {Aliases: slices.Clone(spec.NetworkAliases)}}}
	case d.opts.Network != "":
		hc.NetworkMode = container.NetworkMode(d.opts.Network)
	}
	files, err := filesTar(spec, d.opts.UserDataPath)
	if err != nil {
		return client.ContainerCreateOptions{}, nil, err
	}
	if err := es.Err(); err != nil {
		return client.ContainerCreateOptions{}, nil, err
	}
	return client.ContainerCreateOptions{Name: spec.Name, Config: cfg, HostConfig: hc, NetworkingConfig: nc}, files, nil
}

// filesTar builds a tar, rooted at "/", of the spec's config files and its
// user data. The engine creates missing parent directories.
func filesTar(spec *driver.Spec, userDataPath string) ([]byte, error) {
	if len(spec.ConfigFiles) == 0 && spec.UserData == "" {
		return nil, nil
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	now := time.Now()
	put := func(p, content string, mode uint32) error {
		if mode == 0 {
			mode = 0o644
		}
		hdr := &tar.Header{Name: strings.TrimPrefix(path.Clean(p), "/"), Mode: int64(mode), Size: int64(len(content)), ModTime: now, Typeflag: tar.TypeReg}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		_, err := tw.Write([]byte(content))
		return err
	}
	for _, f := range spec.ConfigFiles {
		if path.Clean(f.Path) == path.Clean(userDataPath) && spec.UserData != "" {
			return nil, &driver.FieldError{Path: "config_files", Reason: fmt.Sprintf("%q is where user data goes", f.Path)}
		}
		if err := put(f.Path, f.Content, f.Mode); err != nil {
			return nil, err
		}
	}
	if spec.UserData != "" {
		if err := put(userDataPath, spec.UserData, 0o644); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, errors.Join(driver.ErrPermanent, err)
	}
	return buf.Bytes(), nil
}

// Delete stops the container (SIGTERM, then SIGKILL after stop_grace),
// removes it with its anonymous volumes, and then the networks its cluster
// made that it was the last container of (a failure there is left to
// Sweep). A container that is already gone makes the operation end with
// ErrNotFound.
func (d *Driver) Delete(ctx context.Context, id string) (driver.Operation, error) {
	e, cid, err := d.resolve(id)
	if err != nil {
		return nil, err
	}
	grace := int((d.opts.StopGrace + time.Second - 1) / time.Second)
	// The container's networks and cluster, read before it goes: a
	// network Berth made for it goes with its last container.
	var nets []string
	var cluster string
	look := step{name: "inspect", call: func(ctx context.Context) (*driver.Instance, error) {
		res, err := e.cli.ContainerInspect(ctx, cid, client.ContainerInspectOptions{})
		switch err := d.callErr(ctx, e, err, "inspect container "+cid); {
		case err == nil:
		case errors.Is(err, driver.ErrNotFound), errors.Is(err, driver.ErrRetryable), errors.Is(err, driver.ErrTimeout):
			return nil, err
		default:
			return nil, nil // the networks stay for Sweep
		}
		if c := res.Container; c.Config != nil && c.NetworkSettings != nil {
			cluster = c.Config.Labels[driver.TagCluster]
			nets = slices.Sorted(maps.Keys(c.NetworkSettings.Networks))
		}
		return nil, nil
	}}
	stop := step{name: "stop", extra: d.opts.StopGrace, call: func(ctx context.Context) (*driver.Instance, error) {
		_, err := e.cli.ContainerStop(ctx, cid, client.ContainerStopOptions{Timeout: &grace})
		switch err := d.callErr(ctx, e, err, "stop container "+cid); {
		case err == nil:
			return nil, nil
		case errors.Is(err, driver.ErrNotFound), errors.Is(err, driver.ErrRetryable), errors.Is(err, driver.ErrTimeout):
			return nil, err
		}
		return nil, nil // the forced remove that follows settles it
	}}
	remove := step{name: "remove", call: func(ctx context.Context) (*driver.Instance, error) {
		_, err := e.cli.ContainerRemove(ctx, cid, client.ContainerRemoveOptions{Force: true, RemoveVolumes: true})
		e.mu.Lock()
		delete(e.limits, cid)
		e.mu.Unlock()
		switch err := d.callErr(ctx, e, err, "remove container "+cid); {
		case err == nil, errors.Is(err, driver.ErrNotFound), errors.Is(err, driver.ErrRetryable), errors.Is(err, driver.ErrTimeout):
			return nil, err
		default:
			return nil, fmt.Errorf("%w: engine %s: remove container %s: %v", driver.ErrDeleteFailed, e.cfg.Name, cid, err)
		}
	}}
	release := step{name: "release networks", call: func(ctx context.Context) (*driver.Instance, error) {
		d.releaseNetworks(ctx, e, nets, cluster)
		return nil, nil
	}}
	return d.newMachine(ctx, e, "delete container "+cid, look, stop, remove, release), nil
}

// Features are what an engine runs: containers, with restart policies,
// volumes, published ports, a user, stdin and a terminal.
func (d *Driver) Features() []string {
	return []string{driver.CapKindContainer, driver.CapRestartPolicy, driver.CapVolumes, driver.CapHostPorts, driver.CapRunAsUser,
		driver.CapStdin, driver.CapTTY}
}

// CheckSpec refuses at submit the spec fields no engine can honour.
func (d *Driver) CheckSpec(spec *driver.Spec) error {
	if err := unsupported(spec); err != nil {
		return err
	}
	if spec.CPU > 0 && spec.CPU < minCPU {
		return fmt.Errorf("docker: %w: %w", driver.ErrInvalid, &driver.FieldError{Path: "cpus", Reason: fmt.Sprintf("%s is less than %s, the smallest CPU limit the kernel enforces (1 ms per 100 ms); ask for at least that, or for no cpus", spec.CPU, minCPU)})
	}
	return nil
}

// minCPU is the smallest CPU limit a container can have: the kernel's
// CFS quota is at least 1 ms per 100 ms period.
const minCPU = driver.MilliCPU(10)

var (
	_ driver.FeatureReporter = (*Driver)(nil)
	_ driver.SpecChecker     = (*Driver)(nil)
)
