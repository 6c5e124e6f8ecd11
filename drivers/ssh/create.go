package ssh

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/pkg/sftp"

	"github.com/berth-dev/berth/driver"
)

// checkSpec refuses what a supervised process cannot honour. Every kind but
// process, also the default kind (container), is ErrUnsupported.
func checkSpec(spec *driver.Spec) error {
	if spec == nil {
		return &driver.FieldError{Path: "spec", Reason: "required"}
	}
	switch spec.Kind {
	case "":
		return driver.Errorf(driver.ErrUnsupported, "kind: empty means %s; the ssh back-end runs processes only (kind process)", spec.KindOrDefault())
	case driver.KindContainer, driver.KindVM, driver.KindBareMetal:
		return driver.Errorf(driver.ErrUnsupported, "kind %q: the ssh back-end runs processes only (kind process)", spec.Kind)
	}
	if err := spec.Validate(); err != nil {
		return err
	}
	var bad []string
	if len(spec.Volumes) > 0 {
		bad = append(bad, "volumes")
	}
	if len(spec.Networks) > 0 {
		bad = append(bad, "networks")
	}
	if spec.NetworkMode != "" && spec.NetworkMode != "host" {
		bad = append(bad, fmt.Sprintf("network_mode %q (only host)", spec.NetworkMode))
	}
	if len(spec.Ports) > 0 {
		bad = append(bad, "ports (a process listens on the host's ports itself)")
	}
	if spec.Hostname != "" || spec.Domainname != "" {
		bad = append(bad, "hostname and domainname")
	}
	if spec.Cpuset != "" {
		bad = append(bad, "cpuset")
	}
	if spec.Flavor != "" {
		bad = append(bad, "flavor (give cpus and memory)")
	}
	if spec.GPUs > 0 {
		bad = append(bad, "gpus")
	}
	if r := spec.RestartPolicy.Name; r != "" && r != "no" {
		bad = append(bad, fmt.Sprintf("restart_policy %q (only no)", r))
	}
	if len(bad) > 0 {
		return driver.Errorf(driver.ErrUnsupported, "the ssh back-end cannot honour %s", strings.Join(bad, "; "))
	}
	return nil
}

// CheckSpec refuses, at submit, what no host can run.
func (d *Driver) CheckSpec(spec *driver.Spec) error { return checkSpec(spec) }

// Features are what the ssh back-end runs: processes, as a user, with
// their input kept for attaches or on a terminal.
func (d *Driver) Features() []string {
	return []string{driver.CapKindProcess, driver.CapRunAsUser, driver.CapStdin, driver.CapTTY}
}

// argv returns the command line: Entrypoint then Command; when Entrypoint is
// empty, Image (if set) is the executable and Command its arguments.
func argv(sp *driver.Spec) []string {
	if len(sp.Entrypoint) > 0 {
		return slices.Concat(sp.Entrypoint, sp.Command)
	}
	if sp.Image != "" {
		return slices.Concat([]string{sp.Image}, sp.Command)
	}
	return slices.Clone(sp.Command)
}

