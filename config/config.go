// Package config reads Berth's server configuration: a YAML file, strictly
// decoded, plus --<driver>-<option> flags that override driver options.
//
// Every error names the file, the path of the offending value
// ("providers[0].options.nodes") and the reason, and wraps driver.ErrInvalid.
package config

import (
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"runtime/debug"
	"slices"
	"sort"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/berth-dev/berth/auth"
	"github.com/berth-dev/berth/control"
	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/scheduler"
)

// MaxFileSize is the largest configuration file Load accepts.
const MaxFileSize = 1 << 20

// Defaults.
const (
	DefaultPort   = 7480
	DefaultListen = "127.0.0.1:7480"
	// DefaultGCPercent is the server's garbage collection target (as
	// GOGC) unless the configuration or the GOGC variable sets one: the
	// heap may grow to two and a half times the live data before a
	// collection, a third fewer collections than Go's default (100),
	// which are most of the latency tail of submissions, while a
	// server with a million instances and its etcd member stays under
	// 2.5 GiB (200 took it to 2.8 GiB; docs/benchmarks.md). MemoryLimit
	// bounds it.
	DefaultGCPercent = 150
)

// Config is the whole server configuration.
type Config struct {
	// Listen is the API's address, host:port.
	Listen string `yaml:"listen"`
	// DataDir holds the embedded store and the drivers' files.
	DataDir string `yaml:"data_dir"`
	// Cluster names this Berth installation; it is written on every back-end
	// resource (driver.TagCluster).
	Cluster string `yaml:"cluster"`
	Log     Log    `yaml:"log"`
	// ShutdownTimeout bounds a graceful shutdown.
	ShutdownTimeout time.Duration `yaml:"shutdown_timeout"`
	// MaxBodySize caps API request bodies. In YAML it is a size string
	// ("1Mi", "512k") or a bare number of MiB.
	MaxBodySize driver.Bytes `yaml:"max_body_size"`
	// MaxCount caps the instances one API submission may ask for.
	MaxCount int `yaml:"max_count"`
	// MemoryLimit is the Go runtime's soft memory limit for the server (as
	// GOMEMLIMIT): as the heap nears it, garbage is collected sooner rather
	// than the heap doubling. 0 leaves the runtime's setting. In YAML it is
	// a size string ("3Gi") or a bare number of MiB.
	MemoryLimit driver.Bytes `yaml:"memory_limit"`
	// GCPercent is the garbage collection target, as GOGC: a collection
	// starts when the heap has grown by this percentage of the live data.
	// 0 means GOGC when it is set, else DefaultGCPercent.
	GCPercent int        `yaml:"gc_percent"`
	Providers []Provider `yaml:"providers"`
	// Pools are Nodepool pools: labels mapped to specs, kept warm.
	Pools []control.Pool `yaml:"pools"`
	// Quotas limit a provider, a pool or a namespace.
	Quotas []control.Quota `yaml:"quotas"`
	// RunAs are the namespaces' policies of who their workloads may run
	// as (control.RunAs); a namespace without one runs non-root only.
	RunAs []control.RunAs `yaml:"run_as"`
	// QueuePolicy orders the groups waiting to be placed whole within a
	// priority class: fifo (the default), size (smallest first) or
	// dynsize (smallest first, with aging).
	QueuePolicy scheduler.Policy `yaml:"queue_policy"`
	// Schedulers is how many schedulers share a placement round of the
	// waiting instances, with optimistic commits (control.Config); 0 means
	// 1.
	Schedulers int `yaml:"schedulers"`

	// TLS serves the API over TLS, and with ClientCA asks for client
	// certificates.
	TLS TLS `yaml:"tls"`
	// Insecure allows a listen address off this host without TLS: the
	// tokens then cross the network in clear.
	Insecure bool `yaml:"insecure"`
	// AllowedOrigins are the Origin header values the API serves; requests
	// from any other origin (cross-site requests from a browser) are
	// refused.
	AllowedOrigins []string `yaml:"allowed_origins"`
	// TokenRate is the requests per second one token may make (0: the
	// default, 2000), TokenBurst how many at once.
	TokenRate  float64 `yaml:"token_rate"`
	TokenBurst int     `yaml:"token_burst"`
	// MaxStreams is how many log, stats and event streams one token may
	// hold open (0: the default, 32).
	MaxStreams int `yaml:"max_streams"`
	// Timeouts bound each phase of an HTTP request.
	Timeouts Timeouts `yaml:"timeouts"`
	// Reconcile tunes the lifecycle loops; zero values take control's
	// defaults.
	Reconcile Reconcile `yaml:"reconcile"`
	// Rebalance is the continuous mode of rebalancing; off unless every
	// is set.
	Rebalance Rebalance `yaml:"rebalance"`
}

