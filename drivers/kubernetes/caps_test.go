package kubernetes_test

import (
	"context"
	"errors"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/driver/drivertest"
	"github.com/berth-dev/berth/drivers/kubernetes/k8stest"
)

// TestPreload: Preload runs one pod bound to each node, with the image,
// and deletes it; the nodes then list the image. KWOK's nodes pull
// nothing and report no images, so what the nodes list here is what the
// driver remembers of its preloads; the pods are real.
func TestPreload(t *testing.T) {
	needCluster(t)
	ctx := ctxT(t)
	const ns = "preload"
	if err := cluster.CreateNamespace(ctx, ns); err != nil {
		t.Fatal(err)
	}
	d := open(t, map[string]any{"namespace": ns})
	closeT(t, d)
	const image = "registry.example/preloaded:7"

	w, err := cluster.Client.CoreV1().Pods(ns).Watch(ctx, metav1.ListOptions{LabelSelector: "berth/preload"})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	var mu sync.Mutex
	onNode := map[string]string{} // pod -> node it was bound to
	deleted := map[string]bool{}
	var wg sync.WaitGroup
	wg.Go(func() {
		for ev := range w.ResultChan() {
			p, ok := ev.Object.(*corev1.Pod)
			if !ok {
				continue
			}
			mu.Lock()
			if p.Spec.NodeName != "" && p.Spec.Containers[0].Image == image {
				onNode[p.Name] = p.Spec.NodeName
			}
			if ev.Type == watch.Deleted {
				deleted[p.Name] = true
			}
			mu.Unlock()
		}
	})

	var reports []driver.PreloadProgress
	if err := d.(driver.Preloader).Preload(ctx, image, nodes, func(p driver.PreloadProgress) { reports = append(reports, p) }); err != nil {
		list, _ := cluster.Client.CoreV1().Pods(ns).List(context.Background(), metav1.ListOptions{})
		for _, p := range list.Items {
			t.Logf("pod %s on %s: %+v", p.Name, p.Spec.NodeName, p.Status)
		}
		t.Fatalf("Preload: %v", err)
	}
	eventually(t, "a deleted preload pod on every node", func() bool {
		mu.Lock()
		defer mu.Unlock()
		var got []string
		for name, n := range onNode {
			if deleted[name] {
				got = append(got, n)
			}
		}
		slices.Sort(got)
		return slices.Equal(got, nodes)
	})
	w.Stop()
	wg.Wait()
	if left, err := cluster.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "berth/preload"}); err != nil || len(left.Items) != 0 {
		t.Errorf("preload pods left: %d, %v", len(left.Items), err)
	}
	for _, n := range nodes {
		imgs, err := d.(driver.ImageLister).Images(ctx, n)
		if err != nil || !slices.ContainsFunc(imgs, func(im driver.Image) bool { return im.Name == image }) {
			t.Errorf("Images %s after Preload: %+v, %v; want %s", n, imgs, err, image)
		}
	}
	present := 0
	for _, r := range reports {
		if r.Status == "present" && r.Image == image {
			present++
		}
	}
	if present != len(nodes) {
		t.Errorf("progress: %+v, want %d present", reports, len(nodes))
	}
	if list, _ := d.List(ctx, nil); len(list) != 0 {
		t.Errorf("List shows preload pods as instances: %+v", list)
	}
	if err := d.(driver.Preloader).Preload(ctx, image, []string{"no-such-node"}, nil); !errors.Is(err, driver.ErrNotFound) {
		t.Errorf("Preload on an unknown node: %v, want ErrNotFound", err)
	}
}

// TestPreloadBadImage: an image the node cannot pull fails the preload
// with ErrPermanent naming the kubelet's reason, and the pod goes.
func TestPreloadBadImage(t *testing.T) {
	needCluster(t)
	ctx := ctxT(t)
	const ns = "preload-bad"
	if err := cluster.CreateNamespace(ctx, ns); err != nil {
		t.Fatal(err)
	}
	d := open(t, map[string]any{"namespace": ns})
	closeT(t, d)
	err := d.(driver.Preloader).Preload(ctx, k8stest.MissingImage, []string{nodes[0]}, nil)
	if !errors.Is(err, driver.ErrPermanent) || !strings.Contains(err.Error(), "ErrImagePull") {
		t.Errorf("Preload of an image that cannot be pulled: %v, want ErrPermanent naming ErrImagePull", err)
	}
	if list, err := cluster.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "berth/preload"}); err != nil || len(list.Items) != 0 {
		t.Errorf("preload pods left: %d, %v", len(list.Items), err)
	}
	imgs, _ := d.(driver.ImageLister).Images(ctx, nodes[0])
	if slices.ContainsFunc(imgs, func(im driver.Image) bool { return im.Name == k8stest.MissingImage }) {
		t.Errorf("Images lists the image that failed: %+v", imgs)
	}
}

