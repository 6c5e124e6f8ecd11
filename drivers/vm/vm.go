package vm

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"sync"
	"time"

	"github.com/digitalocean/go-libvirt"
	"github.com/digitalocean/go-libvirt/socket/dialers"

	"github.com/berth-dev/berth/driver"
)

func init() {
	driver.Register(driver.Define("vm", "virtual machines on libvirt/QEMU hosts", DefaultOptions,
		func(ctx context.Context, opts *Options, env driver.Env) (driver.Driver, error) {
			return New(ctx, *opts, env.Logger)
		}))
}

// Driver runs virtual machines on libvirt hosts. It is safe for concurrent
// use.
type Driver struct {
	opts   Options
	log    *slog.Logger
	nodes  []*node
	byName map[string]*node

	mu     sync.Mutex
	closed bool
	calls  sync.WaitGroup // libvirt calls and operation steps in flight
	stop   chan struct{}  // closed by Close: steps give up
}

// node is one libvirt daemon and the connection to it.
type node struct {
	cfg    NodeConfig
	target target // cfg.URI taken apart

	mu  sync.Mutex
	lv  *libvirt.Libvirt // nil or disconnected until the next call dials
	raw net.Conn         // lv's stream, closed with it

	// dl downloads files; it has a connection of its own.
	dl downloader

	// define serializes the capacity check and the define of creates, so
	// that two creates cannot both take the last room.
	define sync.Mutex
}

// New opens the driver. Hosts are dialled on first use: a host that does
// not answer is an offline node, not an error.
func New(ctx context.Context, opts Options, log *slog.Logger) (*Driver, error) {
	if err := opts.Validate(); err != nil {
		return nil, fmt.Errorf("vm: %w", err)
	}
	if log == nil {
		log = slog.Default()
	}
	d := &Driver{opts: opts, log: log, byName: map[string]*node{}, stop: make(chan struct{})}
	for _, c := range opts.Nodes {
		if c.URI == "" {
			c.URI = "qemu:///system"
		}
		if c.Socket == "" {
			c.Socket = DefaultSocket
		}
		t, _ := parseURI(c.URI) // checked by Validate
		if t.transport == transportSSH {
			if t.user == "" {
				t.user = defaultUser()
			}
			if c.SSHKey == "" {
				c.SSHKey = firstKey()
			}
			if c.KnownHosts == "" {
				c.KnownHosts = homeFile(".ssh", "known_hosts")
			}
		}
		n := &node{cfg: c, target: t}
		d.nodes = append(d.nodes, n)
		d.byName[c.Name] = n
	}
	return d, nil
}

// Close disconnects from every host and waits for the calls in flight,
// which the disconnection ends. Domains keep running.
func (d *Driver) Close(ctx context.Context) error {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return nil
	}
	d.closed = true
	close(d.stop)
	d.mu.Unlock()
	for _, n := range d.nodes {
		n.mu.Lock()
		n.closeConn()
		n.mu.Unlock()
		n.dl.close()
	}
	done := make(chan struct{})
	go func() {
		d.calls.Wait()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("%w: vm: close: %w", driver.ErrTimeout, ctx.Err())
	}
}

// track counts a background call, or reports false once the driver is
// closed.
func (d *Driver) track() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return false
	}
	d.calls.Add(1)
	return true
}

func (d *Driver) node(name string) (*node, error) {
	n, ok := d.byName[name]
	if !ok {
		return nil, driver.Errorf(driver.ErrNotFound, "vm: no node %q", name)
	}
	return n, nil
}

// errUnreachable marks a failure to reach a daemon: nothing was sent.
var errUnreachable = errors.New("libvirt daemon unreachable")

// conn returns the node's connection, dialling it when there is none.
func (n *node) conn(ctx context.Context) (*libvirt.Libvirt, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.lv != nil && n.lv.IsConnected() {
		return n.lv, nil
	}
	n.closeConn()
	c, err := n.dial(ctx)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %w", errUnreachable, n.cfg.URI, err)
	}
	// A stuck handshake is cut off by the deadline, which is then lifted.
	stop := during(ctx, c)
	lv := libvirt.NewWithDialer(dialers.NewAlreadyConnected(c))
	if err := lv.ConnectToURI(libvirt.ConnectURI(n.target.remote)); err != nil {
		stop()
		c.Close()
		return nil, fmt.Errorf("%w: connect to %s: %w", errUnreachable, n.cfg.URI, err)
	}
	stop()
	n.lv, n.raw = lv, c
	return lv, nil
}

// dropConn forgets lv when it is still the node's connection, so that the
// next call dials again.
func (n *node) dropConn(lv *libvirt.Libvirt) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.lv == lv {
		n.closeConn()
	}
}

// closeConn ends the node's connection. go-libvirt leaves the stream open
// when it finds the connection already broken, and an ssh stream holds a
// whole ssh connection: it is closed here too. n.mu is held.
func (n *node) closeConn() {
	if n.lv != nil {
		_ = n.lv.Disconnect()
		_ = n.raw.Close()
		n.lv, n.raw = nil, nil
	}
}

// call runs fn against the node's daemon, bounded by ctx and the call
// timeout. go-libvirt's calls take no context, so fn runs in a goroutine
// the driver waits for in Close (closing the connection ends it); call
// returns when ctx ends. The error is classified (classify).
func (d *Driver) call(ctx context.Context, n *node, what string, fn func(lv *libvirt.Libvirt) error) error {
	ctx, cancel := context.WithTimeout(ctx, d.opts.CallTimeout)
	defer cancel()
	return d.callLong(ctx, n, what, fn)
}