// Timeouts bound the phases of one HTTP request (net/http.Server's);
// streams (logs, events) lift the write timeout for themselves.
type Timeouts struct {
	ReadHeader time.Duration `yaml:"read_header"`
	Read       time.Duration `yaml:"read"`
	Write      time.Duration `yaml:"write"`
	Idle       time.Duration `yaml:"idle"`
}

// Default timeouts.
const (
	DefaultReadHeaderTimeout = 10 * time.Second
	DefaultReadTimeout       = 30 * time.Second
	DefaultWriteTimeout      = 60 * time.Second
	DefaultIdleTimeout       = 2 * time.Minute
)

// TLS names the server's certificate files.
type TLS struct {
	// Cert and Key are PEM files: the server's certificate (chain) and key.
	Cert string `yaml:"cert"`
	Key  string `yaml:"key"`
	// ClientCA is a PEM file of the authorities whose client certificates
	// are accepted: a certificate whose common name is a token's name acts
	// as that token. Without it no client certificate is asked for.
	ClientCA string `yaml:"client_ca"`
}

// Enabled reports whether TLS is configured.
func (t TLS) Enabled() bool { return t.Cert != "" || t.Key != "" }

// Reconcile tunes the control plane's lifecycle loops (control.Config).
type Reconcile struct {
	LaunchTimeout time.Duration `yaml:"launch_timeout"`
	MaxAttempts   int           `yaml:"max_attempts"`
	RetryBackoff  time.Duration `yaml:"retry_backoff"`
	LeakSightings int           `yaml:"leak_sightings"`
	SyncInterval  time.Duration `yaml:"sync_interval"`
	Workers       int           `yaml:"workers"`
	ExcludeFor    time.Duration `yaml:"exclude_for"`
	Retention     time.Duration `yaml:"retention"`
	MaxRetained   int           `yaml:"max_retained"`
	// UsageInterval is how often running instances are measured (for
	// the nodes view and the usage overcommit policy); 0 means 10s.
	UsageInterval time.Duration `yaml:"usage_interval"`
}

// Apply copies r into cfg.
func (r Reconcile) Apply(cfg *control.Config) {
	cfg.LaunchTimeout, cfg.MaxAttempts, cfg.RetryBackoff = r.LaunchTimeout, r.MaxAttempts, r.RetryBackoff
	cfg.LeakSightings, cfg.SyncInterval, cfg.Workers = r.LeakSightings, r.SyncInterval, r.Workers
	cfg.ExcludeFor, cfg.Retention, cfg.MaxRetained = r.ExcludeFor, r.Retention, r.MaxRetained
	cfg.UsageInterval = r.UsageInterval
}

// Log configures the server's slog output.
type Log struct {
	// Format is text (default) or json.
	Format string `yaml:"format"`
	// Level is debug, info (default), warn or error.
	Level string `yaml:"level"`
}

// Provider is one configured back-end: a driver and its options.
type Provider struct {
	Name   string `yaml:"name"`
	Driver string `yaml:"driver"`
	// Options are the driver's options, decoded by its driver.Definition.
	Options   map[string]any `yaml:"options"`
	RateLimit RateLimit      `yaml:"rate_limit"`
	Breaker   Breaker        `yaml:"breaker"`
	// Timeout bounds each call to the back-end; 0 means the provider default.
	Timeout time.Duration `yaml:"timeout"`
	// Overcommit is how the provider's nodes admit instances: by
	// reservations (the default) or by measured usage
	// (scheduler.Overcommit).
	Overcommit scheduler.Overcommit `yaml:"overcommit"`

	// Decoded holds Options after driver.Definition.Decode (set by Load).
	Decoded any `yaml:"-"`
}

// RateLimit limits calls to a back-end (token buckets, one for reads and
// one for changes). Zero rates are unlimited.
type RateLimit struct {
	// Reads is how many reads per second reach the back-end.
	Reads float64 `yaml:"reads"`
	// ReadBurst is how many reads may go at once above Reads.
	ReadBurst int `yaml:"read_burst"`
	// Writes is how many changes per second reach the back-end.
	Writes float64 `yaml:"writes"`
	// WriteBurst is how many changes may go at once above Writes.
	WriteBurst int `yaml:"write_burst"`
}

