package kubernetes

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/berth-dev/berth/driver"
)

// annotationImage on a preload pod names the image it pulls.
const annotationImage = "berth/image"

// Preload makes image present on each of nodes (every online node of
// Berth's when nodes is empty): on each it runs a short-lived pod bound to
// that node whose one container is the image (command "true", so that an
// image whose entry point is a server does not start it). The image is
// present once the kubelet has pulled it: the pod or the container runs
// or has run, or the container could not start for another reason than
// the pull. The pod is then
// deleted. The driver remembers the images it preloaded on each node and
// Images lists them beside those the node reports (a kubelet reports at
// most 50, and may remove unused images later). An image that cannot be
// pulled is ErrPermanent; an unknown node ErrNotFound; a node that is not
// ready ErrRetryable. progress, when not nil, hears "pulling", then
// "present" or "failed", for each node.
func (d *Driver) Preload(ctx context.Context, image string, nodes []string, progress func(driver.PreloadProgress)) error {
	if image == "" || strings.ContainsAny(image, " \t\r\n") || len(image) > 4096 {
		return &driver.FieldError{Path: "image", Reason: fmt.Sprintf("%q: not an image reference", image)}
	}
	if len(nodes) == 0 {
		st, err := d.State(ctx)
		if err != nil {
			return err
		}
		for _, n := range st.Nodes {
			if n.Status == driver.NodeOnline {
				nodes = append(nodes, n.Name)
			}
		}
	}
	nodes = slices.Compact(slices.Sorted(slices.Values(nodes)))
	for _, n := range nodes {
		if _, err := d.nodeByName(n); err != nil {
			return err
		}
	}
	var pmu sync.Mutex
	report := func(p driver.PreloadProgress) {
		if progress != nil {
			pmu.Lock()
			defer pmu.Unlock()
			progress(p)
		}
	}
	errs := make([]error, len(nodes))
	var wg sync.WaitGroup
	for i, n := range nodes {
		wg.Go(func() {
			report(driver.PreloadProgress{Node: n, Image: image, Status: "pulling"})
			errs[i] = d.preloadOne(ctx, n, image)
			if errs[i] != nil {
				report(driver.PreloadProgress{Node: n, Image: image, Status: "failed", Err: errs[i].Error()})
				return
			}
			d.mu.Lock()
			if d.preloaded == nil {
				d.preloaded = map[string]map[string]bool{}
			}
			if d.preloaded[n] == nil {
				d.preloaded[n] = map[string]bool{}
			}
			d.preloaded[n][image] = true
			d.mu.Unlock()
			report(driver.PreloadProgress{Node: n, Image: image, Status: "present"})
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// preloadName is the name of the preload pod of image on node: the same
// for the same pair, so that a preload cut short is taken up again rather
// than doubled.
func preloadName(node, image string) string {
	sum := sha256.Sum256([]byte(node + "\x00" + image))
	return "berth-preload-" + hex.EncodeToString(sum[:10])
}

// preloadPod is the pod that pulls image on node.
func (d *Driver) preloadPod(node, image string) *corev1.Pod {
	name := preloadName(node, image)
	grace := int64(0)
	small := resourceList(driver.Resources{CPU: 10, Memory: 32 * driver.MiB})
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: d.opts.Namespace,
			Labels:      map[string]string{labelManaged: "true", labelPreload: strings.TrimPrefix(name, "berth-preload-")},
			Annotations: map[string]string{annotationImage: image}},
		Spec: corev1.PodSpec{
			NodeName:                      node,
			RestartPolicy:                 corev1.RestartPolicyNever,
			TerminationGracePeriodSeconds: &grace,
			AutomountServiceAccountToken:  new(false),
			// The image goes to every node Berth was asked for, tainted or
			// not.
			Tolerations: []corev1.Toleration{{Operator: corev1.TolerationOpExists}},
			Containers: []corev1.Container{{
				Name:            containerName,
				Image:           image,
				Command:         []string{"true"},
				ImagePullPolicy: corev1.PullIfNotPresent,
				Resources:       corev1.ResourceRequirements{Requests: small, Limits: small},
			}},
		},
	}
}

// preloadOne runs the preload pod of image on node until the image is
// there, and deletes it.
func (d *Driver) preloadOne(ctx context.Context, node, image string) error {
	n, err := d.nodeByName(node)
	if err != nil {
		return err
	}
	if st, why := nodeStatus(n); st == driver.NodeOffline {
		return driver.Errorf(driver.ErrRetryable, "kubernetes: preload %s: node %s is offline (%s)", image, node, why)
	}
	want := d.preloadPod(node, image)
	what := "preload pod " + want.Name + " (" + image + " on " + node + ")"
	cctx, cancel := d.callCtx(ctx)
	made, err := d.core.createPod(cctx, d.opts.Namespace, want)
	cancel()
	if apierrors.IsAlreadyExists(err) {
		// Left by a preload cut short: it pulls the same image on the
		// same node.
		cctx, cancel := d.callCtx(ctx)
		made, err = d.core.getPod(cctx, d.opts.Namespace, want.Name)
		cancel()
	}
	if err != nil {
		return classify(err, "create "+what, true)
	}
	var pulled error
	for {
		obj, ok, _ := d.pods.GetIndexer().GetByKey(d.opts.Namespace + "/" + want.Name)
		if ok && obj.(*corev1.Pod).UID == made.UID {
			done, err := imagePulled(obj.(*corev1.Pod), what)
			if err != nil || done {
				pulled = err
				break
			}
		}
		select {
		case <-ctx.Done():
			pulled = fmt.Errorf("%w: kubernetes: %s: the image was not pulled in time: %w", driver.ErrTimeout, what, ctx.Err())
		case <-time.After(watchWait):
			continue
		}
		break
	}
	dctx, cancel := d.callCtx(context.WithoutCancel(ctx))
	defer cancel()
	err = d.deleteAll(dctx, made.Name, &metav1.Preconditions{UID: &made.UID}, 0, false, false)
	if err != nil && !errors.Is(err, driver.ErrNotFound) {
		return errors.Join(pulled, err)
	}
	if err := d.waitCache(dctx, what+" gone", func() bool { return !d.podThere(made.Name, made.UID) }); err != nil {
		return errors.Join(pulled, err)
	}
	return pulled
}

// imagePulled reads a preload pod: done once its image is on the node, an
// error when it cannot be pulled or the pod cannot go there.
func imagePulled(p *corev1.Pod, what string) (bool, error) {
	if p.DeletionTimestamp != nil {
		return false, driver.Errorf(driver.ErrRetryable, "kubernetes: %s is being deleted by someone else", what)
	}
	if p.Status.Phase == corev1.PodRunning || p.Status.Phase == corev1.PodSucceeded {
		return true, nil
	}
	for _, cs := range p.Status.ContainerStatuses {
		switch {
		case cs.ImageID != "" || cs.State.Running != nil || cs.State.Terminated != nil:
			return true, nil
		case cs.State.Waiting != nil:
			switch cs.State.Waiting.Reason {
			case "ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull":
				return false, driver.Errorf(driver.ErrPermanent, "kubernetes: %s: the image cannot be pulled: %s: %s", what, cs.State.Waiting.Reason, cs.State.Waiting.Message)
			case "", "ContainerCreating", "PodInitializing":
			default:
				return true, nil // pulled; the container could not start for another reason
			}
		}
	}
	if p.Status.Phase == corev1.PodFailed {
		if strings.HasPrefix(p.Status.Reason, "OutOf") {
			return false, driver.Errorf(driver.ErrInsufficientCapacity, "kubernetes: the node refused %s: %s %s", what, p.Status.Reason, p.Status.Message)
		}
		return false, driver.Errorf(driver.ErrPermanent, "kubernetes: %s failed: %s %s", what, p.Status.Reason, p.Status.Message)
	}
	return false, nil
}

// preloadedOn returns the images Preload pulled on node.
func (d *Driver) preloadedOn(node string) []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []string
	for img := range d.preloaded[node] {
		out = append(out, img)
	}
	slices.Sort(out)
	return out
}
