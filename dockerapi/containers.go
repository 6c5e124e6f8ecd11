package dockerapi

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"path"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/mount"
	"github.com/moby/moby/api/types/network"

	"github.com/berth-dev/berth/api"
	"github.com/berth-dev/berth/control"
	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/reconciler"
	"github.com/berth-dev/berth/scheduler"
)

// Labels that carry placement rules, as Swarm classic read them.
const (
	// LabelConstraint holds constraints, comma separated ("disk==ssd,zone!=eu").
	LabelConstraint = "berth.constraint"
	// LabelAffinity holds affinities, comma separated ("image==redis").
	LabelAffinity = "berth.affinity"
	// LabelProvider restricts placement to one provider.
	LabelProvider = "berth.provider"
)

// created is a container created and not started yet: it lives here (and
// in the store, keep.go), not in the plane, until start submits it.
type created struct {
	// keeping is held while the container is changed and kept in the
	// store (changeCreated), and while it leaves (submit, remove): one
	// container's writes leave in order. Lock order: keeping before
	// Server.mu.
	keeping sync.Mutex
	// req, owner, autoRemove and at are guarded by Server.mu.
	req        scheduler.Request
	owner      string
	autoRemove bool
	at         time.Time
}

// newID returns a fresh container id: 16 hex digits (Berth's id form).
func newID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// translate turns a create request into a Berth request, refusing by name
// what Berth cannot honour.
func translate(name string, cr *container.CreateRequest) (scheduler.Request, bool, error) {
	var req scheduler.Request
	if cr.Config == nil {
		return req, false, badRequest("config is required")
	}
	c, hc := cr.Config, cr.HostConfig
	if hc == nil {
		hc = &container.HostConfig{}
	}
	if refused := refusedSettings(cr, hc); len(refused) > 0 {
		return req, false, unsupported("Berth cannot honour %s", strings.Join(refused, ", "))
	}
	spec := driver.Spec{
		Name: name, Kind: driver.KindContainer, Image: c.Image,
		Entrypoint: c.Entrypoint, Command: c.Cmd, WorkingDir: c.WorkingDir,
		Hostname: c.Hostname, Domainname: c.Domainname,
		Cpuset: hc.CpusetCpus, MemoryReservation: driver.Bytes(hc.MemoryReservation),
		Stdin: c.OpenStdin, TTY: c.Tty,
	}
	// --user USER[:GROUP], as the engine reads it.
	spec.User, spec.Group, _ = strings.Cut(c.User, ":")
	spec.CPU = driver.MilliCPU(hc.NanoCPUs / 1_000_000)
	if hc.NanoCPUs > 0 && spec.CPU == 0 {
		return req, false, badRequest("--cpus %.4f: Berth counts cpus in thousandths; ask for at least 0.001", float64(hc.NanoCPUs)/1e9)
	}
	spec.Memory = driver.Bytes(hc.Memory)
	if err := translateEnvLabels(&req, &spec, c); err != nil {
		return req, false, err
	}
	switch hc.NetworkMode {
	case "", "default", "bridge":
	default:
		spec.NetworkMode = string(hc.NetworkMode)
	}
	if err := translatePorts(&spec, hc); err != nil {
		return req, false, err
	}
	if err := translateVolumes(&spec, c, hc); err != nil {
		return req, false, err
	}
	if err := translateRestart(&spec, hc); err != nil {
		return req, false, err
	}
	if hc.AutoRemove && spec.RestartPolicy.Name != "" {
		return req, false, badRequest("--rm and --restart cannot be used together")
	}
	req.Spec = spec
	if err := req.Validate(); err != nil {
		return req, false, err
	}
	return req, hc.AutoRemove, nil
}