// callLong is call bounded by ctx alone: for copies, which last as long as
// their images are large.
func (d *Driver) callLong(ctx context.Context, n *node, what string, fn func(lv *libvirt.Libvirt) error) error {
	if !d.track() {
		return driver.Errorf(driver.ErrRetryable, "vm: the driver is closed")
	}
	lv, err := func() (*libvirt.Libvirt, error) {
		defer d.calls.Done()
		return n.conn(ctx)
	}()
	if err != nil {
		return d.classify(n, what, err)
	}
	if !d.track() {
		return driver.Errorf(driver.ErrRetryable, "vm: the driver is closed")
	}
	done := make(chan error, 1)
	go func() {
		defer d.calls.Done()
		done <- fn(lv)
	}()
	select {
	case err = <-done:
	case <-ctx.Done():
		err = ctx.Err()
	}
	if err != nil && !lv.IsConnected() {
		n.dropConn(lv)
		err = fmt.Errorf("%w: %w", errConnLost, err)
	}
	return d.classify(n, what, err)
}

// errConnLost marks a call whose connection broke: it may have acted.
var errConnLost = errors.New("connection to the libvirt daemon lost")

// State reads every node: its capacity from NodeGetInfo, and what its
// domains (Berth's and others) are given.
func (d *Driver) State(ctx context.Context) (*driver.PlatformState, error) {
	st := &driver.PlatformState{Time: time.Now()}
	for _, n := range d.nodes {
		st.Nodes = append(st.Nodes, d.nodeState(ctx, n))
	}
	return st, nil
}

func (d *Driver) nodeState(ctx context.Context, n *node) driver.Node {
	out := driver.Node{Name: n.cfg.Name, Status: driver.NodeOnline, Attributes: map[string]string{"hypervisor": "qemu", "uri": n.cfg.URI}}
	r, err := d.readNode(ctx, n)
	if err != nil {
		out.Status = driver.NodeOffline
		out.Reason = err.Error()
		return out
	}
	out.Capacity, out.Reserved, out.Instances = r.capacity, r.reserved, r.domains
	for p := range r.ports {
		out.Ports = append(out.Ports, p)
	}
	slices.Sort(out.Ports)
	if ims, err := d.Images(ctx, n.cfg.Name); err == nil {
		for _, im := range ims {
			out.Images = append(out.Images, im.Name)
		}
	}
	return out
}

// reading is one look at a node. Its capacity, reservations and ports
// are the host's, whichever node made its domains (two nodes that reach one
// host through two transports each see all of it); domains counts only the
// node's own.
type reading struct {
	capacity, reserved driver.Resources
	domains            int
	ports              map[int]bool // host ports forwarded to Berth's guests
}

// readNode reads the node's capacity and what its domains hold: a Berth
// domain what its metadata records, another its vCPUs and memory.
func (d *Driver) readNode(ctx context.Context, n *node) (reading, error) {
	r := reading{ports: map[int]bool{}}
	err := d.call(ctx, n, "read node", func(lv *libvirt.Libvirt) error {
		_, mem, cpus, _, _, _, _, _, err := lv.NodeGetInfo()
		if err != nil {
			return err
		}
		pool, err := dirPool(lv, d.opts.StorageDir, true)
		if err != nil {
			return err
		}
		_, disk, _, _, err := lv.StoragePoolGetInfo(pool)
		if err != nil {
			return err
		}
		r.capacity = driver.Resources{
			CPU:    driver.MilliCPU(float64(cpus) * 1000 * d.opts.CPUOvercommit),
			Memory: driver.Bytes(mem) * driver.KiB,
			Disk:   driver.Bytes(disk),
		}
		doms, _, err := lv.ConnectListAllDomains(1, 0)
		if err != nil {
			return err
		}
		for _, dom := range doms {
			if m, err := readMeta(lv, dom); err == nil {
				r.reserved = r.reserved.Add(m.resources())
				for _, pt := range m.Ports {
					r.ports[pt.Host] = true
				}
				if n.owns(m) {
					r.domains++
				}
				continue
			}
			_, maxMem, _, vcpus, _, err := lv.DomainGetInfo(dom)
			if err != nil {
				continue // gone meanwhile
			}
			r.reserved = r.reserved.Add(driver.Resources{CPU: driver.MilliCPU(vcpus) * 1000, Memory: driver.Bytes(maxMem) * driver.KiB})
			r.domains++
		}
		return nil
	})
	return r, err
}

// SharedBackend: the libvirt daemons are named by URI, and every server
// with the same options reaches the same domains and their logs.
func (d *Driver) SharedBackend() bool { return true }

var (
	_ driver.Driver          = (*Driver)(nil)
	_ driver.SharedBackend   = (*Driver)(nil)
	_ driver.FeatureReporter = (*Driver)(nil)
	_ driver.SpecChecker     = (*Driver)(nil)
	_ driver.LogReader       = (*Driver)(nil)
	_ driver.ConsoleReader   = (*Driver)(nil)
	_ driver.Starter         = (*Driver)(nil)
	_ driver.Stopper         = (*Driver)(nil)
	_ driver.Suspender       = (*Driver)(nil)
	_ driver.ImageLister     = (*Driver)(nil)
	_ driver.Killer          = (*Driver)(nil)
	_ driver.Resizer         = (*Driver)(nil)
)
