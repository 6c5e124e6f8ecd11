package ssh

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	gossh "golang.org/x/crypto/ssh"

	"github.com/berth-dev/berth/driver"
)

func init() {
	driver.Register(driver.Define("ssh", "processes on hosts reached over SSH, one node each", DefaultOptions, Open))
}

// Driver runs instances as supervised processes on hosts it reaches over
// SSH. See the package documentation for its contract.
type Driver struct {
	opts       Options
	log        *slog.Logger
	cluster    string // the directory of this cluster's instances on each host
	knownHosts string
	signer     gossh.Signer
	binPath    string // the supervisor binary here
	binSum     string // its SHA-256, hex
	hosts      map[string]*host
	order      []*host       // as configured
	uploads    chan struct{} // one per copy of the binary under way (maxUploads)

	calls  driver.Calls
	closed atomic.Bool
	stop   context.CancelFunc
	loop   sync.WaitGroup

	// Lock order: a host's createMu, then its installMu, then its dialMu,
	// then its mu; khMu (taken while dialling) and mu are leaves, never
	// held while another lock is taken.
	khMu sync.Mutex // known_hosts, read and appended

	mu    sync.Mutex
	names map[string]string // instance name -> id, as far as this driver has seen
}

// Open opens the driver: it reads the key and the supervisor binary, then
// connects to every host at once; a host that cannot be reached is offline
// until a probe reaches it.
func Open(ctx context.Context, opts *Options, env driver.Env) (driver.Driver, error) {
	d := &Driver{opts: *opts, log: env.Logger, hosts: map[string]*host{}, names: map[string]string{}, uploads: make(chan struct{}, maxUploads)}
	if d.log == nil {
		d.log = slog.Default()
	}
	d.cluster = env.Cluster
	if d.cluster == "" {
		d.cluster = "default"
	}
	if driver.CheckName("cluster", d.cluster, driver.MaxNameLength) != nil {
		sum := sha256.Sum256([]byte(d.cluster))
		d.cluster = hex.EncodeToString(sum[:16])
	}
	if opts.KeyFile == "" && !opts.Agent {
		return nil, &driver.FieldError{Path: "key_file", Reason: "required unless agent is set"}
	}
	if opts.KeyFile != "" {
		b, err := os.ReadFile(opts.KeyFile)
		if err != nil {
			return nil, &driver.FieldError{Path: "key_file", Reason: err.Error()}
		}
		if d.signer, err = gossh.ParsePrivateKey(b); err != nil {
			return nil, &driver.FieldError{Path: "key_file", Reason: fmt.Sprintf("%s: %v", opts.KeyFile, err)}
		}
	}
	d.knownHosts = opts.KnownHosts
	if d.knownHosts == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			return nil, &driver.FieldError{Path: "known_hosts", Reason: "not set, and no home directory: " + err.Error()}
		}
		d.knownHosts = filepath.Join(home, ".ssh", "known_hosts")
	}
	if _, err := os.Stat(d.knownHosts); err != nil && !opts.TrustFirstUse {
		pinned := true
		for _, h := range opts.Hosts {
			pinned = pinned && h.HostKey != ""
		}
		if !pinned {
			return nil, &driver.FieldError{Path: "known_hosts", Reason: err.Error()}
		}
	}
	d.binPath = opts.SupervisorBinary
	if d.binPath == "" {
		exe, err := os.Executable()
		if err != nil {
			return nil, &driver.FieldError{Path: "supervisor_binary", Reason: "not set, and this binary's path is unknown: " + err.Error()}
		}
		d.binPath = exe
	}
	sum, err := fileSum(d.binPath)
	if err != nil {
		return nil, &driver.FieldError{Path: "supervisor_binary", Reason: err.Error()}
	}
	d.binSum = sum
	for _, hc := range opts.Hosts {
		h := &host{d: d, cfg: hc, name: hc.name(), slots: make(chan struct{}, opts.MaxChannels), turns: make(chan struct{}, opts.MaxChannels)}
		d.hosts[h.name] = h
		d.order = append(d.order, h)
	}
	var wg sync.WaitGroup
	for _, h := range d.order {
		wg.Go(func() {
			if _, err := h.connect(ctx); err != nil {
				d.log.Warn("ssh: host offline", "host", h.name, "err", err)
			}
		})
	}
	wg.Wait()
	// The names in use, so that a create after a restart never takes one
	// twice; a host that could not be listed is listed again later.
	d.listHosts(ctx)
	lctx, stop := context.WithCancel(context.Background())
	d.stop = stop
	d.loop.Go(func() { d.probeLoop(lctx) })
	return d, nil
}