// TestLogs: logs through pods/log, served by KWOK's kubelet API from a
// file in the container runtime's format: everything, the last line
// (tail), and following as lines are added. stdout and stderr come as one
// stream (stdout); stderr alone is ErrUnsupported.
func TestLogs(t *testing.T) {
	needCluster(t)
	ctx := ctxT(t)
	ns := k8stest.LogsNamespace
	if err := cluster.CreateNamespace(ctx, ns); err != nil {
		t.Fatal(err)
	}
	d := open(t, map[string]any{"namespace": ns, "logs": true})
	closeT(t, d)
	inst, err := create(t, d, nodes[0], spec("talks", nil))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(cluster.LogsFile, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := cluster.AppendLog("stdout", "hello stdout"); err != nil {
		t.Fatal(err)
	}
	if err := cluster.AppendLog("stderr", "hello stderr"); err != nil {
		t.Fatal(err)
	}
	lr := d.(driver.LogReader)
	var out, errOut drivertest.SyncBuffer
	if err := lr.Logs(ctx, inst.ID, driver.LogOptions{Stdout: true, Stderr: true}, &out, &errOut); err != nil {
		t.Fatalf("Logs: %v", err)
	}
	if out.String() != "hello stdout\nhello stderr\n" || errOut.String() != "" {
		t.Errorf("Logs: stdout %q stderr %q, want both lines on stdout", out.String(), errOut.String())
	}
	var tail drivertest.SyncBuffer
	if err := lr.Logs(ctx, inst.ID, driver.LogOptions{Stdout: true, Tail: 1}, &tail, &errOut); err != nil {
		t.Fatalf("Logs with Tail 1: %v", err)
	}
	if tail.String() != "hello stderr\n" {
		t.Errorf("Logs with Tail 1: %q, want the last line", tail.String())
	}
	var stamped drivertest.SyncBuffer
	if err := lr.Logs(ctx, inst.ID, driver.LogOptions{Stdout: true, Tail: 1, Timestamps: true}, &stamped, &errOut); err != nil {
		t.Fatalf("Logs with timestamps: %v", err)
	}
	if f := strings.Fields(stamped.String()); len(f) != 3 || !strings.HasSuffix(stamped.String(), " hello stderr\n") {
		t.Errorf("Logs with timestamps: %q, want a time before the line", stamped.String())
	} else if _, err := time.Parse(time.RFC3339Nano, f[0]); err != nil {
		t.Errorf("Logs with timestamps: %q: %v", stamped.String(), err)
	}
	if err := lr.Logs(ctx, inst.ID, driver.LogOptions{Stderr: true}, &out, &errOut); !errors.Is(err, driver.ErrUnsupported) {
		t.Errorf("Logs of stderr alone: %v, want ErrUnsupported", err)
	}

	fctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var follow drivertest.SyncBuffer
	done := make(chan error, 1)
	go func() {
		done <- lr.Logs(fctx, inst.ID, driver.LogOptions{Stdout: true, Follow: true}, &follow, &errOut)
	}()
	eventually(t, "the follow gives the lines so far", func() bool { return strings.Contains(follow.String(), "hello stderr\n") })
	if err := cluster.AppendLog("stdout", "later"); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the follow gives the line added", func() bool { return strings.HasSuffix(follow.String(), "later\n") })
	cancel()
	select {
	case err := <-done:
		if err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("Logs with Follow after cancel: %v", err)
		}
	case <-ctx.Done():
		t.Fatal("Logs with Follow did not return after its context was cancelled")
	}
}

// TestResize: an in-place resize through pods/resize; the driver returns
// once the node reports the new amounts (KWOK's pod-resources stage plays
// the kubelet that applies them). A node that reports no container
// resources cannot resize: ErrUnsupported.
func TestResize(t *testing.T) {
	needCluster(t)
	ctx := ctxT(t)
	const ns = "resize"
	if err := cluster.CreateNamespace(ctx, ns); err != nil {
		t.Fatal(err)
	}
	d := open(t, map[string]any{"namespace": ns})
	closeT(t, d)
	rs, ok := d.(driver.Resizer)
	if !ok {
		t.Fatalf("the driver is no Resizer: %v", driver.Capabilities(d))
	}
	inst, err := create(t, d, nodes[0], spec("grows", nil))
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "the node reports the container's resources", func() bool {
		p := pod(t, ns, "grows")
		return len(p.Status.ContainerStatuses) == 1 && p.Status.ContainerStatuses[0].Resources != nil
	})
	want := driver.Resources{CPU: 600, Memory: 320 * driver.MiB}
	if err := rs.Resize(ctx, inst.ID, want); err != nil {
		t.Fatalf("Resize: %v", err)
	}
	p := pod(t, ns, "grows")
	c, cs := p.Spec.Containers[0], p.Status.ContainerStatuses[0]
	if c.Resources.Limits.Cpu().MilliValue() != 600 || c.Resources.Requests.Memory().Value() != int64(320*driver.MiB) ||
		cs.Resources.Limits.Cpu().MilliValue() != 600 || cs.State.Running == nil {
		t.Errorf("after Resize: spec %+v, status %+v", c.Resources, cs.Resources)
	}
	if got, err := d.Get(ctx, inst.ID); err != nil || got.Resources.CPU != 600 || got.Resources.Memory != 320*driver.MiB || got.State != driver.StateRunning {
		t.Errorf("Get after Resize: %+v, %v", got, err)
	}

	// On a kubelet that reports no container resources.
	old := open(t, map[string]any{"namespace": ns, "pod_labels": k8stest.NoResizeLabel + "=true"})
	closeT(t, old)
	inst, err = create(t, old, nodes[1], spec("old-kubelet", nil))
	if err != nil {
		t.Fatal(err)
	}
	if err := old.(driver.Resizer).Resize(ctx, inst.ID, want); !errors.Is(err, driver.ErrUnsupported) {
		t.Errorf("Resize where the kubelet cannot: %v, want ErrUnsupported", err)
	}
}
