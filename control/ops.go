package control

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/provider"
	"github.com/berth-dev/berth/reconciler"
	"github.com/berth-dev/berth/scheduler"
	"github.com/berth-dev/berth/store"
)

// delete is Plane.Delete.
func (s verbs) delete(ctx context.Context, ref string) error {
	in, err := s.find(ref)
	if err != nil {
		return err
	}
	_, _, err = s.apply(ctx, in.ID, reconciler.Event{Kind: reconciler.DeleteRequested})
	if err == nil {
		s.graces.Delete(in.ID) // no stop of it is to come
	}
	return err
}

// hold is Plane.Hold.
func (s verbs) hold(ctx context.Context, ref string, until time.Time) error {
	in, err := s.find(ref)
	if err != nil {
		return err
	}
	if in.Phase != reconciler.Running && in.Phase != reconciler.Held {
		return driver.Errorf(driver.ErrInvalid, "instance %s is %s: only a running instance can be held", in.ID, in.Phase)
	}
	_, _, err = s.apply(ctx, in.ID, reconciler.Event{Kind: reconciler.Hold, Until: until})
	return err
}

// live returns the instance named ref with its provider, refusing
// instances that have no back-end resource.
func (s verbs) live(ref string) (reconciler.Instance, *provider.Provider, error) {
	if err := s.refuse(); err != nil {
		return reconciler.Instance{}, nil, err
	}
	in, err := s.find(ref)
	if err != nil {
		return in, nil, err
	}
	if in.BackendID == "" {
		return in, nil, driver.Errorf(driver.ErrInvalid, "instance %s is %s and has no back-end resource", in.ID, in.Phase)
	}
	p, err := s.provider(in.Provider)
	return in, p, err
}

// reading is live for a read of the instance's back-end resource (its
// logs, its usage): a read-only plane reads it itself when its provider
// is a shared back-end (ReadsBackend), and refuses it otherwise.
func (s verbs) reading(ref string) (reconciler.Instance, *provider.Provider, error) {
	if !s.cfg.ReadOnly {
		return s.live(ref)
	}
	in, err := s.find(ref)
	if err != nil {
		return in, nil, err
	}
	p, ok := s.provs[in.Provider]
	if !ok || !sharedBackend(p) {
		return in, nil, ErrReadOnly
	}
	if in.BackendID == "" {
		return in, nil, driver.Errorf(driver.ErrInvalid, "instance %s is %s and has no back-end resource", in.ID, in.Phase)
	}
	return in, p, nil
}

// sharedBackend reports whether p's back-end is reached the same from
// every server (driver.SharedBackend).
func sharedBackend(p *provider.Provider) bool {
	sb, ok := driver.As[driver.SharedBackend](p.Driver(), driver.CapShared)
	return ok && sb.SharedBackend()
}

// target returns the instance named ref for verb v, or why v can never
// apply to it (reconciler.Refusal, naming its phase).
func (s verbs) target(ref string, v reconciler.Verb) (reconciler.Instance, error) {
	if err := s.refuse(); err != nil {
		return reconciler.Instance{}, err
	}
	in, err := s.find(ref)
	if err != nil {
		return in, err
	}
	return in, reconciler.Refusal(&in, v)
}

// backend returns the provider of in, which has a back-end resource.
func (s verbs) backend(in reconciler.Instance) (*provider.Provider, error) {
	if in.BackendID == "" {
		return nil, driver.Errorf(driver.ErrInvalid, "instance %s is %s and has no back-end resource", in.ID, in.Phase)
	}
	return s.provider(in.Provider)
}

