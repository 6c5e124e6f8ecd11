package kubernetes

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/berth-dev/berth/driver"
)

// A pod cannot be stopped and started again as itself: its containers end
// only when the pod is deleted. So Stop keeps what is needed to make the
// pod again in a marker, a config map named <pod>-stopped in the driver's
// namespace (labels berth/stopped=true and berth/id=<instance id>; the pod
// to make again, as JSON, under the key "pod"; the node in an
// annotation), and then deletes the pod. Start makes the pod again from
// the marker, with the label berth/id, and deletes the marker once the
// pod runs. The instance keeps its id throughout: the uid of its first
// pod. The marker lives in the cluster, so a stopped instance survives a
// restart of Berth, and List shows it (leak cleanup deletes it).
//
// The pod's config map and secret (config files, user data) belong to the
// pod (an owner reference, for the cluster's garbage collector); while the
// instance is stopped they belong to the marker instead.

// annotationNode on a marker names the node the stopped pod ran on.
const annotationNode = "berth/node"

// markerByID returns the marker of the stopped instance id from the cache.
func (d *Driver) markerByID(id string) (*corev1.ConfigMap, bool) {
	if id == "" {
		return nil, false
	}
	objs, _ := d.stopped.GetIndexer().ByIndex(byID, id)
	if len(objs) == 0 {
		return nil, false
	}
	return objs[0].(*corev1.ConfigMap), true
}

// markerByName returns the marker of the stopped instance whose pod is
// named name.
func (d *Driver) markerByName(name string) (*corev1.ConfigMap, bool) {
	obj, ok, _ := d.stopped.GetIndexer().GetByKey(d.opts.Namespace + "/" + name + markerSuffix)
	if !ok {
		return nil, false
	}
	return obj.(*corev1.ConfigMap), true
}

// markerFor is the marker of Berth's pod p.
func (d *Driver) markerFor(p *corev1.Pod) (*corev1.ConfigMap, error) {
	id := idOf(p)
	again := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: p.Namespace, Labels: maps.Clone(p.Labels), Annotations: maps.Clone(p.Annotations)},
		Spec:       *p.Spec.DeepCopy(),
	}
	if again.Labels == nil {
		again.Labels = map[string]string{}
	}
	if again.Annotations == nil {
		again.Annotations = map[string]string{}
	}
	again.Labels[labelID] = id
	if _, ok := again.Annotations[annotationCreated]; !ok {
		again.Annotations[annotationCreated] = p.CreationTimestamp.UTC().Format(time.RFC3339)
	}
	again.Spec.NodeName = ""
	again.Spec.EphemeralContainers = nil
	b, err := json.Marshal(again)
	if err != nil {
		return nil, err
	}
	ann := map[string]string{annotationNode: p.Spec.NodeName}
	for _, k := range []string{annotationTags, annotationLabels} {
		if v, ok := p.Annotations[k]; ok {
			ann[k] = v
		}
	}
	return &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: p.Name + markerSuffix, Namespace: p.Namespace, Annotations: ann,
			Labels: map[string]string{labelManaged: "true", labelStopped: "true", labelID: id}},
		Data: map[string]string{markerPodKey: string(b)},
	}, nil
}

// podOfMarker reads the pod a marker keeps and the node it ran on.
func podOfMarker(m *corev1.ConfigMap) (*corev1.Pod, string, error) {
	p := &corev1.Pod{}
	if err := json.Unmarshal([]byte(m.Data[markerPodKey]), p); err != nil {
		return nil, "", fmt.Errorf("marker %s holds no pod: %w", m.Name, err)
	}
	if p.Name == "" || len(p.Spec.Containers) == 0 {
		return nil, "", fmt.Errorf("marker %s holds no pod", m.Name)
	}
	return p, m.Annotations[annotationNode], nil
}

