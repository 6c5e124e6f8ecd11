// Package kubernetes is Berth's back-end for a Kubernetes cluster: each
// node the node_selector matches is a node, each instance a pod (kind
// container) in one namespace.
//
// Nodes, Berth's pods and every pod of the cluster that has not ended are
// kept by informers (list once, then watch), started by Open and stopped by
// Close: State, Get, Find and List read the caches and never ask the API
// server. A node is online when its Ready condition is True, draining when
// it is cordoned, offline otherwise; its capacity is its allocatable cpu,
// memory, ephemeral-storage (disk), nvidia.com/gpu (GPUs) and extended
// resources, and its reserved amount the requests of the pods bound to it.
//
// With bind (the default) Berth places: the pod names a scheduler no one
// else answers to (scheduler_name) and Create binds it to the chosen node
// through the binding subresource. Without it the chosen node is only a
// preference and the cluster's scheduler decides; the instance reports the
// node the pod went to.
//
// A spec becomes a pod of one container: image, entrypoint as command,
// command as args, environment, working directory, requests equal to limits
// (a memory reservation lowers the memory request), ports (host ports when
// given), the restart policy (no: Never, on-failure: OnFailure, always and
// unless-stopped: Always), a numeric user and group, config files from a
// config map and user data from a secret at user_data_path, both owned by
// the pod. What a pod cannot carry is refused by name in CheckSpec.
// Berth's tags are kept exactly in the annotation berth/tags, and those that
// are valid label keys and values are labels too; the label berth.managed
// selects Berth's pods.
//
// Errors: an unreachable server is ErrRetryable, a request cut off (or a
// 5xx answer to a write) ErrTimeout, 429 and 503 ErrRetryable, 404
// ErrNotFound, a name taken ErrAlreadyExists, an exceeded ResourceQuota
// ErrQuotaExceeded, other refusals (409, 422, 400, 403) ErrPermanent. A pod
// another scheduler bound first, that the kubelet refused for room, or that
// the cluster's scheduler cannot place is ErrInsufficientCapacity, after
// the pod is deleted, so that the control plane places it elsewhere.
//
// An instance's id is the uid of its first pod. Stop keeps the pod in a
// marker (a config map <pod>-stopped, read by an informer) and deletes it;
// Start makes it again from the marker, labelled berth/id with the same
// id, so that the id survives the pod and a restart of Berth.
//
// Capabilities: images (from node status, and what Preload pulled),
// events (from the informers), stop, start and preload (a short-lived pod
// per node) always; logs (pods/log, stdout and stderr as one stream) when
// the logs option is set; resize (pods/resize) when the server offers it.
package kubernetes
