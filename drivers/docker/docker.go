// Package docker is Berth's back-end for Docker Engines. One provider spans
// any number of engines (unix sockets, tcp, tcp with TLS); each engine is a
// node. Containers carry Berth's tags as labels, set atomically when the
// container is created, so List finds everything Create ever made.
//
// Each engine has its own health loop, started by Open and ended by Close:
// an engine that stops answering is marked offline at once and probed again
// with exponential backoff (backoff_min up to backoff_max) without holding up
// the other engines. An engine that went offline comes back online only after
// recoverChecks consecutive good probes, so an engine in the middle of
// shutting down (answering one moment, not the next) stays offline. Creates
// on an offline engine fail with ErrRetryable.
//
// Node usage (Node.InUse) is measured in the background, every
// usage_interval per online engine: one stats call per running Berth
// container, summing memory in use (without the page cache) and the cpus
// used since the previous measurement. State reports the last measurement,
// from the second one on (cpus need two), and never waits for it. Usage
// measures one container on demand.
//
// A spec's networks are joined with its network aliases. A network the
// engine lacks is made, labelled as its cluster's, by the create that needs
// it, and removed with its last container (by Delete, or by Sweep when the
// container went another way); see networks.go.
//
// Spec fields the engine cannot honour (flavor, disk, GPUs, other counted
// resources, security groups) make Create fail with ErrUnsupported. SSH keys
// are ignored. User data is written to the file named by user_data_path, and
// config files to their paths, before the container starts. User labels may
// not start with "berth.": that prefix is how tags are told from labels.
package docker

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/system"
	"github.com/moby/moby/client"

	"github.com/berth-dev/berth/driver"
)

func init() {
	driver.Register(driver.Define("docker", "containers on one or more Docker Engines", defaultOptions, open))
}

// Driver runs containers on a set of Docker Engines. It is safe for
// concurrent use.
type Driver struct {
	opts    Options
	log     *slog.Logger
	engines []*engine
	byName  map[string]*engine

	stopLoops context.CancelFunc
	loops     sync.WaitGroup

	mu      sync.Mutex
	closed  bool
	calls   driver.Calls // background calls of operations in flight
	nextSub uint64
	subs    map[uint64]chan driver.Event // node events for watchers
}

// engine is one Docker Engine and what the driver knows of it.
type engine struct {
	cfg  EngineConfig
	cli  *client.Client
	ping *client.Client // a new connection per call: see newClient
	ext  string
	wake chan struct{} // asks the health loop to probe now
	// slots holds a token per container change in flight on the engine
	// (max_in_flight; driver.Calls.GoAfter).
	slots chan struct{}

	// netMu is held while Berth's networks on the engine are made, joined
	// or removed (networks.go); sweptAt is when Sweep last searched the
	// engine, under netMu.
	netMu   sync.Mutex
	sweptAt time.Time

	mu     sync.Mutex
	status driver.NodeStatus // online or offline; drain is applied when reported
	reason string
	info   *system.Info // the last good reading
	limits map[string]driver.Resources
	seen   bool         // e has been online at least once
	streak int          // consecutive good probes while offline
	last   *driver.Node // the last complete State reading

	// The use measured by measureLoop: inUse for State, and each running
	// container's cpu time (ns) at the measurement of measuredAt.
	inUse      *driver.Resources
	cpuTime    map[string]uint64
	measuredAt time.Time
	// cpuSeen is each container's last cpu reading by Usage, which
	// averages from it; State drops those of containers gone.
	cpuSeen map[string]cpuReading
}

// recoverChecks is how many consecutive good probes an engine that went
// offline needs before it is online again. Probes run backoff_min apart
// once the engine answers.
const recoverChecks = 3

// stateWait bounds the reading of one engine in State; an engine that takes
// longer is reported from its last complete reading.
const stateWait = time.Second

