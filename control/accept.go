package control

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/reconciler"
	"github.com/berth-dev/berth/scheduler"
)

// admission is one call of accept: the records it makes, where the
// scheduler placed them, and what it holds until it is stored.
type admission struct {
	s     *state
	now   time.Time
	parts []part
	group *scheduler.Group
	// recs are the new instance records, the parts' in order; specs are
	// the spec each part's instances share.
	recs  []*reconciler.Instance
	specs []*driver.Spec
	// byID is the placement of each placed instance; reasons says why an
	// unplaced one (by "<request>#<index>") waits.
	byID    map[string]scheduler.Placement
	reasons map[string]string
	// launch holds the actions that start each placed instance once it is
	// stored, when the reconciler runs.
	launch map[string][]reconciler.Action
	// held are the ids the scheduler's ledger holds for this call; named
	// is set once the names of recs are claimed. Both are given back
	// unless the records are stored.
	held   []string
	named  bool
	stored bool
}

// accept places the parts' instances, stores the requests, the instances
// (scheduled with their intent, or pending with the reason) and the group
// in one transaction, and starts the launches. groupPlan, when set, is the
// group's plan, made already; otherwise each request is placed here.
//
// Its steps, each a method of admission: make the records and refuse what
// could never fit (build), claim the names (claimNames), place within
// the quotas (place), make the placements the instances' next phase
// (settle), store everything (store), start what was placed (start). Whatever it holds is given back by one deferred
// call when a step fails.
func (s admitter) accept(ctx context.Context, parts []part, groupPlan *scheduler.Plan, group *scheduler.Group) ([]Placed, error) {
	a := &admission{s: s.state, now: s.now(), parts: parts, group: group,
		byID: map[string]scheduler.Placement{}, reasons: map[string]string{}, launch: map[string][]reconciler.Action{}}
	defer a.giveBack()
	if groupPlan != nil {
		a.take(groupPlan)
	}
	if err := a.build(); err != nil {
		return nil, err
	}
	if err := a.claimNames(); err != nil {
		return nil, err
	}
	if groupPlan == nil {
		if err := a.place(); err != nil {
			return nil, err
		}
	}
	a.settle()
	// Nothing of a group that does not fit is placed: it waits in the
	// gang queue and is placed all or none, its instances never alone,
	// not even between their storing and its queueing.
	waits := group != nil && groupPlan != nil && essentialMissing(groupPlan)
	if waits {
		release := s.holdGroup(group.ID)
		defer release()
	}
	if err := a.store(ctx); err != nil {
		return nil, err
	}
	out := a.start()
	if waits {
		s.queueGroup(group, a.now)
	}
	if len(a.byID) < len(a.recs) {
		s.placer.kickPlacer()
	}
	return out, nil
}

// giveBack returns what a failed admission holds: the ledger's
// reservations and the claimed names. Once stored, the instances hold
// both through their records.
func (a *admission) giveBack() {
	if a.stored {
		return
	}
	for _, id := range a.held {
		a.s.cluster.release(id)
	}
	if a.named {
		a.s.unreserveNames(a.recs)
	}
}

// take records the placements and reasons of plan.
func (a *admission) take(plan *scheduler.Plan) {
	for _, pl := range plan.Placements {
		a.byID[pl.Instance] = pl
		a.held = append(a.held, pl.Instance)
	}
	for _, u := range plan.Unplaced {
		for _, i := range u.Indexes {
			a.reasons[u.Request+"#"+strconv.Itoa(i)] = "no node fits: " + u.Reasons.String()
		}
	}
}

// build makes the pending records of every part's instances and refuses a
// part that could never fit: larger than any node, or than a quota.
func (a *admission) build() error {
	s := a.s
	for pi := range a.parts {
		pt := &a.parts[pi]
		r := &pt.req
		// The request's instances share one spec; names are their own.
		spec := r.Spec
		spec.Name = ""
		a.specs = append(a.specs, &spec)
		for i := range r.N() {
			id := r.InstanceID(i)
			name := id
			if r.Name != "" {
				name = instanceName(r, i)
			}
			a.recs = append(a.recs, &reconciler.Instance{
				ID: id, Name: name, Spec: &spec, Phase: reconciler.Pending,
				Owner: pt.owner, Pool: pt.pool, Label: pt.label, Group: r.Group, Request: r.ID,
				Priority: r.Priority, Created: a.now, Updated: a.now,
			})
		}
		prov := r.Provider
		if pt.pool != "" {
			prov = s.placer.poolProvider(pt.pool)
		}
		if why := s.placer.tooLarge(r.Resources, prov); why != "" {
			return driver.Errorf(driver.ErrInsufficientCapacity, "request %s can never fit: %s", r.ID, why)
		}
		for _, u := range s.placer.quotaUse() {
			if !u.Covers(pt.owner, pt.pool, r.Provider) {
				continue
			}
			if why := u.Never(r.Resources, r.N()); why != "" {
				return driver.Errorf(driver.ErrQuotaExceeded, "request %s can never fit: %s", r.ID, why)
			}
		}
	}
	return nil
}

