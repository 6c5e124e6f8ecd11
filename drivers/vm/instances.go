package vm

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"time"

	"github.com/digitalocean/go-libvirt"

	"github.com/berth-dev/berth/driver"
)

// Default sizes of a spec that names neither a flavor nor an amount.
const (
	defaultCPU    = driver.MilliCPU(1000)
	defaultMemory = 128 * driver.MiB
)

// Create defines the domain (with Berth's metadata, before any file is
// made), writes its overlay and config drive, starts it and waits for its
// ready line. A failed create removes what it made.
func (d *Driver) Create(ctx context.Context, nodeName string, spec *driver.Spec) (driver.Operation, error) {
	if err := spec.Validate(); err != nil {
		return nil, fmt.Errorf("vm: create: %w", err)
	}
	if err := d.CheckSpec(spec); err != nil {
		return nil, err
	}
	n, err := d.node(nodeName)
	if err != nil {
		return nil, err
	}
	im, ok := d.opts.Images[spec.Image]
	if !ok {
		return nil, driver.Errorf(driver.ErrPermanent, "vm: image %q is not registered (register it under the option images)", spec.Image)
	}
	p, x, err := d.prepare(n, im, spec)
	if err != nil {
		return nil, err
	}
	res, uuid, us := p.meta.resources(), p.uuid, uuidString(p.uuid)
	id := n.cfg.Name + "/" + us
	m := d.newMachine(ctx, id,
		step{"define", func(ctx context.Context) error { return d.define(ctx, p, x, res) }},
		step{"disk", func(ctx context.Context) error { return d.makeDisk(ctx, p) }},
		step{"config drive", func(ctx context.Context) error {
			img, err := configDriveImage(us, spec)
			if err != nil {
				return fmt.Errorf("%w: %w", driver.ErrInvalid, err)
			}
			return d.call(ctx, n, "write config drive", func(lv *libvirt.Libvirt) error {
				return makeFile(lv, p.path(configDrive), "raw", int64(len(img)), nil, img)
			})
		}},
		step{"start", func(ctx context.Context) error {
			return d.call(ctx, n, "start domain "+p.domName, func(lv *libvirt.Libvirt) error {
				return lv.DomainCreate(libvirt.Domain{Name: p.domName, UUID: uuid})
			})
		}},
		step{"wait for the ready line", func(ctx context.Context) error { return d.waitReady(ctx, p) }},
	)
	m.cleanup = func(ctx context.Context) error { return d.remove(ctx, n, uuid, p.meta.Dir) }
	m.final = func(ctx context.Context) (*driver.Instance, error) { return d.Get(ctx, id) }
	return m, nil
}

// prepare works out the plan of a create of spec on n, and its domain
// XML.
func (d *Driver) prepare(n *node, im Image, spec *driver.Spec) (*plan, string, error) {
	files := im.files(n.cfg.Name)
	res := d.resources(spec)
	var uuid libvirt.UUID
	_, _ = rand.Read(uuid[:])
	uuid[6] = uuid[6]&0x0f | 0x40
	uuid[8] = uuid[8]&0x3f | 0x80
	us := uuidString(uuid)
	p := &plan{
		uuid:    uuid,
		domName: spec.Name,
		node:    n,
		files:   files,
		image:   im,
		vcpus:   vcpusOf(res.CPU),
		spec:    spec,
		meta: meta{
			Node: n.cfg.Name, Name: spec.Name, Image: spec.Image, Created: time.Now().UTC().Format(time.RFC3339Nano),
			CPU: int64(res.CPU), Memory: int64(res.Memory), Disk: int64(res.Disk),
			Dir:  d.opts.StorageDir,
			Tags: toKV(spec.Tags), Labels: toKV(spec.Labels),
		},
	}
	var err error
	if p.meta.Ports, err = hostPorts(spec.Ports); err != nil {
		return nil, "", err
	}
	if p.domName == "" {
		p.domName = "berth-" + us[:8]
	}
	x, err := d.domainXML(p)
	if err != nil {
		return nil, "", fmt.Errorf("vm: %w: domain XML: %w", driver.ErrInvalid, err)
	}
	return p, x, nil
}

// resources are what spec asks for: its flavor's, or its own amounts with
// defaults.
func (d *Driver) resources(spec *driver.Spec) driver.Resources {
	if f, ok := d.opts.Flavors[spec.Flavor]; ok && spec.Flavor != "" {
		return driver.Resources{CPU: f.CPU, Memory: f.Memory, Disk: f.Disk}
	}
	r := driver.Resources{CPU: spec.CPU, Memory: spec.Memory, Disk: spec.Disk}
	if r.CPU == 0 {
		r.CPU = defaultCPU
	}
	if r.Memory == 0 {
		r.Memory = defaultMemory
	}
	return r
}

