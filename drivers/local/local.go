package local

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/internal/procfs"
)

func init() {
	driver.Register(driver.Define("local", "processes on this host, shown as one node", DefaultOptions, Open))
}

// Options configures the local driver.
type Options struct {
	DataDir      string            `option:"data_dir" help:"directory holding the instance records and logs; default <Berth data dir>/local, or a new temporary directory when Berth keeps no data dir"`
	NodeName     string            `option:"node_name" help:"name of the one node; default the host name"`
	Address      string            `option:"address" help:"address at which the node's processes are reached"`
	Labels       map[string]string `option:"labels" help:"labels of the node, matched by placement constraints"`
	StopGrace    time.Duration     `option:"stop_grace" range:"0s,1h" help:"time between SIGTERM and SIGKILL when Delete stops a process"`
	CgroupRoot   string            `option:"cgroup_root" help:"mount point of the cgroup file system used for cpu and memory limits; empty disables limits"`
	PollInterval time.Duration     `option:"poll_interval" range:"5ms,1h" help:"how often Watch and log follow look at /proc and the log files"`
	AllowRoot    bool              `option:"allow_root" help:"run processes as root: a spec naming root, or naming no user while the server runs as root and no default_user is set; refused otherwise"`
	DefaultUser  string            `option:"default_user" help:"the unprivileged user (name or id) a process runs as when its spec names none and the server runs as root; empty: such a spec runs as root with allow_root, else is refused"`
}

// DefaultOptions returns the defaults.
func DefaultOptions() *Options {
	return &Options{
		Address:      "127.0.0.1",
		StopGrace:    10 * time.Second,
		CgroupRoot:   "/sys/fs/cgroup",
		PollInterval: 200 * time.Millisecond,
	}
}

// Validate checks the options beyond their types.
func (o *Options) Validate() error {
	es := driver.CheckRanges(o)
	for k := range o.Labels {
		if k == "" {
			es = append(es, &driver.FieldError{Path: "labels", Reason: "empty key"})
		}
	}
	if o.DefaultUser != "" {
		if uid, _, err := lookupUser(o.DefaultUser); err != nil {
			es = append(es, &driver.FieldError{Path: "default_user", Reason: err.Error()})
		} else if uid == 0 {
			es = append(es, &driver.FieldError{Path: "default_user", Reason: fmt.Sprintf("%q is root: want an unprivileged user", o.DefaultUser)})
		}
	}
	return es.Err()
}

// Driver runs instances as processes on this host. See the package
// documentation for its contract.
type Driver struct {
	opts   Options
	dir    string
	node   string
	boot   string
	log    *slog.Logger
	cg     cgroups
	cap    driver.Resources
	attrs  map[string]string
	closed atomic.Bool

	locks    locks
	inflight sync.Map // id -> struct{}: creates in progress in this driver
	hostCPU  meter    // node InUse
	mu       sync.Mutex
	usage    map[string]*meter // per instance
}

// Open opens the driver on opts. It creates the data directory if needed.
func Open(ctx context.Context, opts *Options, env driver.Env) (driver.Driver, error) {
	o := *opts
	dir := o.DataDir
	switch {
	case dir != "":
	case env.DataDir != "":
		dir = filepath.Join(env.DataDir, "local")
	default:
		tmp, err := os.MkdirTemp("", "berth-local-")
		if err != nil {
			return nil, fmt.Errorf("data_dir: %w", err)
		}
		dir = tmp
	}
	dir, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("data_dir: %w", err)
	}
	for _, sub := range []string{"instances", "names", "tmp"} {
		if err := os.MkdirAll(filepath.Join(dir, sub), 0o700); err != nil {
			return nil, fmt.Errorf("data_dir: %w", err)
		}
	}
	node := o.NodeName
	if node == "" {
		if node, err = os.Hostname(); err != nil || node == "" {
			node = "localhost"
		}
	}
	total, _, err := meminfo()
	if err != nil {
		return nil, err
	}
	capacity := driver.Resources{CPU: driver.MilliCPU(runtime.NumCPU() * 1000), Memory: driver.Bytes(total)}
	var fs syscall.Statfs_t
	if syscall.Statfs(dir, &fs) == nil {
		capacity.Disk = driver.Bytes(int64(fs.Blocks) * fs.Bsize)
	}
	log := env.Logger
	if log == nil {
		log = slog.Default()
	}
	d := &Driver{
		opts:  o,
		dir:   dir,
		node:  node,
		boot:  procfs.BootID(),
		log:   log,
		cg:    detectCgroups(o.CgroupRoot),
		cap:   capacity,
		usage: map[string]*meter{},
	}
	d.attrs = map[string]string{"os": runtime.GOOS, "arch": runtime.GOARCH, "cgroups": d.cg.mode()}
	var uts syscall.Utsname
	if syscall.Uname(&uts) == nil {
		d.attrs["kernel"] = utsString(uts.Release[:])
	}
	if d.cg.reason != "" {
		log.Info("cpu and memory limits are off", "reason", d.cg.reason)
	}
	if err := d.sweep(); err != nil {
		log.Warn("local: cannot remove what an interrupted create or delete left", "data_dir", dir, "err", err)
	}
	return d, nil
}

