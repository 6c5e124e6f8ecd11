package driver

import "time"

// Tags are the keys Berth writes on every back-end resource it creates.
// Drivers store them where the back-end keeps metadata (container labels,
// server metadata, a side file) and List filters on them. A resource without
// TagManaged is never touched by Berth.
const (
	TagManaged  = "berth.managed"  // always "true" on Berth's resources
	TagCluster  = "berth.cluster"  // the id of the Berth cluster that owns it (made once, kept in its store)
	TagProvider = "berth.provider" // the provider (configured back-end) name
	TagInstance = "berth.instance" // Berth's instance id
	// TagClusterName is the cluster's configured name, for people: it
	// decides nothing (TagCluster does).
	TagClusterName = "berth.cluster-name"
)

// Resources is an amount of every resource Berth counts. The zero value is
// nothing. In JSON its fields sit at the top level of the object that embeds
// it, so a spec reads {"image": "...", "cpus": 0.2, "memory": 512}.
type Resources struct {
	CPU    MilliCPU `json:"cpus,omitempty"`
	Memory Bytes    `json:"memory,omitempty"`
	Disk   Bytes    `json:"disk,omitempty"`
	GPUs   int64    `json:"gpus,omitempty"`
	// Other holds named counted resources (e.g. "fpga": 2).
	Other map[string]int64 `json:"other,omitempty"`
}

// Add returns r + o.
func (r Resources) Add(o Resources) Resources {
	out := Resources{CPU: r.CPU + o.CPU, Memory: r.Memory + o.Memory, Disk: r.Disk + o.Disk, GPUs: r.GPUs + o.GPUs}
	if len(r.Other)+len(o.Other) > 0 {
		out.Other = make(map[string]int64, len(r.Other)+len(o.Other))
		for k, v := range r.Other {
			out.Other[k] += v
		}
		for k, v := range o.Other {
			out.Other[k] += v
		}
	}
	return out
}

// Sub returns r - o.
func (r Resources) Sub(o Resources) Resources {
	neg := Resources{CPU: -o.CPU, Memory: -o.Memory, Disk: -o.Disk, GPUs: -o.GPUs}
	if len(o.Other) > 0 {
		neg.Other = make(map[string]int64, len(o.Other))
		for k, v := range o.Other {
			neg.Other[k] = -v
		}
	}
	return r.Add(neg)
}

// Fits reports whether r fits within avail, resource by resource.
func (r Resources) Fits(avail Resources) bool {
	if r.CPU > avail.CPU || r.Memory > avail.Memory || r.Disk > avail.Disk || r.GPUs > avail.GPUs {
		return false
	}
	for k, v := range r.Other {
		if v > avail.Other[k] {
			return false
		}
	}
	return true
}

// IsZero reports whether r asks for nothing.
func (r Resources) IsZero() bool {
	if r.CPU != 0 || r.Memory != 0 || r.Disk != 0 || r.GPUs != 0 {
		return false
	}
	for _, v := range r.Other {
		if v != 0 {
			return false
		}
	}
	return true
}

// NodeStatus says whether a node takes new instances.
type NodeStatus string

// Node statuses. Only online nodes receive new instances; a draining node
// keeps what it runs; an offline node does not answer.
const (
	NodeOnline   NodeStatus = "online"
	NodeDraining NodeStatus = "draining"
	NodeOffline  NodeStatus = "offline"
)

// Node is one machine (or engine, or hypervisor) of a back-end as the back-end
// sees it now.
type Node struct {
	Name    string     `json:"name"`
	Status  NodeStatus `json:"status"`
	Address string     `json:"address,omitempty"` // externally reachable host or host:port
	// Labels are operator-set key/values matched by placement constraints.
	Labels map[string]string `json:"labels,omitempty"`
	// Attributes are facts the back-end reports (os, kernel, arch, zone,
	// rack, storage driver); constraints match them too.
	Attributes map[string]string `json:"attributes,omitempty"`
	Capacity   Resources         `json:"capacity"`
	// Reserved is what the instances on the node have been promised.
	Reserved Resources `json:"reserved"`
	// InUse is the live usage, nil when the back-end cannot measure it.
	InUse *Resources `json:"in_use,omitempty"`
	// Images are the images present on the node.
	Images []string `json:"images,omitempty"`
	// Ports are the host ports already bound on the node.
	Ports []int `json:"ports,omitempty"`
	// MaxInstances caps how many instances the node runs; 0 means no cap.
	MaxInstances int `json:"max_instances,omitempty"`
	// Instances is how many instances the node runs now.
	Instances int `json:"instances"`
	// Reason says why the node is offline or draining, if known.
	Reason string `json:"reason,omitempty"`
}

