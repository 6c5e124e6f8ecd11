package kubernetes

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/berth-dev/berth/driver"
)

// What Berth writes on its pods. Every tag whose key and value are valid
// label parts is also a label under its own key (berth.managed,
// berth.cluster, berth.instance...), so that the informers and kubectl can
// select on it; the annotations hold the tags and the user's labels
// exactly as given.
const (
	labelManaged      = driver.TagManaged
	annotationTags    = "berth/tags"
	annotationLabels  = "berth/labels"
	containerName     = "main"
	filesVolume       = "berth-files"
	userDataVolume    = "berth-user-data"
	userDataKey       = "user-data"
	filesSuffix       = "-files"
	userDataSuffix    = "-user-data"
	generatedNameBase = "berth-"

	// labelID holds the instance id on a pod that Start made again (the
	// uid of the instance's first pod) and on the marker of a stopped
	// instance. A pod without it is its instance's first: its id is its
	// uid.
	labelID = "berth/id"
	// labelStopped marks the config map that holds a stopped instance's
	// pod (its marker, named <pod>-stopped).
	labelStopped = "berth/stopped"
	markerSuffix = "-stopped"
	markerPodKey = "pod"
	// labelPreload marks the short-lived pods of Preload; they are no
	// instances.
	labelPreload = "berth/preload"
	// annotationCreated keeps, on a pod that Start made again, when the
	// instance's first pod was made.
	annotationCreated = "berth/created"
)

// isTagKey reports whether a label key is in Berth's own prefixes, berth.
// (the tags) and berth/ (the driver's bookkeeping).
func isTagKey(k string) bool { return strings.HasPrefix(k, "berth.") || strings.HasPrefix(k, "berth/") }

// idOf is the instance id of Berth's pod: the uid of the instance's first
// pod, which Start carries over to the pods it makes.
func idOf(p *corev1.Pod) string {
	if id := p.Labels[labelID]; id != "" {
		return id
	}
	return string(p.UID)
}

// isPreload reports whether p is a pod of Preload, not an instance.
func isPreload(p *corev1.Pod) bool {
	_, ok := p.Labels[labelPreload]
	return ok
}

// Features are what pods give: containers, with restart policies, host
// ports, GPUs (nvidia.com/gpu) and a numeric user.
func (d *Driver) Features() []string {
	return []string{driver.CapKindContainer, driver.CapRestartPolicy, driver.CapHostPorts, driver.CapGPUs, driver.CapRunAsUser}
}

// CheckSpec refuses, naming the field, what a pod cannot carry: another
// kind than container, a flavor, a cpuset, volumes, networks, a network
// mode, security groups, SSH keys, a domain name, a retry count, a user or
// group that is not numeric, a host port picked by the node, a name or
// labels Kubernetes does not take, other resources without a domain.
func (d *Driver) CheckSpec(spec *driver.Spec) error {
	var es driver.FieldErrors
	un := func(field, why string) { es.Add(field, "%s", why) }
	if k := spec.KindOrDefault(); k != driver.KindContainer {
		un("kind", fmt.Sprintf("%q: Kubernetes runs containers only", k))
	}
	if spec.Flavor != "" {
		un("flavor", "pods have no named sizes; give cpus and memory")
	}
	if spec.Cpuset != "" {
		un("cpuset", "pods cannot pin cpus (the kubelet's cpu manager decides)")
	}
	if len(spec.Volumes) > 0 {
		un("volumes", "the kubernetes driver mounts no volumes")
	}
	if len(spec.Networks) > 0 {
		un("networks", "pods join the cluster network only")
	}
	if spec.NetworkMode != "" {
		un("network_mode", "pods join the cluster network only")
	}
	if len(spec.SecurityGroups) > 0 {
		un("security_groups", "use network policies in the cluster")
	}
	if len(spec.SSHKeys) > 0 {
		un("ssh_keys", "pods run no SSH server Berth could give keys to")
	}
	if spec.Domainname != "" {
		un("domainname", "a pod's domain comes from a headless service")
	}
	if spec.RestartPolicy.MaxRetries > 0 {
		un("restart_policy.max_retries", "a pod cannot cap its restarts")
	}
	if spec.User != "" && !numeric(spec.User) {
		un("user", fmt.Sprintf("%q: a pod runs as a numeric user id only", spec.User))
	}
	if spec.Group != "" && !numeric(spec.Group) {
		un("group", fmt.Sprintf("%q: a pod runs as a numeric group id only", spec.Group))
	}
	for i, p := range spec.Ports {
		if p.HostPort == 0 && p.Publish {
			un(fmt.Sprintf("ports[%d].host_port", i), "Kubernetes binds fixed host ports only; give one, or do not publish")
		}
		if p.HostIP != "" {
			un(fmt.Sprintf("ports[%d].host_ip", i), "a pod's host port binds every address of the node")
		}
	}
	for k := range spec.Other {
		if !strings.Contains(k, "/") {
			un("other."+k, "an extended resource is named with a domain (example.com/"+k+")")
		}
	}
	if spec.Name != "" {
		if errs := validation.IsDNS1123Subdomain(spec.Name); len(errs) > 0 {
			un("name", fmt.Sprintf("%q: a pod name is lower-case letters, digits, '-' and '.': %s", spec.Name, errs[0]))
		} else if len(spec.Name)+len(userDataSuffix) > validation.DNS1123SubdomainMaxLength {
			un("name", "too long for the pod's secret name")
		}
	}
	for k, v := range spec.Labels {
		switch {
		case isTagKey(k):
			un("labels."+k, "the prefixes berth. and berth/ are Berth's own")
		case len(validation.IsQualifiedName(k)) > 0:
			un("labels."+k, "not a Kubernetes label key: "+validation.IsQualifiedName(k)[0])
		case len(validation.IsValidLabelValue(v)) > 0:
			un("labels."+k, fmt.Sprintf("%q: not a Kubernetes label value: %s", v, validation.IsValidLabelValue(v)[0]))
		}
	}
	if len(es) == 0 {
		return nil
	}
	return fmt.Errorf("kubernetes: %w: %w", driver.ErrUnsupported, es)
}

