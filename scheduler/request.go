package scheduler

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/berth-dev/berth/driver"
)

// Strategy names how a request's instances are spread over feasible nodes.
type Strategy string

// Strategies. The empty strategy is the type's default: spread for
// services, binpack for batch work (Citadel's per-type schedulers).
const (
	// StrategyBinpack fills the fullest node that fits first, so that whole
	// nodes stay free for big requests and idle nodes can be released.
	StrategyBinpack Strategy = "binpack"
	// StrategySpread places on the emptiest node, so that a lost node takes
	// few instances with it.
	StrategySpread Strategy = "spread"
	// StrategyRandom picks any feasible node (seeded, hence reproducible).
	StrategyRandom Strategy = "random"
	// StrategyWaterfill raises the least-used node first, like water filling
	// a vessel (Zoe's elastic services): it maximises the free fraction left
	// on the node that will be the fullest after placing.
	StrategyWaterfill Strategy = "waterfill"
	// StrategyAverage keeps every node close to the cluster's average use.
	StrategyAverage Strategy = "average"
)

// Strategies lists the strategies a request may name.
var Strategies = []Strategy{StrategyBinpack, StrategySpread, StrategyRandom, StrategyWaterfill, StrategyAverage}

// MaxCount bounds Request.Count.
const MaxCount = 1_000_000

// The ranges of a request's and a group's numbers besides the spec's
// (driver.RangeCPU...). A record of the control plane keeps a priority in
// 32 bits: MinPriority and MaxPriority are its bounds.
const (
	MinPriority = math.MinInt32
	MaxPriority = math.MaxInt32
)

var (
	// RangeCount bounds count (0 means 1) and max_per_node (0: no cap).
	RangeCount = driver.Range{Min: 0, Max: MaxCount}
	// RangePriority bounds a request's and a group's priority.
	RangePriority = driver.Range{Min: MinPriority, Max: MaxPriority}
	// RangeStartupOrder bounds a service's startup_order.
	RangeStartupOrder = driver.Range{Min: math.MinInt32, Max: math.MaxInt32}
)

// Request asks for Count instances of one spec. Its JSON is Citadel's request
// with every driver.Spec field at the top level plus the placement fields:
//
//	{"image": "crosbymichael/redis", "cpus": "0.2", "memory": 512, "type": "service",
//	 "count": 3, "constraints": ["disk==ssd", "zone!=~eu-1"],
//	 "affinities": ["image==redis", "group!=db"], "priority": 10}
//
// Constraints match nodes. Keys: "node" is the node name, "provider" the
// provider name; any other key is a node label, or when the node has no such
// label, a node attribute (os, arch, zone...).
//
// Affinities match the instances already on a node (and the images it holds).
// Keys: "instance" (also "container" or "name") is an instance's name,
// "group" its group, "image" an image present on the node or run by an
// instance there; "label.K" or any other key K is the instance label K.
// key==v draws the instance to nodes that have a match, key!=v keeps it away
// from them; a ~ makes either a preference.
type Request struct {
	driver.Spec

	// ID names the request. Instance i of a request with Count > 1 is called
	// "<ID>-<i>"; a request with Count 1 names its one instance ID. See
	// InstanceID.
	ID string `json:"id,omitempty"`
	// Count is how many instances to place; 0 means 1.
	Count int `json:"count,omitempty"`
	// Constraints are expressions over node name, labels and attributes.
	Constraints []string `json:"constraints,omitempty"`
	// Affinities are expressions over the instances on a node.
	Affinities []string `json:"affinities,omitempty"`
	// Capabilities are back-end capabilities (driver.CapResize...) the
	// provider must have.
	Capabilities []string `json:"capabilities,omitempty"`
	// Provider restricts placement to one provider; empty means any.
	Provider string `json:"provider,omitempty"`
	// Priority orders the queue: higher first. Within a priority the queue
	// policy decides.
	Priority int `json:"priority,omitempty"`
	// Strategy overrides the type's default strategy.
	Strategy Strategy `json:"strategy,omitempty"`
	// Group is the name of the group the request belongs to, matched by
	// group affinities. Set by Group for its services.
	Group string `json:"group,omitempty"`
	// MaxPerNode caps how many of this request's instances share a node; 0
	// means no cap.
	MaxPerNode int `json:"max_per_node,omitempty"`
	// Movable false keeps the instances where they are placed: a
	// rebalance never moves them. True lets a rebalance move what it
	// keeps by default (processes of the local back-end, instances with
	// volumes). Unset is the default.
	Movable *bool `json:"movable,omitempty"`
	// Avoid are nodes this placement must not use, each with why: a filter
	// the control plane adds (a launch failed there a moment ago, the node
	// refused the spec for good). Not part of a request's JSON.
	Avoid []Avoid `json:"-"`
	// Owner and Pool are whose instances these are, for the quotas that
	// cover them; set by the control plane, not part of a request's JSON.
	Owner string `json:"-"`
	Pool  string `json:"-"`
}