// imageOn checks that an image's files are on the node: ErrPermanent,
// naming the image and the node, when one is missing.
func imageOn(lv *libvirt.Libvirt, n *node, image string, f ImageFiles) error {
	for _, p := range []string{f.Disk, f.Kernel, f.Initrd} {
		if p == "" {
			continue
		}
		if _, err := statFile(lv, p); err != nil {
			if isLibvirt(err, libvirt.ErrNoStorageVol) {
				return driver.Errorf(driver.ErrPermanent, "vm: image %q on node %s: file %s missing", image, n.cfg.Name, p)
			}
			return err
		}
	}
	return nil
}

// hostPorts are the forwards of ports: a port without a host port gets a
// free one of this host, one not published is bound to the loopback
// address only.
func hostPorts(ports []driver.Port) ([]portXML, error) {
	var out []portXML
	for i, p := range ports {
		pt := portXML{Proto: p.Protocol, HostIP: p.HostIP, Host: p.HostPort, Guest: p.ContainerPort}
		if pt.Proto == "" {
			pt.Proto = "tcp"
		}
		if pt.HostIP == "" && !p.Publish {
			pt.HostIP = "127.0.0.1"
		}
		if pt.Host == 0 {
			port, err := freePort(pt.Proto, pt.HostIP)
			if err != nil {
				return nil, driver.Errorf(driver.ErrInsufficientCapacity, "vm: ports[%d]: no free host port: %v", i, err)
			}
			pt.Host = port
		}
		out = append(out, pt)
	}
	return out, nil
}