func numeric(s string) bool {
	_, err := strconv.ParseInt(s, 10, 64)
	return err == nil
}

// newName makes a pod name for a spec without one.
func newName() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return generatedNameBase + hex.EncodeToString(b[:])
}

// podFor maps spec onto a pod named name for node. Resources are requests
// and limits both (a memory reservation lowers the memory request).
func (d *Driver) podFor(spec *driver.Spec, name, node string) (*corev1.Pod, error) {
	tags, err := json.Marshal(spec.Tags)
	if err != nil {
		return nil, err
	}
	lbls := map[string]string{}
	maps.Copy(lbls, spec.Labels)
	maps.Copy(lbls, d.opts.PodLabels)
	for k, v := range spec.Tags {
		if !strings.HasPrefix(k, "berth/") && len(validation.IsQualifiedName(k)) == 0 && len(validation.IsValidLabelValue(v)) == 0 {
			lbls[k] = v
		}
	}
	lbls[labelManaged] = "true"
	ann := map[string]string{annotationTags: string(tags)}
	if len(spec.Labels) > 0 {
		b, _ := json.Marshal(spec.Labels)
		ann[annotationLabels] = string(b)
	}

	limits := resourceList(spec.Resources)
	requests := resourceList(spec.Resources)
	if spec.MemoryReservation > 0 {
		requests[corev1.ResourceMemory] = resourceList(driver.Resources{Memory: spec.MemoryReservation})[corev1.ResourceMemory]
	}
	c := corev1.Container{
		Name:       containerName,
		Image:      spec.Image,
		Command:    slices.Clone(spec.Entrypoint),
		Args:       slices.Clone(spec.Command),
		WorkingDir: spec.WorkingDir,
		Resources:  corev1.ResourceRequirements{Limits: limits, Requests: requests},
	}
	for _, k := range slices.Sorted(maps.Keys(spec.Env)) {
		c.Env = append(c.Env, corev1.EnvVar{Name: k, Value: spec.Env[k]})
	}
	for _, p := range spec.Ports {
		proto := corev1.ProtocolTCP
		if p.Protocol != "" {
			proto = corev1.Protocol(strings.ToUpper(p.Protocol))
		}
		c.Ports = append(c.Ports, corev1.ContainerPort{ContainerPort: int32(p.ContainerPort), HostPort: int32(p.HostPort), Protocol: proto})
	}
	grace := int64((d.opts.StopGrace + 999_999_999) / 1_000_000_000)
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: d.opts.Namespace, Labels: lbls, Annotations: ann},
		Spec: corev1.PodSpec{
			RestartPolicy:                 restartPolicy(spec.RestartPolicy.Name),
			Hostname:                      spec.Hostname,
			TerminationGracePeriodSeconds: &grace,
			AutomountServiceAccountToken:  new(false),
		},
	}
	if spec.User != "" {
		uid, _ := strconv.ParseInt(spec.User, 10, 64)
		pod.Spec.SecurityContext = &corev1.PodSecurityContext{RunAsUser: &uid}
		if spec.Group != "" {
			gid, _ := strconv.ParseInt(spec.Group, 10, 64)
			pod.Spec.SecurityContext.RunAsGroup = &gid
		}
	}
	if len(spec.ConfigFiles) > 0 {
		v := corev1.Volume{Name: filesVolume, VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{
			LocalObjectReference: corev1.LocalObjectReference{Name: name + filesSuffix}}}}
		for i, f := range spec.ConfigFiles {
			key := fmt.Sprintf("file%d", i)
			mode := int32(0o644)
			if f.Mode != 0 {
				mode = int32(f.Mode)
			}
			v.ConfigMap.Items = append(v.ConfigMap.Items, corev1.KeyToPath{Key: key, Path: key, Mode: &mode})
			c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: filesVolume, MountPath: f.Path, SubPath: key, ReadOnly: true})
		}
		pod.Spec.Volumes = append(pod.Spec.Volumes, v)
	}
	if spec.UserData != "" {
		pod.Spec.Volumes = append(pod.Spec.Volumes, corev1.Volume{Name: userDataVolume, VolumeSource: corev1.VolumeSource{
			Secret: &corev1.SecretVolumeSource{SecretName: name + userDataSuffix}}})
		c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: userDataVolume, MountPath: d.opts.UserDataPath, SubPath: userDataKey, ReadOnly: true})
	}
	pod.Spec.Containers = []corev1.Container{c}
	if d.opts.Bind {
		pod.Spec.SchedulerName = d.opts.Scheduler
	} else {
		pod.Spec.Affinity = d.affinity(node)
	}
	return pod, nil
}