func utsString(b []int8) string {
	out := make([]byte, 0, len(b))
	for _, c := range b {
		if c == 0 {
			break
		}
		out = append(out, byte(c))
	}
	return string(out)
}

// DataDir returns the directory holding the driver's records and logs.
func (d *Driver) DataDir() string { return d.dir }

func (d *Driver) checkOpen() error {
	if d.closed.Load() {
		return driver.Errorf(driver.ErrPermanent, "local driver is closed")
	}
	return nil
}

// Close marks the driver closed. The driver runs no goroutine of its own,
// so nothing else is released; the processes keep running and a driver
// opened later on the same data_dir finds them.
func (d *Driver) Close(ctx context.Context) error {
	d.closed.Store(true)
	return nil
}

// State reports the one node: the host's CPUs, memory and the data_dir's
// file system as capacity, the resources of live instances as reserved, and
// the host's measured CPU and memory use as in use.
func (d *Driver) State(ctx context.Context) (*driver.PlatformState, error) {
	if err := d.checkOpen(); err != nil {
		return nil, err
	}
	insts, err := d.List(ctx, nil)
	if err != nil {
		return nil, err
	}
	n := driver.Node{
		Name:       d.node,
		Status:     driver.NodeOnline,
		Address:    d.opts.Address,
		Labels:     maps.Clone(d.opts.Labels),
		Attributes: maps.Clone(d.attrs),
		Capacity:   d.cap,
	}
	for _, in := range insts {
		if !live(in.State) {
			continue
		}
		n.Instances++
		n.Reserved = n.Reserved.Add(in.Resources)
		for _, p := range in.Ports {
			n.Ports = append(n.Ports, p.HostPort)
		}
	}
	slices.Sort(n.Ports)
	if used, err := d.hostInUse(ctx); err == nil {
		n.InUse = used
	} else if ctx.Err() != nil {
		return nil, fmt.Errorf("%w: %w", driver.ErrTimeout, err)
	}
	return &driver.PlatformState{Nodes: []driver.Node{n}, Time: time.Now()}, nil
}

// live reports whether an instance in state s holds resources.
func live(s driver.State) bool {
	return s == driver.StateRunning || s == driver.StateSuspended || s == driver.StateCreating || s == driver.StateDeleting
}

// Get returns the instance with id id, refreshed from /proc.
func (d *Driver) Get(ctx context.Context, id string) (*driver.Instance, error) {
	if err := d.checkOpen(); err != nil {
		return nil, err
	}
	unlock := d.locks.lock(id)
	defer unlock()
	rec, live, err := d.refresh(id)
	if err != nil {
		return nil, err
	}
	return d.instance(rec, live), nil
}

// Find returns the instance named name.
func (d *Driver) Find(ctx context.Context, name string) (*driver.Instance, error) {
	if err := d.checkOpen(); err != nil {
		return nil, err
	}
	id := d.nameOwner(name)
	if id == "" {
		return nil, driver.Errorf(driver.ErrNotFound, "no instance named %q", name)
	}
	in, err := d.Get(ctx, id)
	if errors.Is(err, driver.ErrNotFound) {
		return nil, driver.Errorf(driver.ErrNotFound, "no instance named %q", name)
	}
	if err == nil && in.Name != name {
		return nil, driver.Errorf(driver.ErrNotFound, "no instance named %q", name)
	}
	return in, err
}

// List returns every instance in data_dir whose tags include tags, sorted
// by creation time.
func (d *Driver) List(ctx context.Context, tags map[string]string) ([]*driver.Instance, error) {
	if err := d.checkOpen(); err != nil {
		return nil, err
	}
	ids, err := d.ids()
	if err != nil {
		return nil, err
	}
	out := make([]*driver.Instance, 0, len(ids))
next:
	for _, id := range ids {
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("%w: %w", driver.ErrTimeout, err)
		}
		in, err := d.Get(ctx, id)
		if errors.Is(err, driver.ErrNotFound) {
			continue // deleted meanwhile
		}
		if err != nil {
			return nil, err
		}
		for k, v := range tags {
			if in.Tags[k] != v {
				continue next
			}
		}
		out = append(out, in)
	}
	sortInstances(out)
	return out, nil
}

// sortInstances orders instances by creation time, then id.
func sortInstances(out []*driver.Instance) {
	slices.SortFunc(out, func(a, b *driver.Instance) int {
		return cmp.Or(a.Created.Compare(b.Created), cmp.Compare(a.ID, b.ID))
	})
}

// liveInfo is what refresh saw in /proc about a started process.
type liveInfo struct {
	alive bool
	state byte
}

