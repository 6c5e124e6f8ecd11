package sim

import (
	"fmt"
	"time"

	"github.com/berth-dev/berth/driver"
)

// MaxNodes is the largest cluster the sim builds.
const MaxNodes = 100_000

// DefaultNodes is how many nodes of Shape the sim builds when neither nodes
// nor pools is set.
const DefaultNodes = 10

// Shape is the size and make-up of one kind of node. In JSON its resources
// sit at the top level: {"cpus": 4, "memory": "16Gi", "max_instances": 110}.
type Shape struct {
	driver.Resources
	// MaxInstances caps the instances per node; 0 means no cap.
	MaxInstances int `json:"max_instances,omitempty"`
	// Labels are set on every node of the shape.
	Labels map[string]string `json:"labels,omitempty"`
	// Zones are spread round-robin over the nodes as the attribute "zone".
	Zones []string `json:"zones,omitempty"`
	// Racks are spread round-robin within each zone as the attribute "rack".
	Racks []string `json:"racks,omitempty"`
	// Images are present on every node from the start.
	Images []string `json:"images,omitempty"`
}

// Pool is a group of identical nodes named NamePrefix followed by a
// zero-padded number starting at 1.
type Pool struct {
	Count      int    `json:"count"`
	NamePrefix string `json:"name_prefix,omitempty"`
	Shape
}

// Options configures the sim back-end. The tagged fields are driver options
// (config key or flag --sim-<name>); Clock is for embedders and tests.
type Options struct {
	Nodes int    `option:"nodes" range:"0,100000" help:"number of nodes of the given shape (default 10 when pools is not set)"`
	Shape Shape  `option:"shape" help:"shape of the uniform nodes as JSON: {cpus, memory, disk, gpus, other, max_instances, labels, zones, racks, images}"`
	Pools []Pool `option:"pools" help:"node groups as a JSON list of {count, name_prefix, cpus, memory, disk, gpus, other, max_instances, labels, zones, racks, images}; replaces nodes and shape"`

	StrictImages bool `option:"strict_images" help:"fail a create permanently when its image is not present on the node, as in a cluster without a registry; otherwise the image is fetched on first use"`
	// Overcommit lets a node hold reservations beyond its capacity, as an
	// engine that does not hold instances to their reservations does.
	Overcommit float64 `option:"overcommit" range:"0,10" help:"cpu and memory a node admits in reservations, as a multiple of its capacity (0 means 1; else at least 1)"`

	CreateLatency time.Duration `option:"create_latency" range:"0s,1h" help:"how long a create takes before the instance runs"`
	DeleteLatency time.Duration `option:"delete_latency" range:"0s,1h" help:"how long a delete takes before the instance is gone"`
	LatencyJitter time.Duration `option:"latency_jitter" range:"0s,1h" help:"a random extra of up to this much on every create and delete latency"`
	Seed          uint64        `option:"seed" range:"0,18446744073709551615" help:"seed for every random choice: the same seed and the same calls give the same outcomes"`

	FailRetryable float64 `option:"fail_retryable" range:"0,1" help:"share of creates that fail with a retryable error"`
	FailPermanent float64 `option:"fail_permanent" range:"0,1" help:"share of creates that fail permanently"`
	FailQuota     float64 `option:"fail_quota" range:"0,1" help:"share of creates refused for quota"`
	HangRate      float64 `option:"hang_rate" range:"0,1" help:"share of creates that never finish until their context ends"`

	OfflineRate float64       `option:"offline_rate" range:"0,1" help:"share of nodes that are offline at any time"`
	Flap        time.Duration `option:"flap" range:"0s,24h" help:"how often the set of offline nodes is drawn anew; 0 keeps it fixed"`

	CallLog int `option:"call_log" range:"0,1000000" help:"how many of the most recent calls Calls returns; 0 records none"`

	// Clock tells the sim's time; nil means the wall clock. Tests and
	// what-if runs pass a *ManualClock to make time explicit.
	Clock Clock `json:"-"`
}

