package kubernetes

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/berth-dev/berth/driver"
)

// Create validates spec, maps it onto a pod and returns an operation that
// creates the pod (with Berth's tags as labels and annotations, so a crash
// at any later point leaves it findable by List), creates its config map
// and secret (owned by the pod), binds it to node when bind is set, and
// waits until the informer shows it running.
//
// Create fails at once with ErrInvalid for a bad spec, ErrUnsupported for
// what a pod cannot carry (CheckSpec), ErrNotFound for an unknown node,
// ErrRetryable when the node is not ready and ErrInsufficientCapacity when
// it is cordoned or, by the driver's own count, too full. The operation
// ends with ErrAlreadyExists when a pod of that name exists,
// ErrQuotaExceeded when a ResourceQuota refuses the pod,
// ErrInsufficientCapacity when another scheduler bound the pod elsewhere
// (a placement conflict), the kubelet refused it for want of room, or the
// cluster's scheduler found no node, and ErrPermanent when the image
// cannot be pulled. A failed create deletes what it made before it ends.
func (d *Driver) Create(ctx context.Context, node string, spec *driver.Spec) (driver.Operation, error) {
	if err := spec.Validate(); err != nil {
		return nil, fmt.Errorf("kubernetes: create: %w", err)
	}
	if err := d.CheckSpec(spec); err != nil {
		return nil, err
	}
	if err := d.fits(node, spec); err != nil {
		return nil, err
	}
	name := spec.Name
	if name == "" {
		name = newName()
	}
	if _, ok := d.markerByName(name); ok {
		return nil, driver.Errorf(driver.ErrAlreadyExists, "kubernetes: a stopped instance named %q exists in namespace %s", name, d.opts.Namespace)
	}
	pod, err := d.podFor(spec, name, node)
	if err != nil {
		return nil, fmt.Errorf("kubernetes: create %s: %w", name, err)
	}
	var made *corev1.Pod  // set by the create step, read by the later ones
	var createErr error   // the create step's failure
	seen := false         // the informer has shown the pod
	what := "pod " + name // for messages

	steps := []step{{name: "create " + what, call: func(ctx context.Context) (*driver.Instance, error) {
		p, err := d.core.createPod(ctx, d.opts.Namespace, pod)
		if err != nil {
			createErr = classify(err, "create "+what, true)
			if errors.Is(createErr, driver.ErrAlreadyExists) {
				createErr = fmt.Errorf("%w: a pod named %q exists in namespace %s", createErr, name, d.opts.Namespace)
			}
			return nil, createErr
		}
		made = p
		return instance(p), nil
	}}}
	if len(spec.ConfigFiles) > 0 {
		steps = append(steps, step{name: "create the config map of " + what, call: func(ctx context.Context) (*driver.Instance, error) {
			err := d.core.createConfigMap(ctx, d.opts.Namespace, d.filesFor(spec, made))
			return nil, classify(err, "create the config map of "+what, true)
		}})
	}
	if spec.UserData != "" {
		steps = append(steps, step{name: "create the secret of " + what, call: func(ctx context.Context) (*driver.Instance, error) {
			err := d.core.createSecret(ctx, d.opts.Namespace, d.userDataFor(spec, made))
			return nil, classify(err, "create the secret of "+what, true)
		}})
	}
	if d.opts.Bind {
		steps = append(steps, step{name: "bind " + what, call: func(ctx context.Context) (*driver.Instance, error) {
			return nil, d.bind(ctx, made, node)
		}})
	}
	steps = append(steps, step{name: "wait until " + what + " runs", check: func() (bool, *driver.Instance, error) {
		p, ok := d.podByID(idOf(made))
		if !ok {
			if seen {
				return false, nil, driver.Errorf(driver.ErrRetryable, "kubernetes: %s was deleted while it started", what)
			}
			return false, nil, nil
		}
		seen = true
		return started(p, what)
	}})

	m := d.newMachine(ctx, steps...)
	m.cleanup = []step{
		{name: "delete " + what + " after a failed create", call: func(ctx context.Context) (*driver.Instance, error) {
			var pre *metav1.Preconditions
			switch {
			case made != nil:
				pre = &metav1.Preconditions{UID: &made.UID}
			case driver.ClassOf(createErr) != driver.ErrTimeout:
				return nil, nil // the create was refused: nothing was made
			}
			// A create that timed out may have made the pod: it goes by
			// name, since its uid is unknown.
			return nil, d.deleteAll(ctx, name, pre, 0, len(spec.ConfigFiles) > 0, spec.UserData != "")
		}},
		{name: "wait until " + what + " is gone", check: func() (bool, *driver.Instance, error) {
			if made == nil {
				_, ok, _ := d.pods.GetIndexer().GetByKey(d.opts.Namespace + "/" + name)
				return !ok || createErr == nil || driver.ClassOf(createErr) != driver.ErrTimeout, nil, nil
			}
			_, ok := d.podByID(idOf(made))
			return !ok, nil, nil
		}},
	}
	return m, nil
}

