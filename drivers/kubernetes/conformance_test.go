package kubernetes_test

import (
	"context"
	"testing"

	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/driver/drivertest"
)

// open opens the registered driver on the test cluster with options over
// the defaults the tests use: logs off, since KWOK's nodes run no
// containers and serve no logs.
func open(t *testing.T, opts map[string]any) driver.Driver {
	t.Helper()
	def, err := driver.Lookup("kubernetes")
	if err != nil {
		t.Fatal(err)
	}
	raw := map[string]any{"kubeconfig": cluster.Kubeconfig, "logs": false, "stop_grace": "1s", "force_after": "1s", "node_selector": "pool=main"}
	for k, v := range opts {
		raw[k] = v
	}
	d, err := def.Open(context.Background(), raw, driver.Env{Provider: "k8s"})
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// TestConformance runs the conformance suite on the real API server. The
// harness names no missing image: KWOK starts any image (it runs none), so
// a missing one cannot be told apart there.
func TestConformance(t *testing.T) {
	drivertest.Run(t, drivertest.Harness{
		Open: func(t *testing.T) driver.Driver { return open(t, nil) },
		Spec: func() *driver.Spec {
			return &driver.Spec{
				Image:     "registry.example/hello:1",
				Resources: driver.Resources{CPU: 100, Memory: 64 * driver.MiB},
			}
		},
	})
}