// PlatformState is a fresh reading of a back-end's nodes (Zoe's
// platform_state). A back-end without per-node detail reports a single node
// and sets Aggregated.
type PlatformState struct {
	Nodes      []Node    `json:"nodes"`
	Aggregated bool      `json:"aggregated,omitempty"`
	Time       time.Time `json:"time"`
}

// State is an instance's state, one enum for every driver. Drivers keep their
// own raw state beside it in Instance.RawState.
type State string

// Instance states.
const (
	StateCreating  State = "creating"  // being built, not yet running
	StateRunning   State = "running"   // up
	StateSuspended State = "suspended" // paused; Resume brings it back
	StateStopped   State = "stopped"   // stopped on request; Start brings it back
	StateExited    State = "exited"    // ended by itself; ExitCode says how
	StateFailed    State = "failed"    // broken; Message says why
	StateDeleting  State = "deleting"  // being removed
	StateUnknown   State = "unknown"   // the back-end reports something unmapped
)

// Instance is one workload as a back-end runs it.
type Instance struct {
	ID        string            `json:"id"`
	Name      string            `json:"name,omitempty"`
	Node      string            `json:"node"`
	Kind      Kind              `json:"kind,omitempty"`
	Image     string            `json:"image,omitempty"`
	State     State             `json:"state"`
	RawState  string            `json:"raw_state,omitempty"`
	Message   string            `json:"message,omitempty"`
	ExitCode  *int              `json:"exit_code,omitempty"`
	Addresses []string          `json:"addresses,omitempty"`
	Ports     []PortMapping     `json:"ports,omitempty"`
	Resources Resources         `json:"resources"`
	Labels    map[string]string `json:"labels,omitempty"`
	Tags      map[string]string `json:"tags,omitempty"`
	Created   time.Time         `json:"created,omitzero"`
	Started   time.Time         `json:"started,omitzero"`
	Finished  time.Time         `json:"finished,omitzero"`
}

// PortMapping is a published port as the back-end bound it.
type PortMapping struct {
	ContainerPort int    `json:"container_port"`
	HostPort      int    `json:"host_port"`
	Protocol      string `json:"protocol"`
	HostIP        string `json:"host_ip,omitempty"`
}

// Image is an image present on a node.
type Image struct {
	Name    string    `json:"name"` // repository:tag, or an id when untagged
	ID      string    `json:"id,omitempty"`
	Size    Bytes     `json:"size,omitempty"`
	Created time.Time `json:"created,omitzero"`
}

// Usage is a live measurement of one instance.
type Usage struct {
	CPU    MilliCPU  `json:"cpus"`   // average over the sampling window
	Memory Bytes     `json:"memory"` // resident now
	Time   time.Time `json:"time"`
}

// LogOptions selects what Logs returns.
type LogOptions struct {
	Stdout bool
	Stderr bool
	// Tail keeps only the last Tail lines of each stream; 0 means all.
	Tail int
	// Follow keeps streaming new output until ctx ends or the instance ends.
	Follow bool
	// Timestamps prefixes each line with the time the back-end recorded it
	// (RFC 3339 with nanoseconds, then a space), as docker logs -t does. A
	// back-end that does not record when lines were written answers
	// ErrUnsupported.
	Timestamps bool
}

// EventType names a change reported by an EventWatcher.
type EventType string

// Event types.
const (
	EventStart   EventType = "start"
	EventDie     EventType = "die"
	EventOOM     EventType = "oom"
	EventStop    EventType = "stop"
	EventSuspend EventType = "suspend"
	EventResume  EventType = "resume"
	EventHealth  EventType = "health"
	EventDelete  EventType = "delete"
	EventNode    EventType = "node" // a node changed status
)

// Event is one change in a back-end.
type Event struct {
	Type     EventType         `json:"type"`
	Instance string            `json:"instance,omitempty"` // back-end id
	Node     string            `json:"node,omitempty"`
	State    State             `json:"state,omitempty"` // the instance's state after the event
	Message  string            `json:"message,omitempty"`
	Tags     map[string]string `json:"tags,omitempty"`
	Time     time.Time         `json:"time"`
}

// PreloadProgress reports one step of a Preload.
type PreloadProgress struct {
	Node    string `json:"node"`
	Image   string `json:"image"`
	Status  string `json:"status"` // e.g. "pulling", "copying", "present", "done", "failed"
	Current int64  `json:"current,omitempty"`
	Total   int64  `json:"total,omitempty"`
	Err     string `json:"error,omitempty"`
}
