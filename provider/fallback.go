package provider

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/berth-dev/berth/driver"
)

// The optional capabilities. Each method uses the driver's own
// implementation when it has one, and otherwise applies the one fallback
// written in the capability's doc comment in package driver. This file is the
// only place those fallbacks live.

// consoleLines is how many lines of Logs the Console fallback returns.
const consoleLines = 100

// unsupported reports that the driver lacks what op needs.
func (p *Provider) unsupported(op, why string, attrs ...any) error {
	err := fmt.Errorf("provider %q: %s: %w: %s", p.cfg.Name, op, driver.ErrUnsupported, why)
	p.finish(callOpts{op: op, attrs: attrs}, 0, err)
	return err
}

// invalid reports a bad argument, fe, without calling the driver.
func (p *Provider) invalid(op string, fe *driver.FieldError, attrs ...any) error {
	err := fmt.Errorf("provider %q: %s: %w", p.cfg.Name, op, fe)
	p.finish(callOpts{op: op, attrs: attrs}, 0, err)
	return err
}

// Images lists the images present on node.
// Fallback: the node's Images from State; an unknown node is ErrNotFound.
func (p *Provider) Images(ctx context.Context, node string) ([]driver.Image, error) {
	if il, ok := driver.As[driver.ImageLister](p.d, driver.CapImages); ok {
		return call(ctx, p, callOpts{op: "images", budget: readBudget, timed: true, attrs: []any{"node", node}},
			func(ctx context.Context) ([]driver.Image, error) { return il.Images(ctx, node) })
	}
	st, err := p.State(ctx)
	if err != nil {
		return nil, err
	}
	for _, n := range st.Nodes {
		if n.Name == node {
			out := make([]driver.Image, len(n.Images))
			for i, name := range n.Images {
				out[i] = driver.Image{Name: name}
			}
			return out, nil
		}
	}
	return nil, p.noNode("images", node)
}

func (p *Provider) noNode(op, node string) error {
	err := fmt.Errorf("provider %q: %s: node %q: %w", p.cfg.Name, op, node, driver.ErrNotFound)
	p.finish(callOpts{op: op, attrs: []any{"node", node}}, 0, err)
	return err
}

// Preload makes image present on nodes (all nodes when nodes is empty),
// reporting progress through progress, which may be nil. It spends one
// change from the write budget and is not bounded by CallTimeout.
// Fallback: success, with a "present" progress report per node, when every
// node already has the image (according to State); otherwise ErrUnsupported
// naming the nodes that lack it. An unknown node is ErrNotFound.
func (p *Provider) Preload(ctx context.Context, image string, nodes []string, progress func(driver.PreloadProgress)) error {
	if image == "" {
		return p.invalid("preload", &driver.FieldError{Path: "image", Reason: "required"})
	}
	if pl, ok := driver.As[driver.Preloader](p.d, driver.CapPreload); ok {
		_, err := call(ctx, p, callOpts{op: "preload", budget: writeBudget, long: true, attrs: []any{"image", image}},
			func(ctx context.Context) (struct{}, error) {
				return struct{}{}, pl.Preload(ctx, image, nodes, progress)
			})
		p.state.Invalidate()
		return err
	}
	st, err := p.State(ctx)
	if err != nil {
		return err
	}
	byName := make(map[string]*driver.Node, len(st.Nodes))
	for i := range st.Nodes {
		byName[st.Nodes[i].Name] = &st.Nodes[i]
	}
	if len(nodes) == 0 {
		for _, n := range st.Nodes {
			nodes = append(nodes, n.Name)
		}
	}
	var missing []string
	for _, name := range nodes {
		n, ok := byName[name]
		if !ok {
			return p.noNode("preload", name)
		}
		if !slices.Contains(n.Images, image) {
			missing = append(missing, name)
		}
	}
	if len(missing) > 0 {
		return p.unsupported("preload", fmt.Sprintf("the driver cannot preload images and %q is missing on %s", image, strings.Join(missing, ", ")), "image", image)
	}
	if progress != nil {
		for _, name := range nodes {
			progress(driver.PreloadProgress{Node: name, Image: image, Status: "present"})
		}
	}
	return nil
}

