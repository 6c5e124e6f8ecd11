package scheduler

import (
	"maps"
	"regexp"
	"slices"
	"strings"

	"github.com/berth-dev/berth/driver"
)

// ReplayInput is a cluster as it was when a rebalance was planned, and the
// moves to replay on it.
type ReplayInput struct {
	// Nodes are each provider's nodes as last read, Capabilities each
	// provider's (SetCapabilities), Quotas the quotas in force.
	Nodes        map[string][]driver.Node
	Capabilities map[string][]string
	Quotas       []Quota
	// Allocations are the instances where they are before the moves.
	Allocations []Allocation
	// Request returns the placement request of a request id, as for
	// RebalanceOptions.Request.
	Request func(id string) *Request
	Moves   []Move
}

// ReplayResult is what replaying a rebalance found.
type ReplayResult struct {
	// Moved counts the moves the fresh ledger accepted; Refused says, for
	// each it refused, which and why ("instance: reason").
	Moved   int      `json:"moved"`
	Refused []string `json:"refused"`
	// Overbooked are the nodes holding more than they can at the end
	// (Cluster.Overbooked); Misplaced the instances whose node breaks a
	// hard constraint of their request or whose hard affinity fails at
	// the end, and did not before. Both must be empty.
	Overbooked []string `json:"overbooked"`
	Misplaced  []string `json:"misplaced"`
	// NodesAfter counts the online nodes holding instances at the end.
	NodesAfter int `json:"nodes_after"`
}

// OK reports whether every move was accepted and the end state is valid.
func (r *ReplayResult) OK() bool {
	return len(r.Refused) == 0 && len(r.Overbooked) == 0 && len(r.Misplaced) == 0
}

// maxReplayNotes bounds the refusals and misplaced instances a replay
// lists.
const maxReplayNotes = 100

// ReplayRebalance replays a rebalance plan on a fresh Cluster built from
// in (what berth sim does with a workload): each move make-before-break, the
// new copy placed by Place with its request pinned to the target node (so
// every filter of placement checks it again, with the old copy still
// holding its node), then the old copy released. It then checks the end
// state independently of the planner: every node's allocations against its
// capacity (Overbooked), and every instance's hard constraints and hard
// affinities against its node, evaluated here from the nodes' labels and
// the instances on them.
func ReplayRebalance(in ReplayInput) ReplayResult {
	c := NewCluster()
	for _, p := range slices.Sorted(maps.Keys(in.Nodes)) {
		_ = c.UpdateNodes(p, in.Nodes[p])
	}
	for p, caps := range in.Capabilities {
		c.SetCapabilities(p, caps)
	}
	if len(in.Quotas) > 0 {
		_ = c.SetQuotas(in.Quotas)
	}
	res := ReplayResult{Refused: []string{}, Overbooked: []string{}, Misplaced: []string{}}
	_ = c.Reserve(in.Allocations...)
	where := make(map[string]Allocation, len(in.Allocations))
	for _, a := range in.Allocations {
		where[a.ID] = a
	}
	before := badInstances(in, where)
	refuse := func(id, why string) {
		if len(res.Refused) < maxReplayNotes {
			res.Refused = append(res.Refused, id+": "+why)
		}
	}
	for _, m := range in.Moves {
		a, ok := where[m.Instance]
		if !ok || a.Node != m.From || a.Provider != m.Provider {
			refuse(m.Instance, "not on "+m.Provider+"/"+m.From)
			continue
		}
		var r Request
		if rq := in.Request(a.Request); rq != nil {
			r = *rq
		}
		r.Spec.Resources, r.Spec.Image, r.Spec.Labels, r.Spec.Name = a.Resources, a.Image, a.Labels, a.Name
		r.ID, r.Count, r.Group, r.Priority, r.Owner, r.Pool, r.Provider = m.Instance+"~moved", 1, a.Group, a.Priority, a.Owner, a.Pool, a.Provider
		r.Constraints = append(slices.Clone(r.Constraints), NodeIs(m.To))
		plan, err := c.Place(&r)
		if err != nil {
			refuse(m.Instance, err.Error())
			continue
		}
		if len(plan.Placements) != 1 {
			why := "refused"
			if len(plan.Unplaced) > 0 {
				why = plan.Unplaced[0].Reasons.String()
			}
			refuse(m.Instance, why)
			continue
		}
		_ = c.Release(m.Instance)
		a.Node, a.Ports = m.To, plan.Placements[0].Ports
		where[m.Instance] = a
		res.Moved++
	}
	res.Overbooked = append(res.Overbooked, c.Overbooked()...)
	for id := range badInstances(in, where) {
		if !before[id] && len(res.Misplaced) < maxReplayNotes {
			res.Misplaced = append(res.Misplaced, id)
		}
	}
	slices.Sort(res.Misplaced)
	// A node whose reading counts more instances than Berth had there
	// holds others' too.
	start, used := map[[2]string]int{}, map[[2]string]bool{}
	for _, a := range in.Allocations {
		start[[2]string{a.Provider, a.Node}]++
	}
	for _, a := range where {
		used[[2]string{a.Provider, a.Node}] = true
	}
	for p, ns := range in.Nodes {
		for _, n := range ns {
			k := [2]string{p, n.Name}
			if n.Status == driver.NodeOnline && (used[k] || n.Instances > start[k]) {
				res.NodesAfter++
			}
		}
	}
	return res
}