// Create checks spec and starts, in the background, the copy of the
// instance's directory to the node's host over SFTP and the start of its
// supervisor there.
func (d *Driver) Create(ctx context.Context, node string, spec *driver.Spec) (driver.Operation, error) {
	if err := d.checkOpen(); err != nil {
		return nil, err
	}
	if err := checkSpec(spec); err != nil {
		return nil, fmt.Errorf("ssh: create: %w", err)
	}
	h, ok := d.hosts[node]
	if !ok {
		return nil, driver.Errorf(driver.ErrNotFound, "node %q: no such host", node)
	}
	if up, reason, f := h.online(); !up {
		return nil, driver.Errorf(driver.ErrRetryable, "node %q is offline: %s", node, reason)
	} else if c := h.capacity(driver.Resources{CPU: driver.MilliCPU(f.cpus * 1000), Memory: driver.Bytes(f.memory), Disk: driver.Bytes(f.disk)}); !spec.Resources.Fits(c) {
		return nil, driver.Errorf(driver.ErrInsufficientCapacity, "node %q has cpus %s, memory %s, disk %s; the spec asks for more", node, c.CPU, c.Memory, c.Disk)
	}
	id := newID(node)
	if spec.Name != "" {
		d.mu.Lock()
		other, taken := d.names[spec.Name]
		if !taken {
			d.names[spec.Name] = id
		}
		d.mu.Unlock()
		if taken {
			return nil, driver.Errorf(driver.ErrAlreadyExists, "an instance named %q exists (%s)", spec.Name, other)
		}
	}
	rec := &record{
		ID: id, Name: spec.Name, Node: node, Cluster: d.cluster, Image: spec.Image,
		Tags: spec.Tags, Labels: spec.Labels, Resources: spec.Resources, Created: time.Now().UTC(),
		Argv: argv(spec), Env: spec.Env, Dir: spec.WorkingDir, User: spec.User, Group: spec.Group,
		CgroupParent: d.opts.CgroupParent, CountLimits: d.opts.Limits == LimitsCount,
		Stdin: spec.Stdin || spec.TTY, TTY: spec.TTY,
	}
	if rec.Tags == nil || rec.Tags[driver.TagManaged] != "true" {
		tags := map[string]string{}
		for k, v := range spec.Tags {
			tags[k] = v
		}
		tags[driver.TagManaged] = "true"
		rec.Tags = tags
	}
	// The record, config files and user data, serialised now: spec is the
	// caller's and may be shared.
	recJSON, err := json.Marshal(rec)
	if err != nil {
		return nil, err
	}
	files := slices.Clone(spec.ConfigFiles)
	userData := spec.UserData
	timeout := 4*d.opts.CallTimeout + d.opts.StopGrace
	// The name is free again when nothing was made of the instance.
	unname := func() {
		d.mu.Lock()
		if d.names[rec.Name] == id {
			delete(d.names, rec.Name)
		}
		d.mu.Unlock()
	}
	return d.newCallOp(ctx, h, timeout, "ssh: create "+id, func(ctx context.Context) (*driver.Instance, error) {
		in, err := d.create(ctx, h, rec, recJSON, files, userData)
		if err != nil && spec.Name != "" && !errors.Is(err, driver.ErrTimeout) {
			unname()
		}
		return in, err
	}, unname), nil
}

func (d *Driver) create(ctx context.Context, h *host, rec *record, recJSON []byte, files []driver.ConfigFile, userData string) (*driver.Instance, error) {
	if n := h.cfg.MaxInstances; n > 0 {
		h.createMu.Lock()
		defer h.createMu.Unlock()
		insts, err := d.listHost(ctx, h)
		if err != nil {
			return nil, err
		}
		count := 0
		for _, in := range insts {
			if live(in.State) {
				count++
			}
		}
		if count >= n {
			return nil, driver.Errorf(driver.ErrInsufficientCapacity, "node %q runs %d instances, its max_instances", h.name, count)
		}
	}
	why, err := h.noLimits(ctx)
	if err != nil {
		return nil, err
	}
	if why != "" && !rec.CountLimits && (rec.Resources.CPU > 0 || rec.Resources.Memory > 0) {
		return nil, driver.Errorf(driver.ErrUnsupported, "host %s cannot enforce cpus and memory: %s (with the option limits: %s they run counted, not enforced)", h.name, why, LimitsCount)
	}
	if recJSON, err = superviseWay(ctx, h, rec, recJSON); err != nil {
		return nil, err
	}
	dir := d.instDir(rec.ID)
	tmp := path.Join(d.clusterDir(), ".new-"+rec.ID)
	err = h.sftp(ctx, func(c *sftpClient) error {
		if err := c.MkdirAll(tmp); err != nil {
			return fmt.Errorf("%w: mkdir %s: %w", driver.ErrRetryable, tmp, err)
		}
		if err := c.Chmod(tmp, 0o700); err != nil {
			return fmt.Errorf("%w: %w", driver.ErrRetryable, err)
		}
		if err := c.write(path.Join(tmp, fileRecord), recJSON, 0o600); err != nil {
			return fmt.Errorf("%w: %w", driver.ErrRetryable, err)
		}
		for i, f := range files {
			p := path.Join(tmp, dirFiles, f.Path)
			mode := os.FileMode(f.Mode & 0o7777)
			if f.Mode == 0 {
				mode = 0o644
			}
			if err := c.MkdirAll(path.Dir(p)); err != nil {
				return driver.Errorf(driver.ErrPermanent, "config_files[%d].path %q: %v", i, f.Path, err)
			}
			if err := c.write(p, []byte(f.Content), mode); err != nil {
				return driver.Errorf(driver.ErrPermanent, "config_files[%d].path %q: %v", i, f.Path, err)
			}
		}
		if userData != "" {
			if err := c.write(path.Join(tmp, fileUData), []byte(userData), 0o600); err != nil {
				return driver.Errorf(driver.ErrPermanent, "user_data: %v", err)
			}
		}
		// The directory appears whole, by rename: a listing never sees
		// an instance without its record.
		if err := c.PosixRename(tmp, dir); err != nil {
			return fmt.Errorf("%w: rename %s: %w", driver.ErrRetryable, tmp, err)
		}
		return nil
	})
	if err != nil {
		h.sftp(context.WithoutCancel(ctx), func(c *sftpClient) error { return c.RemoveAll(tmp) })
		return nil, err
	}
	var out bytes.Buffer
	code, msg, err := h.supervise(ctx, &limitedBuffer{b: &out, n: 1 << 20}, nil, "start", dir)
	switch {
	case err != nil:
		// The supervisor may have started it: the caller looks it up.
		return &driver.Instance{ID: rec.ID}, err
	case code == exitPermanent || code == exitFailed || code == exitUnsupported:
		kind := driver.ErrPermanent
		switch code {
		case exitFailed:
			kind = driver.ErrRetryable
		case exitUnsupported:
			kind = driver.ErrUnsupported
		}
		// Nothing runs: remove what was made, so that nothing is left.
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), d.opts.CallTimeout)
		defer cancel()
		if c, m, derr := h.supervise(dctx, nil, nil, "delete", dir, "0s"); derr != nil || (c != 0 && c != exitNotFound) {
			return &driver.Instance{ID: rec.ID}, driver.Errorf(driver.ErrTimeout, "host %s: start %s failed (%s), and its removal too: %v %s", h.name, rec.ID, msg, derr, m)
		}
		return nil, driver.Errorf(kind, "host %s: %s", h.name, msg)
	case code != 0:
		return &driver.Instance{ID: rec.ID}, driver.Errorf(driver.ErrTimeout, "host %s: start %s: exit code %d: %s", h.name, rec.ID, code, msg)
	}
	var st status
	if err := json.Unmarshal(out.Bytes(), &st); err != nil || st.ID != rec.ID {
		return &driver.Instance{ID: rec.ID}, driver.Errorf(driver.ErrTimeout, "host %s: start %s: unexpected answer %q", h.name, rec.ID, out.String())
	}
	return d.instance(h, &st), nil
}