// Avoid is a node a placement must not use, and why. Reason is what the
// rejection counts say ("avoided: <reason>").
type Avoid struct {
	Provider string
	Node     string
	Reason   string
}

// N returns the number of instances asked for (Count, or 1 when unset).
func (r *Request) N() int {
	if r.Count <= 0 {
		return 1
	}
	return r.Count
}

// InstanceID returns the id of instance i of r.
func (r *Request) InstanceID(i int) string {
	if r.N() == 1 {
		return r.ID
	}
	return r.ID + "-" + strconv.Itoa(i)
}

// EffectiveStrategy returns the strategy to use: the one asked for, or the
// type's default.
func (r *Request) EffectiveStrategy() Strategy {
	if r.Strategy != "" {
		return r.Strategy
	}
	if r.Type == driver.TypeBatch {
		return StrategyBinpack
	}
	return StrategySpread
}

// Validate checks the request and returns driver.FieldErrors naming every bad
// field (matching driver.ErrInvalid), or nil.
func (r *Request) Validate() error {
	var es driver.FieldErrors
	r.validate(&es, "")
	return es.Err()
}

func (r *Request) validate(es *driver.FieldErrors, prefix string) {
	es.AddErr(strings.TrimSuffix(prefix, "."), r.Spec.Validate())
	RangeCount.Check(es, prefix+"count", int64(r.Count))
	RangeCount.Check(es, prefix+"max_per_node", int64(r.MaxPerNode))
	RangePriority.Check(es, prefix+"priority", int64(r.Priority))
	for i, c := range r.Constraints {
		if _, err := ParseExpr(c); err != nil {
			es.Add(fmt.Sprintf("%sconstraints[%d]", prefix, i), "%v", err)
		}
	}
	for i, a := range r.Affinities {
		e, err := ParseExpr(a)
		if err != nil {
			es.Add(fmt.Sprintf("%saffinities[%d]", prefix, i), "%v", err)
			continue
		}
		if _, lk := affinityKey(e.Key); lk == "" && strings.HasPrefix(e.Key, "label.") {
			es.Add(fmt.Sprintf("%saffinities[%d]", prefix, i), "%q: empty label name", a)
		}
	}
	for i, c := range r.Capabilities {
		if !slices.Contains(knownCaps, c) {
			es.Add(fmt.Sprintf("%scapabilities[%d]", prefix, i), "%q: want one of %s", c, strings.Join(knownCaps, ", "))
		}
	}
	if r.Strategy != "" && !slices.Contains(Strategies, r.Strategy) {
		names := make([]string, len(Strategies))
		for i, st := range Strategies {
			names[i] = string(st)
		}
		es.Add(prefix+"strategy", "%q: want one of %s", r.Strategy, strings.Join(names, ", "))
	}
}

var knownCaps = []string{
	driver.CapConsole, driver.CapEvents, driver.CapImages, driver.CapKill, driver.CapLogs,
	driver.CapPreload, driver.CapResize, driver.CapRestart, driver.CapStart, driver.CapStop,
	driver.CapSuspend, driver.CapUsage, driver.CapAttach, driver.CapExec, driver.CapArchive, driver.CapTop, driver.CapVolumeRemove, driver.CapNetworkConnect, driver.CapRename,
	driver.CapKindContainer, driver.CapKindProcess, driver.CapKindVM, driver.CapKindBareMetal,
	driver.CapRestartPolicy, driver.CapVolumes, driver.CapHostPorts, driver.CapGPUs, driver.CapRunAsUser,
	driver.CapStdin, driver.CapTTY,
}

// affinity keys
const (
	affInstance = iota
	affGroup
	affImage
	affLabel
)

// affinityKey classifies an affinity key; for labels it returns the label
// name.
func affinityKey(k string) (kind int, label string) {
	switch k {
	case "instance", "container", "name":
		return affInstance, ""
	case "group":
		return affGroup, ""
	case "image":
		return affImage, ""
	}
	if l, ok := strings.CutPrefix(k, "label."); ok {
		return affLabel, l
	}
	return affLabel, k
}

// GroupKind says what a group is.
type GroupKind string

// Group kinds.
const (
	// KindApplication is a Zoe application: services with counts, essential
	// counts and a startup order.
	KindApplication GroupKind = "application"
	// KindNodeSet is a Nodepool node set: one instance per label, all
	// essential, all from one provider.
	KindNodeSet GroupKind = "nodeset"
)