// refusedSettings names the settings of cr that Berth cannot honour, as
// the CLI's flags.
func refusedSettings(cr *container.CreateRequest, hc *container.HostConfig) []string {
	c := cr.Config
	var refused []string
	refuse := func(cond bool, what string) {
		if cond {
			refused = append(refused, what)
		}
	}
	refuse(c.AttachStdin && !c.OpenStdin, "attaching stdin without opening it")
	refuse(c.Healthcheck != nil && len(c.Healthcheck.Test) > 0, "--health-cmd")
	refuse(c.StopSignal != "", "--stop-signal")
	refuse(c.StopTimeout != nil, "--stop-timeout")
	refuse(c.NetworkDisabled, "--network none")
	refuse(hc.Privileged, "--privileged")
	refuse(len(hc.CapAdd) > 0 || len(hc.CapDrop) > 0, "--cap-add/--cap-drop")
	refuse(len(hc.Devices) > 0 || len(hc.DeviceRequests) > 0, "--device/--gpus")
	refuse(len(hc.VolumesFrom) > 0, "--volumes-from")
	refuse(len(hc.Links) > 0, "--link")
	refuse(hc.PidMode != "", "--pid")
	refuse(hc.IpcMode != "" && hc.IpcMode != "private" && hc.IpcMode != "shareable", "--ipc")
	refuse(hc.UTSMode != "", "--uts")
	refuse(hc.UsernsMode != "", "--userns")
	refuse(len(hc.SecurityOpt) > 0, "--security-opt")
	refuse(len(hc.Sysctls) > 0, "--sysctl")
	refuse(len(hc.Tmpfs) > 0, "--tmpfs")
	refuse(len(hc.ExtraHosts) > 0, "--add-host")
	refuse(len(hc.DNS) > 0 || len(hc.DNSOptions) > 0 || len(hc.DNSSearch) > 0, "--dns")
	refuse(hc.Runtime != "", "--runtime")
	refuse(hc.PublishAllPorts, "-P/--publish-all (publish each port with -p)")
	refuse(hc.ReadonlyRootfs, "--read-only")
	refuse(hc.LogConfig.Type != "", "--log-driver")
	refuse(hc.VolumeDriver != "", "--volume-driver")
	refuse(hc.ShmSize != 0, "--shm-size")
	refuse(hc.OomScoreAdj != 0, "--oom-score-adj")
	refuse(hc.Init != nil && *hc.Init, "--init")
	refuse(hc.CPUShares != 0, "--cpu-shares (use --cpus)")
	refuse(hc.CPUQuota != 0 || hc.CPUPeriod != 0, "--cpu-quota/--cpu-period (use --cpus)")
	refuse(hc.MemorySwap > 0, "--memory-swap")
	refuse(hc.PidsLimit != nil && *hc.PidsLimit > 0, "--pids-limit")
	refuse(len(hc.Ulimits) > 0, "--ulimit")
	refuse(hc.BlkioWeight != 0 || len(hc.BlkioWeightDevice) > 0 || len(hc.BlkioDeviceReadBps) > 0 || len(hc.BlkioDeviceWriteBps) > 0, "--blkio-*")
	refuse(cr.NetworkingConfig != nil && len(cr.NetworkingConfig.EndpointsConfig) > 1, "more than one network")
	for _, m := range hc.Mounts {
		refuse(m.Type != mount.TypeBind && m.Type != mount.TypeVolume, "--mount type="+string(m.Type))
	}
	return refused
}

// translateEnvLabels sets spec's environment and labels from c's, and
// req's constraints, affinities and provider from Swarm's forms of them
// among those (constraint:..., affinity:..., the com.docker.swarm labels)
// and Berth's labels.
func translateEnvLabels(req *scheduler.Request, spec *driver.Spec, c *container.Config) error {
	for _, kv := range c.Env {
		k, v, _ := strings.Cut(kv, "=")
		switch {
		case strings.HasPrefix(k, "constraint:"):
			req.Constraints = append(req.Constraints, strings.TrimPrefix(kv, "constraint:"))
			continue
		case strings.HasPrefix(k, "affinity:"):
			req.Affinities = append(req.Affinities, strings.TrimPrefix(kv, "affinity:"))
			continue
		}
		if spec.Env == nil {
			spec.Env = map[string]string{}
		}
		spec.Env[k] = v
	}
	for k, v := range c.Labels {
		switch k {
		case LabelConstraint:
			req.Constraints = append(req.Constraints, splitList(v)...)
		case LabelAffinity:
			req.Affinities = append(req.Affinities, splitList(v)...)
		case LabelProvider:
			req.Provider = v
		case "com.docker.swarm.constraints", "com.docker.swarm.affinities":
			var list []string
			if err := json.Unmarshal([]byte(v), &list); err != nil {
				return badRequest("label %s: want a JSON list of expressions: %v", k, err)
			}
			if k == "com.docker.swarm.constraints" {
				req.Constraints = append(req.Constraints, list...)
			} else {
				req.Affinities = append(req.Affinities, list...)
			}
		default:
			if spec.Labels == nil {
				spec.Labels = map[string]string{}
			}
			spec.Labels[k] = v
		}
	}
	return nil
}

