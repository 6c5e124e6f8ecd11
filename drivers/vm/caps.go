package vm

import (
	"bytes"
	"context"
	"encoding/xml"
	"fmt"
	"io"
	"net"
	"strings"
	"time"

	"github.com/digitalocean/go-libvirt"

	"github.com/berth-dev/berth/driver"
)

// Features: virtual machines, and published ports with user-mode
// networking.
func (d *Driver) Features() []string {
	if d.opts.Network == "user" {
		return []string{driver.CapKindVM, driver.CapHostPorts}
	}
	return []string{driver.CapKindVM}
}

// CheckSpec refuses, naming each field, what no libvirt host of this
// driver can honour.
func (d *Driver) CheckSpec(spec *driver.Spec) error {
	var es driver.FieldErrors
	refuse := func(field, why string) { es.Add(field, "%s", why) }
	if k := spec.KindOrDefault(); k != driver.KindVM {
		refuse("kind", fmt.Sprintf("%q: this driver runs only vm", k))
	}
	if len(spec.SecurityGroups) > 0 {
		refuse("security_groups", "libvirt hosts have no security groups")
	}
	if len(spec.Ports) > 0 && d.opts.Network != "user" {
		refuse("ports", "ports are forwarded only with user-mode networking (option network: user)")
	}
	for i, p := range spec.Ports {
		if p.Protocol == "sctp" {
			es.Add(fmt.Sprintf("ports[%d].protocol", i), "user-mode networking forwards tcp and udp only")
		}
		if p.HostIP != "" && net.ParseIP(p.HostIP) == nil {
			es.Add(fmt.Sprintf("ports[%d].host_ip", i), "%q: not an IP address", p.HostIP)
		}
	}
	if len(spec.Volumes) > 0 {
		refuse("volumes", "volumes are not supported")
	}
	if len(spec.Networks) > 0 || spec.NetworkMode != "" {
		refuse("networks", "the network is the provider's option network")
	}
	if spec.GPUs > 0 {
		refuse("gpus", "GPUs are not supported")
	}
	if len(spec.Other) > 0 {
		refuse("other", "other resources are not supported")
	}
	if spec.User != "" {
		refuse("user", "a VM runs its image's own init; use user_data")
	}
	if n := spec.RestartPolicy.Name; n != "" && n != "no" {
		refuse("restart_policy", "guests are not restarted by the driver")
	}
	if len(spec.Entrypoint) > 0 {
		refuse("entrypoint", "a VM runs its image's own init; use user_data")
	}
	if len(spec.Command) > 0 {
		refuse("command", "a VM runs its image's own init; use user_data")
	}
	if len(spec.Env) > 0 {
		refuse("env", "a VM has no environment to set; use user_data or config_files")
	}
	if spec.WorkingDir != "" {
		refuse("working_dir", "a VM runs its image's own init")
	}
	if spec.Cpuset != "" {
		refuse("cpuset", "vCPU pinning is not supported")
	}
	if spec.MemoryReservation != 0 {
		refuse("memory_reservation", "a guest's memory is all reserved")
	}
	if spec.Flavor != "" {
		if _, ok := d.opts.Flavors[spec.Flavor]; !ok {
			es.Add("flavor", "%q: no such flavor (known: %s)", spec.Flavor, strings.Join(sortedKeys(d.opts.Flavors), ", "))
		}
	}
	for i, c := range spec.ConfigFiles {
		if strings.ContainsAny(c.Path, "\n\r") {
			es.Add(fmt.Sprintf("config_files[%d].path", i), "must not hold a line break")
		}
	}
	if err := es.Err(); err != nil {
		return fmt.Errorf("vm: %w: %w", driver.ErrUnsupported, err)
	}
	return nil
}

// Images lists the registered images whose files are on node.
func (d *Driver) Images(ctx context.Context, node string) ([]driver.Image, error) {
	n, err := d.node(node)
	if err != nil {
		return nil, err
	}
	var out []driver.Image
	err = d.call(ctx, n, "list images", func(lv *libvirt.Libvirt) error {
		for _, name := range sortedKeys(d.opts.Images) {
			f := d.opts.Images[name].files(node)
			im := driver.Image{Name: name}
			present := true
			for _, p := range []string{f.Disk, f.Kernel, f.Initrd} {
				if p == "" {
					continue
				}
				fi, err := statFile(lv, p)
				if isLibvirt(err, libvirt.ErrNoStorageVol) {
					present = false
					break
				}
				if err != nil {
					return err
				}
				im.Size += driver.Bytes(fi.size)
				if fi.modified.After(im.Created) {
					im.Created = fi.modified
				}
			}
			if present {
				out = append(out, im)
			}
		}
		return nil
	})
	return out, err
}