// Resize changes the cpu and memory limits of instance id; zero fields of r
// are left unchanged.
// Fallback: ErrUnsupported.
// CheckSpec returns why the back-end could never run spec, or nil; without
// a driver.SpecChecker every spec is taken.
func (p *Provider) CheckSpec(spec *driver.Spec) error {
	c, ok := p.d.(driver.SpecChecker)
	if !ok {
		return nil
	}
	if err := c.CheckSpec(spec); err != nil {
		return fmt.Errorf("provider %q: %w", p.cfg.Name, err)
	}
	return nil
}

func (p *Provider) Resize(ctx context.Context, id string, r driver.Resources) error {
	rs, ok := driver.As[driver.Resizer](p.d, driver.CapResize)
	if !ok {
		return p.unsupported("resize", "the driver cannot resize instances", "instance", id)
	}
	if err := driver.ValidateResources("", r); err != nil {
		err = fmt.Errorf("provider %q: resize: %w", p.cfg.Name, err)
		p.finish(callOpts{op: "resize", attrs: []any{"instance", id}}, 0, err)
		return err
	}
	err := p.write1(ctx, "resize", id, func(ctx context.Context) error { return rs.Resize(ctx, id, r) })
	p.state.Invalidate()
	return err
}

// write1 runs one timed change against instance id.
func (p *Provider) write1(ctx context.Context, op, id string, fn func(ctx context.Context) error) error {
	return p.writeGrace(ctx, op, id, 0, fn)
}

// writeGrace is write1 for a change that waits out grace first (a stop):
// CallTimeout counts from the end of the grace.
func (p *Provider) writeGrace(ctx context.Context, op, id string, grace time.Duration, fn func(ctx context.Context) error) error {
	_, err := call(ctx, p, callOpts{op: op, budget: writeBudget, timed: true, grace: grace, attrs: []any{"instance", id}},
		func(ctx context.Context) (struct{}, error) { return struct{}{}, fn(ctx) })
	return err
}

// Start starts a stopped or exited instance.
// Fallback: ErrUnsupported.
func (p *Provider) Start(ctx context.Context, id string) error {
	s, ok := driver.As[driver.Starter](p.d, driver.CapStart)
	if !ok {
		return p.unsupported("start", "the driver cannot start instances", "instance", id)
	}
	return p.write1(ctx, "start", id, func(ctx context.Context) error { return s.Start(ctx, id) })
}

// Stop stops an instance gracefully, forcing it after grace.
// Fallback: ErrUnsupported (never a delete).
func (p *Provider) Stop(ctx context.Context, id string, grace time.Duration) error {
	s, ok := driver.As[driver.Stopper](p.d, driver.CapStop)
	if !ok {
		return p.unsupported("stop", "the driver cannot stop instances", "instance", id)
	}
	return p.writeGrace(ctx, "stop", id, grace, func(ctx context.Context) error { return s.Stop(ctx, id, grace) })
}

// Restart restarts an instance.
// Fallback: Stop with grace, then Start, when the driver has both (each
// spends its own change from the write budget); else ErrUnsupported.
func (p *Provider) Restart(ctx context.Context, id string, grace time.Duration) error {
	if r, ok := driver.As[driver.Restarter](p.d, driver.CapRestart); ok {
		return p.writeGrace(ctx, "restart", id, grace, func(ctx context.Context) error { return r.Restart(ctx, id, grace) })
	}
	_, canStart := driver.As[driver.Starter](p.d, driver.CapStart)
	_, canStop := driver.As[driver.Stopper](p.d, driver.CapStop)
	if !canStart || !canStop {
		return p.unsupported("restart", "the driver can neither restart instances nor both stop and start them", "instance", id)
	}
	if err := p.Stop(ctx, id, grace); err != nil {
		return err
	}
	return p.Start(ctx, id)
}

