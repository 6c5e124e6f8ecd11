package kubernetes_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/driver/drivertest"
	"github.com/berth-dev/berth/drivers/kubernetes"
	"github.com/berth-dev/berth/drivers/kubernetes/k8stest"
)

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func closeT(t *testing.T, d driver.Driver) {
	t.Cleanup(func() {
		if err := d.Close(context.Background()); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
}

func spec(name string, tags map[string]string) *driver.Spec {
	all := map[string]string{driver.TagManaged: "true", driver.TagCluster: "test", driver.TagProvider: "k8s"}
	for k, v := range tags {
		all[k] = v
	}
	return &driver.Spec{Name: name, Image: "registry.example/app:1", Tags: all,
		Resources: driver.Resources{CPU: 250, Memory: 128 * driver.MiB}}
}

// create creates and drives; the instance is deleted when the test ends.
func create(t *testing.T, d driver.Driver, node string, sp *driver.Spec) (*driver.Instance, error) {
	t.Helper()
	ctx := ctxT(t)
	op, err := d.Create(ctx, node, sp)
	if err != nil {
		return nil, err
	}
	inst, err := driver.Drive(ctx, op)
	if inst != nil && inst.ID != "" {
		id := inst.ID
		t.Cleanup(func() { remove(d, id) })
	}
	return inst, err
}

func remove(d driver.Driver, id string) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if op, err := d.Delete(ctx, id); err == nil {
		_, _ = driver.Drive(ctx, op)
	}
}

func pod(t *testing.T, ns, name string) *corev1.Pod {
	t.Helper()
	p, err := cluster.Client.CoreV1().Pods(ns).Get(ctxT(t), name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get pod %s: %v", name, err)
	}
	return p
}

// TestBind: with bind, Berth binds the pod to the node it chose, under a
// scheduler name no one else answers to.
func TestBind(t *testing.T) {
	needCluster(t)
	d := open(t, nil)
	closeT(t, d)
	inst, err := create(t, d, nodes[1], spec("bind-on", nil))
	if err != nil {
		t.Fatal(err)
	}
	if inst.Node != nodes[1] || inst.State != driver.StateRunning {
		t.Errorf("instance on %q in state %q, want on %s, running", inst.Node, inst.State, nodes[1])
	}
	p := pod(t, "default", "bind-on")
	if p.Spec.SchedulerName != "berth" || p.Spec.NodeName != nodes[1] {
		t.Errorf("pod: schedulerName %q nodeName %q, want berth and %s", p.Spec.SchedulerName, p.Spec.NodeName, nodes[1])
	}
}

// TestNoBind: without bind the cluster's scheduler places the pod (here
// the test plays it, and picks another node than the one asked for); the
// instance reports where the pod went.
func TestNoBind(t *testing.T) {
	needCluster(t)
	if err := cluster.CreateNamespace(ctxT(t), "nobind"); err != nil {
		t.Fatal(err)
	}
	d := open(t, map[string]any{"bind": false, "namespace": "nobind"})
	closeT(t, d)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() { playScheduler(t, "nobind", nodes[2], stop) })
	defer func() { close(stop); wg.Wait() }()

	inst, err := create(t, d, nodes[0], spec("bind-off", nil))
	if err != nil {
		t.Fatal(err)
	}
	if inst.Node != nodes[2] {
		t.Errorf("instance on %q, want %s, where the scheduler put it", inst.Node, nodes[2])
	}
	p := pod(t, "nobind", "bind-off")
	if p.Spec.SchedulerName != corev1.DefaultSchedulerName {
		t.Errorf("pod: schedulerName %q, want the cluster's", p.Spec.SchedulerName)
	}
	pref := p.Spec.Affinity.NodeAffinity.PreferredDuringSchedulingIgnoredDuringExecution
	if len(pref) != 1 || pref[0].Preference.MatchFields[0].Values[0] != nodes[0] {
		t.Errorf("pod: preferred nodes %+v, want %s", pref, nodes[0])
	}
	req := p.Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution
	if req == nil || req.NodeSelectorTerms[0].MatchExpressions[0].Key != "pool" {
		t.Errorf("pod: required node terms %+v, want node_selector's pool=main", req)
	}
}

