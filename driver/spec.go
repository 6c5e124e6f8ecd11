package driver

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"math"
	"path"
	"regexp"
	"strings"
)

// Kind is what an instance is.
type Kind string

// Kinds of instance.
const (
	KindContainer Kind = "container"
	KindProcess   Kind = "process"
	KindVM        Kind = "vm"
	KindBareMetal Kind = "baremetal"
)

// WorkloadType selects type-specific scheduling (Citadel): services spread and
// keep replicas apart, batch work packs.
type WorkloadType string

// Workload types.
const (
	TypeService WorkloadType = "service"
	TypeBatch   WorkloadType = "batch"
)

// Limits on a spec. Config files follow Octavia's config drive rule; the
// others are of the order of Kubernetes' and Docker's, so that whatever a
// back-end takes Berth takes, and one spec costs a bounded amount.
const (
	MaxConfigFiles    = 5
	MaxConfigFileSize = 10 * 1024
	MaxUserDataSize   = 64 * 1024
	MaxNameLength     = 63
	// MaxLabels bounds the labels (and the tags); a key is at most
	// MaxLabelKey bytes (Kubernetes' 253-byte prefix, '/' and 63-byte
	// name), a value at most MaxLabelValue.
	MaxLabels     = 128
	MaxLabelKey   = 317
	MaxLabelValue = 4096
	// MaxEnv bounds the variables, MaxEnvSize their keys and values
	// together.
	MaxEnv     = 1024
	MaxEnvSize = 256 * 1024
	// MaxArgs bounds the entry point and the command together, MaxArgsSize
	// their bytes (Linux takes 2 MiB of arguments and environment).
	MaxArgs     = 4096
	MaxArgsSize = 256 * 1024
	// MaxListItems bounds the ports, volumes, networks, security groups
	// and SSH keys, each.
	MaxListItems = 256
	// MaxStringSize bounds every other string of a spec (image, paths,
	// host name, SSH keys...).
	MaxStringSize = 4096
)

// Spec describes one instance to create: the union of what Zoe services,
// Octavia amphorae, Nodepool labels and Citadel images carry. Fields a
// back-end cannot honour make Create fail with ErrUnsupported; fields it does
// not use (SSH keys on a process) are ignored and documented by the driver.
type Spec struct {
	// Name is unique within a provider; empty lets the back-end pick one.
	Name string       `json:"name,omitempty"`
	Kind Kind         `json:"kind,omitempty"` // default container
	Type WorkloadType `json:"type,omitempty"` // default service
	// Image is required for containers and VMs; a process may name an
	// executable here instead of in Entrypoint.
	Image  string `json:"image,omitempty"`
	Flavor string `json:"flavor,omitempty"` // a back-end's named size; resources then come from it

	Resources
	Cpuset            string `json:"cpuset,omitempty"`
	MemoryReservation Bytes  `json:"memory_reservation,omitempty"` // soft limit

	// Entrypoint replaces the image's entry point; Command its arguments
	// (Docker's Cmd). A process runs Entrypoint followed by Command.
	Entrypoint []string          `json:"entrypoint,omitempty"`
	Command    []string          `json:"command,omitempty"`
	Env        map[string]string `json:"env,omitempty"`
	WorkingDir string            `json:"working_dir,omitempty"`
	// User runs the instance as this user: a name or a numeric id; Group
	// as this group (default the user's). Empty: the back-end's default.
	// A back-end that cannot honour them refuses the spec.
	User       string `json:"user,omitempty"`
	Group      string `json:"group,omitempty"`
	Hostname   string `json:"hostname,omitempty"`
	Domainname string `json:"domainname,omitempty"`

	// Labels are the user's key/values, shown on the instance and used by
	// affinity rules.
	Labels map[string]string `json:"labels,omitempty"`

	Ports    []Port   `json:"ports,omitempty"`
	Volumes  []Volume `json:"volumes,omitempty"`
	Networks []string `json:"networks,omitempty"`
	// NetworkAliases are further names the instance answers to on each of
	// its Networks, where the back-end resolves names there (the docker
	// driver: the engine's DNS). Each is a name ([a-zA-Z0-9][a-zA-Z0-9_.-]*).
	NetworkAliases []string `json:"network_aliases,omitempty"`
	NetworkMode    string   `json:"network_mode,omitempty"`
	SecurityGroups []string `json:"security_groups,omitempty"`
	SSHKeys        []string `json:"ssh_keys,omitempty"`

	// ConfigFiles are written into the instance before it starts: at most
	// MaxConfigFiles files of at most MaxConfigFileSize bytes each.
	ConfigFiles []ConfigFile `json:"config_files,omitempty"`
	// UserData is exposed to the instance: through a metadata service, a
	// file or an environment variable, as each driver documents.
	UserData string `json:"user_data,omitempty"`

	RestartPolicy RestartPolicy `json:"restart_policy,omitzero"`

	// Stdin keeps the instance's standard input open, for an Attacher to
	// forward to, until the first attach that forwards input ends it
	// (docker run -i). TTY runs the instance on a terminal (docker run
	// -t). A back-end that cannot refuses the spec (features CapStdin and
	// CapTTY).
	Stdin bool `json:"stdin,omitempty"`
	TTY   bool `json:"tty,omitempty"`

	// Tags are Berth's own key/values (see TagManaged); drivers store them so
	// that List can find the instance again after a restart.
	Tags map[string]string `json:"tags,omitempty"`
}

