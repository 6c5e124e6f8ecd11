package control

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/reconciler"
	"github.com/berth-dev/berth/scheduler"
)

// RebalanceOptions ask Plane.PlanRebalance for a plan.
type RebalanceOptions struct {
	// Goal is binpack (empty the most nodes; the default) or spread
	// (bring the most loaded nodes under Threshold).
	Goal      scheduler.RebalanceGoal `json:"goal,omitempty"`
	Threshold float64                 `json:"threshold,omitempty"`
	// Load is how the spread goal counts a node's load: reserved (the
	// default) or measured (the usage loop's latest samples).
	Load string `json:"load,omitempty"`
	// MaxMoves bounds the plan's moves (scheduler.RebalanceOptions).
	MaxMoves int `json:"max_moves,omitempty"`
	// MaxStays bounds the stays listed.
	MaxStays int `json:"max_stays,omitempty"`
	// Owners, when not empty, are the only namespaces whose instances may
	// move; the others stay (the API sets it to the caller's).
	Owners []string `json:"-"`
}

// RebalanceAnswer is a rebalance plan (scheduler.Rebalance) with the
// result of replaying it on a fresh copy of the scheduler's ledger before
// it was answered (Check), and how long planning took.
type RebalanceAnswer struct {
	scheduler.Rebalance
	Check scheduler.ReplayResult `json:"check"`
	// PlanSeconds is the time to plan, CheckSeconds the time to replay.
	PlanSeconds  float64 `json:"plan_seconds"`
	CheckSeconds float64 `json:"check_seconds"`
}

// PlanRebalance computes a rebalance of the cluster as it runs (the
// scheduler's ledger: reservations, node readings, measured use) without
// changing anything: the moves, the nodes freed or the loads before and
// after, and why the instances on the nodes it could not empty or unload
// stay (scheduler.Cluster.PlanRebalance). Only running instances move, and
// of those not: instances whose request says movable false, processes of
// the local back-end and instances with volumes unless their request says
// movable true, pool instances, and instances of namespaces outside
// opt.Owners when it is set. The plan is then replayed make-before-break
// on a fresh ledger built from the same nodes and instances
// (scheduler.ReplayRebalance), whose result is Check. Bad options are
// driver.FieldErrors naming the field.
func (p *Plane) PlanRebalance(ctx context.Context, opt RebalanceOptions) (*RebalanceAnswer, error) {
	if err := p.refuse(); err != nil {
		return nil, err
	}
	return p.planRebalance(ctx, opt)
}

