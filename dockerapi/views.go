package dockerapi

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/netip"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/image"
	"github.com/moby/moby/api/types/jsonstream"
	"github.com/moby/moby/api/types/network"
	"github.com/moby/moby/api/types/system"

	"github.com/berth-dev/berth/control"
	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/reconciler"
)

func (s *Server) ping(w http.ResponseWriter, r *http.Request) error {
	h := w.Header()
	h.Set("Api-Version", Version)
	h.Set("Docker-Experimental", "false")
	h.Set("Ostype", "linux")
	h.Set("Builder-Version", "1")
	h.Set("Cache-Control", "no-cache, no-store, must-revalidate")
	h.Set("Content-Type", "text/plain; charset=utf-8")
	if r.Method == http.MethodHead {
		h.Set("Content-Length", "0")
		w.WriteHeader(http.StatusOK)
		return nil
	}
	w.WriteHeader(http.StatusOK)
	_, err := w.Write([]byte("OK"))
	return err
}

func (s *Server) versionInfo(w http.ResponseWriter, r *http.Request) error {
	return writeJSON(w, http.StatusOK, system.VersionResponse{
		Platform: system.PlatformInfo{Name: "Berth " + s.version},
		Version:  s.version, APIVersion: Version, MinAPIVersion: MinVersion,
		Os: runtime.GOOS, Arch: runtime.GOARCH, GoVersion: runtime.Version(),
		Components: []system.ComponentVersion{{Name: "Berth", Version: s.version, Details: map[string]string{"ApiVersion": Version, "MinAPIVersion": MinVersion}}},
	})
}

// info answers the cluster's totals: nodes, cpus, memory, containers by
// state; each node is a line of SystemStatus, as Swarm classic wrote them.
func (s *Server) info(w http.ResponseWriter, r *http.Request) error {
	nodes, err := s.plane.Nodes(r.Context())
	if err != nil {
		return err
	}
	list, err := s.visible(r, true)
	if err != nil {
		return err
	}
	inf := system.Info{
		ID: s.name, Name: s.name, ServerVersion: s.version, Driver: "berth",
		OSType: "linux", Architecture: runtime.GOARCH, OperatingSystem: "Berth cluster",
		SystemTime: time.Now().Format(time.RFC3339Nano), Labels: []string{}, Warnings: []string{},
		DriverStatus: [][2]string{},
	}
	var cpus driver.MilliCPU
	var online int
	status := [][2]string{{"Strategy", "Berth's scheduler"}, {"Nodes", strconv.Itoa(len(nodes))}}
	for _, n := range nodes {
		cpus += n.Capacity.CPU
		inf.MemTotal += int64(n.Capacity.Memory)
		if n.Status == driver.NodeOnline {
			online++
		}
		status = append(status,
			[2]string{" " + n.Provider + "/" + n.Name, n.Address},
			[2]string{"  └ Status", string(n.Status)},
			[2]string{"  └ Containers", strconv.Itoa(n.BerthCount)},
			[2]string{"  └ Reserved CPUs", fmt.Sprintf("%s / %s", n.Berth.CPU, n.Capacity.CPU)},
			[2]string{"  └ Reserved Memory", fmt.Sprintf("%s / %s", n.Berth.Memory.Human(), n.Capacity.Memory.Human())},
		)
	}
	inf.SystemStatus = status
	inf.NCPU = int(cpus / 1000)
	inf.DriverStatus = [][2]string{{"Nodes", strconv.Itoa(len(nodes))}, {"Nodes online", strconv.Itoa(online)}, {"CPUs", cpus.String()}}
	for _, in := range list {
		inf.Containers++
		switch dockerState(in) {
		case container.StateRunning:
			inf.ContainersRunning++
		case container.StatePaused:
			inf.ContainersPaused++
		case container.StateExited, container.StateDead:
			inf.ContainersStopped++
		}
	}
	return writeJSON(w, http.StatusOK, inf)
}

// visible lists the instances (not deleted) and, with created, the
// containers created and not started that the caller may see.
func (s *Server) visible(r *http.Request, created bool) ([]control.Instance, error) {
	list, err := s.plane.Instances(r.Context(), control.Filter{})
	if err != nil {
		return nil, err
	}
	out := list[:0]
	for _, in := range list {
		if authorized(r, in.Owner) {
			out = append(out, in)
		}
	}
	if !created {
		return out, nil
	}
	kept, err := s.createdNow(r.Context())
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	for id, c := range kept {
		if authorized(r, c.owner) {
			out = append(out, instanceOf(id, c))
		}
	}
	s.mu.Unlock()
	return out, nil
}