// Port asks for a port of the instance to be reachable.
type Port struct {
	ContainerPort int `json:"container_port"`
	// HostPort is the fixed host port; 0 means any free port.
	HostPort int    `json:"host_port,omitempty"`
	Protocol string `json:"protocol,omitempty"` // tcp (default), udp, sctp
	HostIP   string `json:"host_ip,omitempty"`
	// Publish exposes the port outside the host.
	Publish bool `json:"publish,omitempty"`
}

// Volume mounts a host path or a named volume into the instance.
type Volume struct {
	// Source is an absolute host path (a bind) or a volume name.
	Source   string `json:"source"`
	Target   string `json:"target"`
	ReadOnly bool   `json:"read_only,omitempty"`
}

// IsBind reports whether the volume is a host path.
func (v Volume) IsBind() bool { return strings.HasPrefix(v.Source, "/") }

// ConfigFile is a file placed in the instance before it starts.
type ConfigFile struct {
	Path    string `json:"path"`
	Content string `json:"content"`
	Mode    uint32 `json:"mode,omitempty"` // default 0644
}

// RestartPolicy says what the back-end does when the instance ends.
type RestartPolicy struct {
	Name       string `json:"name,omitempty"` // no (default), always, on-failure, unless-stopped
	MaxRetries int    `json:"max_retries,omitempty"`
}