// Open connects to the engines of opts. An engine that does not answer is
// not an error: it starts offline and its health loop keeps trying.
func Open(ctx context.Context, opts *Options, env driver.Env) (*Driver, error) {
	tlsConfigs, err := opts.check()
	if err != nil {
		return nil, err
	}
	if env.Logger == nil {
		env.Logger = slog.Default()
	}
	d := &Driver{
		opts:   *opts,
		log:    env.Logger,
		byName: map[string]*engine{},
		subs:   map[uint64]chan driver.Event{},
	}
	for i, cfg := range opts.engines() {
		var tc *tls.Config
		if i < len(tlsConfigs) {
			tc = tlsConfigs[i]
		}
		cli, err := newClient(cfg, tc, opts.APIVersion, i, true)
		if err != nil {
			d.closeClients()
			return nil, err
		}
		ping, err := newClient(cfg, tc, opts.APIVersion, i, false)
		if err != nil {
			cli.Close()
			d.closeClients()
			return nil, err
		}
		e := &engine{cfg: cfg, cli: cli, ping: ping, ext: cfg.externalAddress(), wake: make(chan struct{}, 1),
			slots: make(chan struct{}, opts.MaxInFlight), status: driver.NodeOffline, reason: "not yet probed", limits: map[string]driver.Resources{}, cpuSeen: map[string]cpuReading{}}
		d.engines = append(d.engines, e)
		d.byName[cfg.Name] = e
	}
	var wg sync.WaitGroup
	for _, e := range d.engines {
		wg.Go(func() { d.probe(ctx, e) })
	}
	wg.Wait()
	loopCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	d.stopLoops = cancel
	for _, e := range d.engines {
		d.loops.Go(func() { d.healthLoop(loopCtx, e) })
		if opts.UsageInterval > 0 {
			d.loops.Go(func() { d.measureLoop(loopCtx, e) })
		}
	}
	return d, nil
}

func open(ctx context.Context, opts *Options, env driver.Env) (driver.Driver, error) {
	d, err := Open(ctx, opts, env)
	if err != nil {
		return nil, err
	}
	return d, nil
}

// newClient makes a client of engine i; tc is its TLS configuration as
// Options.check loaded it, nil for none. Without keepAlive every call dials
// a new connection: that is the client of the health checks, because an
// engine that is shutting down closes its listener first and goes on
// answering on the connections it has for a while, so only a new connection
// tells whether it is still there.
func newClient(cfg EngineConfig, tc *tls.Config, version string, i int, keepAlive bool) (*client.Client, error) {
	ops := []client.Opt{client.WithUserAgent("berth")}
	if tc != nil || !keepAlive {
		ops = append(ops, client.WithHTTPClient(&http.Client{Transport: &http.Transport{TLSClientConfig: tc, DisableKeepAlives: !keepAlive}, CheckRedirect: client.CheckRedirect}))
		if tc == nil {
			// A transport of one's own gets a TLS configuration when the
			// client copies it, which would make the scheme https.
			ops = append(ops, client.WithScheme("http"))
		}
	}
	ops = append(ops, client.WithHost(cfg.Address))
	if version != "" {
		ops = append(ops, client.WithAPIVersion(version))
	}
	cli, err := client.New(ops...)
	if err != nil {
		return nil, &driver.FieldError{Path: fmt.Sprintf("engines[%d].address", i), Reason: err.Error()}
	}
	return cli, nil
}

func (d *Driver) closeClients() {
	for _, e := range d.engines {
		e.cli.Close()
		e.ping.Close()
	}
}

// Close ends the health loops, abandons the background calls of operations
// still in flight and closes every connection. Containers keep running.
func (d *Driver) Close(ctx context.Context) error {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return nil
	}
	d.closed = true
	d.calls.Cancel()
	for id, ch := range d.subs {
		close(ch)
		delete(d.subs, id)
	}
	d.mu.Unlock()
	d.stopLoops()
	done := make(chan struct{})
	go func() {
		d.loops.Wait()
		d.calls.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-ctx.Done():
		return fmt.Errorf("%w: close: %w", driver.ErrTimeout, ctx.Err())
	}
	d.closeClients()
	return nil
}