// Group is placed as one unit (gang placement): the essential instances of
// all its services are placed all or none; the elastic ones (count minus
// essential) are best effort and may be shrunk or removed later to make room
// for another group's essential instances.
type Group struct {
	// ID names the group; it is the Group of each service's request and the
	// prefix of its instance ids ("<group>.<service>-<i>").
	ID   string    `json:"id"`
	Kind GroupKind `json:"kind,omitempty"` // default application
	// Priority orders the queue (higher first); it overrides the services'.
	Priority int `json:"priority,omitempty"`
	// Provider restricts every service to one provider. A node set with no
	// provider goes to the first provider (in name order) where it fits whole.
	Provider string `json:"provider,omitempty"`
	// Pool, for a node set, names the pool whose labels its services name:
	// a service with no image takes its label's spec, the pool's provider
	// is the group's, and ready instances of the pool's labels are handed
	// out first.
	Pool string `json:"pool,omitempty"`
	// Services are the group's parts. In a node set each is one label: its
	// Name is the label and its count is 1 unless set.
	Services []Service `json:"services"`
	// Owner is whose instances these are, for the quotas that cover them;
	// set by the control plane, not part of a group's JSON.
	Owner string `json:"-"`
}

// NewGroupID returns prefix, a dash and a fresh random suffix: an id for a
// group its submitter does not name.
func NewGroupID(prefix string) string {
	var b [3]byte
	_, _ = rand.Read(b[:])
	return prefix + "-" + hex.EncodeToString(b[:])
}

// Service is one part of a group.
type Service struct {
	Request
	// Essential is how many of the Count instances must run for the group to
	// run at all; nil means all of them. The rest are elastic.
	Essential *int `json:"essential,omitempty"`
	// StartupOrder orders start-up: lower first; equal values start together.
	StartupOrder int `json:"startup_order,omitempty"`
}

// EssentialCount returns how many instances of s are essential.
func (s *Service) EssentialCount() int {
	if s.Essential == nil {
		return s.N()
	}
	return *s.Essential
}

// ServiceRequest returns the request of service i as the scheduler places
// it: its ID is the group's ID, a dot and the service's name (else its ID,
// else "s" and i), its Group is the group's ID, and the group's priority and
// provider, when set, replace the service's own.
func (g *Group) ServiceRequest(i int) Request {
	s := &g.Services[i]
	r := s.Request
	name := s.Name
	if name == "" {
		name = s.ID
	}
	if name == "" {
		name = "s" + strconv.Itoa(i)
	}
	r.ID, r.Group, r.Owner = g.ID+"."+name, g.ID, g.Owner
	if g.Priority != 0 {
		r.Priority = g.Priority
	}
	if g.Provider != "" {
		r.Provider = g.Provider
	}
	return r
}

// Validate checks the group and returns driver.FieldErrors naming every bad
// field, or nil. Service fields are reported as "services[i].<field>".
func (g *Group) Validate() error {
	var es driver.FieldErrors
	if g.ID == "" {
		es.Add("id", "required")
	}
	RangePriority.Check(&es, "priority", int64(g.Priority))
	switch g.Kind {
	case "", KindApplication, KindNodeSet:
	default:
		es.Add("kind", "%q: want application or nodeset", g.Kind)
	}
	if len(g.Services) == 0 {
		es.Add("services", "a group needs at least one service")
	}
	if g.Pool != "" && g.Kind != KindNodeSet {
		es.Add("pool", "%q: only a node set (kind nodeset) takes its labels from a pool", g.Pool)
	}
	names := map[string]int{}
	for i := range g.Services {
		s := &g.Services[i]
		p := fmt.Sprintf("services[%d].", i)
		if g.Pool != "" && g.Kind == KindNodeSet && s.Image == "" && s.Kind == "" {
			// The spec is the pool's label's, filled in by the control
			// plane, which validates the group again then.
			RangeCount.Check(&es, p+"count", int64(s.Count))
			RangePriority.Check(&es, p+"priority", int64(s.Priority))
		} else {
			s.validate(&es, p)
		}
		RangeStartupOrder.Check(&es, p+"startup_order", int64(s.StartupOrder))
		if s.Essential != nil && (*s.Essential < 0 || *s.Essential > s.N()) {
			es.Add(p+"essential", "%d: want 0 to count (%d)", *s.Essential, s.N())
		}
		if g.Kind == KindNodeSet && s.EssentialCount() != s.N() {
			es.Add(p+"essential", "every instance of a node set is essential")
		}
		if g.Kind == KindNodeSet && s.Name == "" {
			es.Add(p+"name", "required: the node set label")
		}
		if s.Provider != "" && g.Provider != "" && s.Provider != g.Provider {
			es.Add(p+"provider", "%q differs from the group's provider %q", s.Provider, g.Provider)
		}
		key := s.Name
		if key == "" {
			key = s.ID
		}
		if key != "" {
			if j, dup := names[key]; dup {
				es.Add(p+"name", "%q already names services[%d]", key, j)
			}
			names[key] = i
		}
	}
	return es.Err()
}