// filters decodes the filters parameter: {"key": {"value": true}} or
// {"key": ["value"]}.
func filters(r *http.Request, known ...string) (map[string][]string, error) {
	raw := r.URL.Query().Get("filters")
	out := map[string][]string{}
	if raw == "" {
		return out, nil
	}
	var asMap map[string]map[string]bool
	if err := json.Unmarshal([]byte(raw), &asMap); err == nil {
		for k, vs := range asMap {
			for v, ok := range vs {
				if ok {
					out[k] = append(out[k], v)
				}
			}
		}
	} else if err := json.Unmarshal([]byte(raw), &out); err != nil {
		return nil, badRequest("filters: %v", err)
	}
	for k := range out {
		if !slices.Contains(known, k) {
			return nil, unsupported("the filter %q is not supported by Berth; supported: %s", k, strings.Join(known, ", "))
		}
	}
	return out, nil
}

func matchAny(vals []string, fn func(string) bool) bool {
	if len(vals) == 0 {
		return true
	}
	return slices.ContainsFunc(vals, fn)
}

// listFilters are the filters docker ps may send.
var listFilters = []string{"id", "name", "label", "status", "ancestor", "exited", "node"}

func (s *Server) list(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	all, _ := strconv.ParseBool(q.Get("all"))
	if b, _ := strconv.ParseBool(q.Get("size")); b {
		return unsupported("ps --size: Berth does not measure container file systems")
	}
	limit := -1
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			return badRequest("limit=%q: want a number", v)
		}
		limit = n
	}
	f, err := filters(r, listFilters...)
	if err != nil {
		return err
	}
	// A container created and not started is listed with --all or a
	// status filter only.
	list, err := s.visible(r, all || len(f["status"]) > 0)
	if err != nil {
		return err
	}
	now := time.Now()
	var out []container.Summary
	for _, in := range list {
		sum := summary(in, now)
		if !all && sum.State != container.StateRunning && sum.State != container.StatePaused && len(f["status"]) == 0 {
			continue
		}
		spec := in.Spec
		if spec == nil {
			spec = &driver.Spec{}
		}
		ok := matchAny(f["id"], func(v string) bool { return strings.HasPrefix(in.ID, v) }) &&
			matchAny(f["name"], func(v string) bool { return strings.Contains(in.Name, strings.TrimPrefix(v, "/")) }) &&
			matchAny(f["status"], func(v string) bool { return v == string(sum.State) }) &&
			matchAny(f["ancestor"], func(v string) bool { return spec.Image == v || strings.TrimSuffix(spec.Image, ":latest") == v }) &&
			matchAny(f["exited"], func(v string) bool { return sum.State == container.StateExited && strconv.Itoa(exitCode(in)) == v }) &&
			matchAny(f["node"], func(v string) bool { return in.Node == v || reconciler.NodeID(in.Provider, in.Node) == v }) &&
			labelsMatch(sum.Labels, f["label"])
		if ok {
			out = append(out, sum)
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Created != out[j].Created {
			return out[i].Created > out[j].Created
		}
		return out[i].ID > out[j].ID
	})
	if limit > 0 && len(out) > limit {
		out = out[:limit]
	}
	if out == nil {
		out = []container.Summary{}
	}
	return writeJSON(w, http.StatusOK, out)
}

// inspectResponse is the Engine API's inspect answer with the node the
// container runs on (Swarm classic's Node field).
type inspectResponse struct {
	container.InspectResponse
	Node *nodeInfo `json:"Node,omitempty"`
}

type nodeInfo struct {
	ID       string
	Name     string
	Provider string
}

func (s *Server) inspect(w http.ResponseWriter, r *http.Request) error {
	if b, _ := strconv.ParseBool(r.URL.Query().Get("size")); b {
		return unsupported("inspect --size: Berth does not measure container file systems")
	}
	c, err := s.find(r, r.PathValue("id"))
	if err != nil {
		return err
	}
	in := c.in
	if c.created != nil {
		in = instanceOf(c.id, c.created)
	}
	s.mu.Lock()
	_, autoRm := s.autoRm[c.id]
	autoRm = autoRm || (c.created != nil && c.created.autoRemove)
	s.mu.Unlock()
	if s.follower() && c.created == nil {
		if autoRm, err = s.autoRemoveMarked(r.Context(), c.id); err != nil {
			return errForward
		}
	}
	return writeJSON(w, http.StatusOK, inspectOf(in, autoRm))
}