func fileSum(p string) (string, error) {
	f, err := os.Open(p)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// probeLoop checks every host each probe_interval until ctx ends.
func (d *Driver) probeLoop(ctx context.Context) {
	t := time.NewTicker(d.opts.ProbeInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		var wg sync.WaitGroup
		for _, h := range d.order {
			wg.Go(func() { h.probe(ctx) })
		}
		wg.Wait()
	}
}

// Close stops the probes, ends the calls in flight and closes every
// connection. The instances keep running under their supervisors.
func (d *Driver) Close(ctx context.Context) error {
	if d.closed.Swap(true) {
		return nil
	}
	d.stop()
	d.calls.Cancel()
	d.loop.Wait()
	d.calls.Wait()
	for _, h := range d.order {
		h.close()
	}
	return nil
}

func (d *Driver) checkOpen() error {
	if d.closed.Load() {
		return driver.Errorf(driver.ErrPermanent, "ssh driver is closed")
	}
	return nil
}

// Paths on a host.
func (d *Driver) remoteBin() string { return path.Join(d.opts.Root, "bin", "berth-"+d.binSum[:16]) }
func (d *Driver) clusterDir() string {
	return path.Join(d.opts.Root, "c", d.cluster)
}
func (d *Driver) instDir(id string) string { return path.Join(d.clusterDir(), id) }

// newID returns an id naming its node: <node>.<16 hex digits>.
func newID(node string) string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return node + "." + hex.EncodeToString(b[:])
}

// hostOf returns the host of instance id, or ErrNotFound.
func (d *Driver) hostOf(id string) (*host, error) {
	i := strings.LastIndexByte(id, '.')
	if i <= 0 || len(id)-i-1 != 16 {
		return nil, driver.Errorf(driver.ErrNotFound, "no instance %q", id)
	}
	if _, err := hex.DecodeString(id[i+1:]); err != nil {
		return nil, driver.Errorf(driver.ErrNotFound, "no instance %q", id)
	}
	h, ok := d.hosts[id[:i]]
	if !ok {
		return nil, driver.Errorf(driver.ErrNotFound, "no instance %q: no host %q", id, id[:i])
	}
	return h, nil
}

// supervise runs a verb of the supervisor on h, installing it first when
// needed. It returns the verb's exit code and what it wrote on stderr.
func (h *host) supervise(ctx context.Context, stdout, stderr io.Writer, verb string, args ...string) (int, string, error) {
	return h.superviseIn(ctx, nil, stdout, stderr, verb, args...)
}

// superviseIn is supervise with stdin copied to the verb's input.
func (h *host) superviseIn(ctx context.Context, stdin io.Reader, stdout, stderr io.Writer, verb string, args ...string) (int, string, error) {
	if err := h.install(ctx); err != nil {
		return -1, "", err
	}
	var b strings.Builder
	b.WriteString(quote(h.d.remoteBin()) + " " + SuperviseCommand + " " + verb)
	for _, a := range args {
		b.WriteString(" " + quote(a))
	}
	var errBuf bytes.Buffer
	w := io.Writer(&limitedBuffer{b: &errBuf, n: 4096})
	if stderr != nil {
		w = stderr
	}
	code, err := h.run(ctx, b.String(), stdin, stdout, w)
	if code == 127 || code == 126 {
		// The binary is gone (someone cleaned the root): copy it again.
		h.mu.Lock()
		h.installed, h.limits, h.supervisor = "", "", ""
		h.mu.Unlock()
		return -1, "", driver.Errorf(driver.ErrRetryable, "host %s: the supervisor %s is missing: %s", h.name, h.d.remoteBin(), strings.TrimSpace(errBuf.String()))
	}
	return code, strings.TrimSpace(errBuf.String()), err
}