// superviseWay returns the record recJSON (rec's) as h supervises its
// instances: on a systemd host it runs in a unit, which holds the limits,
// and has no cgroup of the supervisor's.
func superviseWay(ctx context.Context, h *host, rec *record, recJSON []byte) ([]byte, error) {
	sup, err := h.supervision(ctx)
	if err != nil || sup != SupervisionSystemd {
		return recJSON, err
	}
	if _, err := unitName(rec.Cluster, rec.ID); err != nil {
		return nil, driver.Errorf(driver.ErrPermanent, "host %s: %v", h.name, err)
	}
	var own record
	if err := json.Unmarshal(recJSON, &own); err != nil {
		return nil, err
	}
	own.Systemd, own.CgroupParent = true, ""
	return json.Marshal(&own)
}

// sftpClient is an SFTP session on a host's connection.
type sftpClient struct{ *sftp.Client }

// write writes b to p with mode, replacing what is there.
func (c *sftpClient) write(p string, b []byte, mode os.FileMode) error {
	f, err := c.OpenFile(p, os.O_CREATE|os.O_WRONLY|os.O_TRUNC)
	if err != nil {
		return err
	}
	if err := f.Chmod(mode); err != nil {
		f.Close()
		return err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// upload copies the local file src to dst on the host, executable, by way
// of a temporary file and a rename.
func (c *sftpClient) upload(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return driver.Errorf(driver.ErrPermanent, "supervisor_binary: %v", err)
	}
	defer in.Close()
	if err := c.MkdirAll(path.Dir(dst)); err != nil {
		return driver.Errorf(driver.ErrRetryable, "mkdir %s: %v", path.Dir(dst), err)
	}
	tmp := dst + ".tmp-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	f, err := c.OpenFile(tmp, os.O_CREATE|os.O_WRONLY|os.O_TRUNC)
	if err != nil {
		return driver.Errorf(driver.ErrRetryable, "%s: %v", tmp, err)
	}
	_, err = f.ReadFrom(in)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = c.Chmod(tmp, 0o755)
	}
	if err == nil {
		err = c.PosixRename(tmp, dst)
	}
	if err != nil {
		c.Remove(tmp)
		return driver.Errorf(driver.ErrRetryable, "copy the supervisor to %s: %v", dst, err)
	}
	return nil
}

