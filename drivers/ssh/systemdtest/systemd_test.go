package systemdtest_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/driver/drivertest"
	_ "github.com/berth-dev/berth/drivers/ssh"
	"github.com/berth-dev/berth/internal/testdeps"
)

// testTimeout bounds every wait in these tests; it is a liveness bound,
// not a performance assertion.
const testTimeout = time.Minute

// root is where the driver keeps the supervisor and the instances on the
// host.
const root = "/var/lib/berth-ssh"

var (
	host       *systemdHost
	setupErr   error  // why there is no host
	supervisor string // the supervisor binary the driver copies
	remoteBin  string // its path on the host
)

// TestMain builds the supervisor (static: the host is another file
// system) and boots one systemd host that every test shares, each keeping
// to clusters of its own.
func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "berth-systemd-test-")
	if err != nil {
		panic(err)
	}
	code := func() int {
		defer os.RemoveAll(dir)
		supervisor = filepath.Join(dir, "supervise")
		build := exec.Command("go", "build", "-o", supervisor, "../testdata/supervise")
		build.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := build.CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "build the supervisor: %v: %s\n", err, out)
			return 1
		}
		b, err := os.ReadFile(supervisor)
		if err != nil {
			panic(err)
		}
		sum := sha256.Sum256(b)
		remoteBin = path.Join(root, "bin", "berth-"+hex.EncodeToString(sum[:])[:16])
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
		defer cancel()
		if setupErr = ensureImage(ctx); setupErr == nil {
			host, setupErr = startHost(ctx, dir)
		}
		if host != nil {
			defer host.remove()
		}
		return m.Run()
	}()
	os.Exit(code)
}

// need stops t when there is no host: a missing dependency as testdeps
// says, any other cause as a failure.
func need(t *testing.T) {
	t.Helper()
	if errors.Is(setupErr, errMissing) {
		testdeps.Need(t, setupErr)
	}
	if setupErr != nil {
		t.Fatalf("the systemd host: %v", setupErr)
	}
}

// serviceScript writes the two hello lines, then runs until SIGTERM, on
// which it exits 0.
const serviceScript = `trap 'exit 0' TERM; echo hello stdout; echo hello stderr >&2; sleep 1000 & wait $!`

func shSpec(script string) *driver.Spec {
	return &driver.Spec{Kind: driver.KindProcess, Entrypoint: []string{"/bin/sh", "-c", script}}
}

// open opens the driver on the host for cluster, with extra options.
func open(t *testing.T, cluster string, extra map[string]any) driver.Driver {
	t.Helper()
	def, err := driver.Lookup("ssh")
	if err != nil {
		t.Fatal(err)
	}
	o := map[string]any{
		"hosts":    []any{map[string]any{"name": "sd", "address": host.Addr, "host_key": host.HostKey}},
		"key_file": host.Key, "root": root, "supervisor_binary": supervisor,
		"probe_interval": "200ms", "dial_timeout": "20s", "stop_grace": "5s", "call_timeout": "30s",
	}
	for k, v := range extra {
		o[k] = v
	}
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	d, err := def.Open(ctx, o, driver.Env{Cluster: cluster})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	return d
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	t.Cleanup(cancel)
	return ctx
}

func cluster(what string) string {
	return fmt.Sprintf("%s%d", what, time.Now().UnixNano())
}

// TestConformance runs the driver suite with every instance in a
// transient unit.
func TestConformance(t *testing.T) {
	need(t)
	c := cluster("conf")
	drivertest.Run(t, drivertest.Harness{
		Open: func(t *testing.T) driver.Driver { return open(t, c, nil) },
		Spec: func() *driver.Spec { return shSpec(serviceScript) },
		Echo: func() *driver.Spec { return shSpec("echo ready; exec cat") },
		// The supervisor the driver copied is the probe too.
		Exec:       func(steps ...string) []string { return append([]string{remoteBin, "probe"}, steps...) },
		Parallel:   8,
		Timeout:    testTimeout,
		Concurrent: 3,
	})
}

// create makes an instance and drives it to its end.
func create(t *testing.T, d driver.Driver, sp *driver.Spec) *driver.Instance {
	t.Helper()
	ctx := ctxT(t)
	op, err := d.Create(ctx, "sd", sp)
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	in, err := driver.Drive(ctx, op)
	if err != nil {
		t.Fatalf("Create: operation: %v", err)
	}
	return in
}

// unitName is the unit of instance id of cluster, as systemd-escape
// writes it (the ids' "-" and a leading "." escaped).
func unitName(cluster, id string) string {
	esc := func(s string) string { return strings.ReplaceAll(s, "-", `\x2d`) }
	return "berth-" + esc(cluster) + "-" + esc(id) + ".service"
}

// unitProps returns the unit's properties named.
func unitProps(t *testing.T, unit string, names ...string) map[string]string {
	t.Helper()
	out, err := host.exec(ctxT(t), "systemctl", "show", "--property="+strings.Join(names, ","), unit)
	if err != nil {
		t.Fatal(err)
	}
	props := map[string]string{}
	for l := range strings.SplitSeq(out, "\n") {
		if k, v, ok := strings.Cut(l, "="); ok {
			props[k] = v
		}
	}
	return props
}

func wantProps(t *testing.T, what, unit string, want map[string]string) {
	t.Helper()
	var names []string
	for k := range want {
		names = append(names, k)
	}
	got := unitProps(t, unit, names...)
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s: unit %s: %s=%q, want %q", what, unit, k, got[k], v)
		}
	}
}