// fits checks node by the driver's own count: it must be known and ready,
// not cordoned, and (when Berth binds) have room for spec.
func (d *Driver) fits(node string, spec *driver.Spec) error {
	n, err := d.nodeByName(node)
	if err != nil {
		return err
	}
	st := d.node(n)
	switch st.Status {
	case driver.NodeOffline:
		return driver.Errorf(driver.ErrRetryable, "kubernetes: node %s is offline (%s)", node, st.Reason)
	case driver.NodeDraining:
		return driver.Errorf(driver.ErrInsufficientCapacity, "kubernetes: node %s is %s", node, st.Reason)
	}
	if !d.opts.Bind {
		return nil // the cluster's scheduler decides
	}
	want := spec.Resources
	if spec.MemoryReservation > 0 {
		want.Memory = spec.MemoryReservation
	}
	if free := st.Capacity.Sub(st.Reserved); !want.Fits(free) {
		return driver.Errorf(driver.ErrInsufficientCapacity, "kubernetes: node %s has %+v free of %+v; the spec asks for %+v", node, free, st.Capacity, want)
	}
	if st.MaxInstances > 0 && st.Instances >= st.MaxInstances {
		return driver.Errorf(driver.ErrInsufficientCapacity, "kubernetes: node %s runs %d pods, its most", node, st.Instances)
	}
	for _, p := range spec.Ports {
		if p.HostPort > 0 && slices.Contains(st.Ports, p.HostPort) {
			return driver.Errorf(driver.ErrInsufficientCapacity, "kubernetes: node %s: host port %d is taken", node, p.HostPort)
		}
	}
	return nil
}

// bind binds p to node through the binding subresource. A pod that
// another scheduler bound first is a placement conflict, which the caller
// settles by placing the instance elsewhere: ErrInsufficientCapacity.
func (d *Driver) bind(ctx context.Context, p *corev1.Pod, node string) error {
	err := d.core.bindPod(ctx, p.Namespace, &corev1.Binding{
		ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: p.Namespace, UID: p.UID},
		Target:     corev1.ObjectReference{Kind: "Node", Name: node},
	})
	if err == nil {
		return nil
	}
	if apierrors.IsConflict(err) {
		cur, gerr := d.core.getPod(ctx, p.Namespace, p.Name)
		if gerr == nil && cur.UID == p.UID && cur.Spec.NodeName == node {
			return nil // a bind that went through before
		}
		where := "another node"
		if gerr == nil && cur.Spec.NodeName != "" {
			where = "node " + cur.Spec.NodeName
		}
		return fmt.Errorf("%w: kubernetes: placement conflict: pod %s was bound to %s before Berth bound it to %s: %w",
			driver.ErrInsufficientCapacity, p.Name, where, node, err)
	}
	return classify(err, "bind pod "+p.Name+" to node "+node, true)
}

// started reads a starting pod: done once it runs (or has already run to
// its end, as a short batch job may), an error when it cannot start.
func started(p *corev1.Pod, what string) (bool, *driver.Instance, error) {
	inst := instance(p)
	if p.DeletionTimestamp != nil {
		return false, inst, driver.Errorf(driver.ErrRetryable, "kubernetes: %s is being deleted by someone else", what)
	}
	switch p.Status.Phase {
	case corev1.PodRunning, corev1.PodSucceeded:
		return true, inst, nil
	case corev1.PodFailed:
		if inst.ExitCode != nil {
			return true, inst, nil // it ran and ended
		}
		if strings.HasPrefix(p.Status.Reason, "OutOf") || p.Status.Reason == "UnexpectedAdmissionError" || p.Status.Reason == "NodeAffinity" {
			return false, inst, driver.Errorf(driver.ErrInsufficientCapacity, "kubernetes: the node refused %s: %s %s", what, p.Status.Reason, p.Status.Message)
		}
		return false, inst, driver.Errorf(driver.ErrPermanent, "kubernetes: %s failed: %s %s", what, p.Status.Reason, p.Status.Message)
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable {
			return false, inst, driver.Errorf(driver.ErrInsufficientCapacity, "kubernetes: the cluster's scheduler found no node for %s: %s", what, c.Message)
		}
	}
	for _, cs := range p.Status.ContainerStatuses {
		w := cs.State.Waiting
		if w == nil {
			continue
		}
		switch w.Reason {
		case "ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull":
			return false, inst, driver.Errorf(driver.ErrPermanent, "kubernetes: image %q cannot be pulled on node %s; fix the name or make it reachable: %s: %s",
				cs.Image, p.Spec.NodeName, w.Reason, w.Message)
		case "CreateContainerConfigError", "CreateContainerError":
			return false, inst, driver.Errorf(driver.ErrPermanent, "kubernetes: %s: %s: %s", what, w.Reason, w.Message)
		}
	}
	return false, inst, nil
}