// Breaker configures a provider's circuit breaker.
type Breaker struct {
	// Failures is how many consecutive failures open the breaker; 0 means
	// the provider default.
	Failures int `yaml:"failures"`
	// OpenFor is how long the breaker stays open before trying again; 0
	// means the provider default. Negative values are rejected.
	OpenFor time.Duration `yaml:"open_for"`
}

// Default returns the configuration used when no file is given.
func Default() *Config {
	return &Config{
		Listen:          DefaultListen,
		Cluster:         "berth",
		Log:             Log{Format: "text", Level: "info"},
		ShutdownTimeout: 30 * time.Second,
		MaxBodySize:     driver.MiB,
		MaxCount:        10_000,
		Timeouts:        Timeouts{ReadHeader: DefaultReadHeaderTimeout, Read: DefaultReadTimeout, Write: DefaultWriteTimeout, Idle: DefaultIdleTimeout},
	}
}

// Load reads the file at path (empty: no file) over Default, applies the
// driver option overrides (driver name → option → flag text), decodes every
// provider's options with its driver.Definition and validates the result.
func Load(path string, overrides map[string]map[string]string) (*Config, error) {
	cfg := Default()
	if path != "" {
		var err error
		if cfg, err = ReadFile(path); err != nil {
			return nil, err
		}
	}
	if err := cfg.Finish(path, overrides); err != nil {
		return nil, err
	}
	return cfg, nil
}

// ReadFile decodes the file at path over Default, refusing files larger
// than MaxFileSize, without applying overrides or validating (see Finish).
func ReadFile(path string) (*Config, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	defer f.Close()
	cfg := Default()
	if err := cfg.read(path, f); err != nil {
		return nil, err
	}
	return cfg, nil
}

// Parse decodes data (named name in errors) over Default without applying
// overrides or validating; Load is the usual entry point.
func Parse(name string, data []byte) (*Config, error) {
	cfg := Default()
	if err := cfg.read(name, strings.NewReader(string(data))); err != nil {
		return nil, err
	}
	return cfg, nil
}

func (c *Config) read(name string, r io.Reader) error {
	data, err := io.ReadAll(io.LimitReader(r, MaxFileSize+1))
	if err != nil {
		return fmt.Errorf("config %s: %w", name, err)
	}
	if len(data) > MaxFileSize {
		return fmt.Errorf("config %s: %w", name, &driver.FieldError{Reason: fmt.Sprintf("file larger than %d bytes", MaxFileSize)})
	}
	var root yaml.Node
	if err := yaml.Unmarshal(data, &root); err != nil {
		return fmt.Errorf("config %s: %w", name, &driver.FieldError{Reason: strings.TrimPrefix(err.Error(), "yaml: ")})
	}
	if err := (decoder{}).decode(&root, reflectValue(c), ""); err != nil {
		var pe *pathError
		if errors.As(err, &pe) {
			reason := pe.reason
			if pe.line > 0 {
				reason = fmt.Sprintf("line %d: %s", pe.line, reason)
			}
			return fmt.Errorf("config %s: %w", name, &driver.FieldError{Path: pe.path, Reason: reason})
		}
		return fmt.Errorf("config %s: %w", name, err)
	}
	return nil
}

// Finish applies overrides, decodes provider options and validates. name is
// the file name used in errors ("" for flags only).
func (c *Config) Finish(name string, overrides map[string]map[string]string) error {
	if name == "" {
		name = "(flags)"
	}
	used := map[string]bool{}
	for _, p := range c.Providers {
		used[p.Driver] = true
	}
	for _, d := range slices.Sorted(maps.Keys(overrides)) {
		if !used[d] {
			var flags []string
			for opt := range overrides[d] {
				flags = append(flags, "--"+driver.FlagName(d, driver.Option{Name: opt}))
			}
			slices.Sort(flags)
			return fmt.Errorf("config %s: %w", name, &driver.FieldError{Path: flags[0], Reason: fmt.Sprintf("%s: no provider uses the %s driver (configured: %s)", strings.Join(flags, ", "), d, strings.Join(c.ProviderNames(), ", "))})
		}
	}
	for i := range c.Providers {
		p := &c.Providers[i]
		if p.Driver == "" {
			continue
		}
		for opt, val := range overrides[p.Driver] {
			if p.Options == nil {
				p.Options = map[string]any{}
			}
			p.Options[opt] = val
		}
	}
	var es driver.FieldErrors
	c.validate(&es)
	if err := es.Err(); err != nil {
		return fmt.Errorf("config %s: %w", name, err)
	}
	return nil
}

