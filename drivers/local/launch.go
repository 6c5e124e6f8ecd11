package local

import (
	"context"
	"fmt"
	"maps"
	"net"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/internal/procfs"
)

// The variables Berth sets for every process, and the base environment the
// spec's Env is merged onto.
const (
	envInstanceID   = "BERTH_INSTANCE_ID"
	envInstanceName = "BERTH_INSTANCE_NAME"
	envRoot         = "BERTH_ROOT"
	envConfigDir    = "BERTH_CONFIG_DIR"
	envUserData     = "BERTH_USER_DATA_FILE"
	envPortPrefix   = "BERTH_PORT_"
	defaultPath     = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
)

// checkSpec validates spec for this driver and returns the copy to record.
// Every kind but process, also the default kind (container), gives
// ErrUnsupported.
func (d *Driver) checkSpec(node string, spec *driver.Spec) (*driver.Spec, error) {
	if spec == nil {
		return nil, &driver.FieldError{Path: "spec", Reason: "required"}
	}
	sp := *spec
	switch sp.Kind {
	case "":
		return nil, driver.Errorf(driver.ErrUnsupported, "kind: empty means %s; the local back-end runs processes only (kind process)", sp.KindOrDefault())
	case driver.KindContainer, driver.KindVM, driver.KindBareMetal:
		return nil, driver.Errorf(driver.ErrUnsupported, "kind %q: the local back-end runs processes only (kind process)", sp.Kind)
	}
	if err := sp.Validate(); err != nil {
		return nil, err
	}
	if node != "" && node != d.node {
		return nil, driver.Errorf(driver.ErrNotFound, "node %q: the local back-end has the one node %q", node, d.node)
	}
	var bad []string
	if len(sp.Volumes) > 0 {
		bad = append(bad, "volumes (a process sees the host's file system; there is nothing to mount into)")
	}
	if len(sp.Networks) > 0 {
		bad = append(bad, "networks (processes share the host's network)")
	}
	if sp.NetworkMode != "" && sp.NetworkMode != "host" {
		bad = append(bad, fmt.Sprintf("network_mode %q (only host)", sp.NetworkMode))
	}
	if sp.Hostname != "" || sp.Domainname != "" {
		bad = append(bad, "hostname and domainname (processes share the host's names)")
	}
	if sp.Cpuset != "" {
		bad = append(bad, "cpuset")
	}
	if sp.Flavor != "" {
		bad = append(bad, "flavor (this back-end has no flavors; give cpus and memory)")
	}
	if r := sp.RestartPolicy.Name; r != "" && r != "no" {
		bad = append(bad, fmt.Sprintf("restart_policy %q (only no)", r))
	}
	for i, p := range sp.Ports {
		if p.Protocol == "sctp" {
			bad = append(bad, fmt.Sprintf("ports[%d].protocol sctp", i))
		}
	}
	if len(bad) > 0 {
		return nil, driver.Errorf(driver.ErrUnsupported, "the local back-end cannot honour %s", strings.Join(bad, "; "))
	}
	if !sp.Resources.Fits(d.cap) {
		return nil, driver.Errorf(driver.ErrInsufficientCapacity, "node %q has cpus %s, memory %s, disk %s, no gpus and no other resources; the spec asks for more", d.node, d.cap.CPU, d.cap.Memory, d.cap.Disk)
	}
	return &sp, nil
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

func (d *Driver) filesDir(id string) string { return filepath.Join(d.instDir(id), "files") }
func (d *Driver) workDir(id string) string  { return filepath.Join(d.instDir(id), "work") }
func (d *Driver) userDataPath(id string) string {
	return filepath.Join(d.instDir(id), "user-data")
}

// environ builds the process environment: PATH and HOME, then the spec's
// Env over them, then Berth's own variables over both.
func (d *Driver) environ(rec *record) []string {
	sp := rec.Spec
	home := os.Getenv("HOME")
	if home == "" {
		home = "/"
	}
	env := map[string]string{"PATH": defaultPath, "HOME": home}
	maps.Copy(env, sp.Env)
	env[envInstanceID] = rec.ID
	env[envRoot] = d.instDir(rec.ID)
	if rec.Name != "" {
		env[envInstanceName] = rec.Name
	}
	if len(sp.ConfigFiles) > 0 {
		env[envConfigDir] = d.filesDir(rec.ID)
	}
	if sp.UserData != "" {
		env[envUserData] = d.userDataPath(rec.ID)
	}
	for i, p := range rec.Ports {
		k := envPortPrefix + strconv.Itoa(p.ContainerPort)
		if p.Protocol == "udp" {
			k += "_UDP"
		}
		env[k] = strconv.Itoa(p.HostPort)
		if i == 0 {
			env["PORT"] = strconv.Itoa(p.HostPort)
		}
	}
	out := make([]string, 0, len(env))
	for _, k := range slices.Sorted(maps.Keys(env)) {
		out = append(out, k+"="+env[k])
	}
	return out
}

// lookPath finds the executable file named by name, searching pathList when
// name has no slash and resolving a relative name against dir.
func lookPath(name, pathList, dir string) (string, error) {
	isExec := func(p string) error {
		fi, err := os.Stat(p)
		if err != nil {
			return err
		}
		if fi.IsDir() || fi.Mode()&0o111 == 0 {
			return fmt.Errorf("%s is not an executable file", p)
		}
		return nil
	}
	if strings.Contains(name, "/") {
		p := name
		if !filepath.IsAbs(p) {
			p = filepath.Join(dir, p)
		}
		return p, isExec(p)
	}
	for _, dirp := range filepath.SplitList(pathList) {
		if dirp == "" {
			dirp = "."
		}
		p := filepath.Join(dirp, name)
		if !filepath.IsAbs(p) {
			p = filepath.Join(dir, p)
		}
		if isExec(p) == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("%q not found in PATH %s", name, pathList)
}

// prepare writes the instance's files (config files, user data, the empty
// working directory) and binds its ports. It is the first step of Create.
func (d *Driver) prepare(ctx context.Context, rec *record) error {
	sp := rec.Spec
	if err := os.MkdirAll(d.workDir(rec.ID), 0o755); err != nil {
		return fmt.Errorf("%w: %w", driver.ErrRetryable, err)
	}
	for i, c := range sp.ConfigFiles {
		p := filepath.Join(d.filesDir(rec.ID), filepath.FromSlash(path.Clean(c.Path)))
		mode := os.FileMode(c.Mode & 0o777)
		if c.Mode == 0 {
			mode = 0o644
		}
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return driver.Errorf(driver.ErrPermanent, "config_files[%d].path %q: %v", i, c.Path, err)
		}
		if err := os.WriteFile(p, []byte(c.Content), mode); err != nil {
			return driver.Errorf(driver.ErrPermanent, "config_files[%d].path %q: %v", i, c.Path, err)
		}
		if err := os.Chmod(p, mode); err != nil {
			return driver.Errorf(driver.ErrPermanent, "config_files[%d].mode: %v", i, err)
		}
	}
	if sp.UserData != "" {
		if err := os.WriteFile(d.userDataPath(rec.ID), []byte(sp.UserData), 0o600); err != nil {
			return driver.Errorf(driver.ErrPermanent, "user_data: %v", err)
		}
	}
	ports, err := bindPorts(ctx, d.node, sp.Ports, rec.Ports)
	if err != nil {
		return err
	}
	rec.Ports = ports
	return nil
}

// bindPorts chooses the host port of every port: a fixed HostPort must be
// free, HostPort 0 takes the port of the previous run (prev) if it is still
// free, else one the kernel picks. A port is checked by binding it briefly,
// so another program may take it before the process binds it.
func bindPorts(ctx context.Context, node string, ports []driver.Port, prev []driver.PortMapping) ([]driver.PortMapping, error) {
	var out []driver.PortMapping
	for i, p := range ports {
		proto := p.Protocol
		if proto == "" {
			proto = "tcp"
		}
		want := p.HostPort
		if want == 0 {
			for _, m := range prev {
				if m.ContainerPort == p.ContainerPort && m.Protocol == proto {
					if got, err := bindPort(ctx, proto, p.HostIP, m.HostPort); err == nil {
						want = got
					}
				}
			}
		}
		got, err := bindPort(ctx, proto, p.HostIP, want)
		if err != nil {
			if p.HostPort != 0 {
				return nil, driver.Errorf(driver.ErrInsufficientCapacity, "ports[%d].host_port: %d/%s is not free on node %q: %v", i, p.HostPort, proto, node, err)
			}
			return nil, driver.Errorf(driver.ErrRetryable, "ports[%d]: no free %s port: %v", i, proto, err)
		}
		out = append(out, driver.PortMapping{ContainerPort: p.ContainerPort, HostPort: got, Protocol: proto, HostIP: p.HostIP})
	}
	return out, nil
}

// bindPort binds proto ip:port (port 0: any) and releases it at once,
// returning the port bound.
func bindPort(ctx context.Context, proto, ip string, port int) (int, error) {
	var lc net.ListenConfig
	addr := net.JoinHostPort(ip, strconv.Itoa(port))
	if proto == "udp" {
		c, err := lc.ListenPacket(ctx, "udp", addr)
		if err != nil {
			return 0, err
		}
		defer c.Close()
		return c.LocalAddr().(*net.UDPAddr).Port, nil
	}
	l, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// launch starts rec's process in its own process group, with stdin from
// /dev/null and stdout and stderr appended to the instance's log files, and
// records it. On any failure no process is left running. The caller holds
// rec's lock.
func (d *Driver) launch(rec *record) error {
	sp := rec.Spec
	args := argv(sp)
	env := d.environ(rec)
	if sp.WorkingDir != "" {
		if fi, err := os.Stat(sp.WorkingDir); err != nil || !fi.IsDir() {
			return driver.Errorf(driver.ErrPermanent, "working_dir %q: not a directory on node %q", sp.WorkingDir, d.node)
		}
	}
	cred, err := d.credential(sp)
	if err != nil {
		return err
	}
	dir := d.runDir(rec, cred)
	pathList := defaultPath
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "PATH="); ok {
			pathList = v
		}
	}
	exe, err := lookPath(args[0], pathList, d.runDir(rec, nil))
	if err != nil {
		return driver.Errorf(driver.ErrPermanent, "executable %q: %v", args[0], err)
	}
	null, err := os.Open(os.DevNull)
	if err != nil {
		return fmt.Errorf("%w: %w", driver.ErrRetryable, err)
	}
	defer null.Close()
	outs := make([]*os.File, 2)
	for i, name := range []string{"stdout.log", "stderr.log"} {
		f, err := os.OpenFile(filepath.Join(d.instDir(rec.ID), name), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
		if err != nil {
			return fmt.Errorf("%w: %w", driver.ErrRetryable, err)
		}
		defer f.Close()
		outs[i] = f
	}
	sys := &syscall.SysProcAttr{Setpgid: true, Credential: cred}
	limits := d.cg.usable() && (sp.CPU > 0 || sp.Memory > 0)
	if limits {
		// The cgroup and its limits exist before the process does. On v2
		// the process is born in it (CLONE_INTO_CGROUP); on v1 it is moved
		// in right after the start.
		if err := d.cg.apply(rec.ID, 0, sp.Resources); err != nil {
			if driver.ClassOf(err) == nil {
				err = fmt.Errorf("%w: %w", driver.ErrRetryable, err)
			}
			return err
		}
		if d.cg.version == 2 {
			fd, err := syscall.Open(d.cg.dirs(rec.ID)[0], syscall.O_DIRECTORY|syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
			if err != nil {
				return fmt.Errorf("%w: cgroup of %s: %w", driver.ErrRetryable, rec.ID, err)
			}
			defer syscall.Close(fd)
			sys.UseCgroupFD, sys.CgroupFD = true, fd
		}
	}
	pid, err := syscall.ForkExec(exe, args, &syscall.ProcAttr{
		Dir:   dir,
		Env:   env,
		Files: []uintptr{null.Fd(), outs[0].Fd(), outs[1].Fd()},
		Sys:   sys,
	})
	if err != nil {
		return driver.Errorf(driver.ErrPermanent, "start %s: %v", exe, err)
	}
	st, err := procfs.ReadStat(pid)
	if err == nil && limits && d.cg.version == 1 {
		err = d.cg.apply(rec.ID, pid, sp.Resources)
	}
	if err == nil {
		rec.Phase = phaseStarted
		rec.Stopping = false
		rec.Message = ""
		rec.Run = run{PID: pid, StartTicks: st.StartTicks, BootID: d.boot, Started: time.Now()}
		err = d.save(rec)
	}
	if err != nil {
		syscall.Kill(-pid, syscall.SIGKILL)
		var ws syscall.WaitStatus
		syscall.Wait4(pid, &ws, 0, nil) // returns at once: the child was killed
		d.cg.remove(rec.ID)
		if driver.ClassOf(err) != nil {
			return err
		}
		return fmt.Errorf("%w: start %s: %w", driver.ErrRetryable, exe, err)
	}
	return nil
}
