package config

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/scheduler"
)

// testOptions is the options struct of the "cfgtest" driver registered below,
// which exists only so that option decoding can be tested without depending
// on a real back-end's option set.
type testOptions struct {
	Nodes   int               `option:"nodes" help:"number of nodes"`
	Address string            `option:"address"`
	Wait    time.Duration     `option:"wait"`
	Labels  map[string]string `option:"labels"`
	Memory  driver.Bytes      `option:"memory"`
}

func (o *testOptions) Validate() error {
	if o.Nodes < 0 {
		return &driver.FieldError{Path: "nodes", Reason: "must not be negative"}
	}
	return nil
}

func init() {
	driver.Register(driver.Define("cfgtest", "options decoding fixture",
		func() *testOptions { return &testOptions{Nodes: 1} },
		func(context.Context, *testOptions, driver.Env) (driver.Driver, error) {
			return nil, driver.Errorf(driver.ErrUnsupported, "cfgtest cannot be opened")
		}))
}

func writeFile(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "berth.yaml")
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

const good = `
listen: 127.0.0.1:9000
data_dir: /var/lib/berth
log: {format: json, level: debug}
shutdown_timeout: 10s
memory_limit: 3Gi
gc_percent: 150
providers:
  - name: a
    driver: cfgtest
    options: {nodes: 3, wait: 2s, labels: {zone: z1}, memory: 2Gi}
    rate_limit: {reads: 10, read_burst: 20, writes: 5}
    breaker: {failures: 5, open_for: 30s}
    overcommit: {policy: usage, ratio: 2, headroom: 0.1}
  - name: b
    driver: cfgtest
pools:
  - name: small
    provider: a
    max_instances: 10
    labels:
      - name: tiny
        min_ready: 2
        spec: {kind: process, command: [sleep, "60"], cpus: 0.5, memory: 64}
quotas:
  - {provider: a, instances: 100, cpus: 8, memory: 16Gi}
  - {namespace: alice, instances: 5}
run_as:
  - {namespace: ops, users: [root, deploy], groups: ["0"]}
`

func TestLoadGood(t *testing.T) {
	cfg, err := Load(writeFile(t, good), nil)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Listen != "127.0.0.1:9000" || cfg.Log.Format != "json" || cfg.ShutdownTimeout != 10*time.Second || cfg.MemoryLimit != 3*driver.GiB || cfg.GCPercent != 150 {
		t.Errorf("top level: %+v", cfg)
	}
	o, ok := cfg.Providers[0].Decoded.(*testOptions)
	if !ok {
		t.Fatalf("decoded options: %T", cfg.Providers[0].Decoded)
	}
	if o.Nodes != 3 || o.Wait != 2*time.Second || o.Labels["zone"] != "z1" || o.Memory != 2*driver.GiB {
		t.Errorf("options: %+v", o)
	}
	if cfg.Providers[0].Breaker.OpenFor != 30*time.Second || cfg.Providers[0].RateLimit.ReadBurst != 20 {
		t.Errorf("provider: %+v", cfg.Providers[0])
	}
	if oc := cfg.Overcommit(); len(oc) != 1 || oc["a"] != (scheduler.Overcommit{Policy: "usage", Ratio: 2, Headroom: 0.1}) {
		t.Errorf("overcommit: %+v", oc)
	}
	if d := cfg.Providers[1].Decoded.(*testOptions); d.Nodes != 1 {
		t.Errorf("defaults lost: %+v", d)
	}
	spec := cfg.Pools[0].Labels[0].Spec
	if spec.CPU != 500 || spec.Memory != 64*driver.MiB || spec.Kind != driver.KindProcess || len(spec.Command) != 2 {
		t.Errorf("spec: %+v", spec)
	}
	if q := cfg.Quotas[0]; q.CPU != 8000 || q.Memory != 16*driver.GiB {
		t.Errorf("quota: %+v", q)
	}
	if len(cfg.RunAs) != 1 || cfg.RunAs[0].Namespace != "ops" || len(cfg.RunAs[0].Users) != 2 || cfg.RunAs[0].Groups[0] != "0" {
		t.Errorf("run_as: %+v", cfg.RunAs)
	}
}

func TestOverridesBeatTheFile(t *testing.T) {
	cfg, err := Load(writeFile(t, good), map[string]map[string]string{"cfgtest": {"nodes": "7", "wait": "1m"}})
	if err != nil {
		t.Fatal(err)
	}
	for i, p := range cfg.Providers {
		o := p.Decoded.(*testOptions)
		if o.Nodes != 7 || o.Wait != time.Minute {
			t.Errorf("providers[%d]: %+v", i, o)
		}
	}
	_, err = Load(writeFile(t, good), map[string]map[string]string{"cfgtest": {"nodes": "many"}})
	wantField(t, err, "providers[0].options.nodes")
}

