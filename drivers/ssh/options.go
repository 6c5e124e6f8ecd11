package ssh

import (
	"fmt"
	"net"
	"path"
	"time"

	gossh "golang.org/x/crypto/ssh"

	"github.com/berth-dev/berth/driver"
)

// MaxHosts bounds the hosts of one provider.
const MaxHosts = 1024

// Options configure the driver.
type Options struct {
	Hosts []Host `option:"hosts" help:"the hosts as JSON: [{name, address, port, user, labels, capacity: {cpus, memory, disk}, max_instances, host_key}]; name defaults to the address, port to 22, user to root; host_key pins the host's public key (authorized_keys form) instead of known_hosts"`
	// KeyFile and Agent are the ways to log in; at least one.
	KeyFile string `option:"key_file" help:"private key (OpenSSH or PEM, unencrypted) to log in with"`
	Agent   bool   `option:"agent" help:"also log in with the keys of the ssh-agent at $SSH_AUTH_SOCK"`
	// KnownHosts holds the hosts' keys; a host whose key is not there, or
	// differs, is refused.
	KnownHosts       string        `option:"known_hosts" help:"known_hosts file the hosts' keys are checked against (default ~/.ssh/known_hosts); a host with no host_key must be in it"`
	TrustFirstUse    bool          `option:"trust_on_first_use" help:"accept the key of a host known_hosts does not know, and add it there (never a changed key)"`
	Root             string        `option:"root" help:"directory on each host holding the supervisor and the instance directories"`
	MaxChannels      int           `option:"max_channels" range:"1,64" help:"most ssh channels open at once on one host's connection, and most creates and deletes in flight on the host"`
	ProbeInterval    time.Duration `option:"probe_interval" range:"10ms,1h" help:"how often each host's connection is checked (and a lost host dialled again)"`
	DialTimeout      time.Duration `option:"dial_timeout" range:"10ms,10m" help:"bound of connecting to and logging in to a host"`
	CallTimeout      time.Duration `option:"call_timeout" range:"100ms,1h" help:"bound of each command run on a host (the binary's copy excepted)"`
	StopGrace        time.Duration `option:"stop_grace" range:"0s,1h" help:"time between SIGTERM and SIGKILL when Delete stops a process"`
	SupervisorBinary string        `option:"supervisor_binary" help:"the Berth binary copied to each host to supervise its instances (default: this one); it must be built for the hosts' architecture"`
	// CgroupParent and Limits: see the package documentation.
	CgroupParent string `option:"cgroup_parent" help:"cgroup v2 directory on each host under which each instance gets a cgroup <cluster>/<id> with its cpu.max and memory.max; the login user must be able to write it"`
	Limits       string `option:"limits" help:"enforce: an instance with cpus or memory is refused on a host where no cgroup can hold them; count: it runs there with them counted, not enforced"`
	// Supervision: see the package documentation.
	Supervision string `option:"supervision" help:"auto: each instance's supervisor runs in a transient systemd unit (systemd-run) on a host whose service manager is systemd, as a process of its own elsewhere; process: as a process of its own everywhere"`
}

// The values of the option limits.
const (
	LimitsEnforce = "enforce"
	LimitsCount   = "count"
)

// Host is one machine.
type Host struct {
	Name    string            `json:"name,omitempty"`
	Address string            `json:"address"`
	Port    int               `json:"port,omitempty"`
	User    string            `json:"user,omitempty"`
	Labels  map[string]string `json:"labels,omitempty"`
	// Capacity overrides what is read from the host, field by field.
	Capacity     driver.Resources `json:"capacity,omitzero"`
	MaxInstances int              `json:"max_instances,omitempty"`
	// HostKey pins the host's public key, in authorized_keys form.
	HostKey string `json:"host_key,omitempty"`
}

// DefaultOptions returns the defaults.
func DefaultOptions() *Options {
	return &Options{
		Root:          "/var/lib/berth-ssh",
		MaxChannels:   8,
		ProbeInterval: 10 * time.Second,
		DialTimeout:   10 * time.Second,
		CallTimeout:   30 * time.Second,
		StopGrace:     10 * time.Second,
		CgroupParent:  DefaultCgroupParent,
		Limits:        LimitsEnforce,
		Supervision:   SupervisionAuto,
	}
}

// Validate checks what types cannot; every error names its key.
func (o *Options) Validate() error {
	es := driver.CheckRanges(o)
	switch {
	case len(o.Hosts) == 0:
		es.Add("hosts", "at least one host is needed")
	case len(o.Hosts) > MaxHosts:
		es.Add("hosts", "%d hosts: at most %d", len(o.Hosts), MaxHosts)
	}
	names := map[string]int{}
	for i, h := range o.Hosts {
		f := fmt.Sprintf("hosts[%d].", i)
		if h.Address == "" {
			es.Add(f+"address", "required: a host name or IP address")
		} else if len(h.Address) > 255 || net.ParseIP(h.Address) == nil && driver.CheckName(f+"address", h.Address, 255) != nil {
			es.Add(f+"address", "%q: not a host name or IP address", h.Address)
		}
		name := h.name()
		if fe := driver.CheckName(f+"name", name, driver.MaxNameLength); fe != nil {
			es = append(es, fe)
		} else if j, dup := names[name]; dup {
			es.Add(f+"name", "%q is also hosts[%d]'s name", name, j)
		}
		names[name] = i
		if h.Port < 0 || h.Port > 65535 {
			es.Add(f+"port", "%d: want 1 to 65535", h.Port)
		}
		if h.User != "" && driver.CheckName(f+"user", h.User, 32) != nil {
			es.Add(f+"user", "%q: not a user name", h.User)
		}
		for k := range h.Labels {
			if k == "" {
				es.Add(f+"labels", "empty key")
			}
		}
		es.AddErr("", driver.ValidateResources(f+"capacity.", h.Capacity))
		if h.MaxInstances < 0 {
			es.Add(f+"max_instances", "must not be negative")
		}
		if h.HostKey != "" {
			if _, _, _, _, err := gossh.ParseAuthorizedKey([]byte(h.HostKey)); err != nil {
				es.Add(f+"host_key", "not a public key in authorized_keys form: %v", err)
			}
		}
	}
	if o.Root == "" || !path.IsAbs(o.Root) || path.Clean(o.Root) != o.Root || o.Root == "/" {
		es.Add("root", "%q: want a clean absolute directory other than /", o.Root)
	}
	if o.CgroupParent == "" || !path.IsAbs(o.CgroupParent) || path.Clean(o.CgroupParent) != o.CgroupParent || o.CgroupParent == "/" {
		es.Add("cgroup_parent", "%q: want a clean absolute directory other than /", o.CgroupParent)
	}
	if o.Limits != LimitsEnforce && o.Limits != LimitsCount {
		es.Add("limits", "%q: want %s or %s", o.Limits, LimitsEnforce, LimitsCount)
	}
	if o.Supervision != SupervisionAuto && o.Supervision != SupervisionProcess {
		es.Add("supervision", "%q: want %s or %s", o.Supervision, SupervisionAuto, SupervisionProcess)
	}
	return es.Err()
}

// name is the host's node name: Name, else the address.
func (h Host) name() string {
	if h.Name != "" {
		return h.Name
	}
	return h.Address
}

// addr is the host's address with its port.
func (h Host) addr() string {
	port := h.Port
	if port == 0 {
		port = 22
	}
	return net.JoinHostPort(h.Address, fmt.Sprint(port))
}

func (h Host) user() string {
	if h.User == "" {
		return "root"
	}
	return h.User
}