// stop is Plane.Stop, and with later Plane.StopLater: the stop is stored,
// then made by the reconciler with grace rather than here. An instance not
// created yet is stopped once it is (reconciler.Verb); a suspended one is
// resumed first.
func (s verbs) stop(ctx context.Context, ref string, grace time.Duration, later bool) error {
	in, err := s.target(ref, reconciler.VerbStop)
	if err != nil {
		return err
	}
	if in.Phase == reconciler.Suspended {
		if err := s.resume(ctx, in.ID); err != nil && !errors.Is(err, driver.ErrNotSuspended) {
			return err
		}
	}
	if later {
		s.runner.stopGrace(in.ID, grace)
	}
	direct := []reconciler.ActionKind{reconciler.Stop}
	if later {
		direct = nil
	}
	got, acts, err := s.apply(ctx, in.ID, reconciler.Event{Kind: reconciler.StopRequested}, direct...)
	if err != nil || len(acts) == 0 {
		// Recorded for later, or satisfied already.
		return err
	}
	p, err := s.backend(got)
	if err != nil {
		return err
	}
	if err := p.Stop(ctx, got.BackendID, grace); err != nil {
		_, _, _ = s.apply(context.WithoutCancel(ctx), in.ID, reconciler.Event{Kind: reconciler.StopFailed, Err: err})
		return err
	}
	_, _, err = s.apply(context.WithoutCancel(ctx), in.ID, reconciler.Event{Kind: reconciler.StopDone})
	return err
}

// start is Plane.Start. A suspended instance is resumed; a failed one is
// created again; one not created yet or stopping is started when it can
// be (reconciler.Verb).
func (s verbs) start(ctx context.Context, ref string) error {
	in, err := s.target(ref, reconciler.VerbStart)
	if err != nil {
		return err
	}
	if in.Phase == reconciler.Suspended {
		return s.resume(ctx, in.ID)
	}
	got, acts, err := s.apply(ctx, in.ID, reconciler.Event{Kind: reconciler.StartRequested}, reconciler.Start)
	if err != nil || len(acts) == 0 {
		return err
	}
	p, err := s.backend(got)
	if err != nil {
		return err
	}
	if err := p.Start(ctx, got.BackendID); err != nil {
		_, _, _ = s.apply(context.WithoutCancel(ctx), in.ID, reconciler.Event{Kind: reconciler.StartFailed, Err: err})
		return err
	}
	_, _, err = s.apply(context.WithoutCancel(ctx), in.ID, reconciler.Event{Kind: reconciler.StartDone})
	return err
}

// suspend is Plane.Suspend. The back-end pauses the instance first; the
// record follows. Should the plane stop in between, sync sees the paused
// instance and records it all the same. An instance not created yet is
// suspended once it is; where nothing runs it is satisfied already.
func (s verbs) suspend(ctx context.Context, ref string) error {
	in, err := s.target(ref, reconciler.VerbSuspend)
	if err != nil {
		return err
	}
	switch {
	case in.Unborn():
		_, _, err = s.apply(ctx, in.ID, reconciler.Event{Kind: reconciler.SuspendRequested})
		return err
	case in.Phase != reconciler.Running:
		return nil
	}
	p, err := s.backend(in)
	if err != nil {
		return err
	}
	if err := p.Suspend(ctx, in.BackendID); err != nil {
		return err
	}
	_, _, err = s.apply(context.WithoutCancel(ctx), in.ID, reconciler.Event{Kind: reconciler.SuspendDone})
	return err
}

// resume is Plane.Resume. An instance not created yet forgets a suspend
// asked before; a running or held one is satisfied already.
func (s verbs) resume(ctx context.Context, ref string) error {
	in, err := s.target(ref, reconciler.VerbResume)
	if err != nil {
		return err
	}
	switch {
	case in.Unborn():
		_, _, err = s.apply(ctx, in.ID, reconciler.Event{Kind: reconciler.ResumeRequested})
		return err
	case in.Phase != reconciler.Suspended:
		return nil
	}
	p, err := s.backend(in)
	if err != nil {
		return err
	}
	if err := p.Resume(ctx, in.BackendID); err != nil {
		// ErrNotSuspended: resumed behind the plane's back; sync records
		// what the back-end shows.
		return err
	}
	_, _, err = s.apply(context.WithoutCancel(ctx), in.ID, reconciler.Event{Kind: reconciler.ResumeDone})
	return err
}

