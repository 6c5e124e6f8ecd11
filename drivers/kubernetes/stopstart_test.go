package kubernetes_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/berth-dev/berth/driver"
)

// TestStopStart: Stop keeps the pod in a marker and deletes it; the
// instance is stopped with the same id, seen so by a driver opened after
// (a restart of Berth), and by List for its cluster; its name stays taken.
// Its config map and secret belong to the marker while it is stopped and
// to the new pod after Start, which makes the pod again on the same node
// with the same id. Delete of a stopped instance removes the marker, the
// config map and the secret.
func TestStopStart(t *testing.T) {
	needCluster(t)
	ctx := ctxT(t)
	const ns = "stopstart"
	if err := cluster.CreateNamespace(ctx, ns); err != nil {
		t.Fatal(err)
	}
	d := open(t, map[string]any{"namespace": ns})
	sp := spec("kept", map[string]string{driver.TagCluster: "stops"})
	sp.ConfigFiles = []driver.ConfigFile{{Path: "/etc/app.conf", Content: "x=1"}}
	sp.UserData = "secret stuff"
	sp.Labels = map[string]string{"app": "web"}
	inst, err := create(t, d, nodes[1], sp)
	if err != nil {
		t.Fatal(err)
	}
	first := pod(t, ns, "kept")

	// Watch while stopping: the pod's end is a die in state stopped, no
	// delete.
	wctx, cancel := context.WithCancel(ctx)
	var mu sync.Mutex
	var events []driver.Event
	watched := make(chan error, 1)
	go func() {
		watched <- d.(driver.EventWatcher).Watch(wctx, func(e driver.Event) {
			mu.Lock()
			events = append(events, e)
			mu.Unlock()
		})
	}()
	if err := d.(driver.Stopper).Stop(ctx, inst.ID, time.Second); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	if _, err := cluster.Client.CoreV1().Pods(ns).Get(ctx, "kept", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("the pod after Stop: %v, want not found", err)
	}
	eventually(t, "a die event in state stopped", func() bool {
		mu.Lock()
		defer mu.Unlock()
		for _, e := range events {
			if e.Instance == inst.ID && e.Type == driver.EventDie && e.State == driver.StateStopped {
				return true
			}
		}
		return false
	})
	cancel()
	if err := <-watched; !errors.Is(err, context.Canceled) {
		t.Errorf("Watch: %v", err)
	}
	for _, e := range events {
		if e.Instance == inst.ID && e.Type == driver.EventDelete {
			t.Errorf("Watch reported a stop as a delete: %+v", e)
		}
	}
	marker, err := cluster.Client.CoreV1().ConfigMaps(ns).Get(ctx, "kept-stopped", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the marker: %v", err)
	}
	owners := func(what string, want metav1.Object) {
		t.Helper()
		cm, err := cluster.Client.CoreV1().ConfigMaps(ns).Get(ctx, "kept-files", metav1.GetOptions{})
		if err != nil || len(cm.OwnerReferences) != 1 || cm.OwnerReferences[0].UID != want.GetUID() {
			t.Errorf("%s: the config map's owners %+v (%v), want only %s", what, cm.OwnerReferences, err, want.GetName())
		}
		sec, err := cluster.Client.CoreV1().Secrets(ns).Get(ctx, "kept-user-data", metav1.GetOptions{})
		if err != nil || len(sec.OwnerReferences) != 1 || sec.OwnerReferences[0].UID != want.GetUID() {
			t.Errorf("%s: the secret's owners %+v (%v), want only %s", what, sec.OwnerReferences, err, want.GetName())
		}
	}
	owners("stopped", marker)
	if err := d.(driver.Stopper).Stop(ctx, inst.ID, time.Second); err != nil {
		t.Errorf("Stop of a stopped instance: %v", err)
	}
	if err := d.(driver.Resizer).Resize(ctx, inst.ID, driver.Resources{CPU: 500}); !errors.Is(err, driver.ErrPermanent) {
		t.Errorf("Resize of a stopped instance: %v, want ErrPermanent", err)
	}
	if err := d.Close(ctx); err != nil {
		t.Fatal(err)
	}

	// Berth restarts.
	d = open(t, map[string]any{"namespace": ns})
	closeT(t, d)
	got, err := d.Get(ctx, inst.ID)
	if err != nil || got.State != driver.StateStopped || got.Node != nodes[1] || got.Name != "kept" || got.Labels["app"] != "web" ||
		!got.Created.Equal(inst.Created.Truncate(time.Second)) || got.Resources.CPU != 250 {
		t.Fatalf("Get after a restart: %+v, %v; want kept, stopped on %s, made %s", got, err, nodes[1], inst.Created)
	}
	if f, err := d.Find(ctx, "kept"); err != nil || f.ID != inst.ID || f.State != driver.StateStopped {
		t.Errorf("Find: %+v, %v", f, err)
	}
	list, err := d.List(ctx, map[string]string{driver.TagCluster: "stops"})
	if err != nil || len(list) != 1 || list[0].ID != inst.ID || list[0].State != driver.StateStopped {
		t.Errorf("List by cluster: %+v, %v; want the stopped instance", list, err)
	}
	if _, err := d.Create(ctx, nodes[0], spec("kept", nil)); !errors.Is(err, driver.ErrAlreadyExists) {
		t.Errorf("Create with the name of a stopped instance: %v, want ErrAlreadyExists", err)
	}
	if err := d.(driver.Starter).Start(ctx, inst.ID); err != nil {
		t.Fatalf("Start: %v", err)
	}
	again := pod(t, ns, "kept")
	if again.UID == first.UID || again.Spec.NodeName != nodes[1] || again.Labels["berth/id"] != inst.ID || again.Spec.Containers[0].Image != sp.Image {
		t.Errorf("the pod after Start: uid %s (first %s), node %s, id label %q", again.UID, first.UID, again.Spec.NodeName, again.Labels["berth/id"])
	}
	got, err = d.Get(ctx, inst.ID)
	if err != nil || got.State != driver.StateRunning || got.ID != inst.ID || !got.Created.Equal(inst.Created.Truncate(time.Second)) {
		t.Errorf("Get after Start: %+v, %v", got, err)
	}
	owners("started", again)
	eventually(t, "the marker gone", func() bool {
		_, err := cluster.Client.CoreV1().ConfigMaps(ns).Get(ctx, "kept-stopped", metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	})

	// Stopped again, then deleted: nothing is left.
	if err := d.(driver.Stopper).Stop(ctx, inst.ID, time.Second); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	remove(d, inst.ID)
	if _, err := d.Get(ctx, inst.ID); !errors.Is(err, driver.ErrNotFound) {
		t.Errorf("Get after Delete: %v, want ErrNotFound", err)
	}
	for _, name := range []string{"kept-stopped", "kept-files"} {
		if _, err := cluster.Client.CoreV1().ConfigMaps(ns).Get(ctx, name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Errorf("config map %s after Delete: %v, want not found", name, err)
		}
	}
	if _, err := cluster.Client.CoreV1().Secrets(ns).Get(ctx, "kept-user-data", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("secret after Delete: %v, want not found", err)
	}
}

// TestStartExited: a pod that ran to its end is exited; Start makes it
// again with the same id; Stop leaves an exited pod as it is.
func TestStartExited(t *testing.T) {
	needCluster(t)
	ctx := ctxT(t)
	const ns = "exited"
	if err := cluster.CreateNamespace(ctx, ns); err != nil {
		t.Fatal(err)
	}
	d := open(t, map[string]any{"namespace": ns})
	closeT(t, d)
	inst, err := create(t, d, nodes[2], spec("ends", nil))
	if err != nil {
		t.Fatal(err)
	}
	// The kubelet's report of a container that exited with 3.
	p := pod(t, ns, "ends")
	now := metav1.Now()
	p.Status.Phase = corev1.PodFailed
	p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "main", Image: p.Spec.Containers[0].Image,
		State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 3, StartedAt: now, FinishedAt: now, Reason: "Error"}}}}
	if _, err := cluster.Client.CoreV1().Pods(ns).UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the instance exited", func() bool {
		got, err := d.Get(ctx, inst.ID)
		return err == nil && got.State == driver.StateExited && got.ExitCode != nil && *got.ExitCode == 3
	})
	if err := d.(driver.Stopper).Stop(ctx, inst.ID, time.Second); err != nil {
		t.Errorf("Stop of an exited instance: %v", err)
	}
	if got, _ := d.Get(ctx, inst.ID); got == nil || got.State != driver.StateExited {
		t.Errorf("after Stop of an exited instance: %+v, want it exited still", got)
	}
	if err := d.(driver.Starter).Start(ctx, inst.ID); err != nil {
		t.Fatalf("Start of an exited instance: %v", err)
	}
	got, err := d.Get(ctx, inst.ID)
	if err != nil || got.State != driver.StateRunning || got.Node != nodes[2] || got.ExitCode != nil {
		t.Errorf("after Start: %+v, %v; want running on %s", got, err, nodes[2])
	}
	if again := pod(t, ns, "ends"); again.UID == p.UID {
		t.Errorf("Start left the exited pod in place")
	}
}