// freePort asks the kernel for a free port on ip.
func freePort(proto, ip string) (int, error) {
	addr := net.JoinHostPort(ip, "0")
	if proto == "udp" {
		c, err := net.ListenPacket("udp", addr)
		if err != nil {
			return 0, err
		}
		defer c.Close()
		return c.LocalAddr().(*net.UDPAddr).Port, nil
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// define checks that the image's files are on the node and the node's
// room, and defines the domain.
func (d *Driver) define(ctx context.Context, p *plan, x string, res driver.Resources) error {
	err := d.call(ctx, p.node, "look for image "+p.meta.Image, func(lv *libvirt.Libvirt) error {
		return imageOn(lv, p.node, p.meta.Image, p.files)
	})
	if err != nil {
		return err
	}
	p.node.define.Lock()
	defer p.node.define.Unlock()
	r, err := d.readNode(ctx, p.node)
	if err != nil {
		return err
	}
	for _, pt := range p.meta.Ports {
		if r.ports[pt.Host] {
			return driver.Errorf(driver.ErrInsufficientCapacity, "vm: node %s: host port %d is forwarded to another guest", p.node.cfg.Name, pt.Host)
		}
	}
	if free := r.capacity.Sub(r.reserved); !res.Fits(free) {
		return driver.Errorf(driver.ErrInsufficientCapacity, "vm: node %s: %s cpus, %s memory and %s disk are free, the guest needs %s, %s and %s",
			p.node.cfg.Name, max(free.CPU, 0), max(free.Memory, 0), max(free.Disk, 0), res.CPU, res.Memory, res.Disk)
	}
	return d.call(ctx, p.node, "define domain "+p.domName, func(lv *libvirt.Libvirt) error {
		_, err := lv.DomainDefineXMLFlags(x, 0)
		return err
	})
}

// makeDisk makes the guest's root disk (an overlay of the image's disk,
// or an empty disk) and its empty serial logs, all volumes of the storage
// directory's pool on the node.
func (d *Driver) makeDisk(ctx context.Context, p *plan) error {
	return d.call(ctx, p.node, "make disk", func(lv *libvirt.Libvirt) error {
		if p.hasRoot() {
			var backing *ImageFiles
			if p.files.Disk != "" {
				backing = &p.files
			}
			if err := makeFile(lv, p.path(rootDisk), "qcow2", p.meta.Disk, backing, nil); err != nil {
				return err
			}
		}
		for _, f := range []string{consoleLog, stdoutLog, stderrLog} {
			if err := makeFile(lv, p.path(f), "raw", 0, nil, nil); err != nil {
				return err
			}
		}
		return nil
	})
}

// readyPoll is how often the wait for the ready line looks at the console.
const readyPoll = 100 * time.Millisecond

// waitReady waits until the guest writes the ready line on its console,
// and fails when the guest stops first or boot_timeout passes. It reads
// only what the console gained since its last look.
func (d *Driver) waitReady(ctx context.Context, p *plan) error {
	ctx, cancel := context.WithTimeout(ctx, d.opts.BootTimeout)
	defer cancel()
	tick := time.NewTicker(readyPoll)
	defer tick.Stop()
	var w lineWatch
	for i := 0; ; i++ {
		err := d.call(ctx, p.node, "read console", func(lv *libvirt.Libvirt) error {
			b, next, err := readFile(ctx, p.node, lv, p.path(consoleLog), w.off, 1<<20)
			if err == nil {
				w.add(b, next, d.opts.ReadyLine)
			}
			return err
		})
		if err != nil && !errors.Is(err, driver.ErrTimeout) {
			return err
		}
		if w.found {
			return nil
		}
		if i%10 == 9 {
			var state int32
			err := d.call(ctx, p.node, "read domain state", func(lv *libvirt.Libvirt) error {
				var err error
				state, _, err = lv.DomainGetState(libvirt.Domain{Name: p.domName, UUID: p.uuid}, 0)
				return err
			})
			if err != nil && !errors.Is(err, driver.ErrTimeout) {
				return err
			}
			if err == nil && libvirt.DomainState(state) != libvirt.DomainRunning && libvirt.DomainState(state) != libvirt.DomainPaused {
				return driver.Errorf(driver.ErrPermanent, "vm: guest %s stopped before it was ready; its console ends with: %s", p.domName, lastLines(w.tail, 5))
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w: vm: guest %s wrote no %q line in time; its console ends with: %s", driver.ErrTimeout, p.domName, d.opts.ReadyLine, lastLines(w.tail, 5))
		case <-d.stop:
			return driver.Errorf(driver.ErrTimeout, "vm: the driver was closed")
		case <-tick.C:
		}
	}
}

// lineWatch follows a console read piece by piece for one line.
type lineWatch struct {
	off     int64  // how far the console was read
	partial []byte // the line being written (at most 4 KiB of it)
	tail    []byte // the last 4 KiB read, for messages
	found   bool
}

// add takes the bytes read up to offset next.
func (w *lineWatch) add(b []byte, next int64, line string) {
	if next < w.off { // the file is shorter: read it afresh
		w.partial = nil
	}
	w.off = next
	buf := append(w.partial, b...)
	if i := bytes.LastIndexByte(buf, '\n'); i >= 0 {
		w.found = w.found || hasLine(buf[:i+1], line)
		buf = buf[i+1:]
	}
	w.partial = append([]byte(nil), buf[max(len(buf)-4096, 0):]...)
	w.tail = append(w.tail, b...)
	w.tail = append([]byte(nil), w.tail[max(len(w.tail)-4096, 0):]...)
}

// hasLine reports whether b holds line alone on a line (carriage returns
// ignored).
func hasLine(b []byte, line string) bool {
	for _, l := range bytes.Split(b, []byte("\n")) {
		if string(bytes.TrimSpace(l)) == line {
			return true
		}
	}
	return false
}

func lastLines(b []byte, n int) string {
	lines := strings.Split(strings.TrimSpace(strings.ReplaceAll(string(b), "\r", "")), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}

// Delete destroys and undefines the domain and removes its directory. A
// domain that is already gone makes the operation end with ErrNotFound.
func (d *Driver) Delete(ctx context.Context, id string) (driver.Operation, error) {
	n, uuid, err := d.resolve(id)
	if err != nil {
		return nil, err
	}
	m := d.newMachine(ctx, id, step{"delete", func(ctx context.Context) error {
		var dir string
		err := d.call(ctx, n, "look up domain "+id, func(lv *libvirt.Libvirt) error {
			dom, err := lv.DomainLookupByUUID(uuid)
			if err != nil {
				return err
			}
			m, err := nodeMeta(lv, n, dom)
			if err != nil {
				return err
			}
			dir = m.Dir
			return nil
		})
		if err != nil {
			return err
		}
		if err := d.remove(ctx, n, uuid, dir); err != nil {
			if errors.Is(err, driver.ErrNotFound) {
				return err
			}
			return fmt.Errorf("%w: %w", driver.ErrDeleteFailed, err)
		}
		return nil
	}})
	return m, nil
}

// remove destroys and undefines the domain uuid, when it exists, and
// removes its files from dir, the storage directory.
func (d *Driver) remove(ctx context.Context, n *node, uuid libvirt.UUID, dir string) error {
	gone := false
	err := d.call(ctx, n, "remove domain "+uuidString(uuid), func(lv *libvirt.Libvirt) error {
		dom, err := lv.DomainLookupByUUID(uuid)
		if err != nil {
			return err
		}
		if state, _, err := lv.DomainGetState(dom, 0); err == nil && libvirt.DomainState(state) != libvirt.DomainShutoff {
			if err := lv.DomainDestroyFlags(dom, 0); err != nil && !isNotRunning(err) {
				return err
			}
		}
		return lv.DomainUndefineFlags(dom, libvirt.DomainUndefineManagedSave|libvirt.DomainUndefineNvram)
	})
	if errors.Is(err, driver.ErrNotFound) {
		gone, err = true, nil
	}
	if err != nil {
		return err
	}
	if dir != "" && filepath.IsAbs(dir) {
		err := d.call(ctx, n, "remove files of "+uuidString(uuid), func(lv *libvirt.Libvirt) error {
			for _, f := range instanceFiles {
				if err := removeFile(lv, instanceFile(dir, uuid, f)); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			return err
		}
	}
	if gone {
		return driver.Errorf(driver.ErrNotFound, "vm: node %s: no domain %s", n.cfg.Name, uuidString(uuid))
	}
	return nil
}

func isNotRunning(err error) bool {
	var le libvirt.Error
	return errors.As(err, &le) && libvirt.ErrorNumber(le.Code) == libvirt.ErrOperationInvalid
}

// resolve splits an instance id, node/uuid.
func (d *Driver) resolve(id string) (*node, libvirt.UUID, error) {
	name, us, ok := strings.Cut(id, "/")
	uuid, good := parseUUID(us)
	if !ok || !good {
		return nil, uuid, driver.Errorf(driver.ErrNotFound, "vm: %q is not an instance id", id)
	}
	n, err := d.node(name)
	if err != nil {
		return nil, uuid, err
	}
	return n, uuid, nil
}

// Get returns the instance with id id.
func (d *Driver) Get(ctx context.Context, id string) (*driver.Instance, error) {
	n, uuid, err := d.resolve(id)
	if err != nil {
		return nil, err
	}
	var inst *driver.Instance
	err = d.call(ctx, n, "get "+id, func(lv *libvirt.Libvirt) error {
		dom, err := lv.DomainLookupByUUID(uuid)
		if err != nil {
			return err
		}
		m, err := nodeMeta(lv, n, dom)
		if err != nil {
			return err
		}
		state, reason, err := lv.DomainGetState(dom, 0)
		if err != nil {
			return err
		}
		inst = instanceOf(n, dom, m, state, reason)
		return nil
	})
	return inst, err
}

// lookup returns the instance id and its metadata.
func (d *Driver) lookup(ctx context.Context, id string) (*node, libvirt.Domain, *meta, error) {
	n, uuid, err := d.resolve(id)
	if err != nil {
		return nil, libvirt.Domain{}, nil, err
	}
	var dom libvirt.Domain
	var m *meta
	err = d.call(ctx, n, "look up "+id, func(lv *libvirt.Libvirt) error {
		var err error
		if dom, err = lv.DomainLookupByUUID(uuid); err != nil {
			return err
		}
		m, err = nodeMeta(lv, n, dom)
		return err
	})
	return n, dom, m, err
}

// Find returns the instance named name.
func (d *Driver) Find(ctx context.Context, name string) (*driver.Instance, error) {
	list, err := d.List(ctx, nil)
	if err != nil {
		return nil, err
	}
	for _, inst := range list {
		if inst.Name == name {
			return inst, nil
		}
	}
	return nil, driver.Errorf(driver.ErrNotFound, "vm: no instance named %q", name)
}

// List returns the Berth domains of every node whose tags include tags.
// Nodes that cannot be asked make it a *driver.PartialListError.
func (d *Driver) List(ctx context.Context, tags map[string]string) ([]*driver.Instance, error) {
	var out []*driver.Instance
	var missed []string
	var errs []error
	for _, n := range d.nodes {
		var got []*driver.Instance
		err := d.call(ctx, n, "list domains", func(lv *libvirt.Libvirt) error {
			doms, _, err := lv.ConnectListAllDomains(1, 0)
			if err != nil {
				return err
			}
			for _, dom := range doms {
				m, err := nodeMeta(lv, n, dom)
				if err != nil {
					continue // not Berth's, another node's, or gone meanwhile
				}
				inst := instanceOf(n, dom, m, 0, 0)
				if inst.Tags[driver.TagManaged] != "true" || !matches(inst.Tags, tags) {
					continue
				}
				state, reason, err := lv.DomainGetState(dom, 0)
				if err != nil {
					continue
				}
				inst.State, inst.RawState = mapState(libvirt.DomainState(state), reason)
				got = append(got, inst)
			}
			return nil
		})
		if err != nil {
			missed = append(missed, n.cfg.Name)
			errs = append(errs, err)
			continue
		}
		out = append(out, got...)
	}
	if len(missed) > 0 {
		return out, &driver.PartialListError{Nodes: missed, Err: errors.Join(errs...)}
	}
	return out, nil
}

func matches(have, want map[string]string) bool {
	for k, v := range want {
		if hv, ok := have[k]; !ok || hv != v {
			return false
		}
	}
	return true
}