// restart is Plane.Restart. An instance with a back-end resource that runs
// or can run is restarted by its back-end; the others step (a failed one
// is created again, a stopping one started once stopped, one not created
// yet will run).
func (s verbs) restart(ctx context.Context, ref string, grace time.Duration) error {
	in, err := s.target(ref, reconciler.VerbRestart)
	if err != nil {
		return err
	}
	switch in.Phase {
	case reconciler.Running, reconciler.Held, reconciler.Stopped, reconciler.Exited, reconciler.Suspended:
	default:
		_, _, err = s.apply(ctx, in.ID, reconciler.Event{Kind: reconciler.RestartRequested})
		return err
	}
	p, err := s.backend(in)
	if err != nil {
		return err
	}
	if err := p.Restart(ctx, in.BackendID, grace); err != nil {
		return err
	}
	if in.Phase == reconciler.Stopped || in.Phase == reconciler.Exited || in.Phase == reconciler.Running {
		// Recorded for a running one too: a listing taken while the
		// restart ran is older than the record, and sync passes over it.
		_, _, err = s.apply(context.WithoutCancel(ctx), in.ID, reconciler.Event{Kind: reconciler.StartDone})
	}
	return err
}

// kill is Plane.Kill. An instance not created yet is stopped once it is,
// for a signal that ends a process (KILL, TERM, INT, QUIT); where nothing
// runs the kill is satisfied already.
func (s verbs) kill(ctx context.Context, ref, signal string) error {
	in, err := s.target(ref, reconciler.VerbKill)
	if err != nil {
		return err
	}
	if signal == "" {
		signal = "KILL"
	}
	switch in.Phase {
	case reconciler.Running, reconciler.Held, reconciler.Suspended, reconciler.Stopping:
	default:
		if !in.Unborn() {
			return nil
		}
		name, _, err := driver.ParseSignal(signal)
		if err != nil {
			return err
		}
		switch name {
		case "KILL", "TERM", "INT", "QUIT":
		default:
			return driver.Errorf(driver.ErrInvalid, "instance %s is %s: it has no process yet to send %s to", in.ID, in.Phase, name)
		}
		_, _, err = s.apply(ctx, in.ID, reconciler.Event{Kind: reconciler.StopRequested})
		return err
	}
	p, err := s.backend(in)
	if err != nil {
		return err
	}
	return p.Kill(ctx, in.BackendID, signal)
}

// resize is Plane.Resize: the node must have room for the growth, the
// back-end applies the new limits, then the record and the scheduler's
// reservation follow.
func (s verbs) resize(ctx context.Context, ref string, r driver.Resources) error {
	if err := s.refuse(); err != nil {
		return err
	}
	if err := driver.ValidateResources("", r); err != nil {
		return err
	}
	in, p, err := s.live(ref)
	if err != nil {
		return err
	}
	want := in.Spec.Resources
	if r.CPU > 0 {
		want.CPU = r.CPU
	}
	if r.Memory > 0 {
		want.Memory = r.Memory
	}
	grow := driver.Resources{CPU: max(want.CPU-in.Spec.CPU, 0), Memory: max(want.Memory-in.Spec.Memory, 0)}
	if !grow.IsZero() {
		for _, n := range s.cluster.c.Nodes() {
			if n.Provider == in.Provider && n.Name == in.Node && !grow.Fits(n.Free) {
				return driver.Errorf(driver.ErrInsufficientCapacity, "node %s has %s cpus and %s memory free; resizing %s needs %s cpus and %s memory more",
					n.Name, n.Free.CPU, n.Free.Memory, in.ID, grow.CPU, grow.Memory)
			}
		}
	}
	if err := p.Resize(ctx, in.BackendID, driver.Resources{CPU: r.CPU, Memory: r.Memory}); err != nil {
		return err
	}
	return s.mutate(context.WithoutCancel(ctx), in.ID, func(x *reconciler.Instance) {
		spec := *x.Spec // shared with the request's other instances
		spec.CPU, spec.Memory = want.CPU, want.Memory
		x.Spec = &spec
	})
}

