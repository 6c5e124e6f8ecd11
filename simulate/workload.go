// Package simulate replays workloads through Berth's scheduler on a cluster
// built by the sim back-end, and measures speed, packing and safety. It is
// what `berth sim` and the scheduler benchmarks run.
package simulate

import (
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
	"slices"
	"strings"

	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/drivers/sim"
	"github.com/berth-dev/berth/scheduler"
)

// Workload is a cluster and what arrives on it. In JSON:
//
//	{"name": "mine",
//	 "nodes": [{"count": 100, "cpus": 4, "memory": "32Gi", "labels": {"disk": "ssd"}}],
//	 "requests": [{"repeat": 1000, "cpus": 0.5, "memory": 256,
//	               "constraints": ["disk==ssd"], "arrival": 0, "interval": 0.01, "duration": 30}],
//	 "groups": [{"id": "job", "services": [{"name": "big", "type": "batch", "cpus": 6, "count": 4},
//	                                       {"name": "small", "type": "batch", "cpus": 2, "count": 8}],
//	             "arrival": 5, "duration": 60}]}
type Workload struct {
	Name string `json:"name"`
	// Nodes are the sim back-end's node pools.
	Nodes []sim.Pool `json:"nodes"`
	// Requests and Groups arrive in order of arrival time (file order for
	// equal times, requests before groups).
	Requests []Item      `json:"requests,omitempty"`
	Groups   []GroupItem `json:"groups,omitempty"`
}

// GroupItem is one group of a workload, possibly repeated: a group as
// POST /v1/groups takes it (each service with its own size and count),
// placed all or none, plus the replay fields. Repeat k of group "job" is
// called "job-k"; a group that is not repeated keeps its id.
type GroupItem struct {
	scheduler.Group
	// Repeat makes the item stand for this many groups (0 means 1).
	Repeat int `json:"repeat,omitempty"`
	// Arrival is when the first group arrives, in seconds from the start.
	Arrival float64 `json:"arrival,omitempty"`
	// Interval is the time between repeats, in seconds.
	Interval float64 `json:"interval,omitempty"`
	// Duration is how long each group's instances run, in seconds; 0
	// means to the end.
	Duration float64 `json:"duration,omitempty"`
}

// N returns how many instances one of the item's groups asks for.
func (g *GroupItem) N() int {
	n := 0
	for k := range g.Services {
		n += g.Services[k].N()
	}
	return n
}

// Item is one request of a workload, possibly repeated.
type Item struct {
	scheduler.Request
	// Repeat makes the item stand for this many requests (0 means 1).
	Repeat int `json:"repeat,omitempty"`
	// Arrival is when the first request arrives, in seconds from the start.
	Arrival float64 `json:"arrival,omitempty"`
	// Interval is the time between repeats, in seconds.
	Interval float64 `json:"interval,omitempty"`
	// Duration is how long each instance runs, in seconds; 0 means to the
	// end.
	Duration float64 `json:"duration,omitempty"`
	// Essential, when set, places the request as a gang: a group of one
	// service with this many essential instances, all or none.
	Essential *int `json:"essential,omitempty"`
	// Preplaced instances exist before the run: they are reserved
	// round-robin over the nodes, not scheduled.
	Preplaced bool `json:"preplaced,omitempty"`
	// Used is what each instance was measured to use (cpus, memory), for a
	// replay with advised sizes (Workload.Advised); it does not change a
	// replay as given.
	Used *driver.Resources `json:"used,omitempty"`
}

// Advised returns a copy of w where every request whose measured use
// (Used) is far from what it reserves asks for the size scheduler.Advise
// suggests instead, and how many requests were resized.
func (w *Workload) Advised(opt scheduler.AdviceOptions) (*Workload, int) {
	out := *w
	out.Requests = slices.Clone(w.Requests)
	resized := 0
	for i := range out.Requests {
		it := &out.Requests[i]
		if it.Used == nil {
			continue
		}
		a, far := scheduler.Advise(it.Resources, []driver.Usage{{CPU: it.Used.CPU, Memory: it.Used.Memory}}, opt)
		if !far {
			continue
		}
		it.CPU, it.Memory = a.Suggested.CPU, a.Suggested.Memory
		resized += max(it.Repeat, 1)
	}
	return &out, resized
}