// playScheduler binds every unbound pod of ns to node until stop closes.
func playScheduler(t *testing.T, ns, node string, stop chan struct{}) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for {
		list, err := cluster.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName="})
		if err == nil {
			for _, p := range list.Items {
				err := cluster.Client.CoreV1().Pods(ns).Bind(ctx, &corev1.Binding{ObjectMeta: metav1.ObjectMeta{Name: p.Name, UID: p.UID},
					Target: corev1.ObjectReference{Kind: "Node", Name: node}}, metav1.CreateOptions{})
				if err != nil && !apierrors.IsConflict(err) && !apierrors.IsNotFound(err) {
					t.Errorf("scheduler: bind %s: %v", p.Name, err)
				}
			}
		}
		select {
		case <-stop:
			return
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// nodeState returns node's reading from State, and whether it is there.
func nodeState(t *testing.T, d driver.Driver, name string) (driver.Node, bool) {
	t.Helper()
	st, err := d.State(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range st.Nodes {
		if n.Name == name {
			return n, true
		}
	}
	return driver.Node{}, false
}

// eventually polls cond (every 20 ms, at most a minute) and fails with
// what when it never holds.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	ctx := ctxT(t)
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("never: %s", what)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// TestNodeNotReadyAndGone: a node whose Ready condition turns False is
// offline (and refuses creates as retryable); a deleted node is gone from
// State, but reported offline while Berth's pods are bound to it.
func TestNodeNotReadyAndGone(t *testing.T) {
	needCluster(t)
	ctx := ctxT(t)
	extra, err := cluster.AddNodes(ctx, "extra", 2, k8stest.NodeShape{CPU: "4", Memory: "8Gi", Labels: map[string]string{"pool": "extra"}})
	if err != nil {
		t.Fatal(err)
	}
	d := open(t, map[string]any{"node_selector": "pool=extra"})
	closeT(t, d)
	var mu sync.Mutex
	var events []driver.Event
	wctx, stopWatch := context.WithCancel(ctx)
	watched := make(chan error, 1)
	go func() {
		watched <- d.(driver.EventWatcher).Watch(wctx, func(e driver.Event) { mu.Lock(); events = append(events, e); mu.Unlock() })
	}()
	defer func() { stopWatch(); <-watched }()

	for _, name := range extra {
		eventually(t, name+" online", func() bool { n, ok := nodeState(t, d, name); return ok && n.Status == driver.NodeOnline })
	}
	n, _ := nodeState(t, d, extra[0])
	if n.Capacity.CPU != 4000 || n.Capacity.Memory != 8*driver.GiB || n.Labels["pool"] != "extra" || n.Address == "" {
		t.Errorf("node %s: %+v", extra[0], n)
	}

	// NotReady: KWOK is told to leave the node alone, then its status says
	// so.
	node, err := cluster.Client.CoreV1().Nodes().Get(ctx, extra[0], metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	node.Annotations[k8stest.FrozenAnnotation] = "true"
	if node, err = cluster.Client.CoreV1().Nodes().Update(ctx, node, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	for i, c := range node.Status.Conditions {
		if c.Type == corev1.NodeReady {
			node.Status.Conditions[i].Status, node.Status.Conditions[i].Reason, node.Status.Conditions[i].Message = corev1.ConditionFalse, "KubeletDown", "the test stopped it"
		}
	}
	if _, err := cluster.Client.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, extra[0]+" offline", func() bool { n, _ := nodeState(t, d, extra[0]); return n.Status == driver.NodeOffline })
	n, _ = nodeState(t, d, extra[0])
	if !strings.Contains(n.Reason, "KubeletDown") {
		t.Errorf("offline node's reason %q does not say why", n.Reason)
	}
	if _, err := d.Create(ctx, extra[0], spec("on-notready", nil)); !errors.Is(err, driver.ErrRetryable) {
		t.Errorf("Create on a node that is not ready: %v, want ErrRetryable", err)
	}
	eventually(t, "a node event", func() bool {
		mu.Lock()
		defer mu.Unlock()
		for _, e := range events {
			if e.Type == driver.EventNode && e.Node == extra[0] && strings.HasPrefix(e.Message, "offline") {
				return true
			}
		}
		return false
	})

	// Gone: the node with a pod of Berth's stays, offline; the empty one
	// leaves State.
	inst, err := create(t, d, extra[1], spec("on-gone", nil))
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range extra {
		if err := cluster.Client.CoreV1().Nodes().Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, extra[0]+" out of State", func() bool { _, ok := nodeState(t, d, extra[0]); return !ok })
	eventually(t, extra[1]+" offline", func() bool { n, ok := nodeState(t, d, extra[1]); return ok && n.Status == driver.NodeOffline })
	n, _ = nodeState(t, d, extra[1])
	if n.Instances != 1 {
		t.Errorf("gone node %s: %d instances, want 1 (%s)", extra[1], n.Instances, inst.ID)
	}
	if _, err := d.Create(ctx, extra[1], spec("on-gone-2", nil)); !errors.Is(err, driver.ErrNotFound) {
		t.Errorf("Create on a deleted node: %v, want ErrNotFound", err)
	}
}

// TestLeaks: List by cluster id finds every pod of that cluster, including
// one whose create was abandoned right after the pod was made, and none of
// another cluster's, nor pods Berth did not make.
func TestLeaks(t *testing.T) {
	needCluster(t)
	if err := cluster.CreateNamespace(ctxT(t), "leaks"); err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t)
	d := open(t, map[string]any{"namespace": "leaks"})
	mine := map[string]string{driver.TagCluster: "cluster-a"}
	if _, err := create(t, d, nodes[0], spec("a-done", mine)); err != nil {
		t.Fatal(err)
	}
	if _, err := create(t, d, nodes[0], spec("b-done", map[string]string{driver.TagCluster: "cluster-b"})); err != nil {
		t.Fatal(err)
	}
	// A create abandoned after its first step: the pod exists, unbound.
	opCtx, cancel := context.WithCancel(ctx)
	op, err := d.Create(opCtx, nodes[0], spec("a-abandoned", mine))
	if err != nil {
		t.Fatal(err)
	}
	for {
		p, err := op.Advance(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if p.Instance != nil && p.Instance.ID != "" {
			break
		}
		time.Sleep(time.Millisecond)
	}
	cancel()
	if err := d.Close(ctx); err != nil {
		t.Fatal(err)
	}
	// A pod that is not Berth's, with a look-alike tag annotation.
	foreign := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "foreign", Annotations: map[string]string{"berth/tags": `{"berth.cluster":"cluster-a"}`}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "x"}}}}
	if _, err := cluster.Client.CoreV1().Pods("leaks").Create(ctx, foreign, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	// After a restart.
	d = open(t, map[string]any{"namespace": "leaks"})
	closeT(t, d)
	list, err := d.List(ctx, map[string]string{driver.TagCluster: "cluster-a"})
	if err != nil {
		t.Fatal(err)
	}
	// The Advance that gave the pod's id has already sent the bind, which
	// may reach the server before the cancel: the abandoned pod is
	// creating, or bound and running.
	var names []string
	for _, in := range list {
		names = append(names, in.Name+":"+string(in.State))
	}
	if got := strings.Join(names, " "); got != "a-abandoned:creating a-done:running" && got != "a-abandoned:running a-done:running" {
		t.Errorf("List by cluster id: %v, want a-abandoned (creating or running) and a-done (running)", names)
	}
	for _, in := range list {
		if in.Tags[driver.TagCluster] != "cluster-a" || in.Tags[driver.TagProvider] != "k8s" {
			t.Errorf("instance %s: tags %v", in.Name, in.Tags)
		}
		remove(d, in.ID)
	}
	if list, _ := d.List(ctx, map[string]string{driver.TagCluster: "cluster-a"}); len(list) != 0 {
		t.Errorf("List after the cleanup: %d instances left", len(list))
	}
}

// TestQuota: a ResourceQuota that is full makes the create end with
// ErrQuotaExceeded, and leaves nothing behind.
func TestQuota(t *testing.T) {
	needCluster(t)
	ctx := ctxT(t)
	if err := cluster.CreateNamespace(ctx, "quota"); err != nil {
		t.Fatal(err)
	}
	hard := corev1.ResourceList{corev1.ResourcePods: resource.MustParse("1")}
	q, err := cluster.Client.CoreV1().ResourceQuotas("quota").Create(ctx, &corev1.ResourceQuota{
		ObjectMeta: metav1.ObjectMeta{Name: "pods"}, Spec: corev1.ResourceQuotaSpec{Hard: hard}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// There is no controller manager to fill in the quota's status, which
	// the admission needs: the test does.
	q.Status = corev1.ResourceQuotaStatus{Hard: hard, Used: corev1.ResourceList{corev1.ResourcePods: resource.MustParse("0")}}
	if _, err := cluster.Client.CoreV1().ResourceQuotas("quota").UpdateStatus(ctx, q, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	d := open(t, map[string]any{"namespace": "quota"})
	closeT(t, d)
	if _, err := create(t, d, nodes[0], spec("quota-1", nil)); err != nil {
		t.Fatal(err)
	}
	_, err = create(t, d, nodes[0], spec("quota-2", nil))
	if !errors.Is(err, driver.ErrQuotaExceeded) {
		t.Fatalf("second create under a quota of one pod: %v, want ErrQuotaExceeded", err)
	}
	if _, err := d.Find(ctx, "quota-2"); !errors.Is(err, driver.ErrNotFound) {
		t.Errorf("Find after the refused create: %v, want ErrNotFound", err)
	}
}

// TestSpecMapping: the pod carries what the spec asks, config files come
// from a config map and user data from a secret, both owned by the pod
// and deleted with it.
func TestSpecMapping(t *testing.T) {
	needCluster(t)
	ctx := ctxT(t)
	if err := cluster.CreateNamespace(ctx, "mapping"); err != nil {
		t.Fatal(err)
	}
	d := open(t, map[string]any{"namespace": "mapping"})
	closeT(t, d)
	sp := spec("mapped", map[string]string{"team": "with spaces, not a label value"})
	sp.Entrypoint, sp.Command = []string{"/bin/app"}, []string{"--port", "8080"}
	sp.Env = map[string]string{"B": "2", "A": "1"}
	sp.Labels = map[string]string{"app": "web"}
	sp.GPUs = 1
	sp.Ports = []driver.Port{{ContainerPort: 8080, HostPort: 18080}}
	sp.RestartPolicy = driver.RestartPolicy{Name: "on-failure"}
	sp.User, sp.Group = "1000", "1000"
	sp.ConfigFiles = []driver.ConfigFile{{Path: "/etc/app/app.conf", Content: "x=1", Mode: 0o600}}
	sp.UserData = "secret stuff"
	inst, err := create(t, d, nodes[0], sp)
	if err != nil {
		t.Fatal(err)
	}
	if inst.Tags["team"] != sp.Tags["team"] || inst.Labels["app"] != "web" || inst.Resources.GPUs != 1 || len(inst.Ports) != 1 || inst.Ports[0].HostPort != 18080 {
		t.Errorf("instance: %+v", inst)
	}
	p := pod(t, "mapping", "mapped")
	c := p.Spec.Containers[0]
	if fmt.Sprint(c.Command, c.Args) != "[/bin/app] [--port 8080]" || len(c.Env) != 2 || c.Env[0].Name != "A" {
		t.Errorf("container: command %v args %v env %v", c.Command, c.Args, c.Env)
	}
	if p.Spec.RestartPolicy != corev1.RestartPolicyOnFailure || *p.Spec.SecurityContext.RunAsUser != 1000 || p.Labels["app"] != "web" || p.Labels[driver.TagCluster] != "test" {
		t.Errorf("pod: restart %s security %+v labels %v", p.Spec.RestartPolicy, p.Spec.SecurityContext, p.Labels)
	}
	if _, ok := p.Labels["team"]; ok {
		t.Errorf("a tag that is no label value became a label")
	}
	if q := c.Resources.Limits["nvidia.com/gpu"]; q.Value() != 1 {
		t.Errorf("gpu limit %v", q)
	}
	cm, err := cluster.Client.CoreV1().ConfigMaps("mapping").Get(ctx, "mapped-files", metav1.GetOptions{})
	if err != nil || cm.Data["file0"] != "x=1" || cm.OwnerReferences[0].UID != p.UID {
		t.Errorf("config map: %+v %v", cm, err)
	}
	sec, err := cluster.Client.CoreV1().Secrets("mapping").Get(ctx, "mapped-user-data", metav1.GetOptions{})
	if err != nil || string(sec.Data["user-data"]) != "secret stuff" {
		t.Errorf("secret: %v", err)
	}
	// Nodes reserve what the pod asks, host port included.
	n, _ := nodeState(t, d, nodes[0])
	if n.Reserved.GPUs < 1 || n.Reserved.CPU < 250 {
		t.Errorf("node %s reserves %+v, want at least the pod's requests", nodes[0], n.Reserved)
	}
	if _, err := d.Create(ctx, nodes[0], func() *driver.Spec { s := spec("port-again", nil); s.Ports = sp.Ports; return s }()); !errors.Is(err, driver.ErrInsufficientCapacity) {
		t.Errorf("Create with a host port taken on the node: %v, want ErrInsufficientCapacity", err)
	}

	remove(d, inst.ID)
	if _, err := cluster.Client.CoreV1().ConfigMaps("mapping").Get(ctx, "mapped-files", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("config map after Delete: %v, want not found", err)
	}
	if _, err := cluster.Client.CoreV1().Secrets("mapping").Get(ctx, "mapped-user-data", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("secret after Delete: %v, want not found", err)
	}
}

// TestCapacity: a spec larger than what the node has free is refused by
// the driver's own count, before anything is made.
func TestCapacity(t *testing.T) {
	needCluster(t)
	d := open(t, nil)
	closeT(t, d)
	sp := spec("too-big", nil)
	sp.CPU = 9000
	if _, err := d.Create(ctxT(t), nodes[0], sp); !errors.Is(err, driver.ErrInsufficientCapacity) {
		t.Errorf("Create of 9 cpus on an 8-cpu node: %v, want ErrInsufficientCapacity", err)
	}
	if _, err := d.Create(ctxT(t), "no-such-node", spec("nowhere", nil)); !errors.Is(err, driver.ErrNotFound) {
		t.Errorf("Create on an unknown node: %v, want ErrNotFound", err)
	}
}

// TestCheckSpec: what a pod cannot carry is refused by name.
func TestCheckSpec(t *testing.T) {
	needCluster(t)
	d := open(t, nil)
	closeT(t, d)
	sc := d.(driver.SpecChecker)
	for field, mutate := range map[string]func(*driver.Spec){
		"ssh_keys":                   func(s *driver.Spec) { s.SSHKeys = []string{"ssh-ed25519 AAAA"} },
		"volumes":                    func(s *driver.Spec) { s.Volumes = []driver.Volume{{Source: "/data", Target: "/data"}} },
		"user":                       func(s *driver.Spec) { s.User = "nobody" },
		"kind":                       func(s *driver.Spec) { s.Kind = driver.KindVM },
		"name":                       func(s *driver.Spec) { s.Name = "Upper_Case" },
		"labels.berth.x":             func(s *driver.Spec) { s.Labels = map[string]string{"berth.x": "1"} },
		"restart_policy.max_retries": func(s *driver.Spec) { s.RestartPolicy = driver.RestartPolicy{Name: "on-failure", MaxRetries: 3} },
		"ports[0].host_port":         func(s *driver.Spec) { s.Ports = []driver.Port{{ContainerPort: 80, Publish: true}} },
		"other.fpga":                 func(s *driver.Spec) { s.Other = map[string]int64{"fpga": 1} },
	} {
		sp := spec("check", nil)
		mutate(sp)
		err := sc.CheckSpec(sp)
		if !errors.Is(err, driver.ErrUnsupported) || !drivertest.HasField(err, field) {
			t.Errorf("CheckSpec with %s: %v, want ErrUnsupported naming it", field, err)
		}
	}
	if err := sc.CheckSpec(spec("fine", nil)); err != nil {
		t.Errorf("CheckSpec of a plain spec: %v", err)
	}
	got := driver.Features(d)
	if strings.Join(got, " ") != "gpus host-ports kind:container restart-policy run-as-user" {
		t.Errorf("Features: %v", got)
	}
	if k := kubernetes.Unwrap(d); k == nil {
		t.Error("Unwrap: nil")
	}
}

// TestOptions: option errors name their keys.
func TestOptions(t *testing.T) {
	def, _ := driver.Lookup("kubernetes")
	for key, val := range map[string]any{
		"namespace": "Not_A_Namespace", "qps": -1, "node_selector": "a in (", "kubeconfig": "/no/such/file", "pod_labels": "berth.x=1",
	} {
		_, err := def.Open(context.Background(), map[string]any{key: val}, driver.Env{})
		if !drivertest.HasField(err, key) && !(key == "pod_labels" && drivertest.HasField(err, "pod_labels.berth.x")) {
			t.Errorf("option %s=%v: %v, want an error naming it", key, val, err)
		}
	}
}