func restartPolicy(name string) corev1.RestartPolicy {
	switch name {
	case "always", "unless-stopped":
		return corev1.RestartPolicyAlways
	case "on-failure":
		return corev1.RestartPolicyOnFailure
	}
	return corev1.RestartPolicyNever
}

// affinity asks the cluster's scheduler for node, when given, and requires
// a node that node_selector matches.
func (d *Driver) affinity(node string) *corev1.Affinity {
	na := &corev1.NodeAffinity{}
	if node != "" {
		na.PreferredDuringSchedulingIgnoredDuringExecution = []corev1.PreferredSchedulingTerm{{Weight: 100, Preference: corev1.NodeSelectorTerm{
			MatchFields: []corev1.NodeSelectorRequirement{{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{node}}}}}}
	}
	if reqs, ok := d.nodeSel.Requirements(); ok && len(reqs) > 0 {
		var term corev1.NodeSelectorTerm
		for _, r := range reqs {
			op := map[selection.Operator]corev1.NodeSelectorOperator{
				selection.In: corev1.NodeSelectorOpIn, selection.Equals: corev1.NodeSelectorOpIn, selection.DoubleEquals: corev1.NodeSelectorOpIn,
				selection.NotIn: corev1.NodeSelectorOpNotIn, selection.NotEquals: corev1.NodeSelectorOpNotIn,
				selection.Exists: corev1.NodeSelectorOpExists, selection.DoesNotExist: corev1.NodeSelectorOpDoesNotExist,
				selection.GreaterThan: corev1.NodeSelectorOpGt, selection.LessThan: corev1.NodeSelectorOpLt,
			}[r.Operator()]
			term.MatchExpressions = append(term.MatchExpressions, corev1.NodeSelectorRequirement{Key: r.Key(), Operator: op, Values: r.ValuesUnsorted()})
		}
		na.RequiredDuringSchedulingIgnoredDuringExecution = &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{term}}
	}
	return &corev1.Affinity{NodeAffinity: na}
}

// ownedBy makes the object belong to the pod, so that the cluster's
// garbage collector removes it with the pod (Delete removes it as well).
func ownedBy(p *corev1.Pod) []metav1.OwnerReference {
	return []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: p.Name, UID: p.UID}}
}

// filesFor is the config map holding spec's config files.
func (d *Driver) filesFor(spec *driver.Spec, p *corev1.Pod) *corev1.ConfigMap {
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: p.Name + filesSuffix, Namespace: p.Namespace,
		Labels: map[string]string{labelManaged: "true"}, OwnerReferences: ownedBy(p)}, Data: map[string]string{}}
	for i, f := range spec.ConfigFiles {
		cm.Data[fmt.Sprintf("file%d", i)] = f.Content
	}
	return cm
}

