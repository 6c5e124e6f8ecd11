package provider

import (
	"context"
	"errors"
	"sync"

	"github.com/berth-dev/berth/driver"
)

// State returns the back-end's platform state. One reading is shared by all
// callers for StateTTL, and concurrent callers of an expired reading wait for
// a single fetch (driver.ListCache). The result is shared: callers must not
// modify it.
func (p *Provider) State(ctx context.Context) (*driver.PlatformState, error) {
	return p.state.Get(ctx)
}

// InvalidateState forgets the shared State reading, so the next State call
// reads the back-end. The provider calls it itself when a Create, Delete,
// Resize or Preload finishes.
func (p *Provider) InvalidateState() { p.state.Invalidate() }

// Create starts building an instance of spec on node (driver.Driver.Create).
// It spends one change from the write budget, and never waits for one:
// when the budget has none to spare it returns a *Busy at once, saying
// when to try again. ctx bounds the whole operation, so CallTimeout does
// not apply to it; the returned Operation applies CallTimeout to each
// Advance, spends the read budget without ever blocking, and reports its
// outcome to the breaker and the metrics.
func (p *Provider) Create(ctx context.Context, node string, spec *driver.Spec) (driver.Operation, error) {
	attrs := []any{"node", node}
	if spec != nil && spec.Name != "" {
		attrs = append(attrs, "name", spec.Name)
	}
	op, err := call(ctx, p, callOpts{op: "create", budget: writeBudget, noWait: true, attrs: attrs},
		func(ctx context.Context) (driver.Operation, error) { return p.d.Create(ctx, node, spec) })
	if err != nil {
		return nil, err
	}
	return &operation{p: p, op: op, name: "create.advance", attrs: attrs, create: true}, nil
}

// Delete starts removing the instance id (driver.Driver.Delete), on the same
// terms as Create. The operation finishing with driver.ErrNotFound means the
// instance was already gone.
func (p *Provider) Delete(ctx context.Context, id string) (driver.Operation, error) {
	attrs := []any{"instance", id}
	op, err := call(ctx, p, callOpts{op: "delete", budget: writeBudget, noWait: true, attrs: attrs},
		func(ctx context.Context) (driver.Operation, error) { return p.d.Delete(ctx, id) })
	if err != nil {
		return nil, err
	}
	return &operation{p: p, op: op, name: "delete.advance", attrs: attrs}, nil
}

// Get returns the instance with back-end id id, or driver.ErrNotFound.
func (p *Provider) Get(ctx context.Context, id string) (*driver.Instance, error) {
	return call(ctx, p, callOpts{op: "get", budget: readBudget, timed: true, attrs: []any{"instance", id}},
		func(ctx context.Context) (*driver.Instance, error) { return p.d.Get(ctx, id) })
}

// Find returns the instance named name, or driver.ErrNotFound.
func (p *Provider) Find(ctx context.Context, name string) (*driver.Instance, error) {
	return call(ctx, p, callOpts{op: "find", budget: readBudget, timed: true, attrs: []any{"name", name}},
		func(ctx context.Context) (*driver.Instance, error) { return p.d.Find(ctx, name) })
}

// List returns every instance of Berth's whose tags include all of tags.
func (p *Provider) List(ctx context.Context, tags map[string]string) ([]*driver.Instance, error) {
	return call(ctx, p, callOpts{op: "list", budget: readBudget, timed: true},
		func(ctx context.Context) ([]*driver.Instance, error) { return p.d.List(ctx, tags) })
}

// Walk calls fn for each instance List(ctx, tags) would return, through
// the driver's Walk when it has one (driver.Walker), else through List. It
// counts as one list call against the budget and the breaker.
func (p *Provider) Walk(ctx context.Context, tags map[string]string, fn func(*driver.Instance) error) error {
	_, err := call(ctx, p, callOpts{op: "list", budget: readBudget, timed: true},
		func(ctx context.Context) (struct{}, error) {
			if w, ok := p.d.(driver.Walker); ok {
				return struct{}{}, w.Walk(ctx, tags, fn)
			}
			all, err := p.d.List(ctx, tags)
			for _, in := range all {
				if ferr := fn(in); ferr != nil {
					return struct{}{}, ferr
				}
			}
			return struct{}{}, err
		})
	return err
}