// logLimit bounds what Logs reads of a serial log at once.
const logLimit = 8 << 20

// Logs copies the guest's second serial port (its standard output) to
// stdout and its third (standard error) to stderr. Lines carry no time.
func (d *Driver) Logs(ctx context.Context, id string, opts driver.LogOptions, stdout, stderr io.Writer) error {
	if opts.Timestamps {
		return driver.Errorf(driver.ErrUnsupported, "vm: serial ports record no times")
	}
	n, dom, m, err := d.lookup(ctx, id)
	if err != nil {
		return err
	}
	var streams []*logStream
	if opts.Stdout {
		streams = append(streams, &logStream{file: instanceFile(m.Dir, dom.UUID, stdoutLog), w: stdout})
	}
	if opts.Stderr {
		streams = append(streams, &logStream{file: instanceFile(m.Dir, dom.UUID, stderrLog), w: stderr})
	}
	for _, s := range streams {
		var b []byte
		err := d.call(ctx, n, "read log", func(lv *libvirt.Libvirt) error {
			var err error
			b, s.off, err = readFile(ctx, n, lv, s.file, -1, logLimit)
			return err
		})
		if err != nil {
			return err
		}
		text := clean(b)
		if opts.Tail > 0 {
			text = tail(text, opts.Tail)
		}
		if _, err := io.WriteString(s.w, text); err != nil {
			return err
		}
	}
	if !opts.Follow {
		return nil
	}
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-d.stop:
			return nil
		case <-tick.C:
		}
		for _, s := range streams {
			err := d.call(ctx, n, "read log", func(lv *libvirt.Libvirt) error { return s.more(ctx, n, lv) })
			if err != nil {
				return err
			}
		}
		var state int32
		err := d.call(ctx, n, "read domain state", func(lv *libvirt.Libvirt) error {
			var err error
			state, _, err = lv.DomainGetState(dom, 0)
			return err
		})
		if isNotFound(err) || err == nil && libvirt.DomainState(state) == libvirt.DomainShutoff {
			return nil
		}
	}
}

// logStream is one serial log file being followed.
type logStream struct {
	file string
	w    io.Writer
	off  int64
}

// more copies what was written to the file since the last look: whole
// lines only, so that a line is never cut in two.
func (s *logStream) more(ctx context.Context, n *node, lv *libvirt.Libvirt) error {
	b, next, err := readFile(ctx, n, lv, s.file, s.off, logLimit)
	if err != nil {
		return err
	}
	if next < s.off {
		s.off = 0 // the file is shorter: read it afresh next time
		return nil
	}
	if i := bytes.LastIndexByte(b, '\n'); i >= 0 {
		b = b[:i+1]
		s.off += int64(len(b))
		_, err = io.WriteString(s.w, clean(b))
	}
	return err
}

// clean drops the carriage returns a guest's terminal puts before each
// newline.
func clean(b []byte) string { return strings.ReplaceAll(string(b), "\r", "") }

// tail keeps the last n lines of text.
func tail(text string, n int) string {
	lines := strings.SplitAfter(text, "\n")
	if len(lines) > 0 && lines[len(lines)-1] == "" {
		lines = lines[:len(lines)-1]
	}
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "")
}

// Console returns the guest's console: the last 64 KiB of its first serial
// port.
func (d *Driver) Console(ctx context.Context, id string) (string, error) {
	n, dom, m, err := d.lookup(ctx, id)
	if err != nil {
		return "", err
	}
	var b []byte
	err = d.call(ctx, n, "read console", func(lv *libvirt.Libvirt) error {
		var err error
		b, _, err = readFile(ctx, n, lv, instanceFile(m.Dir, dom.UUID, consoleLog), -1, 64<<10)
		return err
	})
	return clean(b), err
}