func wantField(t *testing.T, err error, path string) {
	t.Helper()
	if !errors.Is(err, driver.ErrInvalid) {
		t.Fatalf("error %v: want ErrInvalid", err)
	}
	var fe *driver.FieldError
	if !errors.As(err, &fe) {
		t.Fatalf("error %v: no FieldError", err)
	}
	if fe.Path != path {
		t.Fatalf("error %v: path %q, want %q", err, fe.Path, path)
	}
	if !strings.Contains(err.Error(), "berth.yaml") && !strings.Contains(err.Error(), "(flags)") {
		t.Errorf("error %v does not name the file", err)
	}
}

func TestBadFiles(t *testing.T) {
	cases := []struct {
		name, body, path string
	}{
		{"unknown top key", "listne: x:1\n", "listne"},
		{"unknown provider key", "providers:\n  - {name: a, driver: cfgtest, optons: {}}\n", "providers[0].optons"},
		{"unknown option", "providers:\n  - {name: a, driver: cfgtest, options: {node: 3}}\n", "providers[0].options.node"},
		{"option wrong type", "providers:\n  - {name: a, driver: cfgtest, options: {nodes: [1]}}\n", "providers[0].options.nodes"},
		{"option fails validation", "providers:\n  - {name: a, driver: cfgtest, options: {nodes: -1}}\n", "providers[0].options.nodes"},
		{"unknown driver", "providers:\n  - {name: a, driver: nosuch}\n", "providers[0].driver"},
		{"missing name", "providers:\n  - {driver: cfgtest}\n", "providers[0].name"},
		{"duplicate provider", "providers:\n  - {name: a, driver: cfgtest}\n  - {name: a, driver: cfgtest}\n", "providers[1].name"},
		{"wrong type int", "providers:\n  - {name: a, driver: cfgtest, breaker: {failures: lots}}\n", "providers[0].breaker.failures"},
		{"negative open_for", "providers:\n  - {name: a, driver: cfgtest, breaker: {open_for: -1s}}\n", "providers[0].breaker.open_for"},
		{"negative timeout", "providers:\n  - {name: a, driver: cfgtest, timeout: -5s}\n", "providers[0].timeout"},
		{"launch_timeout is not a provider key", "providers:\n  - {name: a, driver: cfgtest, launch_timeout: 5s}\n", "providers[0].launch_timeout"},
		{"negative reconcile.launch_timeout", "reconcile: {launch_timeout: -5s}\n", "reconcile.launch_timeout"},
		{"negative reconcile.workers", "reconcile: {workers: -1}\n", "reconcile.workers"},
		{"unknown reconcile key", "reconcile: {worker: 2}\n", "reconcile.worker"},
		{"wrong type duration", "shutdown_timeout: 10\n", "shutdown_timeout"},
		{"list instead of map", "log: [json]\n", "log"},
		{"bad log format", "log: {format: xml}\n", "log.format"},
		{"pool unknown provider", "pools:\n  - {name: p, provider: zz}\n", "pools[0].provider"},
		{"negative spec resource", "providers:\n  - {name: a, driver: cfgtest}\npools:\n  - name: p\n    provider: a\n    labels:\n      - {name: l, spec: {image: x, cpus: -1}}\n", "pools[0].labels[0].spec.cpus"},
		{"unknown spec key", "pools:\n  - name: p\n    labels:\n      - {name: l, spec: {imag: x}}\n", "pools[0].labels[0].spec.imag"},
		{"quota without scope", "quotas:\n  - {instances: 3}\n", "quotas[0]"},
		{"quota unknown key", "quotas:\n  - {scope: owner}\n", "quotas[0].scope"},
		{"quota unknown pool", "quotas:\n  - {pool: nope}\n", "quotas[0].pool"},
		{"negative quota", "quotas:\n  - {namespace: x, memory: -1Gi}\n", "quotas[0].memory"},
		{"bad cpus", "quotas:\n  - {namespace: x, cpus: many}\n", "quotas[0].cpus"},
		{"bool for string", "listen: {a: b}\n", "listen"},
		{"negative memory_limit", "memory_limit: -1Gi\n", "memory_limit"},
		{"bad memory_limit", "memory_limit: lots\n", "memory_limit"},
		{"negative gc_percent", "gc_percent: -1\n", "gc_percent"},
		{"huge gc_percent", "gc_percent: 20000\n", "gc_percent"},
		{"bad queue_policy", "queue_policy: lifo\n", "queue_policy"},
		{"run_as bad namespace", "run_as:\n  - {namespace: Ops}\n", "run_as[0].namespace"},
		{"run_as twice", "run_as:\n  - {namespace: ops}\n  - {namespace: ops}\n", "run_as[1].namespace"},
		{"run_as user:group", "run_as:\n  - {namespace: ops, users: [\"app:app\"]}\n", "run_as[0].users[0]"},
		{"run_as unknown key", "run_as:\n  - {namespace: ops, user: app}\n", "run_as[0].user"},
		{"bad pool queue_policy", "providers:\n  - {name: a, driver: cfgtest}\npools:\n  - {name: p, provider: a, queue_policy: lifo}\n", "pools[0].queue_policy"},
		{"negative schedulers", "schedulers: -1\n", "schedulers"},
		{"too many schedulers", "schedulers: 65\n", "schedulers"},
		{"schedulers not a number", "schedulers: many\n", "schedulers"},
		{"unknown overcommit policy", "providers:\n  - {name: a, driver: cfgtest, overcommit: {policy: greedy}}\n", "providers[0].overcommit.policy"},
		{"unknown overcommit key", "providers:\n  - {name: a, driver: cfgtest, overcommit: {policy: usage, rate: 2}}\n", "providers[0].overcommit.rate"},
		{"overcommit ratio below one", "providers:\n  - {name: a, driver: cfgtest, overcommit: {policy: usage, ratio: 0.5}}\n", "providers[0].overcommit.ratio"},
		{"overcommit ratio too high", "providers:\n  - {name: a, driver: cfgtest, overcommit: {policy: usage, ratio: 11}}\n", "providers[0].overcommit.ratio"},
		{"overcommit ratio not a number", "providers:\n  - {name: a, driver: cfgtest, overcommit: {policy: usage, ratio: lots}}\n", "providers[0].overcommit.ratio"},
		{"overcommit headroom of one", "providers:\n  - {name: a, driver: cfgtest, overcommit: {policy: usage, headroom: 1}}\n", "providers[0].overcommit.headroom"},
		{"negative overcommit headroom", "providers:\n  - {name: a, driver: cfgtest, overcommit: {policy: usage, headroom: -0.1}}\n", "providers[0].overcommit.headroom"},
		{"ratio without the usage policy", "providers:\n  - {name: a, driver: cfgtest, overcommit: {ratio: 2}}\n", "providers[0].overcommit.ratio"},
		{"headroom without the usage policy", "providers:\n  - {name: a, driver: cfgtest, overcommit: {policy: reservations, headroom: 0.1}}\n", "providers[0].overcommit.headroom"},
		{"negative reconcile.usage_interval", "reconcile: {usage_interval: -1s}\n", "reconcile.usage_interval"},
		{"tiny reconcile.usage_interval", "reconcile: {usage_interval: 10ms}\n", "reconcile.usage_interval"},
		{"huge reconcile.usage_interval", "reconcile: {usage_interval: 2h}\n", "reconcile.usage_interval"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Load(writeFile(t, c.body), nil)
			wantField(t, err, c.path)
		})
	}
}