// refresh loads id's record and brings it up to date with /proc: a process
// that has ended is reaped when Berth is its parent (which gives the exit
// code) and the end is written to the record. The caller holds id's lock.
func (d *Driver) refresh(id string) (*record, liveInfo, error) {
	rec, err := d.load(id)
	if err != nil {
		return nil, liveInfo{}, err
	}
	if rec.Phase == phaseCreating && rec.Run.PID == 0 {
		if _, busy := d.inflight.Load(id); !busy {
			if err := d.adopt(rec); err != nil {
				return nil, liveInfo{}, err
			}
		}
	}
	if (rec.Phase != phaseStarted && rec.Phase != phaseDeleting) || rec.Run.PID == 0 || !rec.Run.Finished.IsZero() {
		return rec, liveInfo{}, nil
	}
	st, err := procfs.ReadStat(rec.Run.PID)
	mine := err == nil && st.StartTicks == rec.Run.StartTicks && rec.Run.BootID == d.boot
	if mine && st.State != 'Z' && st.State != 'X' {
		return rec, liveInfo{alive: true, state: st.State}, nil
	}
	code, known := -1, false
	msg := "the process ended while Berth was not its parent; exit code unknown"
	if !mine && err == nil {
		msg = fmt.Sprintf("pid %d now belongs to another process; exit code unknown", rec.Run.PID)
	}
	if mine {
		var ws syscall.WaitStatus
		for {
			wpid, werr := syscall.Wait4(rec.Run.PID, &ws, syscall.WNOHANG, nil)
			if werr == syscall.EINTR {
				continue
			}
			if werr == nil && wpid == 0 {
				// Not yet waitable: report it alive until the next look.
				return rec, liveInfo{alive: true, state: st.State}, nil
			}
			if werr == nil && wpid == rec.Run.PID {
				known = true
				switch {
				case ws.Exited():
					code = ws.ExitStatus()
					msg = fmt.Sprintf("exit code %d", code)
				case ws.Signaled():
					code = 128 + int(ws.Signal())
					msg = fmt.Sprintf("killed by signal %s", signalName(ws.Signal()))
				}
			}
			break
		}
	}
	rec.Run.Finished = time.Now()
	if known {
		rec.Run.ExitCode = &code
	}
	rec.Message = msg
	if rec.Phase == phaseStarted {
		rec.Phase = phaseExited
		if rec.Stopping {
			rec.Phase = phaseStopped
		}
	}
	if err := d.save(rec); err != nil {
		return nil, liveInfo{}, err
	}
	return rec, liveInfo{}, nil
}

// adopt settles a record left in phaseCreating by a Berth that stopped
// during the create: a process started before it recorded the pid is found
// by its BERTH_INSTANCE_ID and recorded; otherwise the create failed.
func (d *Driver) adopt(rec *record) error {
	pid := findByEnv(envInstanceID + "=" + rec.ID)
	st, err := procfs.ReadStat(pid)
	if pid != 0 && err == nil {
		rec.Phase = phaseStarted
		rec.Run = run{PID: pid, StartTicks: st.StartTicks, BootID: d.boot, Started: time.Now()}
		rec.Message = "found running after Berth restarted"
	} else {
		rec.Phase = phaseFailed
		rec.Message = "the create was interrupted before the process started"
	}
	return d.save(rec)
}

func signalName(s syscall.Signal) string {
	for name, v := range signals {
		if v == s {
			return "SIG" + name
		}
	}
	return fmt.Sprint(int(s))
}

// instance converts a refreshed record.
func (d *Driver) instance(rec *record, li liveInfo) *driver.Instance {
	sp := rec.Spec
	in := &driver.Instance{
		ID:        rec.ID,
		Name:      rec.Name,
		Node:      rec.Node,
		Kind:      driver.KindProcess,
		Image:     sp.Image,
		Message:   rec.Message,
		Addresses: []string{d.opts.Address},
		Ports:     slices.Clone(rec.Ports),
		Resources: sp.Resources,
		Labels:    sp.Labels,
		Tags:      rec.Tags,
		Created:   rec.Created,
		Started:   rec.Run.Started,
		Finished:  rec.Run.Finished,
		ExitCode:  rec.Run.ExitCode,
		RawState:  string(rec.Phase),
	}
	if d.opts.Address == "" {
		in.Addresses = nil
	}
	switch rec.Phase {
	case phaseCreating:
		in.State = driver.StateCreating
	case phaseFailed:
		in.State = driver.StateFailed
	case phaseStarted:
		in.State = driver.StateRunning
		if li.alive {
			in.RawState = stateName(li.state)
			if li.state == 'T' {
				in.State = driver.StateSuspended
			}
		}
	case phaseExited:
		in.State = driver.StateExited
	case phaseStopped:
		in.State = driver.StateStopped
	case phaseDeleting:
		in.State = driver.StateDeleting
	default:
		in.State = driver.StateUnknown
	}
	return in
}

// Interface guards.
var (
	_ driver.Driver        = (*Driver)(nil)
	_ driver.Starter       = (*Driver)(nil)
	_ driver.Stopper       = (*Driver)(nil)
	_ driver.Restarter     = (*Driver)(nil)
	_ driver.Killer        = (*Driver)(nil)
	_ driver.Suspender     = (*Driver)(nil)
	_ driver.LogReader     = (*Driver)(nil)
	_ driver.EventWatcher  = (*Driver)(nil)
	_ driver.UsageReporter = (*Driver)(nil)
	_ driver.Resizer       = (*Driver)(nil)
)