// deleteAll deletes the pod name (with the preconditions pre, after grace
// seconds) and its config map and secret when it has them. Their absence
// is no error; the pod's is ErrNotFound.
func (d *Driver) deleteAll(ctx context.Context, name string, pre *metav1.Preconditions, grace int64, files, userData bool) error {
	err := d.core.deletePod(ctx, d.opts.Namespace, name, metav1.DeleteOptions{GracePeriodSeconds: &grace, Preconditions: pre})
	if apierrors.IsConflict(err) && pre != nil {
		// The uid precondition failed: the pod of that uid is gone and
		// another of that name took its place.
		err = apierrors.NewNotFound(corev1.Resource("pods"), name)
	}
	perr := classify(err, "delete pod "+name, true)
	if perr != nil && !errors.Is(perr, driver.ErrNotFound) {
		return perr
	}
	if err := d.deleteFiles(ctx, name, files, userData); err != nil {
		return err
	}
	return perr
}

// deleteFiles deletes the config map and the secret of the pod name, those
// of them that files and userData name. Their absence is no error.
func (d *Driver) deleteFiles(ctx context.Context, name string, files, userData bool) error {
	if files {
		err := d.core.deleteConfigMap(ctx, d.opts.Namespace, name+filesSuffix)
		if err := classify(err, "delete config map "+name+filesSuffix, true); err != nil && !errors.Is(err, driver.ErrNotFound) {
			return err
		}
	}
	if userData {
		err := d.core.deleteSecret(ctx, d.opts.Namespace, name+userDataSuffix)
		if err := classify(err, "delete secret "+name+userDataSuffix, true); err != nil && !errors.Is(err, driver.ErrNotFound) {
			return err
		}
	}
	return nil
}

// Delete deletes the pod (SIGTERM, then SIGKILL after stop_grace) with its
// config map and secret, and waits until the informer shows it gone. A pod
// still there force_after past its grace period (its node gone) is removed
// by force. A stopped instance's marker goes too. An instance that is
// already gone ends the operation with ErrNotFound.
func (d *Driver) Delete(ctx context.Context, id string) (driver.Operation, error) {
	p, hasPod := d.podByID(id)
	mk, hasMarker := d.markerByID(id)
	if !hasPod && !hasMarker {
		return driver.Finished(nil, driver.Errorf(driver.ErrNotFound, "kubernetes: no instance of Berth's has id %s", id)), nil
	}
	var steps []step
	if hasPod {
		grace := int64((d.opts.StopGrace + time.Second - 1) / time.Second)
		steps = d.deletePodSteps(ctx, p, grace, true)
	}
	if hasMarker {
		steps = append(steps, d.deleteMarkerSteps(mk, !hasPod)...)
	}
	return d.newMachine(ctx, steps...), nil
}