// superviseStreams runs a verb whose output is an instance's streams,
// framed on the session's stdout (framedStream), and copies each to its
// writer. The session's stderr, where the host's shell may print as it
// starts, stays out of them: it is the message returned, as for the
// other verbs.
func (h *host) superviseStreams(ctx context.Context, stdin io.Reader, stdout, stderr io.Writer, verb string, args ...string) (int, string, error) {
	r, w := io.Pipe()
	decoded := make(chan error, 1)
	go func() {
		_, _, err := readStreams(r, stdout, stderr)
		if err == nil {
			err = errors.New("a frame that is neither stdout nor stderr")
		}
		r.CloseWithError(err)
		decoded <- err
	}()
	code, msg, err := h.superviseIn(ctx, stdin, w, nil, verb, args...)
	w.Close()
	if derr := <-decoded; err == nil && derr != io.EOF && derr != io.ErrClosedPipe {
		err = driver.Errorf(driver.ErrRetryable, "host %s: %s: the output: %v", h.name, verb, derr)
	}
	return code, msg, err
}

// maxUploads bounds the copies of the supervisor binary under way at once.
const maxUploads = 4

// Bounds of what a host's answers may hold: one instance's status, and a
// listing (a few hundred bytes an instance, tags included).
const (
	maxStatus  = 1 << 20
	maxListing = 256 << 20
)

// limitedBuffer keeps the first n bytes written to it, and whether more
// came (then what it holds is not the whole answer, nor valid JSON).
type limitedBuffer struct {
	b    *bytes.Buffer
	n    int
	over bool
}

func (l *limitedBuffer) Write(p []byte) (int, error) {
	room := l.n - l.b.Len()
	if room < len(p) {
		l.over = true
	}
	if room > 0 {
		l.b.Write(p[:min(room, len(p))])
	}
	return len(p), nil
}