// Start starts a shut-off guest; a running one is left alone.
func (d *Driver) Start(ctx context.Context, id string) error {
	n, dom, _, err := d.lookup(ctx, id)
	if err != nil {
		return err
	}
	return d.call(ctx, n, "start "+id, func(lv *libvirt.Libvirt) error {
		state, _, err := lv.DomainGetState(dom, 0)
		if err != nil {
			return err
		}
		if libvirt.DomainState(state) != libvirt.DomainShutoff {
			return nil
		}
		return lv.DomainCreate(dom)
	})
}

// Stop asks the guest to power off (ACPI), and destroys it after grace if
// it has not.
func (d *Driver) Stop(ctx context.Context, id string, grace time.Duration) error {
	n, dom, _, err := d.lookup(ctx, id)
	if err != nil {
		return err
	}
	state := func() (libvirt.DomainState, error) {
		var st int32
		err := d.call(ctx, n, "read domain state", func(lv *libvirt.Libvirt) error {
			var err error
			st, _, err = lv.DomainGetState(dom, 0)
			return err
		})
		return libvirt.DomainState(st), err
	}
	st, err := state()
	if err != nil || st == libvirt.DomainShutoff {
		return err
	}
	if st == libvirt.DomainRunning && grace > 0 {
		err := d.call(ctx, n, "shut down "+id, func(lv *libvirt.Libvirt) error { return lv.DomainShutdown(dom) })
		if err != nil {
			return err
		}
		deadline := time.NewTimer(grace)
		defer deadline.Stop()
		tick := time.NewTicker(200 * time.Millisecond)
		defer tick.Stop()
	wait:
		for {
			select {
			case <-ctx.Done():
				return fmt.Errorf("%w: vm: stop %s: %w", driver.ErrTimeout, id, ctx.Err())
			case <-deadline.C:
				break wait
			case <-tick.C:
				if st, err := state(); err == nil && st == libvirt.DomainShutoff {
					return nil
				}
			}
		}
	}
	return d.call(ctx, n, "destroy "+id, func(lv *libvirt.Libvirt) error {
		if err := lv.DomainDestroyFlags(dom, 0); err != nil && !isNotRunning(err) {
			return err
		}
		return nil
	})
}

// Suspend pauses the guest's vCPUs (its memory stays allocated).
func (d *Driver) Suspend(ctx context.Context, id string) error {
	n, dom, _, err := d.lookup(ctx, id)
	if err != nil {
		return err
	}
	return d.call(ctx, n, "suspend "+id, func(lv *libvirt.Libvirt) error {
		state, _, err := lv.DomainGetState(dom, 0)
		if err != nil {
			return err
		}
		switch libvirt.DomainState(state) {
		case libvirt.DomainPaused:
			return nil
		case libvirt.DomainRunning:
			return lv.DomainSuspend(dom)
		}
		return driver.Errorf(driver.ErrPermanent, "vm: %s is not running", id)
	})
}

// Resume lets a suspended guest run again.
func (d *Driver) Resume(ctx context.Context, id string) error {
	n, dom, _, err := d.lookup(ctx, id)
	if err != nil {
		return err
	}
	return d.call(ctx, n, "resume "+id, func(lv *libvirt.Libvirt) error {
		state, _, err := lv.DomainGetState(dom, 0)
		if err != nil {
			return err
		}
		if libvirt.DomainState(state) != libvirt.DomainPaused {
			return driver.Errorf(driver.ErrNotSuspended, "vm: %s is not suspended", id)
		}
		return lv.DomainResume(dom)
	})
}

// Kill: KILL (and any signal QEMU can only emulate by pulling the plug)
// destroys the guest at once; TERM presses its ACPI power button. Other
// signals have no meaning for a whole machine.
func (d *Driver) Kill(ctx context.Context, id string, signal string) error {
	sig, _, err := driver.ParseSignal(signal)
	if err != nil {
		return err
	}
	n, dom, _, err := d.lookup(ctx, id)
	if err != nil {
		return err
	}
	if sig != "KILL" && sig != "TERM" {
		return driver.Errorf(driver.ErrUnsupported, "vm: signal %s: a guest takes only KILL (power off) and TERM (power button)", signal)
	}
	return d.call(ctx, n, "kill "+id, func(lv *libvirt.Libvirt) error {
		state, _, err := lv.DomainGetState(dom, 0)
		if err != nil {
			return err
		}
		if st := libvirt.DomainState(state); st != libvirt.DomainRunning && st != libvirt.DomainPaused {
			return driver.Errorf(driver.ErrPermanent, "vm: %s is not running", id)
		}
		if sig == "TERM" {
			return lv.DomainShutdown(dom)
		}
		return lv.DomainDestroyFlags(dom, 0)
	})
}