// planRebalance is Plane.PlanRebalance.
func (p *state) planRebalance(ctx context.Context, opt RebalanceOptions) (*RebalanceAnswer, error) {
	so := scheduler.RebalanceOptions{Goal: opt.Goal, Threshold: opt.Threshold, Load: opt.Load, MaxMoves: opt.MaxMoves, MaxStays: opt.MaxStays}
	if err := so.Check(); err != nil {
		return nil, err
	}
	in := p.rebalancer.rebalanceInput(opt.Owners)
	so.Request = in.request
	so.Pinned = func(id string) string { return in.pinned[id] }
	so.Refused = func(id string) []string { return in.refused[id] }
	if len(opt.Owners) > 0 {
		so.Visible = func(ns string) bool { return slices.Contains(opt.Owners, ns) }
	}
	if so.Load == scheduler.LoadMeasured {
		so.Measured = p.rebalancer.measuredUse()
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	start := time.Now()
	rb, err := p.cluster.c.PlanRebalance(so)
	if err != nil {
		return nil, err
	}
	ans := &RebalanceAnswer{Rebalance: *rb, PlanSeconds: time.Since(start).Seconds()}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	start = time.Now()
	ans.Check = scheduler.ReplayRebalance(scheduler.ReplayInput{
		Nodes: in.nodes, Capabilities: in.caps, Quotas: quotas(&p.cfg), Allocations: in.allocs, Request: in.request, Moves: rb.Moves,
	})
	ans.CheckSeconds = time.Since(start).Seconds()
	if so.Visible != nil {
		hideForeign(&ans.Check, in.allocs, so.Visible)
	}
	return ans, nil
}

// rebalanceInput is what a rebalance plans from, read from memory at once.
type rebalanceInput struct {
	reqs   map[string]*scheduler.Request
	pinned map[string]string
	// refused are, by instance, the nodes that refused it for good
	// ("provider/node").
	refused map[string][]string
	allocs  []scheduler.Allocation
	nodes   map[string][]driver.Node
	caps    map[string][]string
}

func (in *rebalanceInput) request(id string) *scheduler.Request { return in.reqs[id] }

// rebalanceInput reads the requests, the instances that hold a node (with
// why each that must stay stays) and the nodes' latest readings.
func (s rebalancer) rebalanceInput(owners []string) *rebalanceInput {
	in := &rebalanceInput{reqs: map[string]*scheduler.Request{}, pinned: map[string]string{}, refused: map[string][]string{},
		nodes: map[string][]driver.Node{}, caps: map[string][]string{}}
	s.mu.RLock()
	for id, sr := range s.requests {
		r := sr.Request
		in.reqs[id] = &r
	}
	byProv := map[string][]string{}
	for id := range s.nodeInfo {
		prov, _, _ := strings.Cut(id, "/")
		byProv[prov] = append(byProv[prov], id)
	}
	for prov, ids := range byProv {
		slices.Sort(ids)
		for _, id := range ids {
			in.nodes[prov] = append(in.nodes[prov], s.nodeInfo[id])
		}
	}
	s.mu.RUnlock()
	for _, name := range s.provNames {
		in.caps[name] = append(s.provs[name].Capabilities(), s.provs[name].Features()...)
	}
	for _, x := range s.snapshot(func(r *rec) bool { return r.Phase.HoldsNode() }) {
		in.allocs = append(in.allocs, allocationOf(&x))
		if why := s.staysFor(&x, in.reqs[x.Request], owners); why != "" {
			in.pinned[x.ID] = why
		}
		if nodes := x.RefusedNodes(); len(nodes) > 0 {
			in.refused[x.ID] = nodes
		}
	}
	return in
}

// staysFor says why instance x must stay where it is, "" when it may move.
func (s rebalancer) staysFor(x *reconciler.Instance, r *scheduler.Request, owners []string) string {
	var movable *bool
	if r != nil {
		movable = r.Movable
	}
	switch {
	case x.Phase != reconciler.Running:
		return fmt.Sprintf("not running (%s)", x.Phase)
	case movable != nil && !*movable:
		return "its request says movable: false"
	case len(owners) > 0 && !slices.Contains(owners, x.Owner):
		return fmt.Sprintf("namespace %q is not the caller's", x.Owner)
	case x.Pool != "":
		return fmt.Sprintf("it belongs to pool %s", x.Pool)
	case movable != nil && *movable:
		return ""
	case x.Spec.Kind == driver.KindProcess && s.provs[x.Provider] != nil && driverName(s.provs[x.Provider]) == "local":
		return "a process of the local back-end (movable: true moves it)"
	case len(x.Spec.Volumes) > 0:
		return "it has volumes, whose data would not follow (movable: true moves it)"
	}
	return ""
}

// measuredUse returns each measured instance's latest use.
func (s rebalancer) measuredUse() map[string]driver.Resources {
	out := map[string]driver.Resources{}
	for _, x := range s.snapshot(func(r *rec) bool { return r.Phase == reconciler.Running }) {
		if us := s.meter.samples(x.ID); len(us) > 0 {
			u := us[len(us)-1]
			out[x.ID] = driver.Resources{CPU: u.CPU, Memory: u.Memory}
		}
	}
	return out
}

// hideForeign names the instances of the check that the caller may not
// see (visible says by namespace) scheduler.Hidden.
func hideForeign(ck *scheduler.ReplayResult, allocs []scheduler.Allocation, visible func(string) bool) {
	owner := make(map[string]string, len(allocs))
	for _, a := range allocs {
		owner[a.ID] = a.Owner
	}
	for k, r := range ck.Refused {
		id, why, _ := strings.Cut(r, ": ")
		if !visible(owner[id]) {
			ck.Refused[k] = scheduler.Hidden + ": " + why
		}
	}
	for k, id := range ck.Misplaced {
		if !visible(owner[id]) {
			ck.Misplaced[k] = scheduler.Hidden
		}
	}
}