// install puts the supervisor on the host unless a binary with its SHA-256
// is there already, once per connection.
func (h *host) install(ctx context.Context) error {
	h.mu.Lock()
	done := h.installed != ""
	h.mu.Unlock()
	if done {
		return nil
	}
	h.installMu.Lock()
	defer h.installMu.Unlock()
	h.mu.Lock()
	done = h.installed != ""
	h.mu.Unlock()
	if done {
		return nil
	}
	bin := h.d.remoteBin()
	check := func() (bool, error) {
		var out bytes.Buffer
		_, err := h.run(ctx, "sha256sum "+quote(bin)+" 2>/dev/null", nil, &limitedBuffer{b: &out, n: 4096}, io.Discard)
		if err != nil {
			return false, err
		}
		f := strings.Fields(out.String())
		return len(f) > 0 && f[0] == h.d.binSum, nil
	}
	ok, err := check()
	if err != nil {
		return err
	}
	if !ok {
		// The binary is tens of megabytes: a few copies at once, however
		// many hosts there are.
		select {
		case h.d.uploads <- struct{}{}:
		case <-ctx.Done():
			return driver.Errorf(driver.ErrRetryable, "host %s: waiting to copy the supervisor: %v", h.name, ctx.Err())
		}
		err := h.sftp(ctx, func(c *sftpClient) error { return c.upload(h.d.binPath, bin) })
		<-h.d.uploads
		if err != nil {
			return err
		}
		if ok, err = check(); err != nil {
			return err
		}
		if !ok {
			return driver.Errorf(driver.ErrRetryable, "host %s: the supervisor copied to %s does not have the SHA-256 %s", h.name, bin, h.d.binSum)
		}
		h.d.log.Info("ssh: supervisor copied", "host", h.name, "path", bin)
	}
	// Whether limits can be enforced: the supervisor makes the cgroup
	// parent, or says why it cannot.
	var errOut bytes.Buffer
	code, err := h.run(ctx, quote(bin)+" "+SuperviseCommand+" cgroup "+quote(h.d.opts.CgroupParent), nil, io.Discard, &limitedBuffer{b: &errOut, n: 4096})
	if err != nil {
		return err
	}
	limits := "ok"
	switch code {
	case exitOK:
	case exitUnsupported:
		limits = strings.TrimSpace(errOut.String())
	default:
		return driver.Errorf(driver.ErrRetryable, "host %s: cgroup check: exit code %d: %s", h.name, code, strings.TrimSpace(errOut.String()))
	}
	supervisor := SupervisionProcess
	if h.d.opts.Supervision == SupervisionAuto {
		sys, why, err := h.checkSystemd(ctx, bin)
		if err != nil {
			return err
		}
		if sys {
			supervisor, limits = SupervisionSystemd, cmp.Or(why, "ok")
		}
	}
	h.mu.Lock()
	h.installed, h.limits, h.supervisor = bin, limits, supervisor
	h.mu.Unlock()
	return nil
}

// checkSystemd asks the supervisor bin on h whether instances can run in
// transient systemd units there, and if so why their limits cannot be
// held ("" when they can).
func (h *host) checkSystemd(ctx context.Context, bin string) (bool, string, error) {
	var out, errOut bytes.Buffer
	code, err := h.run(ctx, quote(bin)+" "+SuperviseCommand+" systemd", nil, &limitedBuffer{b: &out, n: 4096}, &limitedBuffer{b: &errOut, n: 4096})
	switch {
	case err != nil:
		return false, "", err
	case code == exitOK:
		return true, strings.TrimSpace(out.String()), nil
	case code == exitUnsupported:
		h.d.log.Info("ssh: no systemd units: the supervisor runs as a process", "host", h.name, "reason", strings.TrimSpace(errOut.String()))
		return false, "", nil
	}
	return false, "", driver.Errorf(driver.ErrRetryable, "host %s: systemd check: exit code %d: %s", h.name, code, strings.TrimSpace(errOut.String()))
}

