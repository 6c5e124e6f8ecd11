package docker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/client"

	"github.com/berth-dev/berth/driver"
)

// An instance id is "<engine>/<container id>": the engine names the node and
// the container id is the engine's own.
func instanceID(e *engine, containerID string) string { return e.cfg.Name + "/" + containerID }

// resolve splits id into its engine and container id.
func (d *Driver) resolve(id string) (*engine, string, error) {
	name, cid, ok := strings.Cut(id, "/")
	if !ok || name == "" || cid == "" {
		return nil, "", &driver.FieldError{Path: "id", Reason: fmt.Sprintf("%q: want <engine>/<container id>", id)}
	}
	e, ok := d.byName[name]
	if !ok {
		return nil, "", driver.Errorf(driver.ErrNotFound, "instance %s: engine %q is not configured", id, name)
	}
	return e, cid, nil
}

// Get inspects the container with instance id id.
func (d *Driver) Get(ctx context.Context, id string) (*driver.Instance, error) {
	e, cid, err := d.resolve(id)
	if err != nil {
		return nil, err
	}
	return d.inspect(ctx, e, cid)
}

func (d *Driver) inspect(ctx context.Context, e *engine, cid string) (*driver.Instance, error) {
	cctx, cancel := d.callCtx(ctx)
	defer cancel()
	ci, err := e.cli.ContainerInspect(cctx, cid, client.ContainerInspectOptions{})
	if err != nil {
		return nil, d.callErr(cctx, e, err, "inspect container "+cid)
	}
	return fromInspect(e, &ci.Container), nil
}

// Find looks for a container named name on every online engine. Engines
// that are offline cannot be asked; a container there is not found.
func (d *Driver) Find(ctx context.Context, name string) (*driver.Instance, error) {
	found := make([]*driver.Instance, len(d.engines))
	errs := make([]error, len(d.engines))
	var wg sync.WaitGroup
	for i, e := range d.engines {
		if !e.online() {
			continue
		}
		wg.Go(func() {
			// The engine matches names as regular expressions.
			list, err := d.list(ctx, e, make(client.Filters).Add("name", "^/"+regexp.QuoteMeta(name)+"$"), false)
			if err != nil {
				errs[i] = err
				return
			}
			for _, in := range list {
				if in.Name == name {
					found[i], errs[i] = d.inspect(ctx, e, strings.TrimPrefix(in.ID, e.cfg.Name+"/"))
					return
				}
			}
		})
	}
	wg.Wait()
	for i := range d.engines {
		if found[i] != nil {
			return found[i], nil
		}
	}
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	return nil, driver.Errorf(driver.ErrNotFound, "no container named %q on the online engines", name)
}

// List returns Berth's containers (label berth.managed=true) carrying all of
// tags, on every engine. An engine that is offline, or whose listing fails,
// cannot be seen: List then returns the containers of the other engines
// with a *driver.PartialListError naming the engines it missed (it is
// ErrRetryable), so that what runs there is never taken for lost.
func (d *Driver) List(ctx context.Context, tags map[string]string) ([]*driver.Instance, error) {
	f := make(client.Filters).Add("label", driver.TagManaged+"=true")
	for _, k := range slices.Sorted(maps.Keys(tags)) {
		if k != driver.TagManaged {
			f.Add("label", k+"="+tags[k])
		}
	}
	lists := make([][]*driver.Instance, len(d.engines))
	errs := make([]error, len(d.engines))
	var wg sync.WaitGroup
	for i, e := range d.engines {
		if st, reason, _ := e.snapshot(); st == driver.NodeOffline {
			errs[i] = fmt.Errorf("engine %s is offline (%s)", e.cfg.Name, reason)
			continue
		}
		wg.Go(func() { lists[i], errs[i] = d.list(ctx, e, f, true) })
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("%w: list: %w", driver.ErrTimeout, err)
	}
	var out []*driver.Instance
	var missed, why []string
	for i, e := range d.engines {
		if errs[i] != nil {
			missed = append(missed, e.cfg.Name)
			why = append(why, errs[i].Error())
			continue
		}
		out = append(out, lists[i]...)
	}
	if len(missed) > 0 {
		slices.Sort(missed)
		// The reasons are text only: the error is ErrRetryable and nothing else.
		return out, &driver.PartialListError{Nodes: missed, Err: errors.New(strings.Join(why, "; "))}
	}
	return out, nil
}

