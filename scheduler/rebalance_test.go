package scheduler

import (
	"errors"
	"strings"
	"testing"

	"github.com/berth-dev/berth/driver"
)

// reserveOn reserves instance id of request r on node.
func reserveOn(t *testing.T, c *Cluster, r *Request, id, node string) Allocation {
	t.Helper()
	a := Allocation{ID: id, Name: id, Provider: "p", Node: node, Resources: r.Resources, Request: r.ID, Image: r.Image, Labels: r.Labels, Group: r.Group}
	if err := c.Reserve(a); err != nil {
		t.Fatal(err)
	}
	return a
}

// rebalanceFixture is a cluster with the requests its instances came from.
type rebalanceFixture struct {
	c      *Cluster
	nodes  []driver.Node
	reqs   map[string]*Request
	allocs []Allocation
}

func newFixture(t *testing.T, nodes []driver.Node) *rebalanceFixture {
	return &rebalanceFixture{c: newTestCluster(t, "p", nodes), nodes: nodes, reqs: map[string]*Request{}}
}

func (f *rebalanceFixture) put(t *testing.T, r *Request, id, node string) {
	f.reqs[r.ID] = r
	f.allocs = append(f.allocs, reserveOn(t, f.c, r, id, node))
}

func (f *rebalanceFixture) request(id string) *Request { return f.reqs[id] }

func (f *rebalanceFixture) plan(t *testing.T, opt RebalanceOptions) *Rebalance {
	t.Helper()
	opt.Request = f.request
	rb, err := f.c.PlanRebalance(opt)
	if err != nil {
		t.Fatal(err)
	}
	res := ReplayRebalance(ReplayInput{Nodes: map[string][]driver.Node{"p": f.nodes}, Allocations: f.allocs, Request: f.request, Moves: rb.Moves})
	if !res.OK() || res.Moved != len(rb.Moves) {
		t.Fatalf("replay: %+v of %d moves", res, len(rb.Moves))
	}
	if rb.Goal == RebalanceBinpack && res.NodesAfter != rb.NodesAfter {
		t.Fatalf("replay uses %d nodes, the plan says %d", res.NodesAfter, rb.NodesAfter)
	}
	return rb
}

func TestRebalanceBinpackEmptiesNodes(t *testing.T) {
	f := newFixture(t, mkNodes("n", 4, 4, 16, nil))
	r := req("web", 1, 512)
	for k := range 4 {
		f.put(t, r, "web-"+string(rune('0'+k)), "n"+string(rune('0'+k)))
	}
	before := f.c.Nodes()
	rb := f.plan(t, RebalanceOptions{})
	if rb.NodesBefore != 4 || rb.NodesAfter != 1 || len(rb.Freed) != 3 || len(rb.Moves) != 3 || rb.LowerBound != 1 {
		t.Fatalf("plan: %+v", rb)
	}
	// Planning changes nothing in the cluster.
	after := f.c.Nodes()
	for k := range before {
		if before[k].Free.CPU != after[k].Free.CPU || before[k].BerthInstances != after[k].BerthInstances {
			t.Fatalf("node %s changed: %+v -> %+v", before[k].Name, before[k], after[k])
		}
	}
}

func TestRebalanceKeepsConstraints(t *testing.T) {
	nodes := mkNodes("n", 3, 4, 16, nil)
	nodes[0].Labels = map[string]string{"disk": "ssd"}
	f := newFixture(t, nodes)
	db := req("db", 1, 512)
	db.Constraints = []string{"disk==ssd"}
	f.put(t, db, "db", "n0")
	web := req("web", 3, 512)
	f.put(t, web, "web-0", "n1")
	f.put(t, web, "web-1", "n2")
	rb := f.plan(t, RebalanceOptions{})
	// n0 (least filled) cannot be emptied: db needs ssd. web-0 cannot join
	// web-1 (3+3 > 4) but fits beside db.
	for _, m := range rb.Moves {
		if m.Instance == "db" {
			t.Fatalf("db moved off its ssd node: %+v", rb.Moves)
		}
	}
	var stay *Stay
	for k := range rb.Stays {
		if rb.Stays[k].Instance == "db" {
			stay = &rb.Stays[k]
		}
	}
	if stay == nil || !strings.Contains(stay.Reason, "constraint disk==ssd") {
		t.Fatalf("stays: %+v", rb.Stays)
	}
	if rb.NodesAfter != 2 || len(rb.Moves) != 1 {
		t.Fatalf("plan: %+v", rb)
	}
}

func TestRebalancePinnedAndMaxPerNode(t *testing.T) {
	f := newFixture(t, mkNodes("n", 3, 8, 32, nil))
	r := req("svc", 1, 256)
	r.MaxPerNode = 1
	f.put(t, r, "svc-0", "n0")
	f.put(t, r, "svc-1", "n1")
	other := req("job", 1, 256)
	f.put(t, other, "job-0", "n2")
	f.put(t, other, "job-1", "n0")
	rb := f.plan(t, RebalanceOptions{Pinned: func(id string) string {
		if id == "job-0" {
			return "movable: false"
		}
		return ""
	}})
	// svc-1 cannot join svc-0 (max_per_node 1) but may go to n2; job-0
	// is pinned, so n2 stays.
	for _, m := range rb.Moves {
		if m.Instance == "job-0" {
			t.Fatalf("pinned instance moved: %+v", m)
		}
		if m.Instance == "svc-1" && m.To == "n0" {
			t.Fatalf("max_per_node broken: %+v", m)
		}
	}
	found := false
	for _, s := range rb.Stays {
		found = found || s.Instance == "job-0" && s.Reason == "movable: false"
	}
	if !found {
		t.Fatalf("stays: %+v", rb.Stays)
	}
}

