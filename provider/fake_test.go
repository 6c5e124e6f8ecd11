package provider_test

import (
	"context"
	"fmt"
	"io"
	"slices"
	"sync"
	"time"

	"github.com/berth-dev/berth/driver"
)

// fake is the one test driver with fault injection: an in-memory back-end
// whose calls are recorded and whose operations can be made to fail or hang.
// It implements only driver.Driver; lifecycle and full add capabilities.
type fake struct {
	mu       sync.Mutex
	calls    []string
	nodes    []driver.Node
	insts    map[string]*driver.Instance
	next     int
	fault    map[string]error // op -> error every call of op returns
	hang     map[string]bool  // op -> the call blocks until its ctx ends
	deadline map[string]bool  // op -> whether its last ctx had a deadline
	notify   chan string      // if set, receives each op name (never blocks)
}

func newFake() *fake {
	return &fake{
		nodes: []driver.Node{
			{Name: "n1", Status: driver.NodeOnline, Images: []string{"alpine:3", "busybox:1"}},
			{Name: "n2", Status: driver.NodeOnline, Images: []string{"alpine:3"}},
		},
		insts:    map[string]*driver.Instance{},
		fault:    map[string]error{},
		hang:     map[string]bool{},
		deadline: map[string]bool{},
	}
}

// setFault makes every call of op return err (nil clears it).
func (f *fake) setFault(op string, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.fault[op] = err
}

func (f *fake) setHang(op string, on bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.hang[op] = on
}

// count returns how many times op was called.
func (f *fake) count(op string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, c := range f.calls {
		if c == op {
			n++
		}
	}
	return n
}

func (f *fake) callLog() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.calls)
}

func (f *fake) hadDeadline(op string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.deadline[op]
}

// enter records a call of op and applies the injected fault.
func (f *fake) enter(ctx context.Context, op string) error {
	f.mu.Lock()
	f.calls = append(f.calls, op)
	_, dl := ctx.Deadline()
	f.deadline[op] = dl
	err, hang, notify := f.fault[op], f.hang[op], f.notify
	f.mu.Unlock()
	if notify != nil {
		select {
		case notify <- op:
		default:
		}
	}
	if hang {
		<-ctx.Done()
		return ctx.Err()
	}
	return err
}

// put adds or replaces an instance directly, as if the back-end changed.
func (f *fake) put(in driver.Instance) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.insts[in.ID] = &in
}

// setNotify sets the channel that receives each op name.
func (f *fake) setNotify(ch chan string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.notify = ch
}

// apply changes the instances at once, as one back-end change.
func (f *fake) apply(fn func(insts map[string]*driver.Instance)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fn(f.insts)
}

func (f *fake) remove(id string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.insts, id)
}

func (f *fake) setState(id string, s driver.State) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	in, ok := f.insts[id]
	if !ok {
		return driver.Errorf(driver.ErrNotFound, "instance %s", id)
	}
	in.State = s
	return nil
}

func (f *fake) State(ctx context.Context) (*driver.PlatformState, error) {
	if err := f.enter(ctx, "state"); err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return &driver.PlatformState{Nodes: slices.Clone(f.nodes), Time: time.Now()}, nil
}

func (f *fake) Create(ctx context.Context, node string, spec *driver.Spec) (driver.Operation, error) {
	if err := f.enter(ctx, "create"); err != nil {
		return nil, err
	}
	if err := spec.Validate(); err != nil {
		return nil, err
	}
	var id string
	return driver.Steps(
		func(ctx context.Context) (bool, *driver.Instance, error) {
			if err := f.enter(ctx, "create.advance"); err != nil {
				return false, nil, err
			}
			f.mu.Lock()
			defer f.mu.Unlock()
			f.next++
			id = fmt.Sprintf("i-%d", f.next)
			in := &driver.Instance{ID: id, Name: spec.Name, Node: node, Image: spec.Image, State: driver.StateCreating, Tags: spec.Tags}
			f.insts[id] = in
			c := *in
			return true, &c, nil
		},
		func(ctx context.Context) (bool, *driver.Instance, error) {
			if err := f.enter(ctx, "create.advance"); err != nil {
				return false, nil, err
			}
			f.mu.Lock()
			defer f.mu.Unlock()
			in := f.insts[id]
			in.State = driver.StateRunning
			c := *in
			return true, &c, nil
		},
	), nil
}

func (f *fake) Delete(ctx context.Context, id string) (driver.Operation, error) {
	if err := f.enter(ctx, "delete"); err != nil {
		return nil, err
	}
	return driver.Steps(func(ctx context.Context) (bool, *driver.Instance, error) {
		if err := f.enter(ctx, "delete.advance"); err != nil {
			return false, nil, err
		}
		f.mu.Lock()
		defer f.mu.Unlock()
		if _, ok := f.insts[id]; !ok {
			return false, nil, driver.Errorf(driver.ErrNotFound, "instance %s", id)
		}
		delete(f.insts, id)
		return true, nil, nil
	}), nil
}

func (f *fake) Get(ctx context.Context, id string) (*driver.Instance, error) {
	if err := f.enter(ctx, "get"); err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	in, ok := f.insts[id]
	if !ok {
		return nil, driver.Errorf(driver.ErrNotFound, "instance %s", id)
	}
	c := *in
	return &c, nil
}