func rfc3339(t time.Time) string {
	if t.IsZero() {
		return "0001-01-01T00:00:00Z"
	}
	return t.UTC().Format(time.RFC3339Nano)
}

// inspectOf answers in as docker inspect shows it, its secrets (env
// values) redacted as every answer of the API.
func inspectOf(in control.Instance, autoRemove bool) inspectResponse {
	spec := in.Spec.Redacted()
	if spec == nil {
		spec = &driver.Spec{}
	}
	st := &container.State{Status: dockerState(in), ExitCode: exitCode(in), StartedAt: rfc3339(time.Time{}), FinishedAt: rfc3339(time.Time{})}
	st.Running = st.Status == container.StateRunning || st.Status == container.StatePaused
	st.Paused = st.Status == container.StatePaused
	st.Dead = st.Status == container.StateDead
	if in.Phase == reconciler.Failed || in.Phase == reconciler.Pending {
		st.Error = in.Message
	}
	if o := in.Observed; o != nil {
		st.StartedAt, st.FinishedAt = rfc3339(o.Started), rfc3339(o.Finished)
	}
	env := make([]string, 0, len(spec.Env))
	for k, v := range spec.Env {
		env = append(env, k+"="+v)
	}
	sort.Strings(env)
	labels := map[string]string{}
	for k, v := range spec.Labels {
		labels[k] = v
	}
	var path string
	args := []string{}
	if cmd := append(slices.Clone(spec.Entrypoint), spec.Command...); len(cmd) > 0 {
		path, args = cmd[0], cmd[1:]
	}
	hc := &container.HostConfig{
		AutoRemove:    autoRemove,
		RestartPolicy: container.RestartPolicy{Name: container.RestartPolicyMode(spec.RestartPolicy.Name), MaximumRetryCount: spec.RestartPolicy.MaxRetries},
		NetworkMode:   container.NetworkMode(spec.NetworkMode),
		PortBindings:  network.PortMap{},
		Resources: container.Resources{
			NanoCPUs: int64(spec.CPU) * 1_000_000, Memory: int64(spec.Memory),
			MemoryReservation: int64(spec.MemoryReservation), CpusetCpus: spec.Cpuset,
		},
	}
	if hc.RestartPolicy.Name == "" {
		hc.RestartPolicy.Name = container.RestartPolicyDisabled
	}
	if hc.NetworkMode == "" {
		hc.NetworkMode = "default"
	}
	mounts := []container.MountPoint{}
	for _, v := range spec.Volumes {
		hc.Binds = append(hc.Binds, v.Source+":"+v.Target+map[bool]string{true: ":ro"}[v.ReadOnly])
		mp := container.MountPoint{Type: "volume", Name: v.Source, Destination: v.Target, RW: !v.ReadOnly}
		if v.IsBind() {
			mp = container.MountPoint{Type: "bind", Source: v.Source, Destination: v.Target, RW: !v.ReadOnly}
		}
		mounts = append(mounts, mp)
	}
	ns := &container.NetworkSettings{Ports: network.PortMap{}, Networks: endpointsOf(in)}
	exposed := network.PortSet{}
	for _, p := range spec.Ports {
		port, ok := network.PortFrom(uint16(p.ContainerPort), network.IPProtocol(protoOr(p.Protocol)))
		if !ok {
			continue
		}
		exposed[port] = struct{}{}
		b := network.PortBinding{}
		if p.HostPort != 0 {
			b.HostPort = strconv.Itoa(p.HostPort)
		}
		if a, err := netip.ParseAddr(p.HostIP); err == nil {
			b.HostIP = a
		}
		hc.PortBindings[port] = append(hc.PortBindings[port], b)
	}
	for _, p := range ports(in) {
		if p.PublicPort == 0 {
			continue
		}
		port, ok := network.PortFrom(p.PrivatePort, network.IPProtocol(p.Type))
		if !ok {
			continue
		}
		ns.Ports[port] = append(ns.Ports[port], network.PortBinding{HostIP: p.IP, HostPort: strconv.Itoa(int(p.PublicPort))})
	}
	out := inspectResponse{InspectResponse: container.InspectResponse{
		ID: in.ID, Created: rfc3339(in.Created), Path: path, Args: args, State: st,
		Image: spec.Image, Name: "/" + in.Name, Driver: "berth", Platform: "linux",
		HostConfig: hc, Mounts: mounts, NetworkSettings: ns, ExecIDs: nil,
		Config: &container.Config{
			Hostname: spec.Hostname, Domainname: spec.Domainname, Env: env, Cmd: spec.Command,
			Entrypoint: spec.Entrypoint, Image: spec.Image, WorkingDir: spec.WorkingDir, Labels: labels,
			ExposedPorts: exposed,
			Tty:          spec.TTY, OpenStdin: spec.Stdin, StdinOnce: spec.Stdin, AttachStdin: spec.Stdin,
			AttachStdout: true, AttachStderr: true,
		},
	}}
	if in.Node != "" {
		out.Node = &nodeInfo{ID: reconciler.NodeID(in.Provider, in.Node), Name: in.Node, Provider: in.Provider}
	}
	return out
}