// TestStartNoRoom: a stopped instance whose node has no room left is not
// started (ErrInsufficientCapacity, by the driver's count) and stays
// stopped.
func TestStartNoRoom(t *testing.T) {
	needCluster(t)
	ctx := ctxT(t)
	const ns = "noroom"
	if err := cluster.CreateNamespace(ctx, ns); err != nil {
		t.Fatal(err)
	}
	d := open(t, map[string]any{"namespace": ns})
	closeT(t, d)
	sp := spec("big", nil)
	sp.CPU = 5000
	inst, err := create(t, d, nodes[0], sp)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.(driver.Stopper).Stop(ctx, inst.ID, time.Second); err != nil {
		t.Fatal(err)
	}
	// Its room is taken meanwhile.
	if _, err := create(t, d, nodes[0], func() *driver.Spec { s := spec("squatter", nil); s.CPU = 5000; return s }()); err != nil {
		t.Fatal(err)
	}
	if err := d.(driver.Starter).Start(ctx, inst.ID); !errors.Is(err, driver.ErrInsufficientCapacity) {
		t.Errorf("Start with no room on the node: %v, want ErrInsufficientCapacity", err)
	}
	if got, err := d.Get(ctx, inst.ID); err != nil || got.State != driver.StateStopped {
		t.Errorf("after a failed Start: %+v, %v; want it stopped", got, err)
	}
}