// translatePorts sets spec's ports from -p's bindings, sorted by the
// container's port.
func translatePorts(spec *driver.Spec, hc *container.HostConfig) error {
	for p, bindings := range hc.PortBindings {
		if len(bindings) == 0 {
			bindings = []network.PortBinding{{}}
		}
		for _, b := range bindings {
			port := driver.Port{ContainerPort: int(p.Num()), Protocol: string(p.Proto()), Publish: true}
			if b.HostPort != "" {
				n, err := strconv.Atoi(b.HostPort)
				if err != nil || n < 0 || n > 65535 {
					return badRequest("-p %s: host port %q: want a number up to 65535 (ranges are not supported)", p, b.HostPort)
				}
				port.HostPort = n
			}
			if b.HostIP.IsValid() && !b.HostIP.IsUnspecified() {
				port.HostIP = b.HostIP.String()
			}
			spec.Ports = append(spec.Ports, port)
		}
	}
	slices.SortFunc(spec.Ports, func(a, b driver.Port) int { return a.ContainerPort - b.ContainerPort })
	return nil
}

// translateVolumes sets spec's volumes from -v and --mount; anonymous
// volumes (a target of Config.Volumes that neither names) are refused.
func translateVolumes(spec *driver.Spec, c *container.Config, hc *container.HostConfig) error {
	for _, bind := range hc.Binds {
		parts := strings.Split(bind, ":")
		if len(parts) < 2 || len(parts) > 3 {
			return badRequest("-v %s: want SOURCE:TARGET[:ro]", bind)
		}
		v := driver.Volume{Source: parts[0], Target: parts[1]}
		if len(parts) == 3 {
			switch parts[2] {
			case "ro":
				v.ReadOnly = true
			case "rw":
			default:
				return unsupported("-v %s: Berth supports the options ro and rw only", bind)
			}
		}
		spec.Volumes = append(spec.Volumes, v)
	}
	for _, m := range hc.Mounts {
		spec.Volumes = append(spec.Volumes, driver.Volume{Source: m.Source, Target: m.Target, ReadOnly: m.ReadOnly})
	}
	// Config.Volumes lists the targets of anonymous volumes, and those of
	// named ones too (Compose sends both): only a target no -v or --mount
	// names is anonymous.
	for target := range c.Volumes {
		if !slices.ContainsFunc(spec.Volumes, func(v driver.Volume) bool { return path.Clean(v.Target) == path.Clean(target) }) {
			return unsupported("anonymous volumes (-v %s, or VOLUME without a source): name the volume, -v NAME:%s", target, target)
		}
	}
	return nil
}

// translateRestart sets spec's restart policy from --restart.
func translateRestart(spec *driver.Spec, hc *container.HostConfig) error {
	switch hc.RestartPolicy.Name {
	case "", container.RestartPolicyDisabled:
	case container.RestartPolicyAlways, container.RestartPolicyOnFailure, container.RestartPolicyUnlessStopped:
		spec.RestartPolicy = driver.RestartPolicy{Name: string(hc.RestartPolicy.Name), MaxRetries: hc.RestartPolicy.MaximumRetryCount}
	default:
		return badRequest("--restart %q: want no, always, on-failure or unless-stopped", hc.RestartPolicy.Name)
	}
	return nil
}

func splitList(v string) []string {
	var out []string
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s != "" {
			out = append(out, s)
		}
	}
	return out
}

