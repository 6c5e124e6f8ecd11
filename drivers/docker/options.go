package docker

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"os"
	"regexp"
	"strings"
	"time"

	"github.com/berth-dev/berth/driver"
)

// DefaultHost is the engine used when neither engines nor host is set.
const DefaultHost = "unix:///var/run/docker.sock"

// Options configures the docker driver. Every field is also a flag
// --docker-<option>; engines takes JSON there.
type Options struct {
	Engines []EngineConfig `option:"engines" help:"the engines, a JSON list of {name, address, tls: {ca, cert, key, insecure_skip_verify}, labels, capacity, max_instances, drain, external_address}; each engine is one node"`
	Host    string         `option:"host" help:"shorthand for a single engine named \"local\" at this address (unix:///path or tcp://host:port); used when engines is empty"`

	APIVersion   string        `option:"api_version" help:"fix the Engine API version (e.g. 1.41) instead of negotiating it with each engine"`
	CallTimeout  time.Duration `option:"call_timeout" range:"1ms,1h" help:"the longest a single Engine API call may take"`
	PollInterval time.Duration `option:"poll_interval" range:"1ms,1h" help:"how often an online engine is checked"`
	BackoffMin   time.Duration `option:"backoff_min" range:"1ms,1h" help:"first retry delay for an engine that stopped answering"`
	BackoffMax   time.Duration `option:"backoff_max" range:"1ms,1h" help:"longest retry delay for an offline engine"`
	StopGrace    time.Duration `option:"stop_grace" range:"0s,1h" help:"how long Delete waits after SIGTERM before killing the container"`
	// MaxInFlight bounds the creates and deletes in flight on one engine,
	// each its container's calls one after another (create, start; stop,
	// remove). The engine performs starts largely one after another: a
	// start it has queued past call_timeout would be undone and made
	// again, while one waiting here has not started its call_timeout.
	MaxInFlight  int    `option:"max_in_flight" range:"1,1024" help:"the most creates and deletes in flight on one engine at once, each its container's calls one after another (create, start; stop, remove); more wait their turn in Berth, before their call_timeout starts"`
	Network      string `option:"network" help:"network for containers whose spec names neither a network mode nor networks (engine default when empty)"`
	UserDataPath string `option:"user_data_path" help:"file in the container that receives the spec's user data"`
	Pull         bool   `option:"pull" help:"let Preload try the registry before copying an image from another engine"`
	// UsageInterval is how often each online engine's use is measured for
	// Node.InUse: one stats call per running Berth container.
	UsageInterval time.Duration `option:"usage_interval" range:"0s,1h" help:"how often each engine's in-use cpus and memory are measured (one stats call per running Berth container); 0 turns it off"`
	// SweepInterval spaces the sweeps of each engine: the plane asks for
	// one after every listing, and a sweep asks the engine about each of
	// the cluster's networks there.
	SweepInterval time.Duration `option:"sweep_interval" range:"1ms,24h" help:"how often, at most, each engine is searched for the networks Berth made that no container is on (one call per such network)"`
}

// EngineConfig is one Docker Engine, which Berth shows as one node.
type EngineConfig struct {
	// Name is the node name; unique among the engines.
	Name string `json:"name"`
	// Address is unix:///path/to/docker.sock or tcp://host:port.
	Address string `json:"address"`
	// TLS secures a tcp address.
	TLS *TLSConfig `json:"tls,omitempty"`
	// Labels are operator labels, merged over the engine's own labels.
	Labels map[string]string `json:"labels,omitempty"`
	// Capacity replaces the engine's reported capacity, field by field
	// (zero fields keep what the engine reports).
	Capacity driver.Resources `json:"capacity,omitzero"`
	// MaxInstances caps the containers Berth places here; 0 means no cap.
	MaxInstances int `json:"max_instances,omitempty"`
	// Drain keeps the engine's containers but places nothing new on it.
	Drain bool `json:"drain,omitempty"`
	// ExternalAddress is the host at which published ports are reached.
	// Default: the host of a tcp address, 127.0.0.1 for a unix socket.
	ExternalAddress string `json:"external_address,omitempty"`
}