// mutate changes fields of an instance outside the lifecycle (its
// resources, its owner) with a compare-and-swap; the scheduler's ledger
// follows the stored record (applyStored).
func (s verbs) mutate(ctx context.Context, id string, fn func(*reconciler.Instance)) error {
	mu := s.lockOf(id)
	mu.Lock()
	defer mu.Unlock()
	for range 10 {
		cur, ok := s.get(id)
		if !ok {
			return driver.Errorf(driver.ErrNotFound, "instance %s", id)
		}
		next := cur
		fn(&next)
		next.Updated = s.now()
		ok, _, err := s.commit(ctx, &txn{puts: []instPut{{base: cur.Revision, in: &next}}})
		if err != nil {
			return fmt.Errorf("control: instance %s: %w", id, err)
		}
		if !ok {
			if err := s.reload(ctx, id); err != nil {
				return err
			}
			continue
		}
		return nil
	}
	return fmt.Errorf("control: instance %s: too many conflicting writes", id)
}

// logs is Plane.Logs.
func (s verbs) logs(ctx context.Context, ref string, opts driver.LogOptions, stdout, stderr io.Writer) error {
	in, p, err := s.reading(ref)
	if err != nil {
		return err
	}
	return p.Logs(ctx, in.BackendID, opts, stdout, stderr)
}

// events is Plane.Events: a watch on the store's instances and nodes.
func (s verbs) events(ctx context.Context, since int64, fn func(Event)) error {
	from := since
	if from > 0 {
		from = since + 1
	}
	w, err := s.st.Watch(ctx, "/berth/", from)
	if errors.Is(err, store.ErrCompacted) {
		return fmt.Errorf("control: events since revision %d are no longer kept (the server keeps the latest changes in memory, from when it started): follow events from now and list what you need: %w", since, err)
	}
	if err != nil {
		return fmt.Errorf("control: events: %w", err)
	}
	for ev := range w.Events() {
		if out, ok := s.eventOf(ctx, ev); ok {
			fn(out)
		}
	}
	err = w.Err()
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return ctx.Err()
	}
	if err == nil {
		err = ctx.Err()
	}
	return err
}

// eventOf is the Event of a watched change of an instance or a node;
// false for other keys and for records that do not decode.
func (s verbs) eventOf(ctx context.Context, ev store.Event) (Event, bool) {
	key := ev.KV.Key
	out := Event{Revision: ev.KV.ModRevision, Deleted: ev.Type == store.EventDelete}
	switch {
	case strings.HasPrefix(key, PrefixInstances):
		out.Kind = EventInstance
		in := &reconciler.Instance{ID: strings.TrimPrefix(key, PrefixInstances)}
		if !out.Deleted {
			var err error
			if in, err = decodeRecord(ev.KV, s.specOf(ctx, false)); err != nil {
				return out, false
			}
		}
		v := viewOf(in)
		out.Instance = &v
	case strings.HasPrefix(key, PrefixNodes):
		out.Kind = EventNode
		var n NodeState
		if !out.Deleted {
			if err := json.Unmarshal(ev.KV.Value, &n); err != nil {
				return out, false
			}
		}
		out.Node = &n
	default:
		return out, false
	}
	return out, true
}

// nodes is Plane.Nodes.
func (s verbs) nodes(ctx context.Context) ([]NodeView, error) {
	var out []NodeView
	var errs []error
	type key struct{ prov, node string }
	held := map[key]scheduler.NodeUse{}
	for _, u := range s.cluster.c.Nodes() {
		held[key{u.Provider, u.Name}] = u
	}
	for _, name := range s.provNames {
		ps, err := s.provs[name].State(ctx)
		if err != nil {
			errs = append(errs, fmt.Errorf("provider %s: %w", name, err))
			continue
		}
		for _, n := range ps.Nodes {
			v := NodeView{Provider: name, Node: n, Overcommit: scheduler.PolicyReservations}
			if u, ok := held[key{name, n.Name}]; ok {
				v.Berth, v.BerthCount, v.Overcommit = u.Berth, u.BerthInstances, u.Policy
			}
			if m, ok := s.meter.node(name, n.Name); ok {
				v.Measured = &m
			}
			out = append(out, v)
		}
	}
	if out == nil && len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	if out == nil {
		out = []NodeView{}
	}
	return out, nil
}