// claimNames claims the names of the new instances.
func (a *admission) claimNames() error {
	if err := a.s.reserveNames(a.recs); err != nil {
		return err
	}
	a.named = true
	return nil
}

// place places each request's instances within the quotas (the
// scheduler's filters); those it cannot place wait, saying why.
func (a *admission) place() error {
	s := a.s
	for pi := range a.parts {
		pt := &a.parts[pi]
		r := &pt.req
		r.Owner, r.Pool = pt.owner, pt.pool
		start := time.Now()
		plan, err := s.cluster.c.Place(r)
		if s.cfg.Metrics != nil {
			s.cfg.Metrics.Scheduled(time.Since(start), err == nil && plan.Complete())
		}
		if err != nil {
			return err
		}
		a.take(plan)
	}
	return nil
}

// settle makes each placement the instance's next phase (creating, with
// the launch to start, when the reconciler runs; scheduled otherwise), and
// gives each unplaced instance the reason it waits.
func (a *admission) settle() {
	s := a.s
	for _, in := range a.recs {
		pl, ok := a.byID[in.ID]
		if ok {
			// The scheduler's ledger keeps the instance's id for as long
			// as the record: both hold the one copy.
			if in.Name == in.ID {
				in.Name = pl.Instance
			}
			in.ID = pl.Instance
		}
		if !ok {
			in.Message = a.reasons[in.Request+"#"+strconv.Itoa(indexOf(in))]
			if in.Message == "" {
				in.Message = "waiting for a node"
			}
			continue
		}
		if s.runner.runtimeOf() != nil {
			// The reconciler runs: store the instance as creating and start
			// the create once it is stored, saving a transaction.
			next, acts := s.m.Step(*in, reconciler.Event{Kind: reconciler.Placed, Provider: pl.Provider, Node: pl.Node, Ports: pl.Ports}, a.now)
			*in = next
			a.launch[in.ID] = acts
			continue
		}
		in.Phase, in.Provider, in.Node, in.HostPorts = reconciler.Scheduled, pl.Provider, pl.Node, pl.Ports
	}
}

// store commits the requests, every instance and the group in one
// transaction; none of them may exist yet.
func (a *admission) store(ctx context.Context) error {
	t := &txn{newReqs: make(map[string]*storedRequest, len(a.parts)), newGroup: a.group, placed: true}
	for pi, pt := range a.parts {
		t.newReqs[pt.req.ID] = &storedRequest{Request: pt.req, Owner: pt.owner, Time: a.now, spec: a.specs[pi]}
	}
	for _, in := range a.recs {
		t.put(0, in)
	}
	ok, _, err := a.s.commit(ctx, t)
	if err != nil {
		return err
	}
	if !ok {
		return errExists(a.parts[0].req.ID)
	}
	a.stored = true
	return nil
}

// start performs the launches of the stored instances, or wakes the
// reconciler for those stored as scheduled, and returns the answer.
func (a *admission) start() []Placed {
	s := a.s
	out := make([]Placed, 0, len(a.recs))
	for _, in := range a.recs {
		p := Placed{Instance: viewOf(in)}
		if in.Phase.HoldsNode() {
			p.Node = s.nodeRef(in.Provider, in.Node)
		}
		// Read the runtime after storing: a Run starting now either sees
		// the instance when it resumes or is seen here.
		switch rt := s.runner.runtimeOf(); {
		case a.launch[in.ID] != nil:
			s.runner.perform(*in, a.launch[in.ID], nil)
		case in.Phase == reconciler.Scheduled && rt != nil:
			s.runner.tickAt(rt, in.ID, a.now)
		}
		out = append(out, p)
	}
	return out
}

// errExists is the answer to a request whose id, or one of whose
// instances' ids, is taken.
func errExists(id string) error {
	return fmt.Errorf("%w: request %s: %w", driver.ErrAlreadyExists, id, &driver.FieldError{Path: "id", Reason: "a request or instance with this id exists already"})
}