func TestRebalanceKeepsOthersAffinities(t *testing.T) {
	f := newFixture(t, mkNodes("n", 2, 8, 32, nil))
	cache := req("cache", 2, 256)
	f.put(t, cache, "cache", "n0")
	app := req("app", 1, 256)
	app.Affinities = []string{"instance==cache"}
	f.put(t, app, "app", "n0")
	big := req("big", 4, 256)
	f.put(t, big, "big", "n1")
	rb := f.plan(t, RebalanceOptions{})
	// Emptying n0 moves cache first (the larger): that would strand app,
	// whose affinity needs it, so n0 stays as it is; big joins them.
	if len(rb.Moves) != 1 || rb.Moves[0].Instance != "big" || len(rb.Stays) == 0 || !strings.Contains(rb.Stays[0].Reason, "break the affinity of app") {
		t.Fatalf("plan: %+v", rb)
	}
}

func TestRebalanceSpread(t *testing.T) {
	f := newFixture(t, mkNodes("n", 3, 4, 16, nil))
	r := req("w", 1, 256)
	for k := range 4 {
		f.put(t, r, "w-"+string(rune('0'+k)), "n0")
	}
	f.put(t, r, "w-4", "n1")
	rb := f.plan(t, RebalanceOptions{Goal: RebalanceSpread, Threshold: 0.5})
	if rb.MaxLoadBefore != 1 || rb.MaxLoadAfter > 0.5 || rb.OverBefore != 1 || rb.OverAfter != 0 || len(rb.Moves) != 2 {
		t.Fatalf("plan: %+v", rb)
	}
	for _, m := range rb.Moves {
		if m.From != "n0" || m.To == "n0" {
			t.Fatalf("move: %+v", m)
		}
	}
}

func TestRebalanceOptionsChecked(t *testing.T) {
	c := newTestCluster(t, "p", mkNodes("n", 1, 1, 1, nil))
	for _, tc := range []struct {
		opt   RebalanceOptions
		field string
	}{
		{RebalanceOptions{Goal: "pack"}, "goal"},
		{RebalanceOptions{Threshold: 1.5}, "threshold"},
		{RebalanceOptions{MaxMoves: -1}, "max_moves"},
		{RebalanceOptions{Load: "felt"}, "load"},
	} {
		_, err := c.PlanRebalance(tc.opt)
		if !errors.Is(err, driver.ErrInvalid) || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("%+v: %v", tc.opt, err)
		}
	}
}

func TestNodeIsMatchesOneName(t *testing.T) {
	for _, name := range []string{"n1", "a*b", "rack[1]/x", `c:\d`} {
		e, err := ParseExpr(NodeIs(name))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if !e.MatchValue(name) || e.MatchValue(name+"x") || e.MatchValue("a1b") {
			t.Errorf("%s: %q matches wrongly", name, NodeIs(name))
		}
	}
}

func TestRebalanceNeverMovesOntoANodeThatRefused(t *testing.T) {
	f := newFixture(t, mkNodes("n", 2, 8, 32, nil))
	r := req("w", 1, 256)
	f.put(t, r, "w-0", "n0")
	f.put(t, r, "w-1", "n1")
	f.put(t, r, "w-2", "n1")
	rb := f.plan(t, RebalanceOptions{Refused: func(id string) []string {
		if id == "w-0" {
			return []string{"p/n1"}
		}
		return nil
	}})
	// n0 is tried first; its one instance refuses n1: n1 is emptied
	// onto n0 instead.
	if len(rb.Moves) != 2 || rb.Moves[0].To != "n0" || rb.Stays[0].Instance != "w-0" || !strings.Contains(rb.Stays[0].Reason, "refused it for good") {
		t.Fatalf("plan: %+v", rb)
	}
}

func TestRebalanceHidesOtherNamespaces(t *testing.T) {
	f := newFixture(t, mkNodes("n", 2, 8, 32, nil))
	r := req("w", 1, 256)
	f.reqs[r.ID] = r
	for _, a := range []Allocation{
		{ID: "mine", Name: "mine", Provider: "p", Node: "n0", Resources: r.Resources, Request: "w", Owner: "a"},
		{ID: "theirs", Name: "theirs", Provider: "p", Node: "n0", Resources: r.Resources, Request: "w", Owner: "b"},
		{ID: "big", Name: "big", Provider: "p", Node: "n1", Resources: driver.Resources{CPU: driver.CPUs(5)}, Request: "w", Owner: "b"},
	} {
		if err := f.c.Reserve(a); err != nil {
			t.Fatal(err)
		}
		f.allocs = append(f.allocs, a)
	}
	rb := f.plan(t, RebalanceOptions{
		Pinned:  func(id string) string { return map[string]string{"theirs": "pinned", "big": "pinned"}[id] },
		Visible: func(ns string) bool { return ns == "a" },
	})
	// n0 cannot be emptied: "theirs" stays there, and is named Hidden.
	if len(rb.Moves) != 0 || len(rb.Stays) != 1 || rb.StaysTotal != 1 || rb.Stays[0].Instance != "mine" ||
		rb.Stays[0].Reason != "node n0 cannot be emptied: "+Hidden+" stays" {
		t.Fatalf("plan: %+v", rb)
	}
}