// deletePodSteps delete the pod p after grace seconds (with its config map
// and secret when files is set) and wait until the informers show it gone
// (so that State no longer counts it), deleting it by force force_after
// past its grace.
func (d *Driver) deletePodSteps(ctx context.Context, p *corev1.Pod, grace int64, files bool) []step {
	name, uid := p.Name, p.UID
	hasFiles, hasUserData := false, false
	if files {
		hasFiles, hasUserData = volumesOf(p)
	}
	var deadline time.Time
	var force *driver.Call
	forceDelete := func() *driver.Call {
		return d.launch(ctx, "force delete pod "+name, func(ctx context.Context) (*driver.Instance, error) {
			return nil, d.deleteAll(ctx, name, &metav1.Preconditions{UID: &uid}, 0, false, false)
		})
	}
	return []step{
		{name: "delete pod " + name, call: func(ctx context.Context) (*driver.Instance, error) {
			err := d.deleteAll(ctx, name, &metav1.Preconditions{UID: &uid}, grace, hasFiles, hasUserData)
			if err != nil && !errors.Is(err, driver.ErrNotFound) && !errors.Is(err, driver.ErrTimeout) && !errors.Is(err, driver.ErrRetryable) {
				err = fmt.Errorf("%w: %w", driver.ErrDeleteFailed, err)
			}
			deadline = time.Now().Add(time.Duration(grace)*time.Second + d.opts.ForceAfter)
			return nil, err
		}},
		{name: "wait until pod " + name + " is gone", check: func() (bool, *driver.Instance, error) {
			if !d.podCounted(name, uid) {
				return true, nil, nil
			}
			if force == nil && time.Now().After(deadline) {
				force = forceDelete()
			}
			if force != nil && force.Finished() && force.Err != nil && !errors.Is(force.Err, driver.ErrNotFound) {
				err := force.Err
				force = nil
				deadline = time.Now().Add(d.opts.ForceAfter)
				d.log.Warn("kubernetes: force delete", "pod", name, "error", err)
			}
			return false, nil, nil
		}},
	}
}

// volumesOf reports whether p mounts its config files and its user data.
func volumesOf(p *corev1.Pod) (files, userData bool) {
	for _, v := range p.Spec.Volumes {
		files = files || v.Name == filesVolume
		userData = userData || v.Name == userDataVolume
	}
	return files, userData
}

// podThere reports whether the cache of Berth's pods holds the pod name of
// that uid.
func (d *Driver) podThere(name string, uid types.UID) bool {
	obj, ok, _ := d.pods.GetIndexer().GetByKey(d.opts.Namespace + "/" + name)
	return ok && obj.(*corev1.Pod).UID == uid
}

// podCounted reports whether either pod cache holds the pod name of that
// uid: while one does, State counts it in its node's reservation.
func (d *Driver) podCounted(name string, uid types.UID) bool {
	if d.podThere(name, uid) {
		return true
	}
	obj, ok, _ := d.allPods.GetIndexer().GetByKey(d.opts.Namespace + "/" + name)
	return ok && obj.(*corev1.Pod).UID == uid
}

// podByID returns Berth's pod of instance id id from the cache (preload pods have none).
func (d *Driver) podByID(id string) (*corev1.Pod, bool) {
	objs, _ := d.pods.GetIndexer().ByIndex(byID, id)
	if len(objs) == 0 {
		return nil, false
	}
	return objs[0].(*corev1.Pod), true
}

// Get returns the instance id: its pod, or its marker when it is
// stopped, from the cache.
func (d *Driver) Get(ctx context.Context, id string) (*driver.Instance, error) {
	if p, ok := d.podByID(id); ok {
		return instance(p), nil
	}
	if m, ok := d.markerByID(id); ok {
		return stoppedInstance(m), nil
	}
	return nil, driver.Errorf(driver.ErrNotFound, "kubernetes: no instance of Berth's has id %s", id)
}

// Find returns the instance of Berth's pod named name, or the stopped
// instance of that name, from the cache.
func (d *Driver) Find(ctx context.Context, name string) (*driver.Instance, error) {
	obj, ok, _ := d.pods.GetIndexer().GetByKey(d.opts.Namespace + "/" + name)
	if ok && !isPreload(obj.(*corev1.Pod)) {
		return instance(obj.(*corev1.Pod)), nil
	}
	if m, ok := d.markerByName(name); ok {
		return stoppedInstance(m), nil
	}
	return nil, driver.Errorf(driver.ErrNotFound, "kubernetes: no pod of Berth's is named %q in namespace %s", name, d.opts.Namespace)
}

// List returns the instances of Berth's pods and stopped instances whose
// tags include tags, from the cache, sorted by name.
func (d *Driver) List(ctx context.Context, tags map[string]string) ([]*driver.Instance, error) {
	var out []*driver.Instance
	match := func(have map[string]string) bool {
		for k, v := range tags {
			if have[k] != v {
				return false
			}
		}
		return true
	}
	for _, obj := range d.pods.GetStore().List() {
		p := obj.(*corev1.Pod)
		if !isPreload(p) && match(tagsOf(p)) {
			out = append(out, instance(p))
		}
	}
	for _, obj := range d.stopped.GetStore().List() {
		m := obj.(*corev1.ConfigMap)
		if _, running := d.podByID(m.Labels[labelID]); !running && match(tagsIn(m.Annotations)) {
			out = append(out, stoppedInstance(m))
		}
	}
	slices.SortFunc(out, func(a, b *driver.Instance) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}