// TLSConfig holds the files for a TLS connection to an engine.
type TLSConfig struct {
	CA                 string `json:"ca,omitempty"`
	Cert               string `json:"cert,omitempty"`
	Key                string `json:"key,omitempty"`
	InsecureSkipVerify bool   `json:"insecure_skip_verify,omitempty"`
}

func defaultOptions() *Options {
	return &Options{
		CallTimeout:   30 * time.Second,
		PollInterval:  5 * time.Second,
		BackoffMin:    time.Second,
		BackoffMax:    time.Minute,
		StopGrace:     10 * time.Second,
		MaxInFlight:   8,
		UserDataPath:  "/berth/user-data",
		Pull:          true,
		UsageInterval: 15 * time.Second,
		SweepInterval: time.Minute,
	}
}

var apiVersionRE = regexp.MustCompile(`^1\.[0-9]+$`)

// engines returns the configured engines, the host shorthand or the default.
func (o *Options) engines() []EngineConfig {
	if len(o.Engines) > 0 {
		return o.Engines
	}
	host := o.Host
	if host == "" {
		host = DefaultHost
	}
	return []EngineConfig{{Name: "local", Address: host}}
}

// Validate checks every option and names the offending path, e.g.
// "engines[1].tls.cert".
func (o *Options) Validate() error {
	_, err := o.check()
	return err
}

// check validates the options as Validate does and returns the loaded TLS
// configuration of each of o.Engines (nil where an engine has no tls), so
// that the files are read once.
func (o *Options) check() ([]*tls.Config, error) {
	es := driver.CheckRanges(o)
	tlsConfigs := make([]*tls.Config, len(o.Engines))
	if len(o.Engines) > 0 && o.Host != "" {
		es.Add("host", "set either host or engines, not both")
	}
	if o.Host != "" {
		if err := checkAddress(o.Host); err != nil {
			es.Add("host", "%v", err)
		}
	}
	if o.APIVersion != "" && !apiVersionRE.MatchString(o.APIVersion) {
		es.Add("api_version", "%q: want a version such as 1.41", o.APIVersion)
	}
	if o.UsageInterval > 0 && o.UsageInterval < 100*time.Millisecond {
		es.Add("usage_interval", "%s: want 0 (off) or at least 100ms: each round asks every engine for every container's stats", o.UsageInterval)
	}
	if o.BackoffMax < o.BackoffMin {
		es.Add("backoff_max", "%s is shorter than backoff_min %s", o.BackoffMax, o.BackoffMin)
	}
	if o.UserDataPath == "" || !strings.HasPrefix(o.UserDataPath, "/") || strings.HasSuffix(o.UserDataPath, "/") {
		es.Add("user_data_path", "%q: must be an absolute file path", o.UserDataPath)
	}
	names := map[string]int{}
	for i, e := range o.Engines {
		p := fmt.Sprintf("engines[%d]", i)
		if e.Name == "" {
			es.Add(p+".name", "required")
		} else if fe := driver.CheckName(p+".name", e.Name, driver.MaxNameLength); fe != nil {
			es = append(es, fe)
		} else {
			if j, dup := names[e.Name]; dup {
				es.Add(p+".name", "%q is also the name of engines[%d]", e.Name, j)
			}
			names[e.Name] = i
		}
		if e.Address == "" {
			es.Add(p+".address", "required: unix:///path/to/docker.sock or tcp://host:port")
		} else if err := checkAddress(e.Address); err != nil {
			es.Add(p+".address", "%v", err)
		}
		if e.TLS != nil {
			if !strings.HasPrefix(e.Address, "tcp://") {
				es.Add(p+".tls", "TLS needs a tcp:// address")
			}
			tc, err := tlsConfig(e.TLS, p+".tls")
			es.AddErr("", err)
			tlsConfigs[i] = tc
		}
		for k := range e.Labels {
			if k == "" {
				es.Add(p+".labels", "empty key")
			}
		}
		es.AddErr("", driver.ValidateCapacity(p+".capacity.", e.Capacity))
		if e.MaxInstances < 0 {
			es.Add(p+".max_instances", "%d: must not be negative", e.MaxInstances)
		}
		if e.ExternalAddress != "" && strings.ContainsAny(e.ExternalAddress, "/ ") {
			es.Add(p+".external_address", "%q: want a host name or IP address", e.ExternalAddress)
		}
	}
	if err := es.Err(); err != nil {
		return nil, err
	}
	return tlsConfigs, nil
}

