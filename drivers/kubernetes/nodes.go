package kubernetes

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/berth-dev/berth/driver"
)

// ResourceGPU is the extended resource Berth's GPUs are counted in.
const ResourceGPU corev1.ResourceName = "nvidia.com/gpu"

// State reads the nodes from the informer cache: allocatable resources,
// labels, taints (as attributes "taint.<key>" = "<value>:<effect>"), the
// node's facts, its images, and as reserved the requests of every pod bound
// to it that has not ended. A Ready node is online, a cordoned one
// draining, any other offline. A node that is gone (or no longer matches
// node_selector) while Berth's pods are still bound to it is reported
// offline, so that their loss is seen.
func (d *Driver) State(ctx context.Context) (*driver.PlatformState, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("%w: kubernetes: state: %w", driver.ErrTimeout, err)
	}
	st := &driver.PlatformState{Time: time.Now()}
	seen := map[string]bool{}
	for _, obj := range d.nodes.GetStore().List() {
		n := obj.(*corev1.Node)
		seen[n.Name] = true
		st.Nodes = append(st.Nodes, d.node(n))
	}
	for _, name := range d.pods.GetIndexer().ListIndexFuncValues(byNode) {
		if seen[name] {
			continue
		}
		pods, _ := d.pods.GetIndexer().ByIndex(byNode, name)
		if len(pods) == 0 {
			continue
		}
		gone := driver.Node{Name: name, Status: driver.NodeOffline, Reason: "the node is gone, or no longer matches node_selector"}
		d.reserve(&gone)
		st.Nodes = append(st.Nodes, gone)
	}
	slices.SortFunc(st.Nodes, func(a, b driver.Node) int { return strings.Compare(a.Name, b.Name) })
	return st, nil
}

// node maps one Kubernetes node.
func (d *Driver) node(n *corev1.Node) driver.Node {
	out := driver.Node{
		Name:       n.Name,
		Labels:     maps.Clone(n.Labels),
		Attributes: map[string]string{},
		Capacity:   resourcesOf(n.Status.Allocatable),
	}
	if pods, ok := n.Status.Allocatable[corev1.ResourcePods]; ok {
		out.MaxInstances = int(pods.Value())
	}
	out.Status, out.Reason = nodeStatus(n)
	info := n.Status.NodeInfo
	for k, v := range map[string]string{
		"os": info.OperatingSystem, "arch": info.Architecture, "kernel": info.KernelVersion,
		"os_image": info.OSImage, "kubelet": info.KubeletVersion, "container_runtime": info.ContainerRuntimeVersion,
	} {
		if v != "" {
			out.Attributes[k] = v
		}
	}
	for _, t := range n.Spec.Taints {
		out.Attributes["taint."+t.Key] = t.Value + ":" + string(t.Effect)
	}
	for _, kind := range []corev1.NodeAddressType{corev1.NodeInternalIP, corev1.NodeExternalIP, corev1.NodeHostName} {
		if i := slices.IndexFunc(n.Status.Addresses, func(a corev1.NodeAddress) bool { return a.Type == kind }); i >= 0 {
			out.Address = n.Status.Addresses[i].Address
			break
		}
	}
	for _, img := range n.Status.Images {
		out.Images = append(out.Images, img.Names...)
	}
	for _, img := range d.preloadedOn(n.Name) {
		if !slices.Contains(out.Images, img) {
			out.Images = append(out.Images, img)
		}
	}
	d.reserve(&out)
	return out
}

// nodeStatus maps the Ready condition and the cordon.
func nodeStatus(n *corev1.Node) (driver.NodeStatus, string) {
	i := slices.IndexFunc(n.Status.Conditions, func(c corev1.NodeCondition) bool { return c.Type == corev1.NodeReady })
	switch {
	case i < 0:
		return driver.NodeOffline, "the node has not reported Ready yet"
	case n.Status.Conditions[i].Status != corev1.ConditionTrue:
		c := n.Status.Conditions[i]
		why := strings.TrimSpace(c.Reason + " " + c.Message)
		if why == "" {
			why = "Ready is " + string(c.Status)
		}
		return driver.NodeOffline, "not ready: " + why
	case n.Spec.Unschedulable:
		return driver.NodeDraining, "cordoned"
	}
	return driver.NodeOnline, ""
}