func (d *Driver) list(ctx context.Context, e *engine, f client.Filters, managedOnly bool) ([]*driver.Instance, error) {
	cctx, cancel := d.callCtx(ctx)
	defer cancel()
	res, err := e.cli.ContainerList(cctx, client.ContainerListOptions{All: true, Filters: f})
	if err != nil {
		d.noteErr(e, err)
		return nil, classify(err, e, "list containers")
	}
	out := make([]*driver.Instance, 0, len(res.Items))
	for i := range res.Items {
		c := &res.Items[i]
		if managedOnly && c.Labels[driver.TagManaged] != "true" {
			continue
		}
		out = append(out, fromSummary(e, c))
	}
	return out, nil
}

// labelTagKeys is the container label that lists, as a JSON array, which
// of the other labels are Berth's tags; the rest are the user's labels.
const labelTagKeys = "berth.tags"

// tagKeys returns the label value recording the keys of tags.
func tagKeys(tags map[string]string) string {
	keys := slices.Sorted(maps.Keys(tags))
	if !slices.Contains(keys, driver.TagManaged) {
		keys = append(keys, driver.TagManaged)
	}
	b, _ := json.Marshal(keys)
	return string(b)
}

// splitLabels separates Berth's tags from the user's labels, by the list in
// labelTagKeys, or, on a container that lacks the list (made by hand with
// Berth's labels), by the prefix "berth.".
func splitLabels(all map[string]string) (labels, tags map[string]string) {
	var keys []string
	if raw, ok := all[labelTagKeys]; ok {
		_ = json.Unmarshal([]byte(raw), &keys)
	}
	isTag := func(k string) bool {
		if keys != nil {
			return slices.Contains(keys, k)
		}
		return strings.HasPrefix(k, "berth.")
	}
	for k, v := range all {
		switch {
		case k == labelTagKeys:
		case isTag(k):
			if tags == nil {
				tags = map[string]string{}
			}
			tags[k] = v
		default:
			if labels == nil {
				labels = map[string]string{}
			}
			labels[k] = v
		}
	}
	return labels, tags
}

// mapState maps the engine's container state onto Berth's.
func mapState(s container.ContainerState) driver.State {
	switch s {
	case container.StateCreated:
		return driver.StateCreating
	case container.StateRunning, container.StateRestarting:
		return driver.StateRunning
	case container.StatePaused:
		return driver.StateSuspended
	case container.StateExited:
		return driver.StateExited
	case container.StateDead:
		return driver.StateFailed
	case container.StateRemoving:
		return driver.StateDeleting
	}
	return driver.StateUnknown
}

// exitCodeOfStatus reads the exit code from a listed container's status,
// which the engine writes "Exited (3) 2 seconds ago": the list carries no
// other trace of it.
func exitCodeOfStatus(status string) (int, bool) {
	rest, ok := strings.CutPrefix(status, "Exited (")
	if !ok {
		return 0, false
	}
	num, _, ok := strings.Cut(rest, ")")
	if !ok {
		return 0, false
	}
	code, err := strconv.Atoi(num)
	return code, err == nil
}