// healthLoop probes e every poll interval while it answers, and with
// exponential backoff while it does not, until ctx ends.
func (d *Driver) healthLoop(ctx context.Context, e *engine) {
	backoff := d.opts.BackoffMin
	for {
		wait := d.opts.PollInterval
		if !e.online() {
			wait = backoff
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		case <-e.wake:
			t.Stop()
		}
		if d.probe(ctx, e) {
			backoff = d.opts.BackoffMin
		} else {
			backoff = min(2*backoff, d.opts.BackoffMax)
		}
	}
}

// probe pings e on a new connection and reads its info; it records the
// outcome and reports whether e answered.
func (d *Driver) probe(ctx context.Context, e *engine) bool {
	cctx, cancel := context.WithTimeout(ctx, d.opts.CallTimeout)
	defer cancel()
	_, err := e.ping.Ping(cctx, client.PingOptions{NegotiateAPIVersion: true})
	var info client.SystemInfoResult
	if err == nil {
		info, err = e.cli.Info(cctx, client.InfoOptions{})
	}
	if ctx.Err() != nil {
		return false
	}
	if err != nil {
		d.markOffline(e, err.Error())
		return false
	}
	e.mu.Lock()
	recovering := e.seen && e.status == driver.NodeOffline
	if recovering {
		e.streak++
		recovering = e.streak < recoverChecks
	}
	n := e.streak
	e.mu.Unlock()
	if recovering {
		d.setStatus(e, driver.NodeOffline, fmt.Sprintf("answering again; %d of %d checks passed", n, recoverChecks), &info.Info)
		return true
	}
	d.setStatus(e, driver.NodeOnline, "", &info.Info)
	return true
}

// setStatus records e's status and tells watchers when it changed.
func (d *Driver) setStatus(e *engine, st driver.NodeStatus, reason string, info *system.Info) {
	e.mu.Lock()
	changed := e.status != st
	e.status, e.reason = st, reason
	if info != nil {
		e.info = info
	}
	if st == driver.NodeOnline {
		e.seen, e.streak = true, 0
	}
	e.mu.Unlock()
	if !changed {
		return
	}
	if st == driver.NodeOffline {
		d.log.Warn("engine offline", "node", e.cfg.Name, "reason", reason)
	} else {
		d.log.Info("engine online", "node", e.cfg.Name, "api", e.cli.ClientVersion())
	}
	d.publish(driver.Event{Type: driver.EventNode, Node: e.cfg.Name, Message: string(st) + reasonSuffix(reason), Time: time.Now()})
}

func reasonSuffix(r string) string {
	if r == "" {
		return ""
	}
	return ": " + r
}

// noteErr marks e offline at once when err says it cannot be reached, and
// wakes its health loop to start the backoff.
func (d *Driver) noteErr(e *engine, err error) {
	if err == nil || !(client.IsErrConnectionFailed(err) || tlsRefused(err)) {
		return
	}
	d.markOffline(e, err.Error())
	e.probeSoon()
}

// markOffline records that e failed a check or a call: it is offline, and
// the good checks it had made towards coming back count no more.
func (d *Driver) markOffline(e *engine, reason string) {
	e.mu.Lock()
	e.streak = 0
	e.mu.Unlock()
	d.setStatus(e, driver.NodeOffline, reason, nil)
}

// probeSoon asks e's health loop to probe now.
func (e *engine) probeSoon() {
	select {
	case e.wake <- struct{}{}:
	default:
	}
}

func (e *engine) online() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.status == driver.NodeOnline
}

// snapshot returns e's status, the reason and the last info reading.
func (e *engine) snapshot() (driver.NodeStatus, string, *system.Info) {
	e.mu.Lock()
	defer e.mu.Unlock()
	st := e.status
	if st == driver.NodeOnline && e.cfg.Drain {
		return driver.NodeDraining, "drain is set in the configuration", e.info
	}
	return st, e.reason, e.info
}