func (c *Config) validate(es *driver.FieldErrors) {
	switch c.Log.Format {
	case "", "text", "json":
	default:
		es.Add("log.format", "%q: want text or json", c.Log.Format)
	}
	switch c.Log.Level {
	case "", "debug", "info", "warn", "error":
	default:
		es.Add("log.level", "%q: want debug, info, warn or error", c.Log.Level)
	}
	if c.Listen == "" {
		es.Add("listen", "required (host:port)")
	} else if !strings.Contains(c.Listen, ":") {
		es.Add("listen", "%q: want host:port", c.Listen)
	}
	if c.MemoryLimit < 0 {
		es.Add("memory_limit", "must not be negative")
	}
	if c.TLS.Enabled() && (c.TLS.Cert == "" || c.TLS.Key == "") {
		es.Add("tls", "cert and key go together: name both")
	}
	if c.TLS.ClientCA != "" && !c.TLS.Enabled() {
		es.Add("tls.client_ca", "needs tls.cert and tls.key")
	}
	for i, o := range c.AllowedOrigins {
		if !strings.HasPrefix(o, "http://") && !strings.HasPrefix(o, "https://") || strings.Count(o, "/") != 2 {
			es.Add(fmt.Sprintf("allowed_origins[%d]", i), "%q: want an origin such as https://berth.example.com (scheme, host and port, no path)", o)
		}
	}
	checkRange(es, "token_rate", c.TokenRate, 0, 1e6)
	checkRange(es, "token_burst", c.TokenBurst, 0, 1_000_000)
	checkRange(es, "max_streams", c.MaxStreams, 0, 10_000)
	for _, v := range []struct {
		name string
		d    time.Duration
	}{{"read_header", c.Timeouts.ReadHeader}, {"read", c.Timeouts.Read}, {"write", c.Timeouts.Write}, {"idle", c.Timeouts.Idle}} {
		checkRange(es, "timeouts."+v.name, v.d, 100*time.Millisecond, time.Hour)
	}
	if c.GCPercent < 0 || c.GCPercent > 10000 {
		es.Add("gc_percent", "%d: want 1 to 10000, or 0 for the default", c.GCPercent)
	}
	checkRange(es, "max_body_size", c.MaxBodySize, 0, 64<<20)
	checkRange(es, "max_count", c.MaxCount, 0, 1_000_000)
	if err := c.QueuePolicy.Check("queue_policy"); err != nil {
		var fe *driver.FieldError
		if errors.As(err, &fe) {
			es.Add(fe.Path, "%s", fe.Reason)
		}
	}
	checkRange(es, "schedulers", c.Schedulers, 0, control.MaxSchedulers)
	checkRange(es, "shutdown_timeout", c.ShutdownTimeout, 0, time.Hour)
	c.Rebalance.validate(es)
	r := c.Reconcile
	// Zero takes control's default; anything else must be in range: a
	// knob that costs memory or CPU per unit is bounded.
	checkRange(es, "reconcile.launch_timeout", r.LaunchTimeout, 0, 24*time.Hour, time.Second)
	checkRange(es, "reconcile.max_attempts", r.MaxAttempts, 0, 100)
	checkRange(es, "reconcile.retry_backoff", r.RetryBackoff, 0, time.Hour, time.Millisecond)
	checkRange(es, "reconcile.leak_sightings", r.LeakSightings, 0, 100)
	checkRange(es, "reconcile.sync_interval", r.SyncInterval, 0, time.Hour, 100*time.Millisecond)
	checkRange(es, "reconcile.workers", r.Workers, 0, 256)
	checkRange(es, "reconcile.exclude_for", r.ExcludeFor, 0, 24*time.Hour, time.Second)
	checkRange(es, "reconcile.retention", r.Retention, 0, 30*24*time.Hour, time.Second)
	checkRange(es, "reconcile.max_retained", r.MaxRetained, 0, 1_000_000)
	checkRange(es, "reconcile.usage_interval", r.UsageInterval, 0, time.Hour, time.Second)
	providers := map[string]bool{}
	for i := range c.Providers {
		p := &c.Providers[i]
		f := fmt.Sprintf("providers[%d]", i)
		if p.Name == "" {
			es.Add(f+".name", "required")
		} else if err := auth.ValidName(p.Name); err != nil {
			es.Add(f+".name", "%v", err)
		} else if providers[p.Name] {
			es.Add(f+".name", "%q is configured twice", p.Name)
		}
		providers[p.Name] = true
		if p.Driver == "" {
			es.Add(f+".driver", "required; registered drivers: %s", strings.Join(driver.Drivers(), ", "))
		} else if def, err := driver.Lookup(p.Driver); err != nil {
			es.Add(f+".driver", "%v", err)
		} else if opts, err := def.Decode(p.Options); err != nil {
			es.AddErr(f+".options", err)
		} else {
			p.Decoded = opts
		}
		for _, v := range []struct {
			name string
			val  float64
		}{{"reads", p.RateLimit.Reads}, {"read_burst", float64(p.RateLimit.ReadBurst)}, {"writes", p.RateLimit.Writes}, {"write_burst", float64(p.RateLimit.WriteBurst)}} {
			if v.val < 0 {
				es.Add(f+".rate_limit."+v.name, "must not be negative")
			}
		}
		*es = append(*es, p.Overcommit.Check(f+".overcommit")...)
		if p.Breaker.Failures < 0 {
			es.Add(f+".breaker.failures", "must not be negative")
		}
		for _, d := range []struct {
			name string
			val  time.Duration
		}{{"breaker.open_for", p.Breaker.OpenFor}, {"timeout", p.Timeout}} {
			if d.val < 0 {
				es.Add(f+"."+d.name, "%s: must not be negative", d.val)
			}
		}
	}
	*es = append(*es, control.CheckPools(c.Pools, c.Quotas, func(name string) bool { return providers[name] })...)
	*es = append(*es, control.CheckRunAs(c.RunAs)...)
}

