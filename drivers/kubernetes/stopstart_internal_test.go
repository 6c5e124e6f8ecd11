package kubernetes

import (
	"errors"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/berth-dev/berth/driver"
)

// TestMarkerRoundTrip: the marker keeps the pod to make again (unbound,
// labelled with the instance id, with its first creation time) and the
// instance it shows is the pod's, stopped, on its node.
func TestMarkerRoundTrip(t *testing.T) {
	d := &Driver{opts: *defaultOptions()}
	made := metav1.NewTime(time.Date(2026, 11, 25, 10, 0, 0, 0, time.UTC))
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "default", UID: "uid-1", CreationTimestamp: made,
			Labels:      map[string]string{labelManaged: "true", "app": "web"},
			Annotations: map[string]string{annotationTags: `{"berth.managed":"true","berth.cluster":"c1"}`}},
		Spec: corev1.PodSpec{NodeName: "n1", Containers: []corev1.Container{{Name: containerName, Image: "img:1",
			Resources: corev1.ResourceRequirements{Limits: resourceList(driver.Resources{CPU: 250, Memory: 64 * driver.MiB})}}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIPs: []corev1.PodIP{{IP: "10.0.0.1"}}},
	}
	m, err := d.markerFor(p)
	if err != nil {
		t.Fatal(err)
	}
	if m.Name != "web-stopped" || m.Labels[labelID] != "uid-1" || m.Labels[labelStopped] != "true" || m.Annotations[annotationNode] != "n1" {
		t.Errorf("marker: %+v", m.ObjectMeta)
	}
	again, node, err := podOfMarker(m)
	if err != nil {
		t.Fatal(err)
	}
	if node != "n1" || again.Spec.NodeName != "" || again.Labels[labelID] != "uid-1" || again.Labels["app"] != "web" || again.UID != "" {
		t.Errorf("the pod to make again: node %q, %+v", node, again.ObjectMeta)
	}
	in := stoppedInstance(m)
	if in.ID != "uid-1" || in.Name != "web" || in.Node != "n1" || in.State != driver.StateStopped || in.Image != "img:1" ||
		in.Resources.CPU != 250 || !in.Created.Equal(made.Time) || in.Tags[driver.TagCluster] != "c1" || len(in.Addresses) != 0 {
		t.Errorf("stopped instance: %+v", in)
	}
	// A pod made again from it has the same id.
	again.UID = "uid-2"
	if idOf(again) != "uid-1" || idOf(p) != "uid-1" {
		t.Errorf("ids: %s, %s", idOf(again), idOf(p))
	}
	m.Data[markerPodKey] = "{not json"
	if in := stoppedInstance(m); in.ID != "uid-1" || in.State != driver.StateStopped || in.Message == "" {
		t.Errorf("stopped instance of a broken marker: %+v", in)
	}
}

func TestStopGrace(t *testing.T) {
	for _, c := range []struct {
		in   time.Duration
		want int64
	}{{0, 1}, {time.Millisecond, 1}, {time.Second, 1}, {1500 * time.Millisecond, 2}, {10 * time.Second, 10}} {
		if got := stopGrace(c.in); got != c.want {
			t.Errorf("stopGrace(%s) = %d, want %d", c.in, got, c.want)
		}
	}
}

func TestImagePulled(t *testing.T) {
	waiting := func(reason string) corev1.ContainerStatus {
		return corev1.ContainerStatus{Name: containerName, State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: reason}}}
	}
	for _, c := range []struct {
		name   string
		status corev1.PodStatus
		done   bool
		err    error
	}{
		{"pending", corev1.PodStatus{Phase: corev1.PodPending}, false, nil},
		{"creating", corev1.PodStatus{Phase: corev1.PodPending, ContainerStatuses: []corev1.ContainerStatus{waiting("ContainerCreating")}}, false, nil},
		{"image id", corev1.PodStatus{Phase: corev1.PodPending, ContainerStatuses: []corev1.ContainerStatus{{Name: containerName, ImageID: "sha256:1"}}}, true, nil},
		{"running", corev1.PodStatus{Phase: corev1.PodRunning, ContainerStatuses: []corev1.ContainerStatus{{Name: containerName,
			State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}}}}, true, nil},
		{"no true in the image", corev1.PodStatus{Phase: corev1.PodPending, ContainerStatuses: []corev1.ContainerStatus{waiting("CreateContainerError")}}, true, nil},
		{"pull error", corev1.PodStatus{Phase: corev1.PodPending, ContainerStatuses: []corev1.ContainerStatus{waiting("ImagePullBackOff")}}, false, driver.ErrPermanent},
		{"no room", corev1.PodStatus{Phase: corev1.PodFailed, Reason: "OutOfcpu"}, false, driver.ErrInsufficientCapacity},
	} {
		done, err := imagePulled(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p"}, Status: c.status}, "preload")
		if done != c.done || (c.err == nil) != (err == nil) || (c.err != nil && !errors.Is(err, c.err)) {
			t.Errorf("%s: %v, %v; want %v, %v", c.name, done, err, c.done, c.err)
		}
	}
}