func (d *Driver) publish(ev driver.Event) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, ch := range d.subs {
		select {
		case ch <- ev:
		default: // a watcher that does not keep up misses node events, never blocks the loops
		}
	}
}

// engine returns the engine called name or ErrNotFound.
func (d *Driver) engine(name string) (*engine, error) {
	e, ok := d.byName[name]
	if !ok {
		return nil, driver.Errorf(driver.ErrNotFound, "node %q: no such engine; engines: %s", name, strings.Join(d.nodeNames(), ", "))
	}
	return e, nil
}

func (d *Driver) nodeNames() []string {
	names := make([]string, len(d.engines))
	for i, e := range d.engines {
		names[i] = e.cfg.Name
	}
	return names
}

// callCtx bounds one Engine API call by call_timeout under ctx.
func (d *Driver) callCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, d.opts.CallTimeout)
}

// State reads every engine in parallel, each for at most stateWait. An
// engine's status is the health loop's: offline engines are reported at
// once with their last known capacity, and an engine whose reading fails or
// takes longer is reported from its last complete reading (and probed at
// once), so one dying engine cannot hold up State.
func (d *Driver) State(ctx context.Context) (*driver.PlatformState, error) {
	nodes := make([]driver.Node, len(d.engines))
	var wg sync.WaitGroup
	for i, e := range d.engines {
		wg.Go(func() { nodes[i] = d.nodeState(ctx, e) })
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("%w: state: %w", driver.ErrTimeout, err)
	}
	return &driver.PlatformState{Nodes: nodes, Time: time.Now()}, nil
}

func (d *Driver) nodeState(ctx context.Context, e *engine) driver.Node {
	st, reason, info := e.snapshot()
	if st == driver.NodeOffline {
		return e.cached(st, reason, info)
	}
	cctx, cancel := context.WithTimeout(ctx, min(d.opts.CallTimeout, stateWait))
	defer cancel()
	n, err := d.readNode(cctx, e)
	if err != nil {
		d.noteErr(e, err)
		e.probeSoon()
		st, reason, info := e.snapshot()
		return e.cached(st, reason, info)
	}
	// The status may have changed during the reading.
	n.Status, n.Reason, _ = e.snapshot()
	cp := n
	e.mu.Lock()
	e.last = &cp
	e.mu.Unlock()
	return n
}

// cached returns e's last complete reading (or what info tells, when there
// is none) with status st.
func (e *engine) cached(st driver.NodeStatus, reason string, info *system.Info) driver.Node {
	e.mu.Lock()
	last := e.last
	e.mu.Unlock()
	var n driver.Node
	if last != nil {
		n = *last
		n.Labels, n.Attributes, n.Capacity = nodeFacts(e.cfg, info)
	} else {
		n = driver.Node{Name: e.cfg.Name, Address: e.ext, MaxInstances: e.cfg.MaxInstances}
		n.Labels, n.Attributes, n.Capacity = nodeFacts(e.cfg, info)
	}
	n.Status, n.Reason = st, reason
	return n
}