// checkRange adds an error naming key when v is outside [lo, hi]; a
// duration's optional least positive value follows (0 keeps the default).
func checkRange[T int | float64 | time.Duration | driver.Bytes](es *driver.FieldErrors, key string, v, lo, hi T, least ...T) {
	switch {
	case v < lo || v > hi:
		es.Add(key, "%v: want %v to %v", v, lo, hi)
	case len(least) > 0 && v != 0 && v < least[0]:
		es.Add(key, "%v: want 0 (the default) or %v to %v", v, least[0], hi)
	}
}

// Overcommit returns the overcommit policy of every provider that sets
// one, by name (control.Config.Overcommit).
func (c *Config) Overcommit() map[string]scheduler.Overcommit {
	out := map[string]scheduler.Overcommit{}
	for _, p := range c.Providers {
		if p.Overcommit != (scheduler.Overcommit{}) {
			out[p.Name] = p.Overcommit
		}
	}
	return out
}

// ProviderNames returns the configured provider names, sorted.
func (c *Config) ProviderNames() []string {
	names := make([]string, 0, len(c.Providers))
	for _, p := range c.Providers {
		names = append(names, p.Name)
	}
	slices.Sort(names)
	return names
}

// DriverFlag is one generated --<driver>-<option> flag.
type DriverFlag struct {
	Driver string
	Option driver.Option
	// Name is the flag name, driver.FlagName(Driver, Option).
	Name string
}

// DriverFlags lists a flag for every option of every registered driver,
// sorted by flag name.
func DriverFlags() []DriverFlag {
	var out []DriverFlag
	for _, name := range driver.Drivers() {
		def, err := driver.Lookup(name)
		if err != nil {
			continue
		}
		for _, o := range def.Options() {
			out = append(out, DriverFlag{Driver: name, Option: o, Name: driver.FlagName(name, o)})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

func sortStrings(s []string) { slices.Sort(s) }

// SetRuntime applies MemoryLimit and GCPercent to the Go runtime of this
// process: the limit when it is set, the GC target from GCPercent, else
// from GOGC when that is set, else DefaultGCPercent.
func (c *Config) SetRuntime() {
	if c.MemoryLimit > 0 {
		debug.SetMemoryLimit(int64(c.MemoryLimit))
	}
	switch {
	case c.GCPercent > 0:
		debug.SetGCPercent(c.GCPercent)
	case os.Getenv("GOGC") == "":
		debug.SetGCPercent(DefaultGCPercent)
	}
}