// stoppedInstance maps a marker: the instance as its pod was, stopped.
func stoppedInstance(m *corev1.ConfigMap) *driver.Instance {
	p, node, err := podOfMarker(m)
	if err != nil {
		return &driver.Instance{ID: m.Labels[labelID], Name: strings.TrimSuffix(m.Name, markerSuffix), Kind: driver.KindContainer,
			Node: m.Annotations[annotationNode], Tags: tagsIn(m.Annotations), State: driver.StateStopped, RawState: "Stopped",
			Message: err.Error(), Finished: m.CreationTimestamp.Time}
	}
	in := instance(p)
	in.ID = m.Labels[labelID]
	in.Node = node
	in.State, in.RawState, in.Message = driver.StateStopped, "Stopped", ""
	in.Started, in.Finished, in.ExitCode, in.Addresses = time.Time{}, m.CreationTimestamp.Time, nil, nil
	for i := range in.Ports {
		in.Ports[i].HostIP = ""
	}
	return in
}

// ended reports whether the pod ran to its end by itself.
func ended(p *corev1.Pod) bool {
	return p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed
}

// stopGrace is a stop's grace period in whole seconds, rounded up, at
// least one: a grace of zero would remove the pod from the API at once,
// before its kubelet has killed the containers, and Start could then make
// the pod again beside them.
func stopGrace(grace time.Duration) int64 {
	return max(1, int64((grace+time.Second-1)/time.Second))
}

// Stop stops the instance: it keeps the pod in a marker, deletes the pod
// (SIGTERM, then SIGKILL after grace, at least a second), and returns once
// the informer shows the pod gone; the instance is then stopped, with the
// same id. A pod that ran to its end is left as it is (exited). Stopping a
// stopped instance is not an error; an unknown id is ErrNotFound; a pod
// that someone is deleting is ErrPermanent.
func (d *Driver) Stop(ctx context.Context, id string, grace time.Duration) error {
	p, ok := d.podByID(id)
	if !ok {
		if _, ok := d.markerByID(id); ok {
			return nil
		}
		return driver.Errorf(driver.ErrNotFound, "kubernetes: no instance of Berth's has id %s", id)
	}
	if ended(p) {
		return nil
	}
	return d.stop(ctx, p, grace)
}

// stop keeps p in a marker and deletes it; see Stop.
func (d *Driver) stop(ctx context.Context, p *corev1.Pod, grace time.Duration) error {
	id, what := idOf(p), "pod "+p.Name
	if _, stopping := d.markerByID(id); p.DeletionTimestamp != nil && !stopping {
		return driver.Errorf(driver.ErrPermanent, "kubernetes: stop: %s is being deleted", what)
	}
	m, err := d.ensureMarker(ctx, p)
	if err != nil {
		return err
	}
	// The marker is in the cache before the pod goes: Get never misses
	// the instance, and Watch tells this stop from a delete.
	if err := d.waitCache(ctx, "the marker of "+what, func() bool { _, ok := d.markerByID(id); return ok }); err != nil {
		return err
	}
	if err := d.moveFiles(ctx, p, ownerRef("ConfigMap", m.Name, m.UID)); err != nil {
		return err
	}
	_, err = driver.Drive(ctx, d.newMachine(ctx, d.deletePodSteps(ctx, p, stopGrace(grace), false)...))
	if errors.Is(err, driver.ErrNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("kubernetes: stop %s: %w", what, err)
	}
	return nil
}

// ensureMarker returns the marker of p's instance, creating it when there
// is none.
func (d *Driver) ensureMarker(ctx context.Context, p *corev1.Pod) (*corev1.ConfigMap, error) {
	if m, ok := d.markerByID(idOf(p)); ok {
		return m, nil
	}
	want, err := d.markerFor(p)
	if err != nil {
		return nil, fmt.Errorf("kubernetes: stop pod %s: %w", p.Name, err)
	}
	cctx, cancel := d.callCtx(ctx)
	defer cancel()
	m, err := d.core.createMarker(cctx, d.opts.Namespace, want)
	if apierrors.IsAlreadyExists(err) {
		m, err = d.core.getConfigMap(cctx, d.opts.Namespace, want.Name)
		if err == nil && m.Labels[labelID] != want.Labels[labelID] {
			return nil, driver.Errorf(driver.ErrAlreadyExists, "kubernetes: stop pod %s: config map %s exists and is not the marker of instance %s",
				p.Name, want.Name, want.Labels[labelID])
		}
	}
	if err != nil {
		return nil, classify(err, "create the marker of pod "+p.Name, true)
	}
	return m, nil
}