var (
	envKey  = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_.-]*$`)
	hostRE  = regexp.MustCompile(`^[a-zA-Z0-9]([a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?$`)
	cpusetR = regexp.MustCompile(`^[0-9]+(-[0-9]+)?(,[0-9]+(-[0-9]+)?)*$`)
)

// CheckName checks a name of an instance, volume or engine: 1 to max
// letters, digits, '_', '.' or '-', starting with a letter or digit. It
// returns nil or a *FieldError for path.
func CheckName(path, s string, max int) *FieldError {
	if len(s) > 0 && len(s) <= max && isName(s) {
		return nil
	}
	return &FieldError{Path: path, Reason: fmt.Sprintf("%q: use 1 to %d letters, digits, '_', '.' or '-', starting with a letter or digit", s, max)}
}

// isName reports whether s matches ^[a-zA-Z0-9][a-zA-Z0-9_.-]*$. It is
// written out rather than a regexp because every create validates a name.
func isName(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case i > 0 && (c == '_' || c == '.' || c == '-'):
		default:
			return false
		}
	}
	return s != ""
}

// Validate checks the spec and returns FieldErrors naming every bad field, or
// nil. It is the one validation routine for all drivers; a driver adds only
// the checks specific to its back-end.
func (s *Spec) Validate() error {
	var es FieldErrors
	if s.Name != "" {
		if fe := CheckName("name", s.Name, MaxNameLength); fe != nil {
			es = append(es, fe)
		}
	}
	switch s.Kind {
	case "", KindContainer, KindVM, KindBareMetal:
		if s.Image == "" {
			es.Add("image", "required for kind %q", s.kindOrDefault())
		}
	case KindProcess:
		if s.Image == "" && len(s.Entrypoint) == 0 && len(s.Command) == 0 {
			es.Add("command", "a process needs an image (executable), an entrypoint or a command")
		}
	default:
		es.Add("kind", "%q: want one of container, process, vm, baremetal", s.Kind)
	}
	switch s.Type {
	case "", TypeService, TypeBatch:
	default:
		es.Add("type", "%q: want service or batch", s.Type)
	}
	if strings.ContainsAny(s.Image, " \t\n") {
		es.Add("image", "%q: must not contain white space", s.Image)
	}
	s.validateBounds(&es)
	validateResources(&es, "", s.Resources)
	if RangeBytes.Check(&es, "memory_reservation", int64(s.MemoryReservation)) && s.Memory > 0 && s.MemoryReservation > s.Memory {
		es.Add("memory_reservation", "%s exceeds the memory limit %s", s.MemoryReservation, s.Memory)
	}
	if s.Cpuset != "" && !cpusetR.MatchString(s.Cpuset) {
		es.Add("cpuset", "%q: want a list such as 0-3,6", s.Cpuset)
	}
	for k := range s.Env {
		if !envKey.MatchString(k) {
			es.Add("env."+k, "not a valid variable name")
		}
	}
	if k := s.kindOrDefault(); k == KindVM || k == KindBareMetal {
		if s.Stdin {
			es.Add("stdin", "a %s has no standard input: use its console", k)
		}
		if s.TTY {
			es.Add("tty", "a %s has no terminal of its own: use its console", k)
		}
	}
	if s.Group != "" && s.User == "" {
		es.Add("group", "needs a user")
	}
	if s.WorkingDir != "" && !path.IsAbs(s.WorkingDir) {
		es.Add("working_dir", "%q: must be an absolute path", s.WorkingDir)
	}
	if s.Hostname != "" && !hostRE.MatchString(s.Hostname) {
		es.Add("hostname", "%q: not a valid host name", s.Hostname)
	}
	for k := range s.Labels {
		if k == "" {
			es.Add("labels", "empty key")
		}
	}
	for k := range s.Tags {
		if k == "" {
			es.Add("tags", "empty key")
		}
	}
	type portKey struct {
		port  int
		proto string
	}
	seen := map[portKey]bool{}
	for i, p := range s.Ports {
		f := fmt.Sprintf("ports[%d]", i)
		RangeContainerPort.Check(&es, f+".container_port", int64(p.ContainerPort))
		RangeHostPort.Check(&es, f+".host_port", int64(p.HostPort))
		proto := p.Protocol
		switch proto {
		case "":
			proto = "tcp"
		case "tcp", "udp", "sctp":
		default:
			es.Add(f+".protocol", "%q: want tcp, udp or sctp", p.Protocol)
		}
		if p.HostPort > 0 {
			k := portKey{p.HostPort, proto}
			if seen[k] {
				es.Add(f+".host_port", "%d/%s is bound twice", p.HostPort, proto)
			}
			seen[k] = true
		}
	}
	targets := map[string]bool{}
	for i, v := range s.Volumes {
		f := fmt.Sprintf("volumes[%d]", i)
		if v.Source == "" {
			es.Add(f+".source", "required: an absolute host path or a volume name")
		} else if !v.IsBind() && !isName(v.Source) {
			es.Add(f+".source", "%q: neither an absolute path nor a volume name", v.Source)
		}
		if !path.IsAbs(v.Target) {
			es.Add(f+".target", "%q: must be an absolute path", v.Target)
		} else if targets[path.Clean(v.Target)] {
			es.Add(f+".target", "%q is mounted twice", v.Target)
		}
		targets[path.Clean(v.Target)] = true
	}
	for i, n := range s.Networks {
		if n == "" {
			es.Add(fmt.Sprintf("networks[%d]", i), "empty network name")
		}
	}
	for i, a := range s.NetworkAliases {
		if !isName(a) {
			es.Add(fmt.Sprintf("network_aliases[%d]", i), "%q: want [a-zA-Z0-9_.-], starting with a letter or digit", a)
		}
	}
	if len(s.NetworkAliases) > 0 && len(s.Networks) == 0 {
		es.Add("network_aliases", "aliases need networks to be known on")
	}
	if len(s.ConfigFiles) > MaxConfigFiles {
		es.Add("config_files", "%d files: at most %d are allowed", len(s.ConfigFiles), MaxConfigFiles)
	}
	files := map[string]int{}
	for i, c := range s.ConfigFiles {
		f := fmt.Sprintf("config_files[%d]", i)
		switch {
		case !path.IsAbs(c.Path) || path.Clean(c.Path) != c.Path || c.Path == "/":
			es.Add(f+".path", "%q: must be a clean absolute file path (no ., .., // or trailing /)", c.Path)
		default:
			if j, ok := files[c.Path]; ok {
				es.Add(f+".path", "%q appears twice (config_files[%d])", c.Path, j)
			}
			for o, j := range files {
				if strings.HasPrefix(c.Path, o+"/") || strings.HasPrefix(o, c.Path+"/") {
					es.Add(f+".path", "%q and %q (config_files[%d]) overlap: one would be the other's directory", c.Path, o, j)
				}
			}
			files[c.Path] = i
		}
		if len(c.Content) > MaxConfigFileSize {
			es.Add(f+".content", "%d bytes: at most %d are allowed", len(c.Content), MaxConfigFileSize)
		}
		RangeFileMode.Check(&es, f+".mode", int64(c.Mode))
	}
	if len(s.UserData) > MaxUserDataSize {
		es.Add("user_data", "%d bytes: at most %d are allowed", len(s.UserData), MaxUserDataSize)
	}
	switch s.RestartPolicy.Name {
	case "", "no", "always", "unless-stopped":
		if s.RestartPolicy.MaxRetries != 0 {
			es.Add("restart_policy.max_retries", "only allowed with on-failure")
		}
	case "on-failure":
		RangeRetries.Check(&es, "restart_policy.max_retries", int64(s.RestartPolicy.MaxRetries))
	default:
		es.Add("restart_policy.name", "%q: want no, always, on-failure or unless-stopped", s.RestartPolicy.Name)
	}
	return es.Err()
}

// validateBounds checks the sizes and counts of a spec's fields, and that
// no string holds a NUL byte (no back-end takes one: a C string ends there).
func (s *Spec) validateBounds(es *FieldErrors) {
	str := func(field, v string) {
		switch {
		case len(v) > MaxStringSize:
			es.Add(field, "%d bytes: at most %d are allowed", len(v), MaxStringSize)
		case strings.IndexByte(v, 0) >= 0:
			es.Add(field, "contains a NUL byte")
		}
	}
	for _, f := range []struct{ name, v string }{
		{"image", s.Image}, {"flavor", s.Flavor}, {"working_dir", s.WorkingDir}, {"hostname", s.Hostname},
		{"domainname", s.Domainname}, {"network_mode", s.NetworkMode}, {"user", s.User}, {"group", s.Group},
	} {
		str(f.name, f.v)
	}
	n, size := 0, 0
	for _, args := range []struct {
		name string
		list []string
	}{{"entrypoint", s.Entrypoint}, {"command", s.Command}} {
		for i, a := range args.list {
			n, size = n+1, size+len(a)
			if strings.IndexByte(a, 0) >= 0 {
				es.Add(fmt.Sprintf("%s[%d]", args.name, i), "contains a NUL byte")
			}
		}
	}
	if n > MaxArgs || size > MaxArgsSize {
		es.Add("command", "%d arguments of %d bytes (entrypoint and command): at most %d and %d bytes", n, size, MaxArgs, MaxArgsSize)
	}
	if len(s.Env) > MaxEnv {
		es.Add("env", "%d variables: at most %d", len(s.Env), MaxEnv)
	}
	size = 0
	for k, v := range s.Env {
		size += len(k) + len(v)
		if strings.IndexByte(v, 0) >= 0 {
			es.Add("env."+k, "the value contains a NUL byte")
		}
	}
	if size > MaxEnvSize {
		es.Add("env", "%d bytes of names and values: at most %d", size, MaxEnvSize)
	}
	for _, m := range []struct {
		name string
		kv   map[string]string
	}{{"labels", s.Labels}, {"tags", s.Tags}} {
		if len(m.kv) > MaxLabels {
			es.Add(m.name, "%d keys: at most %d", len(m.kv), MaxLabels)
		}
		for k, v := range m.kv {
			switch {
			case len(k) > MaxLabelKey:
				es.Add(m.name, "key of %d bytes: at most %d", len(k), MaxLabelKey)
			case strings.IndexByte(k, 0) >= 0:
				es.Add(m.name, "a key contains a NUL byte")
			case len(v) > MaxLabelValue:
				es.Add(m.name+"."+k, "%d bytes: at most %d", len(v), MaxLabelValue)
			case strings.IndexByte(v, 0) >= 0:
				es.Add(m.name+"."+k, "contains a NUL byte")
			}
		}
	}
	for _, l := range []struct {
		name string
		n    int
	}{{"ports", len(s.Ports)}, {"volumes", len(s.Volumes)}, {"networks", len(s.Networks)}, {"network_aliases", len(s.NetworkAliases)}, {"security_groups", len(s.SecurityGroups)}, {"ssh_keys", len(s.SSHKeys)}} {
		if l.n > MaxListItems {
			es.Add(l.name, "%d items: at most %d", l.n, MaxListItems)
		}
	}
	for i, v := range s.Volumes {
		str(fmt.Sprintf("volumes[%d].source", i), v.Source)
		str(fmt.Sprintf("volumes[%d].target", i), v.Target)
	}
	for i, v := range s.Networks {
		str(fmt.Sprintf("networks[%d]", i), v)
	}
	for i, v := range s.NetworkAliases {
		str(fmt.Sprintf("network_aliases[%d]", i), v)
	}
	for i, v := range s.SecurityGroups {
		str(fmt.Sprintf("security_groups[%d]", i), v)
	}
	for i, v := range s.SSHKeys {
		str(fmt.Sprintf("ssh_keys[%d]", i), v)
	}
	for i, c := range s.ConfigFiles {
		str(fmt.Sprintf("config_files[%d].path", i), c.Path)
	}
}

// Size is an upper bound of the bytes s holds in its strings: what one
// instance of it costs to keep, before the fixed part.
func (s *Spec) Size() int {
	n := len(s.Name) + len(s.Image) + len(s.Flavor) + len(s.Cpuset) + len(s.WorkingDir) + len(s.Hostname) +
		len(s.Domainname) + len(s.NetworkMode) + len(s.UserData) + len(s.User) + len(s.Group)
	for _, l := range [][]string{s.Entrypoint, s.Command, s.Networks, s.NetworkAliases, s.SecurityGroups, s.SSHKeys} {
		for _, v := range l {
			n += len(v)
		}
	}
	for _, m := range []map[string]string{s.Env, s.Labels, s.Tags} {
		for k, v := range m {
			n += len(k) + len(v)
		}
	}
	for _, v := range s.Volumes {
		n += len(v.Source) + len(v.Target)
	}
	for _, c := range s.ConfigFiles {
		n += len(c.Path) + len(c.Content)
	}
	return n
}

func (s *Spec) kindOrDefault() Kind {
	if s.Kind == "" {
		return KindContainer
	}
	return s.Kind
}

// KindOrDefault returns the spec's kind, container when unset.
func (s *Spec) KindOrDefault() Kind { return s.kindOrDefault() }

// validateResources checks that every amount is in its range. prefix is
// prepended to each field path.
func validateResources(es *FieldErrors, prefix string, r Resources) {
	checkAmounts(es, prefix, r, RangeCPU, RangeBytes, RangeGPUs, RangeOther)
}

// checkAmounts checks r's amounts against the ranges given for each.
func checkAmounts(es *FieldErrors, prefix string, r Resources, cpu, bytes, gpus, other Range) {
	cpu.Check(es, prefix+"cpus", int64(r.CPU))
	bytes.Check(es, prefix+"memory", int64(r.Memory))
	bytes.Check(es, prefix+"disk", int64(r.Disk))
	gpus.Check(es, prefix+"gpus", r.GPUs)
	for k, v := range r.Other {
		if k == "" {
			es.Add(prefix+"other", "empty resource name")
		}
		other.Check(es, prefix+"other."+k, v)
	}
}

// ValidateResources checks that every amount in r, what an instance
// asks for, is in its range (RangeCPU...); field paths are prefixed with
// prefix (e.g. "resources.").
func ValidateResources(prefix string, r Resources) error {
	var es FieldErrors
	validateResources(&es, prefix, r)
	return es.Err()
}

// ValidateCapacity checks that no amount in r, what a node has or
// holds back, is negative; field paths are prefixed with prefix (e.g.
// "capacity."). A node may have more than one instance may ask for.
func ValidateCapacity(prefix string, r Resources) error {
	var es FieldErrors
	some := Range{0, math.MaxInt64}
	checkAmounts(&es, prefix, r, some, some, some, some)
	return es.Err()
}

// Redacted returns a copy of s whose secrets (env values, user data and
// config-file contents) are replaced by SecretDigest of each: secrets are
// write-only, and whatever shows a spec (API answers, events, pages, logs)
// shows it redacted. s is not changed.
func (s *Spec) Redacted() *Spec {
	if s == nil {
		return nil
	}
	c := *s
	if len(s.Env) > 0 {
		c.Env = make(map[string]string, len(s.Env))
		for k, v := range s.Env {
			c.Env[k] = SecretDigest(v)
		}
	}
	if s.UserData != "" {
		c.UserData = SecretDigest(s.UserData)
	}
	if len(s.ConfigFiles) > 0 {
		c.ConfigFiles = make([]ConfigFile, len(s.ConfigFiles))
		for i, f := range s.ConfigFiles {
			f.Content = SecretDigest(f.Content)
			c.ConfigFiles[i] = f
		}
	}
	return &c
}

// SecretDigest describes a secret value by its size and SHA-256 digest
// only: "14 bytes, sha256:3d47…" (the whole digest).
func SecretDigest(v string) string {
	sum := sha256.Sum256([]byte(v))
	return fmt.Sprintf("%d bytes, sha256:%s", len(v), hex.EncodeToString(sum[:]))
}