// create stores a container to be started: nothing is placed until start.
func (s *Server) create(w http.ResponseWriter, r *http.Request) error {
	var cr container.CreateRequest
	body, err := api.ReadBody(w, r.Body)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(body, &cr); err != nil {
		return badRequest("decode the container: %v", err)
	}
	name := r.URL.Query().Get("name")
	name = strings.TrimPrefix(name, "/")
	if q := r.URL.Query().Get("platform"); q != "" {
		return unsupported("--platform: Berth places on any node that can run the image")
	}
	ns, err := identityOf(r).Namespace("")
	if err != nil {
		return err
	}
	if err := s.joinNetwork(r.Context(), ns, &cr); err != nil {
		return err
	}
	req, autoRemove, err := translate(name, &cr)
	if err != nil {
		return err
	}
	if err := s.plane.CheckSubmitter(r.Context(), &req.Spec, ns); err != nil {
		return err // refused now, not at start
	}
	id := newID()
	req.ID = id
	if err := s.checkName(r.Context(), name, ns); err != nil {
		return err
	}
	s.mu.Lock()
	if len(s.created) >= s.maxNew {
		s.mu.Unlock()
		return &httpError{http.StatusTooManyRequests, fmt.Sprintf("%d containers are created and not started: start or remove some first", s.maxNew)}
	}
	for _, c := range s.created {
		if name != "" && c.req.Name == name && c.owner == ns {
			s.mu.Unlock()
			return nameInUse(name)
		}
	}
	c := &created{req: req, owner: ns, autoRemove: autoRemove, at: time.Now()}
	// Kept in the store before it is answered; a change asked meanwhile
	// waits for it.
	c.keeping.Lock()
	s.created[id] = c
	s.mu.Unlock()
	err = s.keep(r.Context(), id, c)
	if err != nil {
		s.mu.Lock()
		delete(s.created, id)
		s.mu.Unlock()
	}
	c.keeping.Unlock()
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusCreated, container.CreateResponse{ID: id, Warnings: []string{}})
}

func nameInUse(name string) error {
	return &httpError{http.StatusConflict, fmt.Sprintf("Conflict. The container name %q is already in use. Remove it or choose another name.", "/"+name)}
}