// Kill sends signal ("TERM", "SIGKILL", "9", ...) to an instance. A signal
// driver.ParseSignal rejects is ErrInvalid without calling the driver.
// Fallback: KILL (also "SIGKILL", "9", any case) becomes Stop with zero
// grace; other signals are ErrUnsupported.
func (p *Provider) Kill(ctx context.Context, id string, signal string) error {
	if strings.TrimSpace(signal) == "" {
		return p.invalid("kill", &driver.FieldError{Path: "signal", Reason: "required"}, "instance", id)
	}
	name, _, err := driver.ParseSignal(signal)
	if fe := (*driver.FieldError)(nil); errors.As(err, &fe) {
		return p.invalid("kill", fe, "instance", id)
	}
	if k, ok := driver.As[driver.Killer](p.d, driver.CapKill); ok {
		return p.write1(ctx, "kill", id, func(ctx context.Context) error { return k.Kill(ctx, id, signal) })
	}
	if _, ok := driver.As[driver.Stopper](p.d, driver.CapStop); !ok || name != "KILL" {
		return p.unsupported("kill", fmt.Sprintf("the driver cannot send signals; only KILL can be done as a stop with no grace, not %q", signal), "instance", id)
	}
	return p.Stop(ctx, id, 0)
}

// Suspend pauses an instance.
// Fallback: ErrUnsupported.
func (p *Provider) Suspend(ctx context.Context, id string) error {
	s, ok := driver.As[driver.Suspender](p.d, driver.CapSuspend)
	if !ok {
		return p.unsupported("suspend", "the driver cannot suspend instances", "instance", id)
	}
	return p.write1(ctx, "suspend", id, func(ctx context.Context) error { return s.Suspend(ctx, id) })
}

// Resume resumes a suspended instance; an instance that is not suspended
// gives driver.ErrNotSuspended.
// Fallback: ErrUnsupported.
func (p *Provider) Resume(ctx context.Context, id string) error {
	s, ok := driver.As[driver.Suspender](p.d, driver.CapSuspend)
	if !ok {
		return p.unsupported("resume", "the driver cannot resume instances", "instance", id)
	}
	return p.write1(ctx, "resume", id, func(ctx context.Context) error { return s.Resume(ctx, id) })
}

// Logs copies an instance's output to stdout and stderr. It spends one read;
// CallTimeout applies unless opts.Follow is set, in which case it returns
// when ctx ends or the instance ends.
// Fallback: ErrUnsupported.
func (p *Provider) Logs(ctx context.Context, id string, opts driver.LogOptions, stdout, stderr io.Writer) error {
	lr, ok := driver.As[driver.LogReader](p.d, driver.CapLogs)
	if !ok {
		return p.unsupported("logs", "the driver cannot read logs", "instance", id)
	}
	_, err := call(ctx, p, callOpts{op: "logs", budget: readBudget, timed: !opts.Follow, long: opts.Follow, attrs: []any{"instance", id}},
		func(ctx context.Context) (struct{}, error) { return struct{}{}, lr.Logs(ctx, id, opts, stdout, stderr) })
	return err
}

// Attach connects to an instance's standard streams (driver.Attacher):
// output to stdout and stderr, stdin (when not nil) to its input, until the
// output ends or ctx ends. It spends one read and is not bounded by
// CallTimeout, as Logs with Follow; its outcome reaches the breaker when
// it ends.
// Fallback: ErrUnsupported.
func (p *Provider) Attach(ctx context.Context, id string, opts driver.AttachOptions, stdin io.Reader, stdout, stderr io.Writer) error {
	a, ok := driver.As[driver.Attacher](p.d, driver.CapAttach)
	if !ok {
		return p.unsupported("attach", "the driver cannot attach to instances", "instance", id)
	}
	_, err := call(ctx, p, callOpts{op: "attach", budget: readBudget, long: true, attrs: []any{"instance", id}},
		func(ctx context.Context) (struct{}, error) {
			return struct{}{}, a.Attach(ctx, id, opts, stdin, stdout, stderr)
		})
	return err
}

// ResizeTTY sets the size of an instance's terminal. It spends one change
// and is bounded by CallTimeout; a size with no rows or no columns is
// ErrInvalid without calling the driver.
// Fallback: ErrUnsupported.
func (p *Provider) ResizeTTY(ctx context.Context, id string, size driver.TTYSize) error {
	a, ok := driver.As[driver.Attacher](p.d, driver.CapAttach)
	if !ok {
		return p.unsupported("resize-tty", "the driver cannot attach to instances", "instance", id)
	}
	if size.Rows == 0 || size.Cols == 0 {
		return p.invalid("resize-tty", &driver.FieldError{Path: "size", Reason: fmt.Sprintf("%dx%d: want at least one row and one column", size.Rows, size.Cols)}, "instance", id)
	}
	return p.write1(ctx, "resize-tty", id, func(ctx context.Context) error { return a.ResizeTTY(ctx, id, size) })
}