func (f *fake) Find(ctx context.Context, name string) (*driver.Instance, error) {
	if err := f.enter(ctx, "find"); err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, in := range f.insts {
		if in.Name == name {
			c := *in
			return &c, nil
		}
	}
	return nil, driver.Errorf(driver.ErrNotFound, "instance named %s", name)
}

func (f *fake) List(ctx context.Context, tags map[string]string) ([]*driver.Instance, error) {
	if err := f.enter(ctx, "list"); err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []*driver.Instance
	for _, in := range f.insts {
		c := *in
		out = append(out, &c)
	}
	return out, nil
}

func (f *fake) Close(ctx context.Context) error { return f.enter(ctx, "close") }

// lifecycle is a fake that can start, stop and read logs, and nothing else.
type lifecycle struct{ *fake }

func (l lifecycle) Start(ctx context.Context, id string) error {
	if err := l.enter(ctx, "start"); err != nil {
		return err
	}
	return l.setState(id, driver.StateRunning)
}

func (l lifecycle) Stop(ctx context.Context, id string, grace time.Duration) error {
	if err := l.enter(ctx, fmt.Sprintf("stop(%s)", grace)); err != nil {
		return err
	}
	return l.setState(id, driver.StateStopped)
}

// logLines is how many lines of stdout every instance of the fake has
// written.
const logLines = 150

// Logs writes "out N" lines to stdout (the last Tail of them when Tail is
// set) and one "err" line to stderr; with Follow it then waits for ctx.
func (l lifecycle) Logs(ctx context.Context, id string, opts driver.LogOptions, stdout, stderr io.Writer) error {
	if err := l.enter(ctx, "logs"); err != nil {
		return err
	}
	if _, err := l.Get(ctx, id); err != nil {
		return err
	}
	first := 1
	if opts.Tail > 0 {
		first = max(1, logLines-opts.Tail+1)
	}
	if opts.Stdout {
		for i := first; i <= logLines; i++ {
			fmt.Fprintf(stdout, "out %d\n", i)
		}
	}
	if opts.Stderr {
		fmt.Fprintln(stderr, "err")
	}
	if opts.Follow {
		<-ctx.Done()
		return ctx.Err()
	}
	return nil
}

// full is a fake with every optional capability of its own.
type full struct{ lifecycle }

func (f full) Restart(ctx context.Context, id string, grace time.Duration) error {
	return f.enter(ctx, "restart")
}

func (f full) Kill(ctx context.Context, id string, signal string) error {
	return f.enter(ctx, "kill "+signal)
}

func (f full) Console(ctx context.Context, id string) (string, error) {
	return "serial console", f.enter(ctx, "console")
}

func (f full) Images(ctx context.Context, node string) ([]driver.Image, error) {
	return []driver.Image{{Name: "native:1"}}, f.enter(ctx, "images")
}

func (f full) Preload(ctx context.Context, image string, nodes []string, progress func(driver.PreloadProgress)) error {
	return f.enter(ctx, "preload")
}

func (f full) Resize(ctx context.Context, id string, r driver.Resources) error {
	return f.enter(ctx, "resize")
}

func (f full) Suspend(ctx context.Context, id string) error { return f.enter(ctx, "suspend") }

func (f full) Resume(ctx context.Context, id string) error { return f.enter(ctx, "resume") }

func (f full) Usage(ctx context.Context, id string) (*driver.Usage, error) {
	return &driver.Usage{CPU: 250}, f.enter(ctx, "usage")
}

func (f full) Watch(ctx context.Context, fn func(driver.Event)) error {
	if err := f.enter(ctx, "watch"); err != nil {
		return err
	}
	fn(driver.Event{Type: driver.EventStart, Instance: "native"})
	<-ctx.Done()
	return ctx.Err()
}

// Attach echoes stdin to stdout, as cat would, and ends with stdin.
func (f full) Attach(ctx context.Context, id string, opts driver.AttachOptions, stdin io.Reader, stdout, stderr io.Writer) error {
	if err := f.enter(ctx, "attach"); err != nil {
		return err
	}
	if stdin == nil {
		<-ctx.Done()
		return ctx.Err()
	}
	_, err := io.Copy(stdout, stdin)
	return err
}

// Exec copies stdin to stdout, as cat would, and exits with the number
// of the command's words.
func (f full) Exec(ctx context.Context, id string, opts driver.ExecOptions, stdin io.Reader, stdout, stderr io.Writer) (int, error) {
	if err := f.enter(ctx, "exec"); err != nil {
		return -1, err
	}
	if stdin != nil {
		if _, err := io.Copy(stdout, stdin); err != nil {
			return -1, err
		}
	}
	return len(opts.Cmd), nil
}

func (f full) ResizeTTY(ctx context.Context, id string, size driver.TTYSize) error {
	return f.enter(ctx, fmt.Sprintf("resize-tty(%dx%d)", size.Rows, size.Cols))
}

var (
	_ driver.Attacher      = full{}
	_ driver.Execer        = full{}
	_ driver.Driver        = (*fake)(nil)
	_ driver.Starter       = lifecycle{}
	_ driver.Stopper       = lifecycle{}
	_ driver.LogReader     = lifecycle{}
	_ driver.Restarter     = full{}
	_ driver.Killer        = full{}
	_ driver.ConsoleReader = full{}
	_ driver.ImageLister   = full{}
	_ driver.Preloader     = full{}
	_ driver.Resizer       = full{}
	_ driver.Suspender     = full{}
	_ driver.UsageReporter = full{}
	_ driver.EventWatcher  = full{}
)