// supervision returns how instances made on h now are supervised
// (SupervisionSystemd or SupervisionProcess). It installs the supervisor
// first when needed.
func (h *host) supervision(ctx context.Context) (string, error) {
	if err := h.install(ctx); err != nil {
		return "", err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.supervisor, nil
}

// noLimits says why cpu and memory limits cannot be enforced on h, or ""
// when they can. It installs the supervisor first when needed.
func (h *host) noLimits(ctx context.Context) (string, error) {
	if err := h.install(ctx); err != nil {
		return "", err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.limits == "ok" {
		return "", nil
	}
	return h.limits, nil
}

// status reads one instance from its host.
func (d *Driver) status(ctx context.Context, id string) (*host, *status, error) {
	h, err := d.hostOf(id)
	if err != nil {
		return nil, nil, err
	}
	var out bytes.Buffer
	code, msg, err := h.supervise(ctx, &limitedBuffer{b: &out, n: maxStatus}, nil, "status", d.instDir(id))
	if err != nil {
		return h, nil, err
	}
	if code != 0 {
		return h, nil, driver.Errorf(driver.ErrRetryable, "host %s: status of %s: exit code %d: %s", h.name, id, code, msg)
	}
	var st status
	if err := json.Unmarshal(out.Bytes(), &st); err != nil {
		return h, nil, driver.Errorf(driver.ErrRetryable, "host %s: status of %s: %v", h.name, id, err)
	}
	if st.Phase == "gone" {
		return h, nil, driver.Errorf(driver.ErrNotFound, "no instance %q", id)
	}
	return h, &st, nil
}

// instance converts what the supervisor reported.
func (d *Driver) instance(h *host, st *status) *driver.Instance {
	in := &driver.Instance{
		ID: st.ID, Name: st.Name, Node: st.Node, Kind: driver.KindProcess, Image: st.Image,
		RawState: st.Phase, Message: st.Message, ExitCode: st.ExitCode,
		Addresses: []string{h.cfg.Address}, Resources: st.Resources, Labels: st.Labels, Tags: st.Tags,
		Created: st.Created, Started: st.Started, Finished: st.Finished,
	}
	switch st.Phase {
	case "creating":
		in.State = driver.StateCreating
	case "running":
		in.State = driver.StateRunning
	case "suspended":
		in.State = driver.StateSuspended
	case "exited":
		in.State = driver.StateExited
	case "stopped":
		in.State = driver.StateStopped
	case "failed":
		in.State = driver.StateFailed
	default:
		in.State = driver.StateUnknown
	}
	return in
}

// Get returns the instance with id id.
func (d *Driver) Get(ctx context.Context, id string) (*driver.Instance, error) {
	if err := d.checkOpen(); err != nil {
		return nil, err
	}
	h, st, err := d.status(ctx, id)
	if err != nil {
		return nil, err
	}
	return d.instance(h, st), nil
}

// Find returns the instance named name: the one this driver knows by that
// name, else the one a listing of every host shows.
func (d *Driver) Find(ctx context.Context, name string) (*driver.Instance, error) {
	if err := d.checkOpen(); err != nil {
		return nil, err
	}
	d.mu.Lock()
	id := d.names[name]
	d.mu.Unlock()
	if id != "" {
		in, err := d.Get(ctx, id)
		if err == nil && in.Name == name {
			return in, nil
		}
		if err != nil && !errors.Is(err, driver.ErrNotFound) {
			return nil, err
		}
	}
	list, err := d.List(ctx, nil)
	for _, in := range list {
		if in.Name == name {
			return in, nil
		}
	}
	if err != nil {
		return nil, err
	}
	return nil, driver.Errorf(driver.ErrNotFound, "no instance named %q", name)
}

// List returns this cluster's instances on every host whose tags include
// tags. Hosts that cannot be asked are named in a *PartialListError.
func (d *Driver) List(ctx context.Context, tags map[string]string) ([]*driver.Instance, error) {
	if err := d.checkOpen(); err != nil {
		return nil, err
	}
	per := d.listHosts(ctx)
	var out []*driver.Instance
	var missed []string
	var errs []error
	for _, r := range per {
		if r.err != nil {
			missed = append(missed, r.h.name)
			errs = append(errs, r.err)
			continue
		}
	next:
		for _, in := range r.insts {
			for k, v := range tags {
				if in.Tags[k] != v {
					continue next
				}
			}
			out = append(out, in)
		}
	}
	slices.SortFunc(out, func(a, b *driver.Instance) int {
		return cmp.Or(a.Created.Compare(b.Created), cmp.Compare(a.ID, b.ID))
	})
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("%w: %w", driver.ErrTimeout, err)
	}
	if len(missed) > 0 {
		slices.Sort(missed)
		return out, &driver.PartialListError{Nodes: missed, Err: errors.Join(errs...)}
	}
	return out, nil
}

type hostList struct {
	h     *host
	insts []*driver.Instance
	err   error
}

// listHosts lists every host at once, in the configured order, and notes
// the names seen.
func (d *Driver) listHosts(ctx context.Context) []hostList {
	out := make([]hostList, len(d.order))
	var wg sync.WaitGroup
	for i, h := range d.order {
		wg.Go(func() {
			insts, err := d.listHost(ctx, h)
			out[i] = hostList{h: h, insts: insts, err: err}
		})
	}
	wg.Wait()
	d.mu.Lock()
	for _, r := range out {
		for _, in := range r.insts {
			if in.Name != "" {
				d.names[in.Name] = in.ID
			}
		}
	}
	d.mu.Unlock()
	return out
}

// listHost lists the instances of this cluster on h.
func (d *Driver) listHost(ctx context.Context, h *host) ([]*driver.Instance, error) {
	ctx, cancel := context.WithTimeout(ctx, d.opts.CallTimeout)
	defer cancel()
	var out bytes.Buffer
	lim := &limitedBuffer{b: &out, n: maxListing}
	code, msg, err := h.supervise(ctx, lim, nil, "list", d.clusterDir())
	if err != nil {
		return nil, err
	}
	if code != 0 {
		return nil, driver.Errorf(driver.ErrRetryable, "host %s: list: exit code %d: %s", h.name, code, msg)
	}
	if lim.over {
		return nil, driver.Errorf(driver.ErrRetryable, "host %s: list: more than %d bytes", h.name, maxListing)
	}
	var insts []*driver.Instance
	sc := bufio.NewScanner(&out)
	sc.Buffer(make([]byte, 64*1024), 4*1024*1024)
	for sc.Scan() {
		var st status
		if err := json.Unmarshal(sc.Bytes(), &st); err != nil {
			return nil, driver.Errorf(driver.ErrRetryable, "host %s: list: %v", h.name, err)
		}
		if st.Node != h.name {
			continue // hosts sharing the root's file system: the other's
		}
		insts = append(insts, d.instance(h, &st))
	}
	return insts, sc.Err()
}

// live reports whether an instance in state s holds resources.
func live(s driver.State) bool {
	return s == driver.StateRunning || s == driver.StateSuspended || s == driver.StateCreating || s == driver.StateDeleting
}

// State reports one node per host: its cpus, memory and disk as read from
// the host (or as configured), the resources of its live instances as
// reserved. A host that is not connected, or whose listing fails, is
// offline with the reason.
func (d *Driver) State(ctx context.Context) (*driver.PlatformState, error) {
	if err := d.checkOpen(); err != nil {
		return nil, err
	}
	per := d.listHosts(ctx)
	st := &driver.PlatformState{Time: time.Now()}
	for _, r := range per {
		h := r.h
		up, reason, f := h.online()
		n := driver.Node{
			Name: h.name, Status: driver.NodeOnline, Address: h.cfg.Address, Labels: maps.Clone(h.cfg.Labels),
			MaxInstances: h.cfg.MaxInstances,
		}
		switch {
		case r.err != nil:
			n.Status, n.Reason = driver.NodeOffline, r.err.Error()
		case !up:
			n.Status, n.Reason = driver.NodeOffline, reason
		}
		if f.cpus > 0 {
			n.Capacity = driver.Resources{CPU: driver.MilliCPU(f.cpus * 1000), Memory: driver.Bytes(f.memory), Disk: driver.Bytes(f.disk)}
			n.Attributes = map[string]string{"kernel": f.kernel, "arch": f.arch, "os": "linux"}
			h.mu.Lock()
			switch {
			case h.limits == "":
			case h.limits == "ok" && h.supervisor == SupervisionSystemd:
				n.Attributes["limits"] = "systemd"
			case h.limits == "ok":
				n.Attributes["limits"] = "cgroup2"
			default:
				n.Attributes["limits"] = "none"
			}
			if h.supervisor != "" {
				n.Attributes["supervisor"] = h.supervisor
			}
			h.mu.Unlock()
		}
		n.Capacity = h.capacity(n.Capacity)
		for _, in := range r.insts {
			if live(in.State) {
				n.Instances++
				n.Reserved = n.Reserved.Add(in.Resources)
			}
		}
		st.Nodes = append(st.Nodes, n)
	}
	return st, nil
}

// capacity applies the host's configured capacity over what was read.
func (h *host) capacity(read driver.Resources) driver.Resources {
	c := h.cfg.Capacity
	if c.CPU > 0 {
		read.CPU = c.CPU
	}
	if c.Memory > 0 {
		read.Memory = c.Memory
	}
	if c.Disk > 0 {
		read.Disk = c.Disk
	}
	if c.GPUs > 0 {
		read.GPUs = c.GPUs
	}
	if len(c.Other) > 0 {
		read.Other = maps.Clone(c.Other)
	}
	return read
}

// callOp is a create or delete whose work runs in one background call, in
// its host's turn (host.turns); until it has its turn it is Queued.
type callOp struct{ c *driver.Call }

// newCallOp runs fn in the background once h gives it a turn, with
// timeout from then; unsent (if set) runs instead when the operation ends
// while it waits.
func (d *Driver) newCallOp(ctx context.Context, h *host, timeout time.Duration, what string, fn func(ctx context.Context) (*driver.Instance, error), unsent func()) callOp {
	return callOp{d.calls.GoAfter(ctx, h.turns, timeout, what, fn, unsent)}
}

func (o callOp) Advance(context.Context) (driver.Progress, error) {
	if !o.c.Finished() {
		return driver.Progress{Wait: o.c.Wait(5 * time.Millisecond), Queued: !o.c.Sent()}, nil
	}
	if o.c.Err != nil {
		return driver.Progress{Instance: o.c.Inst}, o.c.Err
	}
	return driver.Progress{Done: true, Instance: o.c.Inst}, nil
}

// Delete stops the instance's process (TERM, then KILL after stop_grace)
// and removes its directory.
func (d *Driver) Delete(ctx context.Context, id string) (driver.Operation, error) {
	if err := d.checkOpen(); err != nil {
		return nil, err
	}
	h, err := d.hostOf(id)
	if err != nil {
		return driver.Finished(nil, err), nil
	}
	timeout := d.opts.CallTimeout + d.opts.StopGrace + 10*time.Second
	return d.newCallOp(ctx, h, timeout, "ssh: delete "+id, func(ctx context.Context) (*driver.Instance, error) {
		code, msg, err := h.supervise(ctx, nil, nil, "delete", d.instDir(id), d.opts.StopGrace.String())
		switch {
		case err != nil:
			return nil, err
		case code == exitNotFound:
			d.forget(id)
			return nil, driver.Errorf(driver.ErrNotFound, "no instance %q", id)
		case code != 0:
			return nil, driver.Errorf(driver.ErrDeleteFailed, "host %s: delete %s: %s", h.name, id, msg)
		}
		d.forget(id)
		return nil, nil
	}, nil), nil
}

// forget drops id from the names this driver knows.
func (d *Driver) forget(id string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for n, v := range d.names {
		if v == id {
			delete(d.names, n)
		}
	}
}

// SharedBackend: the hosts are named by address, and every server with
// the same options reaches the same processes.
func (d *Driver) SharedBackend() bool { return true }

// Interface guards.
var (
	_ driver.Driver          = (*Driver)(nil)
	_ driver.Starter         = (*Driver)(nil)
	_ driver.Stopper         = (*Driver)(nil)
	_ driver.Restarter       = (*Driver)(nil)
	_ driver.Killer          = (*Driver)(nil)
	_ driver.Suspender       = (*Driver)(nil)
	_ driver.UsageReporter   = (*Driver)(nil)
	_ driver.LogReader       = (*Driver)(nil)
	_ driver.FeatureReporter = (*Driver)(nil)
	_ driver.SpecChecker     = (*Driver)(nil)
	_ driver.Resizer         = (*Driver)(nil)
	_ driver.Attacher        = (*Driver)(nil)
	_ driver.Execer          = (*Driver)(nil)
	_ driver.SharedBackend   = (*Driver)(nil)
)