// checkAddress accepts unix:///abs/path and tcp://host:port.
func checkAddress(addr string) error {
	scheme, rest, ok := strings.Cut(addr, "://")
	if !ok {
		return fmt.Errorf("%q: want unix:///path/to/docker.sock or tcp://host:port", addr)
	}
	switch scheme {
	case "unix":
		if !strings.HasPrefix(rest, "/") {
			return fmt.Errorf("%q: the socket path must be absolute", addr)
		}
	case "tcp":
		host, port, err := net.SplitHostPort(rest)
		if err != nil || host == "" || port == "" {
			return fmt.Errorf("%q: want tcp://host:port", addr)
		}
	default:
		return fmt.Errorf("%q: unknown scheme %q; want unix or tcp", addr, scheme)
	}
	return nil
}

// tlsConfig loads the TLS files; errors name path.ca, path.cert, path.key.
func tlsConfig(c *TLSConfig, path string) (*tls.Config, error) {
	var es driver.FieldErrors
	add := func(p, format string, args ...any) { es.Add(path+"."+p, format, args...) }
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, InsecureSkipVerify: c.InsecureSkipVerify} //nolint:gosec // the operator's explicit choice
	if c.CA != "" {
		pem, err := os.ReadFile(c.CA)
		if err != nil {
			add("ca", "%s: %v", c.CA, fileReason(err))
		} else {
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(pem) {
				add("ca", "%s: no PEM certificate in the file", c.CA)
			}
			cfg.RootCAs = pool
		}
	} else if !c.InsecureSkipVerify {
		add("ca", "required unless insecure_skip_verify is set")
	}
	switch {
	case c.Cert == "" && c.Key == "":
	case c.Cert == "":
		add("cert", "required with key")
	case c.Key == "":
		add("key", "required with cert")
	default:
		certOK, keyOK := true, true
		if _, err := os.Stat(c.Cert); err != nil {
			add("cert", "%s: %v", c.Cert, fileReason(err))
			certOK = false
		}
		if _, err := os.Stat(c.Key); err != nil {
			add("key", "%s: %v", c.Key, fileReason(err))
			keyOK = false
		}
		if certOK && keyOK {
			pair, err := tls.LoadX509KeyPair(c.Cert, c.Key)
			if err != nil {
				add("cert", "%s with key %s: %v", c.Cert, c.Key, err)
			} else {
				cfg.Certificates = []tls.Certificate{pair}
			}
		}
	}
	if len(es) > 0 {
		return nil, es
	}
	return cfg, nil
}

func fileReason(err error) string {
	switch {
	case os.IsNotExist(err):
		return "file not found"
	case os.IsPermission(err):
		return "permission denied"
	}
	return err.Error()
}

// externalAddress is where published ports of engine e are reached.
func (e EngineConfig) externalAddress() string {
	if e.ExternalAddress != "" {
		return e.ExternalAddress
	}
	if rest, ok := strings.CutPrefix(e.Address, "tcp://"); ok {
		if host, _, err := net.SplitHostPort(rest); err == nil {
			return host
		}
	}
	return "127.0.0.1"
}