func TestUnknownKeyNamesLine(t *testing.T) {
	_, err := Load(writeFile(t, "listen: 127.0.0.1:1\n\nproviders:\n  - name: a\n    drivr: cfgtest\n"), nil)
	wantField(t, err, "providers[0].drivr")
	if !strings.Contains(err.Error(), "line 5") || !strings.Contains(err.Error(), "known keys") {
		t.Errorf("error %q: want the line and the known keys", err)
	}
}

func TestOversizedFile(t *testing.T) {
	body := "# " + strings.Repeat("x", MaxFileSize) + "\n"
	_, err := Load(writeFile(t, body), nil)
	if !errors.Is(err, driver.ErrInvalid) || !strings.Contains(err.Error(), "larger than") || !strings.Contains(err.Error(), "berth.yaml") {
		t.Fatalf("got %v", err)
	}
}

func TestMalformedYAML(t *testing.T) {
	_, err := Load(writeFile(t, "providers: [\n"), nil)
	if !errors.Is(err, driver.ErrInvalid) || !strings.Contains(err.Error(), "berth.yaml") {
		t.Fatalf("got %v", err)
	}
}

func TestMissingFile(t *testing.T) {
	_, err := Load(filepath.Join(t.TempDir(), "nope.yaml"), nil)
	if !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("got %v", err)
	}
}

func TestDriverFlags(t *testing.T) {
	var names []string
	for _, f := range DriverFlags() {
		if f.Driver == "cfgtest" {
			names = append(names, f.Name)
		}
	}
	want := "cfgtest-address cfgtest-labels cfgtest-memory cfgtest-nodes cfgtest-wait"
	if got := strings.Join(names, " "); got != want {
		t.Errorf("flags %q, want %q", got, want)
	}
}
