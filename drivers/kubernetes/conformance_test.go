package kubernetes_test

import (
	"context"
	"testing"

	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/driver/drivertest"
	"github.com/berth-dev/berth/drivers/kubernetes/k8stest"
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

// TestConformance runs the conformance suite on the real API server.
//
// Logs are off here: the suite wants stdout and stderr apart, and
// Kubernetes gives them as one stream (splitting them is the alpha
// feature PodLogsQuerySplitStreams, which KWOK's log server does not
// serve either); TestLogs checks logs on their own. The missing image is
// one that the test's KWOK reports ErrImagePull for (KWOK pulls nothing),
// as a kubelet reports an image that does not exist. The preloaded image
// is present on no node before, since KWOK's nodes report no images.
func TestConformance(t *testing.T) {
	needCluster(t)
	drivertest.Run(t, drivertest.Harness{
		Open: func(t *testing.T) driver.Driver { return open(t, nil) },
		Spec: func() *driver.Spec {
			return &driver.Spec{
				Image:     "registry.example/hello:1",
				Resources: driver.Resources{CPU: 100, Memory: 64 * driver.MiB},
			}
		},
		MissingImage: func() *driver.Spec {
			return &driver.Spec{
				Image:     k8stest.MissingImage,
				Resources: driver.Resources{CPU: 100, Memory: 64 * driver.MiB},
			}
		},
		PreloadImage: "registry.example/preload-conformance:1",
	})
}