// waitCache polls the informer caches until cond holds, for at most the
// call timeout.
func (d *Driver) waitCache(ctx context.Context, what string, cond func() bool) error {
	cctx, cancel := d.callCtx(ctx)
	defer cancel()
	for !cond() {
		select {
		case <-cctx.Done():
			return fmt.Errorf("%w: kubernetes: the informer never showed %s: %w", driver.ErrTimeout, what, cctx.Err())
		case <-time.After(watchWait):
		}
	}
	return nil
}

func ownerRef(kind, name string, uid types.UID) metav1.OwnerReference {
	return metav1.OwnerReference{APIVersion: "v1", Kind: kind, Name: name, UID: uid}
}

// moveFiles makes owner the owner of p's config map and secret, those it
// has. One that is gone is left so.
func (d *Driver) moveFiles(ctx context.Context, p *corev1.Pod, owner metav1.OwnerReference) error {
	files, userData := volumesOf(p)
	for _, o := range []struct {
		has            bool
		resource, name string
	}{{files, "configmaps", p.Name + filesSuffix}, {userData, "secrets", p.Name + userDataSuffix}} {
		if !o.has {
			continue
		}
		cctx, cancel := d.callCtx(ctx)
		err := d.core.setOwner(cctx, d.opts.Namespace, o.resource, o.name, owner)
		cancel()
		if err := classify(err, "give "+o.name+" to "+owner.Name, true); err != nil && !errors.Is(err, driver.ErrNotFound) {
			return err
		}
	}
	return nil
}

// Start starts a stopped or exited instance: it makes the pod again from
// the marker (an exited pod is stopped first), binds it to the node it ran
// on (when bind is set; the cluster's scheduler places it otherwise),
// waits until it runs, and then deletes the marker. A pod that cannot run
// is deleted and the instance stays stopped; the error says why, as
// Create's would (ErrInsufficientCapacity, ErrRetryable for a node that
// is not ready, ErrPermanent...). Starting a running instance is not an
// error; an unknown id is ErrNotFound.
func (d *Driver) Start(ctx context.Context, id string) error {
	if p, ok := d.podByID(id); ok {
		_, stopping := d.markerByID(id)
		switch {
		case p.DeletionTimestamp != nil && stopping:
			// A stop cut short: finish it.
			if err := d.stop(ctx, p, d.opts.StopGrace); err != nil {
				return err
			}
		case ended(p):
			if err := d.stop(ctx, p, 0); err != nil {
				return err
			}
		case p.DeletionTimestamp != nil:
			return driver.Errorf(driver.ErrPermanent, "kubernetes: start: pod %s is being deleted", p.Name)
		default:
			if m, ok := d.markerByID(id); ok {
				d.dropMarker(ctx, m) // left by a start cut short
			}
			return nil
		}
	}
	m, ok := d.markerByID(id)
	if !ok {
		return driver.Errorf(driver.ErrNotFound, "kubernetes: no instance of Berth's has id %s", id)
	}
	return d.startFrom(ctx, id, m)
}

