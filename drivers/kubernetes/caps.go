package kubernetes

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/tools/cache"

	"github.com/berth-dev/berth/driver"
)

// logs copies the output of the pod's container through pods/log, with
// the tail, follow and timestamps options the API has. Kubernetes keeps
// stdout and stderr as one stream (splitting them is an alpha feature), so
// all of it goes to stdout when stdout is asked for; asking for stderr
// alone is ErrUnsupported.
func (d *Driver) logs(ctx context.Context, id string, opts driver.LogOptions, stdout, stderr io.Writer) error {
	p, err := d.livePod(id)
	if err != nil {
		return err
	}
	if !opts.Stdout {
		if opts.Stderr {
			return driver.Errorf(driver.ErrUnsupported, "kubernetes: pod logs hold stdout and stderr as one stream; ask for stdout")
		}
		return nil
	}
	lo := &corev1.PodLogOptions{Container: containerName, Follow: opts.Follow, Timestamps: opts.Timestamps}
	if opts.Tail > 0 {
		tail := int64(opts.Tail)
		lo.TailLines = &tail
	}
	rc, err := d.core.podLogs(ctx, p.Namespace, p.Name, lo)
	if err != nil {
		return classify(err, "logs of pod "+p.Name, false)
	}
	defer rc.Close()
	if _, err := io.Copy(stdout, rc); err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return classify(err, "logs of pod "+p.Name, false)
	}
	return nil
}

// resize changes the cpus and memory of the pod's container in place
// through the pods/resize subresource, limits and requests alike (a
// memory request below the limit is kept, so that the pod's QoS class does
// not change, which the API refuses), and waits until the informer shows
// that the kubelet applied the new amounts (the container's status reports
// them), at most call_timeout. A resize the kubelet finds infeasible on its
// node is ErrInsufficientCapacity.
func (d *Driver) resize(ctx context.Context, id string, r driver.Resources) error {
	p, err := d.livePod(id)
	if err != nil {
		return err
	}
	var c *corev1.Container
	for i := range p.Spec.Containers {
		if p.Spec.Containers[i].Name == containerName {
			c = &p.Spec.Containers[i]
		}
	}
	if c == nil {
		return driver.Errorf(driver.ErrPermanent, "kubernetes: pod %s has no container %q", p.Name, containerName)
	}
	want := resourcesOf(c.Resources.Limits)
	if r.CPU > 0 {
		want.CPU = r.CPU
	}
	if r.Memory > 0 {
		want.Memory = r.Memory
	}
	limits := resourceList(driver.Resources{CPU: want.CPU, Memory: want.Memory})
	requests := resourceList(driver.Resources{CPU: want.CPU, Memory: want.Memory})
	if q, ok := c.Resources.Requests[corev1.ResourceMemory]; ok {
		if l, ok := c.Resources.Limits[corev1.ResourceMemory]; ok && q.Cmp(l) < 0 && driver.Bytes(q.Value()) < want.Memory {
			requests[corev1.ResourceMemory] = q
		}
	}
	patch, err := json.Marshal(map[string]any{"spec": map[string]any{"containers": []any{map[string]any{
		"name": containerName, "resources": map[string]any{"limits": limits, "requests": requests}}}}})
	if err != nil {
		return err
	}
	cctx, cancel := d.callCtx(ctx)
	defer cancel()
	if err := d.core.resizePod(cctx, p.Namespace, p.Name, patch); err != nil {
		if apierrors.IsInvalid(err) && strings.Contains(err.Error(), "without support for resize") {
			// The node's kubelet reports no container resources: it
			// predates in-place resize (or is no kubelet at all).
			return fmt.Errorf("%w: kubernetes: resize pod %s: node %s cannot resize pods in place: %w", driver.ErrUnsupported, p.Name, p.Spec.NodeName, err)
		}
		return classify(err, "resize pod "+p.Name, true)
	}
	for {
		cur, ok := d.podByID(id)
		if !ok {
			return driver.Errorf(driver.ErrNotFound, "kubernetes: pod %s went away during the resize", p.Name)
		}
		applied, err := resized(cur, want)
		if err != nil || applied {
			return err
		}
		select {
		case <-cctx.Done():
			return fmt.Errorf("%w: kubernetes: resize pod %s: the kubelet has not applied the new resources (the pod's spec has them): %w", driver.ErrTimeout, p.Name, cctx.Err())
		case <-time.After(watchWait):
		}
	}
}

// resized reads a pod being resized to want: done once its spec asks for
// want and its kubelet reports the container running with want; an error
// when the kubelet finds the resize infeasible on its node.
func resized(p *corev1.Pod, want driver.Resources) (bool, error) {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodResizePending && c.Reason == corev1.PodReasonInfeasible {
			return false, driver.Errorf(driver.ErrInsufficientCapacity, "kubernetes: resize pod %s: node %s cannot give it: %s", p.Name, p.Spec.NodeName, c.Message)
		}
	}
	if got := instance(p).Resources; got.CPU != want.CPU || got.Memory != want.Memory {
		return false, nil
	}
	for _, cs := range p.Status.ContainerStatuses {
		if cs.Name == containerName && cs.Resources != nil {
			got := resourcesOf(cs.Resources.Limits)
			return got.CPU == want.CPU && got.Memory == want.Memory, nil
		}
	}
	return false, nil
}

