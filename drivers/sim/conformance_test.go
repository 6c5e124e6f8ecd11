package sim_test

import (
	"context"
	"testing"
	"time"

	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/driver/drivertest"
	"github.com/berth-dev/berth/drivers/sim"
)

// harness returns a conformance harness for a sim opened through the
// registry with raw options.
func harness(raw map[string]any) drivertest.Harness {
	return drivertest.Harness{
		Open: func(t *testing.T) driver.Driver {
			def, err := driver.Lookup("sim")
			if err != nil {
				t.Fatal(err)
			}
			d, err := def.Open(context.Background(), raw, driver.Env{})
			if err != nil {
				t.Fatal(err)
			}
			return d
		},
		Spec: func() *driver.Spec {
			return &driver.Spec{
				Image:     "sim/hello:1",
				Resources: driver.Resources{CPU: driver.CPUs(0.1), Memory: 64 * driver.MiB},
				Env:       map[string]string{sim.EnvStdout: "hello stdout", sim.EnvStderr: "hello stderr"},
			}
		},
		MissingImage: func() *driver.Spec {
			return &driver.Spec{Image: "sim/missing:1", Resources: driver.Resources{CPU: driver.CPUs(0.1)}}
		},
		PreloadImage: "sim/preload:1",
		Timeout:      20 * time.Second,
	}
}

func TestConformance(t *testing.T) {
	drivertest.Run(t, harness(map[string]any{
		"nodes":         3,
		"strict_images": true,
		"shape":         map[string]any{"cpus": 4, "memory": "8Gi", "images": []any{"sim/hello:1"}},
	}))
}

// TestConformanceLatency runs the suite with create and delete latency on
// the wall clock, so that operations report Wait hints and take several
// Advance calls.
func TestConformanceLatency(t *testing.T) {
	drivertest.Run(t, harness(map[string]any{
		"pools": `[{"count": 2, "name_prefix": "a-", "cpus": 8, "memory": "16Gi", "images": ["sim/hello:1"], "zones": ["z1", "z2"]},
		           {"count": 1, "name_prefix": "b-", "cpus": 2, "memory": "4Gi", "images": ["sim/hello:1"]}]`,
		"strict_images":  "true",
		"create_latency": "30ms",
		"delete_latency": "10ms",
		"latency_jitter": "20ms",
		"seed":           7,
	}))
}