// startFrom makes the pod of the stopped instance id again from its
// marker m; see Start.
func (d *Driver) startFrom(ctx context.Context, id string, m *corev1.ConfigMap) error {
	pod, node, err := podOfMarker(m)
	if err != nil {
		return driver.Errorf(driver.ErrPermanent, "kubernetes: start %s: %v", id, err)
	}
	what := "pod " + pod.Name
	if d.opts.Bind {
		if err := d.fits(node, specOf(pod)); err != nil {
			return fmt.Errorf("kubernetes: start %s: %w", what, err)
		}
	}
	cctx, cancel := d.callCtx(ctx)
	made, err := d.core.createPod(cctx, d.opts.Namespace, pod)
	cancel()
	if err != nil {
		err = classify(err, "create "+what, true)
		if errors.Is(err, driver.ErrAlreadyExists) {
			err = fmt.Errorf("%w: another pod named %q exists in namespace %s", err, pod.Name, d.opts.Namespace)
		}
		return err
	}
	// undo deletes the pod that cannot run, so that the instance stays
	// stopped.
	undo := func(cause error) error {
		uctx, cancel := d.callCtx(context.WithoutCancel(ctx))
		defer cancel()
		if err := d.deleteAll(uctx, made.Name, &metav1.Preconditions{UID: &made.UID}, 0, false, false); err != nil && !errors.Is(err, driver.ErrNotFound) {
			return fmt.Errorf("%w; deleting the new pod failed too, so it may be left: %v", cause, err)
		}
		if err := d.waitCache(uctx, "the new "+what+" gone", func() bool { return !d.podThere(made.Name, made.UID) }); err != nil {
			return fmt.Errorf("%w; %v", cause, err)
		}
		return cause
	}
	if d.opts.Bind {
		bctx, cancel := d.callCtx(ctx)
		err := d.bind(bctx, made, node)
		cancel()
		if err != nil {
			return undo(err)
		}
	}
	for {
		if obj, ok, _ := d.pods.GetIndexer().GetByKey(d.opts.Namespace + "/" + made.Name); ok && obj.(*corev1.Pod).UID == made.UID {
			done, _, err := started(obj.(*corev1.Pod), what)
			if err != nil {
				return undo(err)
			}
			if done {
				break
			}
		}
		select {
		case <-ctx.Done():
			return undo(fmt.Errorf("%w: kubernetes: start %s: it did not run in time: %w", driver.ErrTimeout, what, ctx.Err()))
		case <-time.After(watchWait):
		}
	}
	if err := d.moveFiles(ctx, made, ownerRef("Pod", made.Name, made.UID)); err != nil {
		d.log.Warn("kubernetes: start: the config map and secret stay with the marker", "pod", made.Name, "error", err)
	}
	d.dropMarker(ctx, m)
	return nil
}

// specOf is what fits needs to know of a pod: its resources, its memory
// request when lower, its host ports.
func specOf(p *corev1.Pod) *driver.Spec {
	in := instance(p)
	sp := &driver.Spec{Resources: in.Resources}
	if len(p.Spec.Containers) > 0 {
		if q, ok := p.Spec.Containers[0].Resources.Requests[corev1.ResourceMemory]; ok && driver.Bytes(q.Value()) < sp.Resources.Memory {
			sp.MemoryReservation = driver.Bytes(q.Value())
		}
	}
	for _, port := range in.Ports {
		sp.Ports = append(sp.Ports, driver.Port{ContainerPort: port.ContainerPort, HostPort: port.HostPort, Protocol: port.Protocol})
	}
	return sp
}

// dropMarker deletes the marker m, if it is still there; a failure is
// logged, since the pod (which Get prefers) runs.
func (d *Driver) dropMarker(ctx context.Context, m *corev1.ConfigMap) {
	cctx, cancel := d.callCtx(ctx)
	defer cancel()
	err := d.core.deleteMarker(cctx, d.opts.Namespace, m.Name, m.UID)
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		d.log.Warn("kubernetes: delete the marker of a started instance", "marker", m.Name, "error", err)
	}
}

// deleteMarkerSteps delete the marker of a stopped instance (and, when
// files is set, the config map and secret it keeps) and wait until the
// informer shows it gone.
func (d *Driver) deleteMarkerSteps(m *corev1.ConfigMap, files bool) []step {
	hasFiles, hasUserData := false, false
	if p, _, err := podOfMarker(m); err == nil && files {
		hasFiles, hasUserData = volumesOf(p)
	}
	name := strings.TrimSuffix(m.Name, markerSuffix)
	return []step{
		{name: "delete the marker " + m.Name, call: func(ctx context.Context) (*driver.Instance, error) {
			err := d.core.deleteMarker(ctx, d.opts.Namespace, m.Name, m.UID)
			if apierrors.IsConflict(err) {
				err = nil // another marker of that name: not this one
			}
			if err := classify(err, "delete the marker "+m.Name, true); err != nil && !errors.Is(err, driver.ErrNotFound) {
				return nil, err
			}
			return nil, d.deleteFiles(ctx, name, hasFiles, hasUserData)
		}},
		{name: "wait until the marker " + m.Name + " is gone", check: func() (bool, *driver.Instance, error) {
			obj, ok, _ := d.stopped.GetIndexer().GetByKey(m.Namespace + "/" + m.Name)
			return !ok || obj.(*corev1.ConfigMap).UID != m.UID, nil, nil
		}},
	}
}