// checkName refuses a name held by an instance of namespace ns that is not
// deleted: names are per namespace.
func (s *Server) checkName(ctx context.Context, name, ns string) error {
	if name == "" {
		return nil
	}
	in, err := s.plane.Lookup(ctx, name, control.Scope{Namespaces: []string{ns}})
	if errors.Is(err, driver.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	if in.Phase != reconciler.Deleted && in.Phase != reconciler.Deleting {
		return nameInUse(name)
	}
	return nil
}

// ref is a container as a handler found it: created here, or an instance.
type ref struct {
	id      string
	created *created
	in      control.Instance
}

// find resolves a container reference: an id, a name (within the
// caller's namespaces) or a unique prefix of an id, among what the caller
// is authorized for (auth.Identity.Authorize with the request's
// permission).
func (s *Server) find(r *http.Request, idOrName string) (ref, error) {
	idOrName = strings.TrimPrefix(idOrName, "/")
	who := identityOf(r)
	if s.follower() {
		return s.findFollowed(r, idOrName)
	}
	s.mu.Lock()
	for id, c := range s.created {
		if (id == idOrName || c.req.Name == idOrName) && authorized(r, c.owner) {
			s.mu.Unlock()
			return ref{id: id, created: c}, nil
		}
	}
	s.mu.Unlock()
	in, err := s.plane.Lookup(r.Context(), idOrName, control.ScopeOf(who))
	if err == nil && in.Phase != reconciler.Deleted && authorized(r, in.Owner) {
		return ref{id: in.ID, in: in}, nil
	}
	var fe *driver.FieldError
	if errors.As(err, &fe) {
		return ref{}, badRequest("%s", fe.Reason) // a name held in several of the caller's namespaces
	}
	if err != nil && !errors.Is(err, driver.ErrNotFound) {
		return ref{}, err
	}
	if len(idOrName) >= 1 {
		list, err := s.plane.Instances(r.Context(), control.Filter{})
		if err != nil {
			return ref{}, err
		}
		var found []control.Instance
		for _, in := range list {
			if strings.HasPrefix(in.ID, idOrName) && authorized(r, in.Owner) {
				found = append(found, in)
			}
		}
		if len(found) == 1 {
			return ref{id: found[0].ID, in: found[0]}, nil
		}
		if len(found) > 1 {
			return ref{}, badRequest("multiple containers found with id prefix %s: give more of the id", idOrName)
		}
	}
	return ref{}, noSuch(idOrName)
}

// start submits a created container to the plane, or starts a stopped
// instance.
func (s *Server) start(w http.ResponseWriter, r *http.Request) error {
	c, err := s.find(r, r.PathValue("id"))
	if err != nil {
		return err
	}
	if c.created != nil {
		if err := s.submit(r.Context(), c.id, c.created); err != nil {
			return err
		}
		if err := s.awaitStarted(r.Context(), c.id); err != nil {
			return err
		}
		w.WriteHeader(http.StatusNoContent)
		return nil
	}
	switch c.in.Phase {
	case reconciler.Running, reconciler.Held, reconciler.Creating, reconciler.Scheduled, reconciler.Pending:
		w.WriteHeader(http.StatusNotModified)
		return nil
	}
	if err := s.plane.Start(r.Context(), c.id); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// startWait bounds how long a start waits for its container to run: past
// it the start is answered and the create goes on.
const startWait = 5 * time.Minute

// awaitStarted waits, as the Engine's start does, until the submitted
// container id runs or has ended, so that docker run -d returns with the
// container up. One that failed to be created is the error: the Engine's
// 500 with the back-end's reason, which the CLI turns into its exit code
// (126 or 127 when the reason says the entrypoint cannot run, else 125).
// One that a node refused to create (back to pending, to be placed again)
// is that error too, and stays created, as after the Engine's failed
// start. One waiting for room (pending, never tried) is answered at once:
// it starts when room frees up.
func (s *Server) awaitStarted(ctx context.Context, id string) error {
	ctx, cancel := context.WithTimeout(ctx, startWait)
	defer cancel()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		in, err := s.plane.Instance(ctx, id)
		if err != nil {
			return err
		}
		switch in.Phase {
		case reconciler.Scheduled, reconciler.Creating:
		case reconciler.Failed:
			return &httpError{http.StatusInternalServerError, "failed to create the container's process: " + in.Message}
		case reconciler.Pending, reconciler.Deleting:
			// Deleting: what a refused create left is being removed.
			if in.Attempts > 0 || len(in.Refused) > 0 {
				// A node refused its create: as the Engine's failed start,
				// the container stays created (Berth places it again).
				return &httpError{http.StatusInternalServerError, "failed to create the container's process: " + in.Message}
			}
			return nil
		default:
			return nil
		}
		select {
		case <-ctx.Done():
			return nil // the create goes on; inspect shows where it is
		case <-tick.C:
		}
	}
}

// submit hands a created container to the plane; it stays in created
// until the plane has it, so that it is never unseen meanwhile.
func (s *Server) submit(ctx context.Context, id string, c *created) error {
	if c.autoRemove {
		// Taken here before the mark is kept: resumeAutoRemove leaves
		// the container to this call.
		s.mu.Lock()
		s.autoRm[id] = struct{}{}
		s.mu.Unlock()
		if err := s.markAutoRemove(ctx, id); err != nil {
			s.mu.Lock()
			delete(s.autoRm, id)
			s.mu.Unlock()
			return err
		}
	}
	req, placed, err := s.onNetwork(ctx, c)
	if err == nil {
		var pinned func(context.Context, error)
		req, pinned, err = s.onVolumes(ctx, c, req)
		if err == nil {
			_, err = s.plane.Submit(ctx, req, c.owner)
			pinned(ctx, err)
		}
		placed(ctx, err)
	}
	// As the Engine, a --rm container that fails to start is removed.
	gone := err == nil || c.autoRemove
	c.keeping.Lock()
	s.mu.Lock()
	if gone {
		delete(s.created, id)
	}
	if err != nil {
		delete(s.autoRm, id)
	}
	s.mu.Unlock()
	if gone {
		s.dropKept(ctx, id)
	}
	c.keeping.Unlock()
	if err != nil {
		if c.autoRemove {
			s.unmarkAutoRemove(id)
		}
		return err
	}
	if c.autoRemove {
		s.wg.Go(func() { s.removeWhenEnded(id) })
	}
	return nil
}

// removeWhenEnded deletes the instance id once it has ended and its exit
// code is known (--rm), then drops its mark. Cut short by Close (this
// server no longer leads) or a failed delete, it leaves the mark to the
// next server that leads.
func (s *Server) removeWhenEnded(id string) {
	gone := false
	defer func() {
		s.mu.Lock()
		delete(s.autoRm, id)
		s.mu.Unlock()
		if gone {
			s.unmarkAutoRemove(id)
		}
	}()
	ctx, cancel := s.until(context.Background())
	defer cancel()
	in, err := s.waitFor(ctx, id, ended)
	if err != nil {
		return
	}
	if in.Phase == reconciler.Deleted || in.Phase == reconciler.Deleting {
		gone = true
		return
	}
	if in := s.settle(ctx, id); in.Observed != nil && in.Observed.ExitCode != nil {
		s.keepExit(id, *in.Observed.ExitCode)
	}
	s.detached(ctx, id)
	if ctx.Err() != nil {
		return
	}
	if err := s.plane.Delete(ctx, id); err != nil && !errors.Is(err, driver.ErrNotFound) {
		s.log.Warn("dockerapi: --rm: delete", "instance", id, "error", err)
		return
	}
	gone = true
}

// maxExits bounds the exit codes of removed --rm containers kept.
const maxExits = 1024

// keepExit remembers the exit code of the --rm container id, removed next.
func (s *Server) keepExit(id string, code int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.exits[id]; !ok {
		s.exitOrder = append(s.exitOrder, id)
	}
	s.exits[id] = code
	for len(s.exitOrder) > maxExits {
		delete(s.exits, s.exitOrder[0])
		s.exitOrder = s.exitOrder[1:]
	}
}

// removedExit returns the exit code kept for the removed --rm container id.
func (s *Server) removedExit(id string) (int, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	code, ok := s.exits[id]
	return code, ok
}

// detached waits, up to settleTimeout, until no attach stream of id is
// open, so that --rm removes a container only after its output was read.
func (s *Server) detached(ctx context.Context, id string) {
	ctx, cancel := context.WithTimeout(ctx, settleTimeout)
	defer cancel()
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for {
		s.mu.Lock()
		n := s.attached[id]
		s.mu.Unlock()
		if n == 0 {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// ended reports whether an instance has stopped running for good.
func ended(in control.Instance) bool {
	switch in.Phase {
	case reconciler.Exited, reconciler.Stopped, reconciler.Failed, reconciler.Deleting, reconciler.Deleted:
		return true
	}
	return false
}

// hasExit reports whether the exit code of an ended instance is known, or
// will never be.
func hasExit(in control.Instance) bool {
	return (in.Observed != nil && in.Observed.ExitCode != nil) || in.Phase == reconciler.Failed || in.Phase == reconciler.Deleting || in.Phase == reconciler.Deleted
}

// settleTimeout bounds the wait for a back-end to report the exit code of
// an instance that has ended.
const settleTimeout = 10 * time.Second

// settle waits, up to settleTimeout, for the ended instance id to show its
// exit code, and returns it as last seen.
func (s *Server) settle(ctx context.Context, id string) control.Instance {
	ctx, cancel := context.WithTimeout(ctx, settleTimeout)
	defer cancel()
	in, _ := s.waitFor(ctx, id, hasExit)
	return in
}

// waitFor polls the instance id until cond holds, ctx ends or the instance
// is gone (then it answers the last instance seen, marked deleted).
func (s *Server) waitFor(ctx context.Context, id string, cond func(control.Instance) bool) (control.Instance, error) {
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	var last control.Instance
	for {
		in, err := s.plane.Instance(ctx, id)
		switch {
		case errors.Is(err, driver.ErrNotFound):
			last.Phase = reconciler.Deleted
			return last, nil
		case err != nil:
			return last, err
		}
		last = in
		if cond(in) {
			return in, nil
		}
		select {
		case <-ctx.Done():
			return last, ctx.Err()
		case <-t.C:
		}
	}
}

func graceParam(r *http.Request) (time.Duration, error) {
	v := r.URL.Query().Get("t")
	if v == "" {
		v = r.URL.Query().Get("timeout")
	}
	if v == "" {
		return 10 * time.Second, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < -1 {
		return 0, badRequest("t=%q: want whole seconds", v)
	}
	if n == -1 {
		return 0, unsupported("t=-1 (wait for ever): give a number of seconds")
	}
	return time.Duration(n) * time.Second, nil
}

func (s *Server) stop(w http.ResponseWriter, r *http.Request) error {
	grace, err := graceParam(r)
	if err != nil {
		return err
	}
	if r.URL.Query().Has("signal") {
		return unsupported("stop --signal: Berth stops with the back-end's stop signal")
	}
	c, err := s.find(r, r.PathValue("id"))
	if err != nil {
		return err
	}
	if c.created != nil || ended(c.in) {
		w.WriteHeader(http.StatusNotModified)
		return nil
	}
	if api.LongGrace(grace, s.writeTimeout) {
		if err := s.plane.StopLater(r.Context(), c.id, grace); err != nil {
			return err
		}
		w.WriteHeader(http.StatusNoContent)
		return nil
	}
	if err := s.plane.Stop(r.Context(), c.id, grace); err != nil {
		return err
	}
	// A container still being created (docker stop right after run -d) is
	// stopped once it is: as the Engine, answer once it has stopped. One
	// that takes longer goes on, and its stop with it; one waiting for
	// room is answered at once.
	ctx, cancel := context.WithTimeout(r.Context(), s.answerWait())
	defer cancel()
	_, _ = s.waitFor(ctx, c.id, func(in control.Instance) bool {
		return in.Phase == reconciler.Pending || in.Want == "" && in.Phase != reconciler.Stopping
	})
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (s *Server) restart(w http.ResponseWriter, r *http.Request) error {
	grace, err := graceParam(r)
	if err != nil {
		return err
	}
	c, err := s.find(r, r.PathValue("id"))
	if err != nil {
		return err
	}
	if c.created != nil {
		if err := s.submit(r.Context(), c.id, c.created); err != nil {
			return err
		}
	} else if api.LongGrace(grace, s.writeTimeout) {
		if err := s.plane.RestartLater(r.Context(), c.id, grace); err != nil {
			return err
		}
	} else if err := s.plane.Restart(r.Context(), c.id, grace); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (s *Server) kill(w http.ResponseWriter, r *http.Request) error {
	sig := r.URL.Query().Get("signal")
	if sig == "" {
		sig = "KILL"
	}
	c, err := s.find(r, r.PathValue("id"))
	if err != nil {
		return err
	}
	if c.created != nil || c.in.Phase != reconciler.Running {
		return &httpError{http.StatusConflict, fmt.Sprintf("Cannot kill container: %s: container is not running", r.PathValue("id"))}
	}
	if err := s.plane.Kill(r.Context(), c.id, sig); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (s *Server) remove(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	// rm -v removes a container's anonymous volumes, as the engine's;
	// Berth's containers have none (they are refused at create), and
	// named volumes stay, as with the engine: v needs nothing more.
	if b, _ := strconv.ParseBool(q.Get("link")); b {
		return unsupported("rm --link: Berth has no links")
	}
	force, _ := strconv.ParseBool(q.Get("force"))
	c, err := s.find(r, r.PathValue("id"))
	if err != nil {
		return err
	}
	if c.created != nil {
		c.created.keeping.Lock()
		s.mu.Lock()
		delete(s.created, c.id)
		delete(s.sizes, c.id)
		s.mu.Unlock()
		s.dropKept(r.Context(), c.id)
		c.created.keeping.Unlock()
		w.WriteHeader(http.StatusNoContent)
		return nil
	}
	if !force && !ended(c.in) && c.in.Phase != reconciler.Pending {
		return &httpError{http.StatusConflict, fmt.Sprintf("You cannot remove a %s container %s. Stop the container before attempting removal or force remove", dockerState(c.in), c.id)}
	}
	if err := s.plane.Delete(r.Context(), c.id); err != nil {
		return err
	}
	s.mu.Lock()
	delete(s.sizes, c.id)
	s.mu.Unlock()
	// As the Engine, answer once the container is gone; a removal that
	// takes longer goes on (ps shows it "Removal In Progress"). The answer
	// is given well within the write deadline: one cut by it would reach
	// the client as a closed connection.
	ctx, cancel := context.WithTimeout(r.Context(), s.answerWait())
	defer cancel()
	_, _ = s.waitFor(ctx, c.id, func(in control.Instance) bool { return in.Phase == reconciler.Deleted })
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// removeWait bounds how long rm waits for the back-end resource to go.
const removeWait = 30 * time.Second

// answerWait bounds how long rm waits for the back-end resource to go, and
// stop for a container still being created to be stopped: removeWait,
// within half the answer's write deadline.
func (s *Server) answerWait() time.Duration {
	if s.writeTimeout > 0 {
		return min(removeWait, s.writeTimeout/2)
	}
	return removeWait
}

// dockerState maps a Berth phase to a Docker container state.
func dockerState(in control.Instance) container.ContainerState {
	switch in.Phase {
	case reconciler.Pending, reconciler.Scheduled, reconciler.Creating:
		return container.StateCreated
	case reconciler.Running, reconciler.Held, reconciler.Stopping:
		return container.StateRunning
	case reconciler.Suspended:
		return container.StatePaused
	case reconciler.Stopped, reconciler.Exited:
		return container.StateExited
	case reconciler.Deleting:
		return container.StateRemoving
	}
	return container.StateDead
}

func exitCode(in control.Instance) int {
	if in.Observed != nil && in.Observed.ExitCode != nil {
		return *in.Observed.ExitCode
	}
	return 0
}

// statusText is the STATUS column: "Up 3 minutes", "Exited (0) 2 seconds
// ago", "Created", "Pending: <reason>".
func statusText(in control.Instance, now time.Time) string {
	switch in.Phase {
	case reconciler.Pending:
		if in.Message != "" {
			return "Pending: " + in.Message
		}
		return "Pending"
	case reconciler.Scheduled, reconciler.Creating:
		return "Created"
	case reconciler.Running, reconciler.Held, reconciler.Stopping, reconciler.Suspended:
		since := in.Updated
		if in.Observed != nil && !in.Observed.Started.IsZero() {
			since = in.Observed.Started
		}
		if in.Phase == reconciler.Suspended {
			return "Up " + humanDuration(now.Sub(since)) + " (Paused)"
		}
		return "Up " + humanDuration(now.Sub(since))
	case reconciler.Stopped, reconciler.Exited:
		at := in.Updated
		if in.Observed != nil && !in.Observed.Finished.IsZero() {
			at = in.Observed.Finished
		}
		return fmt.Sprintf("Exited (%d) %s ago", exitCode(in), humanDuration(now.Sub(at)))
	case reconciler.Deleting:
		return "Removal In Progress"
	case reconciler.Failed:
		return "Dead: " + in.Message
	}
	return string(in.Phase)
}

// humanDuration writes d as docker does ("About a minute", "3 hours").
func humanDuration(d time.Duration) string {
	switch s := int(d.Seconds()); {
	case s < 1:
		return "Less than a second"
	case s == 1:
		return "1 second"
	case s < 60:
		return fmt.Sprintf("%d seconds", s)
	}
	switch m := int(d.Minutes()); {
	case m == 1:
		return "About a minute"
	case m < 60:
		return fmt.Sprintf("%d minutes", m)
	}
	switch h := int(d.Hours() + 0.5); {
	case h == 1:
		return "About an hour"
	case h < 48:
		return fmt.Sprintf("%d hours", h)
	default:
		return fmt.Sprintf("%d days", h/24)
	}
}

func command(spec *driver.Spec) string {
	if spec == nil {
		return ""
	}
	return strings.Join(append(slices.Clone(spec.Entrypoint), spec.Command...), " ")
}

// ports are the instance's ports as the Engine API lists them.
func ports(in control.Instance) []container.PortSummary {
	out := []container.PortSummary{}
	if in.Observed != nil && len(in.Observed.Ports) > 0 {
		for _, p := range in.Observed.Ports {
			ps := container.PortSummary{PrivatePort: uint16(p.ContainerPort), PublicPort: uint16(p.HostPort), Type: protoOr(p.Protocol)}
			if a, err := netip.ParseAddr(p.HostIP); err == nil {
				ps.IP = a
			} else if p.HostPort != 0 {
				ps.IP = netip.IPv4Unspecified()
			}
			out = append(out, ps)
		}
		return out
	}
	if in.Spec != nil {
		for _, p := range in.Spec.Ports {
			out = append(out, container.PortSummary{PrivatePort: uint16(p.ContainerPort), PublicPort: uint16(p.HostPort), Type: protoOr(p.Protocol)})
		}
	}
	return out
}

func protoOr(p string) string {
	if p == "" {
		return "tcp"
	}
	return p
}

// instanceOf is a created container seen as an instance not placed yet.
func instanceOf(id string, c *created) control.Instance {
	spec := c.req.Spec
	name := spec.Name
	if name == "" {
		name = id
	}
	return control.Instance{ID: id, Name: name, Spec: &spec, Phase: reconciler.Scheduled, Owner: c.owner, Created: c.at, Updated: c.at}
}

// summary is one row of docker ps.
func summary(in control.Instance, now time.Time) container.Summary {
	spec := in.Spec
	if spec == nil {
		spec = &driver.Spec{}
	}
	labels := map[string]string{}
	for k, v := range spec.Labels {
		labels[k] = v
	}
	if in.Node != "" {
		labels["berth.node"] = reconciler.NodeID(in.Provider, in.Node)
	}
	return container.Summary{
		ID: in.ID, Names: []string{"/" + in.Name}, Image: spec.Image,
		Command: command(spec), Created: in.Created.Unix(), Ports: ports(in), Labels: labels,
		State: dockerState(in), Status: statusText(in, now), Mounts: []container.MountPoint{},
	}
}