// images lists the images of every node of every provider that lists
// images, one row per image id.
func (s *Server) images(w http.ResponseWriter, r *http.Request) error {
	f, err := filters(r, "reference", "dangling")
	if err != nil {
		return err
	}
	if b, _ := strconv.ParseBool(r.URL.Query().Get("digests")); b {
		return unsupported("images --digests: Berth's engines share no registry")
	}
	all, err := s.imageSummaries(r.Context())
	if err != nil {
		return err
	}
	out := []image.Summary{}
	for _, sum := range all {
		if len(f["dangling"]) > 0 && (len(sum.RepoTags) == 0) != (f["dangling"][0] == "true") {
			continue
		}
		if !matchAny(f["reference"], func(v string) bool {
			return slices.ContainsFunc(sum.RepoTags, func(t string) bool { return t == v || strings.HasPrefix(t, v+":") })
		}) {
			continue
		}
		out = append(out, *sum)
	}
	return writeJSON(w, http.StatusOK, out)
}

// pull preloads an image on every node of the providers that have it on
// some node: Berth's engines share no registry, so the image is copied from
// where it is.
func (s *Server) pull(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	if q.Get("fromSrc") != "" {
		return unsupported("docker import: load the image onto an engine, then pull it through Berth")
	}
	name := q.Get("fromImage")
	if name == "" {
		return badRequest("fromImage is required")
	}
	if tag := q.Get("tag"); tag != "" && !strings.Contains(name, "@") {
		name += ":" + tag
	} else if !strings.Contains(name[strings.LastIndex(name, "/")+1:], ":") {
		name += ":latest"
	}
	name = familiar(name)
	nodes, err := s.plane.Nodes(r.Context())
	if err != nil {
		return err
	}
	provs, err := s.plane.Providers(r.Context())
	if err != nil {
		return err
	}
	canPreload := map[string]bool{}
	for _, p := range provs {
		canPreload[p.Name] = slices.Contains(p.Capabilities, driver.CapImages) && slices.Contains(p.Capabilities, driver.CapPreload)
	}
	var have []string
	for _, n := range nodes {
		if !canPreload[n.Provider] || slices.Contains(have, n.Provider) || n.Status != driver.NodeOnline {
			continue
		}
		imgs, err := s.plane.Images(r.Context(), n.Provider, n.Name)
		if err != nil {
			return err
		}
		if slices.ContainsFunc(imgs, func(im driver.Image) bool { return familiar(im.Name) == name || im.ID == name }) {
			have = append(have, n.Provider)
		}
	}
	if len(have) == 0 {
		return &httpError{http.StatusNotFound, fmt.Sprintf("no engine in the cluster has %s and Berth has no registry to pull from: load the image onto one engine (docker load), then pull it through Berth to copy it to the others", name)}
	}
	release, err := s.acquire(w, r)
	if err != nil {
		return err
	}
	defer release()
	ctx, cancel := s.streamContext(r)
	defer cancel()
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	enc := json.NewEncoder(w)
	emit := func(m jsonstream.Message) {
		_ = enc.Encode(m)
		_ = rc.Flush()
	}
	for _, p := range have {
		err := s.plane.Preload(ctx, p, name, nil, func(pr driver.PreloadProgress) {
			msg := jsonstream.Message{ID: p + "/" + pr.Node, Status: pr.Status}
			if pr.Err != "" {
				msg.Status += ": " + pr.Err
			}
			emit(msg)
		})
		if err != nil {
			emit(jsonstream.Message{Error: &jsonstream.Error{Message: err.Error()}})
			return nil
		}
	}
	emit(jsonstream.Message{Status: "Status: Image is up to date on every node of " + strings.Join(have, ", ") + " for " + name})
	return nil
}

// familiar drops the default registry and namespace from an image name, as
// the engines list their images.
func familiar(name string) string {
	name = strings.TrimPrefix(name, "docker.io/")
	return strings.TrimPrefix(name, "library/")
}