// Exec runs a command in an instance (driver.Execer) and returns its exit
// code. It spends one change and is not bounded by CallTimeout, as
// Attach; malformed options are ErrInvalid without calling the driver.
// Fallback: ErrUnsupported.
func (p *Provider) Exec(ctx context.Context, id string, opts driver.ExecOptions, stdin io.Reader, stdout, stderr io.Writer) (int, error) {
	x, ok := driver.As[driver.Execer](p.d, driver.CapExec)
	if !ok {
		return -1, p.unsupported("exec", "the driver cannot run commands in instances", "instance", id)
	}
	if err := opts.Check(); err != nil {
		var fe *driver.FieldError
		errors.As(err, &fe)
		return -1, p.invalid("exec", fe, "instance", id)
	}
	return call(ctx, p, callOpts{op: "exec", budget: writeBudget, long: true, attrs: []any{"instance", id}},
		func(ctx context.Context) (int, error) { return x.Exec(ctx, id, opts, stdin, stdout, stderr) })
}

// Usage measures one instance's live usage.
// Fallback: ErrUnsupported; node usage is in State's InUse.
func (p *Provider) Usage(ctx context.Context, id string) (*driver.Usage, error) {
	u, ok := driver.As[driver.UsageReporter](p.d, driver.CapUsage)
	if !ok {
		return nil, p.unsupported("usage", "the driver cannot measure instances; node usage is in State", "instance", id)
	}
	return call(ctx, p, callOpts{op: "usage", budget: readBudget, timed: true, attrs: []any{"instance", id}},
		func(ctx context.Context) (*driver.Usage, error) { return u.Usage(ctx, id) })
}

// Console returns an instance's console output.
// Fallback: the last 100 lines of Logs (stdout and stderr together) when the
// driver reads logs; else ErrUnsupported.
func (p *Provider) Console(ctx context.Context, id string) (string, error) {
	if c, ok := driver.As[driver.ConsoleReader](p.d, driver.CapConsole); ok {
		return call(ctx, p, callOpts{op: "console", budget: readBudget, timed: true, attrs: []any{"instance", id}},
			func(ctx context.Context) (string, error) { return c.Console(ctx, id) })
	}
	if _, ok := driver.As[driver.LogReader](p.d, driver.CapLogs); !ok {
		return "", p.unsupported("console", "the driver reads neither console output nor logs", "instance", id)
	}
	var buf lockedBuffer
	if err := p.Logs(ctx, id, driver.LogOptions{Stdout: true, Stderr: true, Tail: consoleLines}, &buf, &buf); err != nil {
		return "", err
	}
	return buf.String(), nil
}

// lockedBuffer is a bytes.Buffer that two streams may write concurrently.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// Watch calls fn for every change in the back-end until ctx ends, and
// returns ctx's error then, or the error that broke the stream.
// Fallback: poll List every WatchInterval and report the differences from
// the previous listing as driver.DiffListings names them. The first listing
// is the baseline and reports nothing. A listing
// that fails because the back-end misbehaves is skipped; one that fails
// with an answer (ErrUnsupported, ErrInvalid, ...) ends the watch with that
// error.
func (p *Provider) Watch(ctx context.Context, fn func(driver.Event)) error {
	if w, ok := driver.As[driver.EventWatcher](p.d, driver.CapEvents); ok {
		_, err := call(ctx, p, callOpts{op: "watch", long: true},
			func(ctx context.Context) (struct{}, error) { return struct{}{}, w.Watch(ctx, fn) })
		return err
	}
	t := time.NewTicker(p.cfg.WatchInterval)
	defer t.Stop()
	var prev map[string]*driver.Instance
	for {
		list, err := p.List(ctx, nil)
		switch {
		case ctx.Err() != nil:
			return ctx.Err()
		case err == nil:
			cur := make(map[string]*driver.Instance, len(list))
			for _, in := range list {
				cur[in.ID] = in
			}
			if prev != nil {
				for _, ev := range driver.DiffListings(prev, cur, time.Now()) {
					fn(ev)
				}
			}
			prev = cur
		case !isFailure(err):
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}