// Skim calls skim with the glance of each instance List(ctx, tags) would
// return and fn with the whole instance when skim returns true, through the
// driver's Skim when it has one (driver.Skimmer), else through Walk. It
// counts as one list call against the budget and the breaker.
func (p *Provider) Skim(ctx context.Context, tags map[string]string, skim func(*driver.Glance) bool, fn func(*driver.Instance) error) error {
	if s, ok := p.d.(driver.Skimmer); ok {
		_, err := call(ctx, p, callOpts{op: "list", budget: readBudget, timed: true},
			func(ctx context.Context) (struct{}, error) { return struct{}{}, s.Skim(ctx, tags, skim, fn) })
		return err
	}
	return p.Walk(ctx, tags, func(in *driver.Instance) error {
		g := driver.Glance{ID: in.ID, Instance: in.Tags[driver.TagInstance], State: in.State, ExitCode: in.ExitCode}
		if !skim(&g) {
			return nil
		}
		return fn(in)
	})
}

// Sweep removes the back-end's shared resources tagged with tags that no
// instance uses (driver.Sweeper); a driver that shares nothing has nothing
// to sweep. It counts as one read (mostly a listing) against the budget
// and the breaker.
func (p *Provider) Sweep(ctx context.Context, tags map[string]string) error {
	sw, ok := p.d.(driver.Sweeper)
	if !ok {
		return nil
	}
	_, err := call(ctx, p, callOpts{op: "sweep", budget: readBudget, timed: true},
		func(ctx context.Context) (struct{}, error) { return struct{}{}, sw.Sweep(ctx, tags) })
	return err
}

// Close closes the driver. It takes no budget and is not refused by the
// breaker; instances keep running.
func (p *Provider) Close(ctx context.Context) error {
	err := p.d.Close(ctx)
	p.finish(callOpts{op: "close"}, 0, err)
	return err
}

// operation wraps a driver's Operation so that each Advance goes through the
// provider: read budget (never waited for), breaker, CallTimeout, logging
// and metrics. Once the operation is over its result is kept and repeated
// without calling the driver again.
type operation struct {
	p     *Provider
	op    driver.Operation
	name  string
	attrs []any
	// create adds the instance id to the log attributes once it is known.
	create bool

	mu   sync.Mutex
	last driver.Progress
	err  error
	over bool
}

// Advance makes one non-blocking step. When the read budget is spent or the
// breaker refuses calls, it returns at once with Progress.Wait set and
// without calling the driver.
func (o *operation) Advance(ctx context.Context) (driver.Progress, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.over {
		return o.last, o.err
	}
	attrs := o.attrs
	if o.create && o.last.Instance != nil && o.last.Instance.ID != "" {
		attrs = append(attrs[:len(attrs):len(attrs)], "instance", o.last.Instance.ID)
	}
	pr, err := call(ctx, o.p, callOpts{op: o.name, budget: readBudget, timed: true, advance: true, quiet: true, attrs: attrs}, o.op.Advance)
	if b, ok := errors.AsType[*Busy](err); ok {
		// Not asked: as far as is known, still queued or not.
		return driver.Progress{Instance: o.last.Instance, Wait: b.Wait, Queued: o.last.Queued}, nil
	}
	o.last = pr
	if err != nil || pr.Done {
		o.over, o.err = true, err
		o.p.state.Invalidate()
		if err == nil {
			attrs = o.attrs
			if o.create && pr.Instance != nil && pr.Instance.ID != "" {
				attrs = append(attrs[:len(attrs):len(attrs)], "instance", pr.Instance.ID)
			}
			o.p.log.Debug(o.name+" done", append([]any{"op", o.name}, attrs...)...)
		}
	}
	return pr, err
}

// Provider has every method of the driver contract, with the same
// signatures, so code written against driver interfaces can take a Provider.
var (
	_ driver.Driver        = (*Provider)(nil)
	_ driver.ImageLister   = (*Provider)(nil)
	_ driver.Preloader     = (*Provider)(nil)
	_ driver.Resizer       = (*Provider)(nil)
	_ driver.Starter       = (*Provider)(nil)
	_ driver.Stopper       = (*Provider)(nil)
	_ driver.Restarter     = (*Provider)(nil)
	_ driver.Killer        = (*Provider)(nil)
	_ driver.Suspender     = (*Provider)(nil)
	_ driver.LogReader     = (*Provider)(nil)
	_ driver.EventWatcher  = (*Provider)(nil)
	_ driver.UsageReporter = (*Provider)(nil)
	_ driver.ConsoleReader = (*Provider)(nil)
)