// Load reads a workload from a JSON file. Unknown fields are errors; every
// error names the field.
func Load(path string) (*Workload, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return Decode(f)
}

// Decode reads a workload from JSON and validates it.
func Decode(r io.Reader) (*Workload, error) {
	data, err := io.ReadAll(r)
	if err != nil {
		return nil, err
	}
	var w Workload
	if err := driver.DecodeJSON(data, &w, "workload"); err != nil {
		return nil, err
	}
	if err := w.Validate(); err != nil {
		return nil, err
	}
	return &w, nil
}

// Validate checks the workload; every error names its field.
func (w *Workload) Validate() error {
	var es driver.FieldErrors
	add := func(path, format string, args ...any) {
		es = append(es, &driver.FieldError{Path: path, Reason: fmt.Sprintf(format, args...)})
	}
	// replay checks the replay fields of a request or group at p.
	replay := func(p string, repeat int, arrival, interval, duration float64) {
		if repeat < 0 {
			add(p+"repeat", "%d: must not be negative", repeat)
		}
		for _, f := range []struct {
			name string
			v    float64
		}{{"arrival", arrival}, {"interval", interval}, {"duration", duration}} {
			if f.v < 0 {
				add(p+f.name, "%v: must not be negative", f.v)
			}
		}
	}
	if len(w.Nodes) == 0 {
		add("nodes", "a workload needs at least one node pool")
	}
	if err := (&sim.Options{Pools: w.Nodes}).Validate(); err != nil {
		var fes driver.FieldErrors
		if errors.As(err, &fes) {
			for _, e := range fes {
				add(strings.Replace(e.Path, "pools", "nodes", 1), "%s", e.Reason)
			}
		} else {
			add("nodes", "%v", err)
		}
	}
	if len(w.Requests) == 0 && len(w.Groups) == 0 {
		add("requests", "a workload needs at least one request or group")
	}
	for i := range w.Requests {
		it := &w.Requests[i]
		p := fmt.Sprintf("requests[%d].", i)
		if err := it.Request.Validate(); err != nil {
			var fes driver.FieldErrors
			if errors.As(err, &fes) {
				for _, e := range fes {
					add(p+e.Path, "%s", e.Reason)
				}
			}
		}
		replay(p, it.Repeat, it.Arrival, it.Interval, it.Duration)
		if it.Essential != nil && (*it.Essential < 0 || *it.Essential > it.N()) {
			add(p+"essential", "%d: want 0 to count (%d)", *it.Essential, it.N())
		}
		if it.Used != nil {
			if err := driver.ValidateResources(p+"used.", *it.Used); err != nil {
				var fes driver.FieldErrors
				if errors.As(err, &fes) {
					for _, e := range fes {
						add(e.Path, "%s", e.Reason)
					}
				}
			}
		}
		if it.Preplaced && it.Essential != nil {
			add(p+"essential", "a preplaced item is reserved, not placed as a gang")
		}
	}
	ids := map[string]int{}
	for i := range w.Groups {
		g := &w.Groups[i]
		p := fmt.Sprintf("groups[%d].", i)
		if err := g.Group.Validate(); err != nil {
			var fes driver.FieldErrors
			if errors.As(err, &fes) {
				for _, e := range fes {
					add(p+e.Path, "%s", e.Reason)
				}
			}
		}
		switch {
		case g.ID == "":
		case strings.ContainsAny(g.ID, ".") || strings.HasPrefix(g.ID, "pre") || reqID.MatchString(g.ID):
			add(p+"id", "%q: a group id has no '.' and does not look like a request's (pre..., r<n>)", g.ID)
		default:
			if j, dup := ids[g.ID]; dup {
				add(p+"id", "%q already names groups[%d]", g.ID, j)
			}
			ids[g.ID] = i
		}
		replay(p, g.Repeat, g.Arrival, g.Interval, g.Duration)
	}
	return es.Err()
}

// reqID matches the ids the run gives requests ("r<item>.<repeat>").
var reqID = regexp.MustCompile(`^r[0-9]`)

// Builtins names the built-in workloads.
var Builtins = []string{"w1", "w2", "w3", "w5"}