// reserve fills in what the pods bound to the node ask for: every pod of
// the cluster that has not ended, Berth's own counted from its own cache
// too so that a pod just created is never missed.
func (d *Driver) reserve(n *driver.Node) {
	seen := map[string]bool{}
	add := func(objs []any) {
		for _, obj := range objs {
			p := obj.(*corev1.Pod)
			if seen[string(p.UID)] || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
				continue
			}
			seen[string(p.UID)] = true
			n.Reserved = n.Reserved.Add(podRequests(p))
			n.Instances++
			for _, c := range p.Spec.Containers {
				for _, port := range c.Ports {
					if port.HostPort > 0 {
						n.Ports = append(n.Ports, int(port.HostPort))
					}
				}
			}
		}
	}
	objs, _ := d.pods.GetIndexer().ByIndex(byNode, n.Name)
	add(objs)
	objs, _ = d.allPods.GetIndexer().ByIndex(byNode, n.Name)
	add(objs)
	slices.Sort(n.Ports)
	n.Ports = slices.Compact(n.Ports)
}

// podRequests is what a pod asks of its node, as the scheduler counts it:
// the larger of its containers' requests and each init container's, plus
// the pod's overhead.
func podRequests(p *corev1.Pod) driver.Resources {
	var sum driver.Resources
	for _, c := range p.Spec.Containers {
		sum = sum.Add(resourcesOf(c.Resources.Requests))
	}
	for _, c := range p.Spec.InitContainers {
		r := resourcesOf(c.Resources.Requests)
		if c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways {
			sum = sum.Add(r) // a sidecar runs beside the containers
			continue
		}
		sum.CPU, sum.Memory, sum.Disk, sum.GPUs = max(sum.CPU, r.CPU), max(sum.Memory, r.Memory), max(sum.Disk, r.Disk), max(sum.GPUs, r.GPUs)
	}
	return sum.Add(resourcesOf(p.Spec.Overhead))
}

// resourcesOf maps a Kubernetes resource list: cpu, memory,
// ephemeral-storage as disk, nvidia.com/gpu as GPUs and other extended
// resources (names with a domain) by name.
func resourcesOf(l corev1.ResourceList) driver.Resources {
	var r driver.Resources
	for name, q := range l {
		switch name {
		case corev1.ResourceCPU:
			r.CPU = driver.MilliCPU(q.MilliValue())
		case corev1.ResourceMemory:
			r.Memory = driver.Bytes(q.Value())
		case corev1.ResourceEphemeralStorage:
			r.Disk = driver.Bytes(q.Value())
		case ResourceGPU:
			r.GPUs = q.Value()
		default:
			if strings.Contains(string(name), "/") && !strings.HasPrefix(string(name), corev1.ResourceHugePagesPrefix) {
				if r.Other == nil {
					r.Other = map[string]int64{}
				}
				r.Other[string(name)] = q.Value()
			}
		}
	}
	return r
}

// resourceList maps Berth's resources back; zero amounts are left out.
func resourceList(r driver.Resources) corev1.ResourceList {
	l := corev1.ResourceList{}
	if r.CPU > 0 {
		l[corev1.ResourceCPU] = *resource.NewMilliQuantity(int64(r.CPU), resource.DecimalSI)
	}
	if r.Memory > 0 {
		l[corev1.ResourceMemory] = *resource.NewQuantity(int64(r.Memory), resource.BinarySI)
	}
	if r.Disk > 0 {
		l[corev1.ResourceEphemeralStorage] = *resource.NewQuantity(int64(r.Disk), resource.BinarySI)
	}
	if r.GPUs > 0 {
		l[ResourceGPU] = *resource.NewQuantity(r.GPUs, resource.DecimalSI)
	}
	for k, v := range r.Other {
		if v > 0 {
			l[corev1.ResourceName(k)] = *resource.NewQuantity(v, resource.DecimalSI)
		}
	}
	return l
}

// Images lists the images the node reports in its status, and those
// Preload pulled there that it does not report.
func (d *Driver) Images(ctx context.Context, node string) ([]driver.Image, error) {
	n, err := d.nodeByName(node)
	if err != nil {
		return nil, err
	}
	var out []driver.Image
	for _, img := range n.Status.Images {
		im := driver.Image{Size: driver.Bytes(img.SizeBytes)}
		for _, name := range img.Names {
			if strings.Contains(name, "@sha256:") {
				if im.ID == "" {
					im.ID = name
				}
			} else if im.Name == "" {
				im.Name = name
			}
		}
		if im.Name == "" && im.ID == "" {
			continue
		}
		out = append(out, im)
	}
	for _, img := range d.preloadedOn(node) {
		if !slices.ContainsFunc(out, func(im driver.Image) bool { return im.Name == img }) {
			out = append(out, driver.Image{Name: img})
		}
	}
	return out, nil
}

// nodeByName returns the node from the cache, or ErrNotFound.
func (d *Driver) nodeByName(name string) (*corev1.Node, error) {
	obj, ok, _ := d.nodes.GetStore().GetByKey(name)
	if !ok {
		return nil, driver.Errorf(driver.ErrNotFound, "kubernetes: node %q (or it does not match node_selector)", name)
	}
	return obj.(*corev1.Node), nil
}