// NodeIs returns the constraint that holds on the node named name alone
// (its name as a literal, or as a quoted regular expression when it holds
// a character of globs).
func NodeIs(name string) string {
	if !strings.ContainsAny(name, "*?[]/\\") {
		return "node==" + name
	}
	return "node==/" + regexp.QuoteMeta(name) + "/"
}

// badInstances returns the instances at where whose node breaks a hard
// constraint or a hard affinity of their request, evaluated from the
// nodes' labels and attributes and the instances on each node.
func badInstances(in ReplayInput, where map[string]Allocation) map[string]bool {
	type key = [2]string
	nodes := map[key]*driver.Node{}
	for p, ns := range in.Nodes {
		for k := range ns {
			nodes[key{p, ns[k].Name}] = &ns[k]
		}
	}
	on := map[key][]Allocation{}
	for _, a := range where {
		k := key{a.Provider, a.Node}
		on[k] = append(on[k], a)
	}
	bad := map[string]bool{}
	reqs := map[string]*Request{}
	for id, a := range where {
		r, ok := reqs[a.Request]
		if !ok {
			r = in.Request(a.Request)
			reqs[a.Request] = r
		}
		if r == nil {
			continue
		}
		n := nodes[key{a.Provider, a.Node}]
		for _, s := range r.Constraints {
			e, err := ParseExpr(s)
			if err != nil || e.Soft {
				continue
			}
			if n == nil || !nodeMatches(&e, a.Provider, n) {
				bad[id] = true
			}
		}
		for _, s := range r.Affinities {
			e, err := ParseExpr(s)
			if err != nil || e.Soft {
				continue
			}
			match := false
			kind, label := affinityKey(e.Key)
			for _, b := range on[key{a.Provider, a.Node}] {
				var v string
				okv := true
				switch kind {
				case affInstance:
					v = b.Name
					if v == "" {
						v = b.ID
					}
				case affGroup:
					v, okv = b.Group, b.Group != ""
				case affImage:
					v = b.Image
				case affLabel:
					v, okv = b.Labels[label]
				}
				if okv && e.MatchValue(v) {
					match = true
					break
				}
			}
			if kind == affImage && n != nil && slices.ContainsFunc(n.Images, e.MatchValue) {
				match = true
			}
			if match == e.Negate {
				bad[id] = true
			}
		}
		if r.MaxPerNode > 0 {
			k := 0
			for _, b := range on[key{a.Provider, a.Node}] {
				if b.Request == a.Request {
					k++
				}
			}
			if k > r.MaxPerNode {
				bad[id] = true
			}
		}
	}
	return bad
}

// nodeMatches evaluates constraint e on node n of provider p: "node" is
// the name, "provider" the provider, any other key a label or else an
// attribute; a node without the key satisfies != and fails ==.
func nodeMatches(e *Expr, p string, n *driver.Node) bool {
	var v string
	var ok bool
	switch e.Key {
	case "node":
		v, ok = n.Name, true
	case "provider":
		v, ok = p, true
	default:
		if v, ok = n.Labels[e.Key]; !ok {
			v, ok = n.Attributes[e.Key]
		}
	}
	return (ok && e.MatchValue(v)) != e.Negate
}