// Builtin returns a built-in workload. nodes overrides the node count when
// positive.
//
//   - w1: 5,000 nodes of 4 cpus / 32 GiB / 110 instances; 1,000 instances
//     preplaced; then 50,000 requests of 0.1 cpu / 500 MiB, one at a time.
//   - w2: 10,000 nodes of 4 cpus / 32 GiB, half labelled disk=ssd; 1,000
//     requests of 0.5 cpu / 256 MiB with constraint disk==ssd, each
//     committed before the next.
//   - w3: 5,000 nodes of 32 cpus / 128 GiB in 10 zones; 1,000 batch groups
//     of 1,000 instances (0.1 cpu / 256 MiB) placed all or none, each with
//     one constraint zone==z<k>: 1,000,000 placements.
//   - w5: 100,000 nodes of 4 cpus / 32 GiB, each 90% full; 20,000 requests
//     of 0.1 cpu / 256 MiB, meant for several parallel schedulers.
func Builtin(name string, nodes int) (*Workload, error) {
	pick := func(def int) int {
		if nodes > 0 {
			return nodes
		}
		return def
	}
	img := driver.Spec{Image: "berth/sim"}
	spec := func(cpus float64, mem driver.Bytes) driver.Spec {
		s := img
		s.Resources = driver.Resources{CPU: driver.CPUs(cpus), Memory: mem}
		return s
	}
	switch name {
	case "w1":
		n := pick(5000)
		return &Workload{
			Name:  "w1",
			Nodes: []sim.Pool{{Count: n, NamePrefix: "n", Shape: sim.Shape{Resources: driver.Resources{CPU: driver.CPUs(4), Memory: 32 * driver.GiB}, MaxInstances: 110}}},
			Requests: []Item{
				{Request: scheduler.Request{Spec: spec(0.1, 500*driver.MiB)}, Repeat: 1000, Preplaced: true},
				{Request: scheduler.Request{Spec: spec(0.1, 500*driver.MiB)}, Repeat: 50000},
			},
		}, nil
	case "w2":
		n := pick(10000)
		shape := sim.Shape{Resources: driver.Resources{CPU: driver.CPUs(4), Memory: 32 * driver.GiB}}
		ssd := shape
		ssd.Labels = map[string]string{"disk": "ssd"}
		hdd := shape
		hdd.Labels = map[string]string{"disk": "hdd"}
		return &Workload{
			Name:  "w2",
			Nodes: []sim.Pool{{Count: n - n/2, NamePrefix: "ssd", Shape: ssd}, {Count: n / 2, NamePrefix: "hdd", Shape: hdd}},
			Requests: []Item{
				{Request: scheduler.Request{Spec: spec(0.5, 256*driver.MiB), Constraints: []string{"disk==ssd"}}, Repeat: 1000},
			},
		}, nil
	case "w3":
		n := pick(5000)
		zones := make([]string, 10)
		for i := range zones {
			zones[i] = fmt.Sprintf("z%d", i)
		}
		w := &Workload{
			Name:  "w3",
			Nodes: []sim.Pool{{Count: n, NamePrefix: "n", Shape: sim.Shape{Resources: driver.Resources{CPU: driver.CPUs(32), Memory: 128 * driver.GiB}, Zones: zones}}},
		}
		all := 1000
		for g := range 1000 {
			s := spec(0.1, 256*driver.MiB)
			s.Type = driver.TypeBatch
			w.Requests = append(w.Requests, Item{
				Request:   scheduler.Request{Spec: s, Count: 1000, Constraints: []string{fmt.Sprintf("zone==z%d", g%10)}},
				Essential: &all,
			})
		}
		return w, nil
	case "w5":
		n := pick(100000)
		return &Workload{
			Name:  "w5",
			Nodes: []sim.Pool{{Count: n, NamePrefix: "n", Shape: sim.Shape{Resources: driver.Resources{CPU: driver.CPUs(4), Memory: 32 * driver.GiB}}}},
			Requests: []Item{
				{Request: scheduler.Request{Spec: spec(3.6, 32*driver.GiB/10*9)}, Repeat: n, Preplaced: true},
				{Request: scheduler.Request{Spec: spec(0.1, 256*driver.MiB)}, Repeat: 20000},
			},
		}, nil
	}
	return nil, fmt.Errorf("%w: unknown workload %q: want one of %s or a JSON file", driver.ErrInvalid, name, strings.Join(Builtins, ", "))
}