// sftp runs fn with an SFTP session on the host's connection, taking one
// channel slot.
func (h *host) sftp(ctx context.Context, fn func(c *sftpClient) error) error {
	select {
	case h.slots <- struct{}{}:
		defer func() { <-h.slots }()
	case <-ctx.Done():
		return driver.Errorf(driver.ErrRetryable, "host %s: no free channel before the call's end: %v", h.name, ctx.Err())
	}
	h.mu.Lock()
	conn, reason := h.client, h.reason
	h.mu.Unlock()
	if conn == nil {
		return driver.Errorf(driver.ErrRetryable, "host %s is offline: %s", h.name, reason)
	}
	c, err := sftp.NewClient(conn)
	for try := 1; refusedOpen(err) && openAgain(ctx, try); try++ {
		c, err = sftp.NewClient(conn)
	}
	if err != nil {
		return driver.Errorf(driver.ErrRetryable, "host %s: sftp: %v", h.name, err)
	}
	defer c.Close()
	done := make(chan error, 1)
	go func() { done <- fn(&sftpClient{c}) }()
	select {
	case err = <-done:
	case <-ctx.Done():
		c.Close()
		<-done
		return fmt.Errorf("%w: host %s: sftp: %w", driver.ErrTimeout, h.name, ctx.Err())
	}
	if err != nil && driver.ClassOf(err) == nil {
		err = fmt.Errorf("%w: host %s: %w", driver.ErrRetryable, h.name, err)
	}
	return err
}

// Start runs a stopped or exited instance again; a running one is left
// alone.
func (d *Driver) Start(ctx context.Context, id string) error {
	h, err := d.hostOf(id)
	if err != nil {
		return err
	}
	return d.simple(ctx, h, id, "start", d.instDir(id))
}

// Stop sends SIGTERM to the instance's process group, then SIGKILL after
// grace, and returns once the process ended.
func (d *Driver) Stop(ctx context.Context, id string, grace time.Duration) error {
	h, err := d.hostOf(id)
	if err != nil {
		return err
	}
	return d.simple(ctx, h, id, "stop", d.instDir(id), grace.String())
}

// Restart stops the instance (as Stop) and starts it again.
func (d *Driver) Restart(ctx context.Context, id string, grace time.Duration) error {
	if err := d.Stop(ctx, id, grace); err != nil {
		return err
	}
	return d.Start(ctx, id)
}

// Kill sends signal to the instance's process group; an instance that is
// not running is ErrPermanent.
func (d *Driver) Kill(ctx context.Context, id string, signal string) error {
	name, _, err := driver.ParseSignal(signal)
	if err != nil {
		return err
	}
	h, err := d.hostOf(id)
	if err != nil {
		return err
	}
	return d.simple(ctx, h, id, "signal", d.instDir(id), name)
}

// Suspend stops the instance's process group (SIGSTOP); suspending a
// suspended instance is not an error, one that is not running is
// ErrPermanent.
func (d *Driver) Suspend(ctx context.Context, id string) error {
	h, err := d.hostOf(id)
	if err != nil {
		return err
	}
	return d.simple(ctx, h, id, "suspend", d.instDir(id))
}

// Resume continues a suspended instance (SIGCONT); one that is not
// suspended is ErrNotSuspended.
func (d *Driver) Resume(ctx context.Context, id string) error {
	h, err := d.hostOf(id)
	if err != nil {
		return err
	}
	return d.simple(ctx, h, id, "resume", d.instDir(id))
}