func fromSummary(e *engine, c *container.Summary) *driver.Instance {
	labels, tags := splitLabels(c.Labels)
	inst := &driver.Instance{
		ID:       instanceID(e, c.ID),
		Node:     e.cfg.Name,
		Kind:     driver.KindContainer,
		Image:    c.Image,
		State:    mapState(c.State),
		RawState: string(c.State),
		Message:  c.Status,
		Labels:   labels,
		Tags:     tags,
		Created:  time.Unix(c.Created, 0),
	}
	if len(c.Names) > 0 {
		inst.Name = strings.TrimPrefix(c.Names[0], "/")
	}
	if code, ok := exitCodeOfStatus(c.Status); ok && c.State == container.StateExited {
		inst.ExitCode = &code
	}
	inst.Addresses = []string{e.ext}
	if c.NetworkSettings != nil {
		for _, n := range slices.Sorted(maps.Keys(c.NetworkSettings.Networks)) {
			if ep := c.NetworkSettings.Networks[n]; ep != nil && ep.IPAddress.IsValid() {
				inst.Addresses = append(inst.Addresses, ep.IPAddress.String())
			}
		}
	}
	for _, p := range c.Ports {
		if p.PublicPort == 0 {
			continue
		}
		inst.Ports = append(inst.Ports, driver.PortMapping{ContainerPort: int(p.PrivatePort), HostPort: int(p.PublicPort), Protocol: p.Type, HostIP: hostIP(e, p.IP)})
	}
	inst.Ports = sortPorts(inst.Ports)
	return inst
}

// hostIP is the address at which a port bound on ip is reached: the
// engine's external address when bound on every interface.
func hostIP(e *engine, ip netip.Addr) string {
	if !ip.IsValid() || ip.IsUnspecified() {
		return e.ext
	}
	return ip.String()
}

func sortPorts(ps []driver.PortMapping) []driver.PortMapping {
	slices.SortFunc(ps, func(a, b driver.PortMapping) int {
		if a.ContainerPort != b.ContainerPort {
			return a.ContainerPort - b.ContainerPort
		}
		if a.Protocol != b.Protocol {
			return strings.Compare(a.Protocol, b.Protocol)
		}
		return strings.Compare(a.HostIP, b.HostIP)
	})
	// An engine binds IPv4 and IPv6 separately; one mapping per address is enough.
	return slices.CompactFunc(ps, func(a, b driver.PortMapping) bool { return a == b })
}

func fromInspect(e *engine, c *container.InspectResponse) *driver.Instance {
	inst := &driver.Instance{
		ID:        instanceID(e, c.ID),
		Name:      strings.TrimPrefix(c.Name, "/"),
		Node:      e.cfg.Name,
		Kind:      driver.KindContainer,
		Addresses: []string{e.ext},
	}
	if c.Config != nil {
		inst.Image = c.Config.Image
		inst.Labels, inst.Tags = splitLabels(c.Config.Labels)
	}
	if c.HostConfig != nil {
		inst.Resources = resourcesOf(&c.HostConfig.Resources)
	}
	inst.Created = parseTime(c.Created)
	if s := c.State; s != nil {
		inst.State = mapState(s.Status)
		inst.RawState = string(s.Status)
		inst.Started = parseTime(s.StartedAt)
		if s.Status == container.StateExited || s.Status == container.StateDead {
			code := s.ExitCode
			inst.ExitCode = &code
			inst.Finished = parseTime(s.FinishedAt)
			inst.Message = "exit code " + strconv.Itoa(code)
			if s.OOMKilled {
				inst.Message += "; killed for lack of memory"
			}
		}
		if s.Error != "" {
			inst.Message = s.Error
		}
		if s.Health != nil {
			inst.Message = strings.TrimPrefix(inst.Message+"; health: "+string(s.Health.Status), "; ")
		}
	}
	if ns := c.NetworkSettings; ns != nil {
		for _, n := range slices.Sorted(maps.Keys(ns.Networks)) {
			if ep := ns.Networks[n]; ep != nil && ep.IPAddress.IsValid() {
				inst.Addresses = append(inst.Addresses, ep.IPAddress.String())
			}
		}
		for p, bs := range ns.Ports {
			for _, b := range bs {
				hp, err := strconv.Atoi(b.HostPort)
				if err != nil || hp == 0 {
					continue
				}
				inst.Ports = append(inst.Ports, driver.PortMapping{ContainerPort: int(p.Num()), HostPort: hp, Protocol: string(p.Proto()), HostIP: hostIP(e, b.HostIP)})
			}
		}
		inst.Ports = sortPorts(inst.Ports)
	}
	return inst
}

func parseTime(s string) time.Time {
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil || t.Year() <= 1 {
		return time.Time{}
	}
	return t
}