// Resize changes a guest's memory within the maximum it was defined with
// (option memory_headroom), live through its balloon, and its CPUs within
// its maximum vCPUs (option cpu_headroom): vCPUs are plugged in or out of
// a running guest, which must bring new ones online itself. The new sizes
// are recorded in its metadata and count in the node's reservations.
func (d *Driver) Resize(ctx context.Context, id string, r driver.Resources) error {
	if err := driver.ValidateResources("", r); err != nil {
		return fmt.Errorf("vm: resize: %w", err)
	}
	n, dom, m, err := d.lookup(ctx, id)
	if err != nil {
		return err
	}
	if r.Disk != 0 || r.GPUs != 0 || len(r.Other) > 0 {
		return driver.Errorf(driver.ErrUnsupported, "vm: resize: only cpus and memory change")
	}
	old := m.resources()
	want := old
	if r.CPU != 0 {
		want.CPU = r.CPU
	}
	if r.Memory != 0 {
		want.Memory = r.Memory
	}
	// What can never fit the guest is refused before what does not fit
	// the node now.
	oldV, newV := vcpusOf(old.CPU), vcpusOf(want.CPU)
	var state uint8
	err = d.call(ctx, n, "read the maximums of "+id, func(lv *libvirt.Libvirt) error {
		var maxMem uint64
		var err error
		state, maxMem, _, _, _, err = lv.DomainGetInfo(dom)
		if err != nil {
			return err
		}
		if uint64(want.Memory/driver.KiB) > maxMem {
			return driver.Errorf(driver.ErrUnsupported, "vm: resize: %s memory is above the guest's maximum %s (option memory_headroom)", want.Memory, driver.Bytes(maxMem)*driver.KiB)
		}
		if newV == oldV {
			return nil
		}
		maxV, err := lv.DomainGetVcpusFlags(dom, uint32(libvirt.DomainVCPUMaximum|libvirt.DomainVCPUConfig))
		if err != nil {
			return err
		}
		if int32(newV) > maxV {
			return driver.Errorf(driver.ErrUnsupported, "vm: resize: %s cpus need %d vCPUs, above the guest's maximum %d (option cpu_headroom)", want.CPU, newV, maxV)
		}
		return nil
	})
	if err != nil {
		return err
	}
	n.define.Lock()
	defer n.define.Unlock()
	rd, err := d.readNode(ctx, n)
	if err != nil {
		return err
	}
	if free := rd.capacity.Sub(rd.reserved).Add(old); !want.Fits(free) {
		return driver.Errorf(driver.ErrInsufficientCapacity, "vm: node %s: %s cpus and %s memory are free for %s", n.cfg.Name, free.CPU, free.Memory, id)
	}
	m.CPU, m.Memory = int64(want.CPU), int64(want.Memory)
	m.NS = ""
	x, err := xml.Marshal(m)
	if err != nil {
		return err
	}
	return d.call(ctx, n, "resize "+id, func(lv *libvirt.Libvirt) error {
		live := libvirt.DomainState(state) != libvirt.DomainShutoff
		memFlags, metaFlags := uint32(libvirt.DomainMemConfig), libvirt.DomainAffectConfig
		vcpuFlags := uint32(libvirt.DomainVCPUConfig)
		if live {
			memFlags |= uint32(libvirt.DomainMemLive)
			metaFlags |= libvirt.DomainAffectLive
			vcpuFlags |= uint32(libvirt.DomainVCPULive)
		}
		if newV != oldV {
			if err := lv.DomainSetVcpusFlags(dom, uint32(newV), vcpuFlags); err != nil {
				return err
			}
		}
		if want.Memory != old.Memory {
			if err := lv.DomainSetMemoryFlags(dom, uint64(want.Memory/driver.KiB), memFlags); err != nil {
				return err
			}
		}
		return lv.DomainSetMetadata(dom, int32(libvirt.DomainMetadataElement), libvirt.OptString{string(x)}, libvirt.OptString{"berth"}, libvirt.OptString{metaNS}, metaFlags)
	})
}
