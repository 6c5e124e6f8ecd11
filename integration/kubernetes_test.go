package integration_test

import (
	"context"
	"encoding/json"
	"os"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/berth-dev/berth/control"
	"github.com/berth-dev/berth/driver"
	_ "github.com/berth-dev/berth/drivers/kubernetes" // registers the kubernetes driver
	"github.com/berth-dev/berth/drivers/kubernetes/k8stest"
	"github.com/berth-dev/berth/provider"
	"github.com/berth-dev/berth/reconciler"
	"github.com/berth-dev/berth/scheduler"
)

// TestGroupAcrossKubernetesAndDocker: one plane with a docker provider on
// the machine's engines and a kubernetes provider on a real kube-apiserver
// with two KWOK nodes places a group across both. A member stopped and
// started keeps its back-end id. When the KWOK node of a
// member goes away, Berth records the node offline, the member is placed
// again on the other node, and the cluster ends with exactly one pod per
// member.
func TestGroupAcrossKubernetesAndDocker(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	dir, err := os.MkdirTemp("", "berth-it-k8s-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	cluster, err := k8stest.Start(ctx, dir)
	if cluster != nil {
		defer cluster.Stop()
	}
	if err != nil {
		t.Fatal("start kube-apiserver and KWOK: ", err)
	}
	kwok, err := cluster.AddNodes(ctx, "it", 2, k8stest.NodeShape{CPU: "4", Memory: "8Gi", Labels: map[string]string{"pool": "it"}})
	if err != nil {
		t.Fatal(err)
	}

	var k8s *provider.Provider
	e := setup(t, func(c *control.Config) {
		def, err := driver.Lookup("kubernetes")
		if err != nil {
			t.Fatal(err)
		}
		raw := map[string]any{"kubeconfig": cluster.Kubeconfig, "logs": false, "stop_grace": "1s", "force_after": "1s", "node_selector": "pool=it"}
		d, err := def.Open(ctx, raw, driver.Env{Provider: "k8s", Cluster: c.Cluster, Logger: quiet})
		if err != nil {
			t.Fatal("open the kubernetes driver: ", err)
		}
		if k8s, err = provider.New(d, provider.Config{Name: "k8s", Logger: quiet, StateTTL: 100 * time.Millisecond}); err != nil {
			_ = d.Close(ctx)
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := k8s.Close(context.Background()); err != nil {
				t.Errorf("close the kubernetes provider: %v", err)
			}
		})
		c.Providers = append(c.Providers, k8s)
	})

	web := scheduler.Service{Request: scheduler.Request{Spec: driver.Spec{Name: "web", Image: "registry.example/web:1",
		Resources: driver.Resources{CPU: driver.CPUs(1), Memory: 256 * driver.MiB}}, Count: 2, Provider: "k8s"}}
	db := scheduler.Service{Request: scheduler.Request{Spec: helloSpec(), Provider: provName}}
	db.Name = e.cluster + "-db"
	g := scheduler.Group{ID: "shop", Services: []scheduler.Service{web, db}}
	if _, err := e.plane.SubmitGroup(ctx, g, ""); err != nil {
		t.Fatal(err)
	}
	ins := e.allIn(t, reconciler.Running, 3)
	onK8s := map[string]string{}
	for _, in := range ins {
		want := provName
		if in.Request == "shop.web" {
			want = "k8s"
			onK8s[in.ID] = in.Node
		}
		if in.Provider != want {
			t.Fatalf("%s runs on %s/%s, want provider %s", in.ID, in.Provider, in.Node, want)
		}
	}
	if len(onK8s) != 2 {
		t.Fatalf("web instances on kubernetes: %v", onK8s)
	}
	// A member stopped and started through the plane keeps its back-end
	// id: the pod is made again under the same identity, and the syncs in
	// between see a stopped instance, not a lost one.
	var member string
	for id := range onK8s {
		member = id
	}
	before, err := e.plane.Instance(ctx, member)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.plane.Stop(ctx, member, time.Second); err != nil {
		t.Fatalf("stop %s: %v", member, err)
	}
	e.afterSyncs(t, 2)
	if in, err := e.plane.Instance(ctx, member); err != nil || in.Phase != reconciler.Stopped || in.BackendID != before.BackendID {
		t.Fatalf("%s after stop and two syncs: %s, backend id %q (was %q), %v", member, in.Phase, in.BackendID, before.BackendID, err)
	}
	pods, err := cluster.Client.CoreV1().Pods("").List(ctx, metav1.ListOptions{LabelSelector: driver.TagInstance + "=" + member})
	if err != nil || len(pods.Items) != 0 {
		t.Fatalf("pods of %s while it is stopped: %d, %v; want none", member, len(pods.Items), err)
	}
	if err := e.plane.Start(ctx, member); err != nil {
		t.Fatalf("start %s: %v", member, err)
	}
	e.afterSyncs(t, 2)
	if in, err := e.plane.Instance(ctx, member); err != nil || in.Phase != reconciler.Running || in.BackendID != before.BackendID || in.Node != before.Node {
		t.Fatalf("%s after start: %s on %s, backend id %q (was %q on %s), %v", member, in.Phase, in.Node, in.BackendID, before.BackendID, before.Node, err)
	}

	// The member on the first KWOK node loses it.
	gone := kwok[0]
	var moved string
	for id, node := range onK8s {
		if node == gone {
			moved = id
		}
	}
	if moved == "" {
		// Spread put both on the other node: lose that one instead.
		gone = kwok[1]
		for id := range onK8s {
			moved = id
		}
	}
	if err := cluster.Client.CoreV1().Nodes().Delete(ctx, gone, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.waitFor(t, moved+" placed again off "+gone, func() bool {
		in, err := e.plane.Instance(ctx, moved)
		return err == nil && in.Phase == reconciler.Running && in.Provider == "k8s" && in.Node != "" && in.Node != gone
	})
	// Berth saw the node go offline: its record in the store says so.
	e.waitFor(t, "node "+gone+" recorded offline", func() bool {
		kvs, _, err := e.store.List(ctx, control.PrefixNodes+"k8s/"+gone)
		if err != nil || len(kvs) != 1 {
			return false
		}
		var st control.NodeState
		return json.Unmarshal(kvs[0].Value, &st) == nil && st.Status == driver.NodeOffline
	})
	// Exactly one pod per web member in the end: the copy on the lost node
	// is deleted (forced, since no kubelet will confirm it).
	var last []string
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("the pods last seen: %v", last)
		}
	})
	e.waitFor(t, "one pod per member", func() bool {
		pods, err := cluster.Client.CoreV1().Pods("").List(ctx, metav1.ListOptions{LabelSelector: driver.TagManaged + "=true," + driver.TagClusterName + "=" + e.cluster})
		if err != nil {
			return false
		}
		per := map[string]int{}
		last = last[:0]
		for _, p := range pods.Items {
			last = append(last, p.Name+" "+p.Spec.NodeName+" "+string(p.Status.Phase)+" "+p.Labels[driver.TagInstance]+" deleting="+
				boolString(p.DeletionTimestamp != nil))
			if p.DeletionTimestamp == nil && p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed {
				per[p.Labels[driver.TagInstance]]++
			}
		}
		live := 0
		for _, n := range per {
			if n > 1 {
				return false
			}
			live += n
		}
		return live == 2
	})
	e.deleteAll(t)
}

func boolString(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}