// Usage measures the instance's process group on its host: cpu over
// 200 ms, resident memory now.
func (d *Driver) Usage(ctx context.Context, id string) (*driver.Usage, error) {
	h, err := d.hostOf(id)
	if err != nil {
		return nil, err
	}
	var out bytes.Buffer
	code, msg, err := h.supervise(ctx, &limitedBuffer{b: &out, n: 4096}, nil, "usage", d.instDir(id))
	switch {
	case err != nil:
		return nil, err
	case code == exitNotFound:
		return nil, driver.Errorf(driver.ErrNotFound, "no instance %q", id)
	case code == exitNotRunning:
		return nil, driver.Errorf(driver.ErrPermanent, "instance %s is not running", id)
	case code != 0:
		return nil, driver.Errorf(driver.ErrRetryable, "host %s: usage of %s: exit code %d: %s", h.name, id, code, msg)
	}
	var u usage
	if err := json.Unmarshal(out.Bytes(), &u); err != nil {
		return nil, driver.Errorf(driver.ErrRetryable, "host %s: usage of %s: %v", h.name, id, err)
	}
	return &driver.Usage{CPU: u.CPU, Memory: u.Memory, Time: time.Now()}, nil
}

// simple runs a verb that answers with its exit code only.
func (d *Driver) simple(ctx context.Context, h *host, id, verb string, args ...string) error {
	if err := d.checkOpen(); err != nil {
		return err
	}
	code, msg, err := h.supervise(ctx, nil, nil, verb, args...)
	switch {
	case err != nil:
		return err
	case code == 0:
		return nil
	case code == exitNotFound:
		return driver.Errorf(driver.ErrNotFound, "no instance %q", id)
	case code == exitNotRunning:
		return driver.Errorf(driver.ErrPermanent, "instance %s is not running", id)
	case code == exitNotPaused:
		return driver.Errorf(driver.ErrNotSuspended, "instance %s is not suspended", id)
	case code == exitPermanent:
		return driver.Errorf(driver.ErrPermanent, "host %s: %s %s: %s", h.name, verb, id, msg)
	case code == exitUnsupported:
		return driver.Errorf(driver.ErrUnsupported, "host %s: %s %s: %s", h.name, verb, id, msg)
	case code == exitInvalid:
		return driver.Errorf(driver.ErrInvalid, "host %s: %s %s: %s", h.name, verb, id, msg)
	}
	return driver.Errorf(driver.ErrRetryable, "host %s: %s %s: exit code %d: %s", h.name, verb, id, code, msg)
}

// Resize sets the cpu and memory limits of the instance (a zero field is
// left as it is): cpu.max and memory.max of its cgroup when it runs, and
// its record, which a later start applies and Get shows. A host without
// a usable cgroup v2, or an instance running without a cgroup, is
// ErrUnsupported.
func (d *Driver) Resize(ctx context.Context, id string, r driver.Resources) error {
	if err := d.checkOpen(); err != nil {
		return err
	}
	if r.CPU < 0 || r.Memory < 0 {
		return &driver.FieldError{Path: "resources", Reason: "cpus and memory must not be negative"}
	}
	h, err := d.hostOf(id)
	if err != nil {
		return err
	}
	return d.simple(ctx, h, id, "resize", d.instDir(id), strconv.FormatInt(int64(r.CPU), 10), strconv.FormatInt(int64(r.Memory), 10))
}

// Logs copies the instance's stdout.log to stdout and stderr.log to
// stderr, with tail and follow, as the supervisor on the host reads them.
func (d *Driver) Logs(ctx context.Context, id string, opts driver.LogOptions, stdout, stderr io.Writer) error {
	if opts.Timestamps {
		return driver.Errorf(driver.ErrUnsupported, "ssh: logs with time stamps: the log files do not record when each line was written")
	}
	if opts.Tail < 0 {
		return &driver.FieldError{Path: "tail", Reason: "must not be negative"}
	}
	h, err := d.hostOf(id)
	if err != nil {
		return err
	}
	streams := "both"
	switch {
	case opts.Stdout && !opts.Stderr || stderr == nil:
		streams = "out"
	case opts.Stderr && !opts.Stdout || stdout == nil:
		streams = "err"
	}
	if stdout == nil {
		stdout = io.Discard
	}
	if stderr == nil {
		stderr = io.Discard
	}
	follow := "once"
	if opts.Follow {
		follow = "follow"
	}
	code, _, err := h.superviseStreams(ctx, nil, stdout, stderr, "logs", d.instDir(id), streams, strconv.Itoa(opts.Tail), follow)
	switch {
	case err != nil && ctx.Err() != nil && opts.Follow:
		return ctx.Err()
	case err != nil:
		return err
	case code == exitNotFound:
		return driver.Errorf(driver.ErrNotFound, "no instance %q", id)
	case code != 0:
		return driver.Errorf(driver.ErrRetryable, "host %s: logs of %s: exit code %d", h.name, id, code)
	}
	return nil
}