// providers is Plane.Providers.
func (s verbs) providers(ctx context.Context) ([]ProviderView, error) {
	out := make([]ProviderView, 0, len(s.provNames))
	for _, name := range s.provNames {
		p := s.provs[name]
		v := ProviderView{Name: name, Driver: driverName(p), Capabilities: p.Capabilities(), Features: p.Features(), Health: p.Health()}
		if v.Capabilities == nil {
			v.Capabilities = []string{}
		}
		if ps, err := p.State(ctx); err != nil {
			v.Error = err.Error()
		} else {
			v.Nodes = len(ps.Nodes)
		}
		out = append(out, v)
	}
	return out, nil
}

// driverName names p's driver by its Go type's package, the name it
// registers under by convention.
func driverName(p *provider.Provider) string {
	t := fmt.Sprintf("%T", p.Driver())
	t = strings.TrimPrefix(t, "*")
	if pkg, _, ok := strings.Cut(t, "."); ok {
		return pkg
	}
	return t
}

// images is Plane.Images.
func (s verbs) images(ctx context.Context, providerName, node string) ([]driver.Image, error) {
	p, err := s.provider(providerName)
	if err != nil {
		return nil, err
	}
	return p.Images(ctx, node)
}

// preload is Plane.Preload.
func (s verbs) preload(ctx context.Context, providerName, image string, nodes []string, progress func(driver.PreloadProgress)) error {
	if image == "" {
		return &driver.FieldError{Path: "image", Reason: "required"}
	}
	p, err := s.provider(providerName)
	if err != nil {
		return err
	}
	return p.Preload(ctx, image, nodes, progress)
}

// quotas is Plane.Quotas.
func (s verbs) quotas(ctx context.Context) ([]QuotaUse, error) {
	return s.placer.quotaUse(), nil
}

// syncPools keeps every pool label's MinReady unassigned instances: it
// submits the missing ones, within the label's and the pool's caps.
func (s verbs) syncPools(ctx context.Context) {
	for _, pl := range s.cfg.Pools {
		total := 0
		byLabel := map[string][2]int{} // label -> (unassigned not ended, all not ended)
		for _, in := range s.snapshot(func(in *rec) bool { return in.Pool == pl.Name }) {
			if in.Phase.Terminal() || in.Phase == reconciler.Deleting {
				continue
			}
			c := byLabel[in.Label]
			if in.Owner == "" && in.Group == "" {
				c[0]++
			}
			c[1]++
			byLabel[in.Label] = c
			if in.Phase.HoldsNode() || in.Phase == reconciler.Pending {
				total++
			}
		}
		for _, l := range pl.Labels {
			c := byLabel[l.Name]
			missing := l.MinReady - c[0]
			if l.Max > 0 {
				missing = min(missing, l.Max-c[1])
			}
			if pl.MaxInstances > 0 {
				missing = min(missing, pl.MaxInstances-total)
			}
			if missing <= 0 {
				continue
			}
			req := scheduler.Request{Spec: l.Spec, Count: missing, Provider: pl.Provider}
			req.ID = pl.Name + "." + l.Name + "." + newID()
			req.Spec.Name = ""
			if _, err := s.admitter.accept(ctx, []part{{req: req, pool: pl.Name, label: l.Name}}, nil, nil); err != nil {
				s.log.Warn("pool", "pool", pl.Name, "label", l.Name, "err", err)
				continue
			}
			total += missing
		}
	}
}

// tags returns the tags Berth writes on the back-end resource of in.
func (s verbs) tags(in *reconciler.Instance) map[string]string {
	return map[string]string{
		driver.TagManaged:     "true",
		driver.TagCluster:     s.clusterID,
		driver.TagClusterName: s.cfg.Cluster,
		driver.TagProvider:    in.Provider,
		driver.TagInstance:    in.ID,
	}
}

// provider returns the named provider or an ErrNotFound naming the known
// ones.
func (s verbs) provider(name string) (*provider.Provider, error) {
	if err := s.refuse(); err != nil {
		return nil, err
	}
	p, ok := s.provs[name]
	if !ok {
		return nil, driver.Errorf(driver.ErrNotFound, "provider %q (known: %s)", name, strings.Join(s.provNames, ", "))
	}
	return p, nil
}