// readNode reads e's info, Berth's containers there and its images.
func (d *Driver) readNode(ctx context.Context, e *engine) (driver.Node, error) {
	n := driver.Node{Name: e.cfg.Name, Address: e.ext, MaxInstances: e.cfg.MaxInstances}
	ir, err := e.cli.Info(ctx, client.InfoOptions{})
	if err != nil {
		return n, err
	}
	n.Labels, n.Attributes, n.Capacity = nodeFacts(e.cfg, &ir.Info)
	cl, err := e.cli.ContainerList(ctx, client.ContainerListOptions{All: true, Filters: make(client.Filters).Add("label", driver.TagManaged+"=true")})
	if err != nil {
		return n, err
	}
	il, err := e.cli.ImageList(ctx, client.ImageListOptions{})
	if err != nil {
		return n, err
	}
	for _, im := range il.Items {
		for _, t := range im.RepoTags {
			if t != "<none>:<none>" {
				n.Images = append(n.Images, t)
			}
		}
	}
	live := map[string]bool{}
	for _, c := range cl.Items {
		for _, p := range c.Ports {
			if p.PublicPort != 0 {
				n.Ports = append(n.Ports, int(p.PublicPort))
			}
		}
		switch c.State {
		case container.StateExited, container.StateDead, container.StateRemoving:
			continue
		}
		n.Instances++
		live[c.ID] = true
		r, err := d.limits(ctx, e, c.ID)
		if ctx.Err() != nil {
			return n, ctx.Err()
		}
		if err != nil {
			continue // removed between the listing and the inspect
		}
		n.Reserved = n.Reserved.Add(r)
	}
	e.mu.Lock()
	for id := range e.limits {
		if !live[id] {
			delete(e.limits, id)
		}
	}
	for id := range e.cpuSeen {
		if !live[id] {
			delete(e.cpuSeen, id)
		}
	}
	if e.inUse != nil {
		u := *e.inUse
		n.InUse = &u
	}
	e.mu.Unlock()
	return n, nil
}

// limits returns the cpu and memory limits of container id, inspecting it
// only the first time; Resize forgets the entry.
func (d *Driver) limits(ctx context.Context, e *engine, id string) (driver.Resources, error) {
	e.mu.Lock()
	r, ok := e.limits[id]
	e.mu.Unlock()
	if ok {
		return r, nil
	}
	ci, err := e.cli.ContainerInspect(ctx, id, client.ContainerInspectOptions{})
	if err != nil {
		return driver.Resources{}, err
	}
	if ci.Container.HostConfig != nil {
		r = resourcesOf(&ci.Container.HostConfig.Resources)
	}
	e.mu.Lock()
	e.limits[id] = r
	e.mu.Unlock()
	return r, nil
}

func resourcesOf(r *container.Resources) driver.Resources {
	cpu := driver.MilliCPU(r.NanoCPUs / 1_000_000)
	if cpu == 0 && r.CPUQuota > 0 && r.CPUPeriod > 0 {
		cpu = driver.MilliCPU(r.CPUQuota * 1000 / r.CPUPeriod)
	}
	return driver.Resources{CPU: cpu, Memory: driver.Bytes(r.Memory)}
}

// nodeFacts derives labels, attributes and capacity from the configuration
// and the engine's info (nil when the engine was never reached).
func nodeFacts(cfg EngineConfig, info *system.Info) (map[string]string, map[string]string, driver.Resources) {
	labels := map[string]string{}
	attrs := map[string]string{}
	var capa driver.Resources
	if info != nil {
		for _, l := range info.Labels {
			k, v, _ := strings.Cut(l, "=")
			labels[k] = v
		}
		for k, v := range map[string]string{
			"os": info.OperatingSystem, "ostype": info.OSType, "kernel": info.KernelVersion,
			"arch": info.Architecture, "storage_driver": info.Driver, "engine_version": info.ServerVersion,
			"engine_name": info.Name,
		} {
			if v != "" {
				attrs[k] = v
			}
		}
		capa = driver.Resources{CPU: driver.MilliCPU(info.NCPU) * 1000, Memory: driver.Bytes(info.MemTotal)}
	}
	maps.Copy(labels, cfg.Labels)
	o := cfg.Capacity
	if o.CPU != 0 {
		capa.CPU = o.CPU
	}
	if o.Memory != 0 {
		capa.Memory = o.Memory
	}
	if o.Disk != 0 {
		capa.Disk = o.Disk
	}
	if o.GPUs != 0 {
		capa.GPUs = o.GPUs
	}
	if len(o.Other) > 0 {
		capa.Other = maps.Clone(o.Other)
	}
	return labels, attrs, capa
}