// DefaultOptions returns the options the sim uses when none are given.
func DefaultOptions() *Options {
	return &Options{
		Shape: Shape{
			Resources: driver.Resources{CPU: driver.CPUs(4), Memory: 16 * driver.GiB, Disk: 100 * driver.GiB},
		},
		CallLog: 10_000,
	}
}

// Validate checks the options; every error names its key.
func (o *Options) Validate() error {
	es := driver.CheckRanges(o)
	if o.Nodes > 0 && len(o.Pools) > 0 {
		es.Add("nodes", "set either nodes (with shape) or pools, not both")
	}
	if len(o.Pools) == 0 {
		validateShape(&es, "shape.", o.Shape)
	}
	total := 0
	prefixes := map[string]int{}
	for i, p := range o.Pools {
		f := fmt.Sprintf("pools[%d].", i)
		if p.Count < 1 || p.Count > MaxNodes {
			es.Add(f+"count", "%d: want 1 to %d", p.Count, MaxNodes)
		}
		total += max(p.Count, 0)
		prefix := poolPrefix(i, p)
		if fe := driver.CheckName(f+"name_prefix", prefix, driver.MaxNameLength); fe != nil {
			es = append(es, fe)
		} else if j, dup := prefixes[prefix]; dup {
			es.Add(f+"name_prefix", "%q is also the prefix of pools[%d]", prefix, j)
		}
		prefixes[prefix] = i
		validateShape(&es, f, p.Shape)
	}
	if total > MaxNodes {
		es.Add("pools", "%d nodes in total: at most %d", total, MaxNodes)
	}
	if sum := o.FailRetryable + o.FailPermanent + o.FailQuota + o.HangRate; sum > 1 {
		es.Add("fail_retryable", "fail_retryable, fail_permanent, fail_quota and hang_rate add up to %v: at most 1", sum)
	}
	if o.Overcommit != 0 && !(o.Overcommit >= 1 && o.Overcommit <= 10) {
		es.Add("overcommit", "%v: want 1 to 10, or 0 for 1", o.Overcommit)
	}
	return es.Err()
}

func validateShape(es *driver.FieldErrors, prefix string, s Shape) {
	es.AddErr("", driver.ValidateCapacity(prefix, s.Resources))
	if s.CPU <= 0 {
		es.Add(prefix+"cpus", "a node needs more than 0 cpus")
	}
	if s.Memory <= 0 {
		es.Add(prefix+"memory", "a node needs more than 0 memory")
	}
	if s.MaxInstances < 0 {
		es.Add(prefix+"max_instances", "%d: must not be negative", s.MaxInstances)
	}
	for i, img := range s.Images {
		if img == "" {
			es.Add(fmt.Sprintf("%simages[%d]", prefix, i), "empty image name")
		}
	}
	for i, z := range s.Zones {
		if z == "" {
			es.Add(fmt.Sprintf("%szones[%d]", prefix, i), "empty zone name")
		}
	}
	for i, r := range s.Racks {
		if r == "" {
			es.Add(fmt.Sprintf("%sracks[%d]", prefix, i), "empty rack name")
		}
	}
}

// poolPrefix returns the node name prefix of pool i.
func poolPrefix(i int, p Pool) string {
	if p.NamePrefix != "" {
		return p.NamePrefix
	}
	return fmt.Sprintf("pool%d-", i)
}

// normImages returns a normalised copy of images.
func normImages(images []string) []string {
	out := make([]string, len(images))
	for i, img := range images {
		out[i] = normImage(img)
	}
	return out
}

// pools returns the node groups the options describe.
func (o *Options) pools() []Pool {
	if len(o.Pools) > 0 {
		out := make([]Pool, len(o.Pools))
		for i, p := range o.Pools {
			p.NamePrefix = poolPrefix(i, p)
			p.Images = normImages(p.Images)
			out[i] = p
		}
		return out
	}
	n := o.Nodes
	if n == 0 {
		n = DefaultNodes
	}
	shape := o.Shape
	shape.Images = normImages(shape.Images)
	return []Pool{{Count: n, NamePrefix: "node-", Shape: shape}}
}