// TestStopStartNoBind: without bind, Start leaves the new pod to the
// cluster's scheduler (played by the test) and waits until it runs.
func TestStopStartNoBind(t *testing.T) {
	needCluster(t)
	ctx := ctxT(t)
	const ns = "nobind-stop"
	if err := cluster.CreateNamespace(ctx, ns); err != nil {
		t.Fatal(err)
	}
	d := open(t, map[string]any{"bind": false, "namespace": ns})
	closeT(t, d)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() { playScheduler(t, ns, nodes[2], stop) })
	defer func() { close(stop); wg.Wait() }()
	inst, err := create(t, d, nodes[0], spec("scheduled", nil))
	if err != nil {
		t.Fatal(err)
	}
	if err := d.(driver.Stopper).Stop(ctx, inst.ID, time.Second); err != nil {
		t.Fatal(err)
	}
	if err := d.(driver.Starter).Start(ctx, inst.ID); err != nil {
		t.Fatalf("Start: %v", err)
	}
	got, err := d.Get(ctx, inst.ID)
	if err != nil || got.State != driver.StateRunning || got.Node != nodes[2] {
		t.Errorf("after Start: %+v, %v; want running where the scheduler put it, %s", got, err, nodes[2])
	}
	p := pod(t, ns, "scheduled")
	if p.Spec.SchedulerName != corev1.DefaultSchedulerName || p.Spec.Affinity == nil {
		t.Errorf("the pod made again: scheduler %q, affinity %+v; want the cluster's scheduler and the node affinity", p.Spec.SchedulerName, p.Spec.Affinity)
	}
}