// livePod returns the pod of instance id: ErrNotFound when there is no
// such instance, ErrPermanent when it is stopped (it has no pod).
func (d *Driver) livePod(id string) (*corev1.Pod, error) {
	if p, ok := d.podByID(id); ok {
		return p, nil
	}
	if _, ok := d.markerByID(id); ok {
		return nil, driver.Errorf(driver.ErrPermanent, "kubernetes: instance %s is stopped: it has no pod until it is started", id)
	}
	return nil, driver.Errorf(driver.ErrNotFound, "kubernetes: no instance of Berth's has id %s", id)
}

// Watch reports, from the informers, each pod of Berth's that starts
// (EventStart), ends (EventDie, with its exit code), begins terminating
// (EventStop) or is deleted (EventDelete; EventDie in state stopped when
// Stop deleted it), and each node whose status changes (EventNode), until
// ctx ends. fn is called from Watch's own
// goroutine, one event at a time.
func (d *Driver) Watch(ctx context.Context, fn func(driver.Event)) error {
	events := make(chan driver.Event, 256)
	emit := func(e driver.Event) {
		select {
		case events <- e:
		case <-ctx.Done():
		}
	}
	podReg, err := d.pods.AddEventHandler(cache.ResourceEventHandlerFuncs{
		UpdateFunc: func(oldObj, newObj any) {
			oldPod, ok1 := oldObj.(*corev1.Pod)
			newPod, ok2 := newObj.(*corev1.Pod)
			if !ok1 || !ok2 || isPreload(newPod) {
				return
			}
			if e, ok := podEvent(oldPod, newPod); ok {
				emit(e)
			}
		},
		DeleteFunc: func(obj any) {
			if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = t.Obj
			}
			p, ok := obj.(*corev1.Pod)
			if !ok || isPreload(p) {
				return
			}
			if _, stopped := d.markerByID(idOf(p)); stopped {
				// Stop keeps the instance: its pod ended.
				emit(driver.Event{Type: driver.EventDie, Instance: idOf(p), Node: p.Spec.NodeName, State: driver.StateStopped,
					Message: "stopped", Tags: tagsOf(p), Time: time.Now()})
				return
			}
			emit(driver.Event{Type: driver.EventDelete, Instance: idOf(p), Node: p.Spec.NodeName, Tags: tagsOf(p), Time: time.Now()})
		},
	})
	if err != nil {
		return fmt.Errorf("%w: kubernetes: watch: %w", driver.ErrRetryable, err)
	}
	defer func() { _ = d.pods.RemoveEventHandler(podReg) }()
	nodeReg, err := d.nodes.AddEventHandler(cache.ResourceEventHandlerFuncs{
		UpdateFunc: func(oldObj, newObj any) {
			oldNode, ok1 := oldObj.(*corev1.Node)
			newNode, ok2 := newObj.(*corev1.Node)
			if !ok1 || !ok2 {
				return
			}
			before, _ := nodeStatus(oldNode)
			after, why := nodeStatus(newNode)
			if before != after {
				emit(driver.Event{Type: driver.EventNode, Node: newNode.Name, Message: string(after) + " " + why, Time: time.Now()})
			}
		},
		DeleteFunc: func(obj any) {
			if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = t.Obj
			}
			if n, ok := obj.(*corev1.Node); ok {
				emit(driver.Event{Type: driver.EventNode, Node: n.Name, Message: "offline: the node was deleted", Time: time.Now()})
			}
		},
	})
	if err != nil {
		return fmt.Errorf("%w: kubernetes: watch: %w", driver.ErrRetryable, err)
	}
	defer func() { _ = d.nodes.RemoveEventHandler(nodeReg) }()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case e := <-events:
			fn(e)
		}
	}
}

// podEvent is the event of a pod's change, if it is one Watch reports.
func podEvent(oldPod, newPod *corev1.Pod) (driver.Event, bool) {
	e := driver.Event{Instance: idOf(newPod), Node: newPod.Spec.NodeName, Tags: tagsOf(newPod), Time: time.Now()}
	inst := instance(newPod)
	e.State = inst.State
	ended := func(p *corev1.Pod) bool {
		return p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed
	}
	switch {
	case oldPod.DeletionTimestamp == nil && newPod.DeletionTimestamp != nil:
		e.Type = driver.EventStop
	case oldPod.Status.Phase != corev1.PodRunning && newPod.Status.Phase == corev1.PodRunning:
		e.Type = driver.EventStart
	case !ended(oldPod) && ended(newPod):
		e.Type = driver.EventDie
		if inst.ExitCode != nil {
			e.Message = fmt.Sprintf("exit code %d", *inst.ExitCode)
		}
		if inst.Message != "" {
			e.Message = inst.Message
		}
	default:
		return e, false
	}
	return e, true
}
