package kubernetes_test

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/berth-dev/berth/drivers/kubernetes/k8stest"
	"github.com/berth-dev/berth/internal/testdeps"
)

// cluster is the control plane every test of the package shares: a real
// kube-apiserver on an etcd member, with KWOK playing the kubelet of
// nodeCount fake nodes.
// clusterMissing says why there is none (the servers are not built).
var (
	cluster        *k8stest.Cluster
	nodes          []string
	clusterMissing error
)

const nodeCount = 3

func TestMain(m *testing.M) {
	k8stest.ServeEtcdIfAsked()
	os.Exit(runMain(m))
}

func runMain(m *testing.M) int {
	if _, err := k8stest.BinDir(); err != nil {
		if testdeps.Required() {
			fmt.Fprintln(os.Stderr, "kubernetes tests:", err)
			return 1
		}
		// Every test that needs the cluster skips, naming the script.
		clusterMissing = err
		return m.Run()
	}
	dir, err := os.MkdirTemp("", "berth-k8stest-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cluster, err = k8stest.Start(ctx, dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, "kubernetes tests: start the control plane:", err)
		return 1
	}
	defer cluster.Stop()
	nodes, err = cluster.AddNodes(ctx, "kwok", nodeCount, k8stest.NodeShape{CPU: "8", Memory: "32Gi", GPUs: 2, Labels: map[string]string{"pool": "main"}})
	if err != nil {
		fmt.Fprintln(os.Stderr, "kubernetes tests: add nodes:", err)
		return 1
	}
	return m.Run()
}

// needCluster skips t, or fails it under testdeps.EnvRequireAll, when the
// kubernetes test servers are not built.
func needCluster(t testing.TB) {
	t.Helper()
	testdeps.Need(t, clusterMissing)
}