// userDataFor is the secret holding spec's user data.
func (d *Driver) userDataFor(spec *driver.Spec, p *corev1.Pod) *corev1.Secret {
	return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: p.Name + userDataSuffix, Namespace: p.Namespace,
		Labels: map[string]string{labelManaged: "true"}, OwnerReferences: ownedBy(p)},
		Type: corev1.SecretTypeOpaque, StringData: map[string]string{userDataKey: spec.UserData}}
}

// tagsOf reads the tags Create stored on the pod.
func tagsOf(p *corev1.Pod) map[string]string { return tagsIn(p.Annotations) }

// tagsIn reads the tags from the annotations of a pod or a marker.
func tagsIn(ann map[string]string) map[string]string {
	var tags map[string]string
	if s, ok := ann[annotationTags]; ok {
		_ = json.Unmarshal([]byte(s), &tags)
	}
	return tags
}

// instance maps a pod.
func instance(p *corev1.Pod) *driver.Instance {
	in := &driver.Instance{
		ID:      idOf(p),
		Name:    p.Name,
		Node:    p.Spec.NodeName,
		Kind:    driver.KindContainer,
		Tags:    tagsOf(p),
		Created: p.CreationTimestamp.Time,
	}
	if t, err := time.Parse(time.RFC3339, p.Annotations[annotationCreated]); err == nil {
		in.Created = t
	}
	if s, ok := p.Annotations[annotationLabels]; ok {
		_ = json.Unmarshal([]byte(s), &in.Labels)
	}
	var main *corev1.Container
	if i := slices.IndexFunc(p.Spec.Containers, func(c corev1.Container) bool { return c.Name == containerName }); i >= 0 {
		main = &p.Spec.Containers[i]
	} else if len(p.Spec.Containers) > 0 {
		main = &p.Spec.Containers[0]
	}
	if main != nil {
		in.Image = main.Image
		in.Resources = resourcesOf(main.Resources.Limits)
		for _, port := range main.Ports {
			if port.HostPort > 0 {
				in.Ports = append(in.Ports, driver.PortMapping{ContainerPort: int(port.ContainerPort), HostPort: int(port.HostPort),
					Protocol: strings.ToLower(string(port.Protocol)), HostIP: p.Status.HostIP})
			}
		}
	}
	for _, ip := range p.Status.PodIPs {
		in.Addresses = append(in.Addresses, ip.IP)
	}
	var cs *corev1.ContainerStatus
	if i := slices.IndexFunc(p.Status.ContainerStatuses, func(c corev1.ContainerStatus) bool { return c.Name == containerName }); i >= 0 {
		cs = &p.Status.ContainerStatuses[i]
	}
	in.State, in.RawState, in.Message = podState(p, cs)
	if cs != nil {
		if r := cs.State.Running; r != nil {
			in.Started = r.StartedAt.Time
		}
		if t := cs.State.Terminated; t != nil {
			code := int(t.ExitCode)
			in.ExitCode = &code
			in.Started, in.Finished = t.StartedAt.Time, t.FinishedAt.Time
		}
	}
	if in.Started.IsZero() && p.Status.StartTime != nil && in.State == driver.StateRunning {
		in.Started = p.Status.StartTime.Time
	}
	return in
}

// podState maps a pod's phase and its container's state.
func podState(p *corev1.Pod, cs *corev1.ContainerStatus) (driver.State, string, string) {
	raw := string(p.Status.Phase)
	if p.Status.Reason != "" {
		raw += "/" + p.Status.Reason
	}
	msg := p.Status.Message
	if cs != nil {
		if w := cs.State.Waiting; w != nil {
			raw += "/" + w.Reason
			if msg == "" {
				msg = w.Message
			}
		}
		if t := cs.State.Terminated; t != nil && msg == "" {
			msg = t.Reason + " " + t.Message
		}
	}
	msg = strings.TrimSpace(msg)
	if p.DeletionTimestamp != nil {
		return driver.StateDeleting, raw, msg
	}
	switch p.Status.Phase {
	case corev1.PodPending, "":
		return driver.StateCreating, raw, msg
	case corev1.PodRunning:
		return driver.StateRunning, raw, msg
	case corev1.PodSucceeded:
		return driver.StateExited, raw, msg
	case corev1.PodFailed:
		if cs != nil && cs.State.Terminated != nil {
			return driver.StateExited, raw, msg
		}
		return driver.StateFailed, raw, msg
	}
	return driver.StateUnknown, raw, msg
}
