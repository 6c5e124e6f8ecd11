package drivertest_test

import (
	"context"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/driver/drivertest"
	"github.com/berth-dev/berth/drivers/sim"
)

// The suite is tested by running it against drivers that break one rule
// each, in a child process, and checking that the right subtest fails.

const brokenEnv = "DRIVERTEST_BROKEN"

// broken is the sim with one rule broken, chosen by mode.
type broken struct {
	*sim.Sim
	mode string
	stop chan struct{}
}

func (b *broken) Delete(ctx context.Context, id string) (driver.Operation, error) {
	if b.mode == "delete-gone-ok" {
		if _, err := b.Sim.Get(ctx, id); err != nil {
			return driver.Finished(nil, nil), nil
		}
	}
	return b.Sim.Delete(ctx, id)
}

func (b *broken) List(ctx context.Context, tags map[string]string) ([]*driver.Instance, error) {
	if b.mode == "list-ignores-tags" {
		return b.Sim.List(ctx, nil)
	}
	return b.Sim.List(ctx, tags)
}

func (b *broken) Resume(ctx context.Context, id string) error {
	if b.mode == "resume-always-ok" {
		_ = b.Sim.Resume(ctx, id)
		return nil
	}
	return b.Sim.Resume(ctx, id)
}

func (b *broken) Logs(ctx context.Context, id string, opts driver.LogOptions, stdout, stderr io.Writer) error {
	if b.mode == "logs-merged" {
		return b.Sim.Logs(ctx, id, opts, stdout, stdout)
	}
	return b.Sim.Logs(ctx, id, opts, stdout, stderr)
}

func (b *broken) Resize(ctx context.Context, id string, r driver.Resources) error {
	if b.mode == "resize-ignored" {
		return nil
	}
	return b.Sim.Resize(ctx, id, r)
}

func (b *broken) Create(ctx context.Context, node string, spec *driver.Spec) (driver.Operation, error) {
	if b.mode == "no-validation" && spec.Validate() != nil {
		clean := *spec
		clean.CPU, clean.Kind, clean.ConfigFiles = 0, "", nil
		return b.Sim.Create(ctx, node, &clean)
	}
	if b.mode == "changes-spec" {
		if spec.Env == nil {
			spec.Env = map[string]string{}
		}
		spec.Env["ADDED_BY_THE_DRIVER"] = "1"
	}
	return b.Sim.Create(ctx, node, spec)
}

func (b *broken) Watch(ctx context.Context, fn func(driver.Event)) error {
	if b.mode == "watch-silent" {
		<-ctx.Done()
		return ctx.Err()
	}
	return b.Sim.Watch(ctx, fn)
}

func (b *broken) Stop(ctx context.Context, id string, grace time.Duration) error {
	if b.mode == "stop-kills" {
		return b.Sim.Kill(ctx, id, "KILL")
	}
	return b.Sim.Stop(ctx, id, grace)
}

func (b *broken) Close(ctx context.Context) error {
	if b.mode == "leaky-close" {
		go func() { <-b.stop }()
	}
	return b.Sim.Close(ctx)
}

func simHarness(open func(t *testing.T, s *sim.Sim) driver.Driver) drivertest.Harness {
	return drivertest.Harness{
		Open: func(t *testing.T) driver.Driver {
			opts := sim.DefaultOptions()
			opts.Nodes = 2
			opts.StrictImages = true
			opts.Shape.Images = []string{"sim/hello:1"}
			s, err := sim.New(*opts)
			if err != nil {
				t.Fatal(err)
			}
			return open(t, s)
		},
		Spec: func() *driver.Spec {
			return &driver.Spec{
				Image:     "sim/hello:1",
				Resources: driver.Resources{CPU: 100, Memory: 32 * driver.MiB},
				Env:       map[string]string{sim.EnvStdout: "hello stdout", sim.EnvStderr: "hello stderr"},
			}
		},
		MissingImage: func() *driver.Spec { return &driver.Spec{Image: "sim/none:1"} },
		PreloadImage: "sim/preload:1",
		Parallel:     8,
		Timeout:      2 * time.Second,
	}
}

// TestBrokenHelper runs the suite against the broken driver named by the
// environment; it only does something as TestSuiteCatchesBrokenDrivers's
// child.
func TestBrokenHelper(t *testing.T) {
	mode := os.Getenv(brokenEnv)
	if mode == "" {
		t.Skip("runs only as the child of TestSuiteCatchesBrokenDrivers")
	}
	stop := make(chan struct{})
	defer close(stop)
	h := simHarness(func(t *testing.T, s *sim.Sim) driver.Driver {
		return &broken{Sim: s, mode: mode, stop: stop}
	})
	h.Concurrent, _ = strconv.Atoi(os.Getenv(concurrentEnv))
	drivertest.Run(t, h)
}

// concurrentEnv is the child's Harness.Concurrent.
const concurrentEnv = "DRIVERTEST_CONCURRENT"

func TestSuiteCatchesBrokenDrivers(t *testing.T) {
	if os.Getenv(brokenEnv) != "" {
		return
	}
	cases := []struct {
		mode, failing string
	}{
		{"delete-gone-ok", "--- FAIL: TestBrokenHelper/DeleteTwice"},
		{"list-ignores-tags", "--- FAIL: TestBrokenHelper/Lifecycle"},
		{"resume-always-ok", "--- FAIL: TestBrokenHelper/Cap/suspend"},
		{"logs-merged", "--- FAIL: TestBrokenHelper/Cap/logs"},
		{"resize-ignored", "--- FAIL: TestBrokenHelper/Cap/resize"},
		{"no-validation", "--- FAIL: TestBrokenHelper/InvalidSpec"},
		{"watch-silent", "--- FAIL: TestBrokenHelper/Cap/events"},
		{"stop-kills", "--- FAIL: TestBrokenHelper/Cap/stop"},
		{"leaky-close", "found unexpected goroutines"},
		{"changes-spec", "Create changed the spec it was given"},
	}
	// Each case one case at a time, then four at once.
	for _, concurrent := range []string{"1", "4"} {
		for _, c := range cases {
			t.Run(c.mode+"/concurrent-"+concurrent, func(t *testing.T) {
				cmd := exec.Command(os.Args[0], "-test.run=^TestBrokenHelper$", "-test.v", "-test.count=1")
				cmd.Env = append(os.Environ(), brokenEnv+"="+c.mode, concurrentEnv+"="+concurrent)
				out, err := cmd.CombinedOutput()
				if err == nil {
					t.Fatalf("the suite passed a driver with %s:\n%s", c.mode, out)
				}
				if !strings.Contains(string(out), c.failing) {
					t.Errorf("the suite failed, but not in %s:\n%s", c.failing, out)
				}
			})
		}
	}
}

// TestSimPasses runs the suite against the unbroken sim, in this process,
// one case at a time and four at once.
func TestSimPasses(t *testing.T) {
	drivertest.Run(t, simHarness(func(t *testing.T, s *sim.Sim) driver.Driver { return s }))
}

func TestSimPassesConcurrently(t *testing.T) {
	h := simHarness(func(t *testing.T, s *sim.Sim) driver.Driver { return s })
	h.Concurrent = 4
	drivertest.Run(t, h)
}
