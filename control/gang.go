package control

import (
	"context"
	"time"

	"github.com/berth-dev/berth/reconciler"
	"github.com/berth-dev/berth/scheduler"
)

// gang holds the groups whose essential instances wait to be placed all or
// none: the scheduler's queues (priority classes, a policy, backfill) and
// the ids of the queued groups, whose pending instances the one-by-one
// placer leaves alone. A group all of whose services belong to a pool
// that sets its own queue policy waits in that pool's queue; every other
// group in the server's (Config.QueuePolicy).
type gang struct {
	q     scheduler.Queue
	pools map[string]*scheduler.Queue
	// order is the server's queue, then the pools' in configured order:
	// the order in which a pass takes the queues' groups of one priority
	// class (scheduler.Cluster.ScheduleQueues).
	order []*scheduler.Queue
	ids   map[string]bool
	// held are the groups about to be queued: their instances are being
	// stored, and the one-by-one placer leaves them alone already.
	held map[string]bool
}

// init makes the server's queue with policy and one queue for each pool
// that sets a policy of its own.
func (g *gang) init(policy scheduler.Policy, pools []Pool) {
	g.q.Policy = policy
	g.ids = map[string]bool{}
	g.held = map[string]bool{}
	g.pools = map[string]*scheduler.Queue{}
	g.order = []*scheduler.Queue{&g.q}
	for _, p := range pools {
		if p.QueuePolicy != "" {
			q := &scheduler.Queue{Policy: p.QueuePolicy}
			g.pools[p.Name] = q
			g.order = append(g.order, q)
		}
	}
}

// queueOf returns the queue group gr waits in.
func (g *gang) queueOf(gr *scheduler.Group) *scheduler.Queue {
	if q, ok := g.pools[groupPool(gr)]; ok {
		return q
	}
	return &g.q
}

// len returns how many groups wait in all the queues.
func (g *gang) len() int {
	n := 0
	for _, q := range g.order {
		n += q.Len()
	}
	return n
}

// groupPool returns the pool every service of g belongs to, or "" when
// they do not all belong to one. A service's pool is its own (set from
// a node set's pool when it is submitted), else the group's (a group
// loaded from the store keeps only that).
func groupPool(g *scheduler.Group) string {
	pool := ""
	for k := range g.Services {
		p := g.Services[k].Pool
		if p == "" {
			p = g.Pool
		}
		if p == "" || (k > 0 && p != pool) {
			return ""
		}
		pool = p
	}
	return pool
}

func essentialMissing(p *scheduler.Plan) bool {
	for _, u := range p.Unplaced {
		if !u.Elastic {
			return true
		}
	}
	return false
}

// placeGroups places what fits of the gang queues and stores it.
//
// A placement that does not take (its instance was deleted while its group
// waited) is released at once; the pass is then made again, since the
// groups behind may fit in that room. Each pass takes the groups it placed
// off the queues, so this ends.
func (s placer) placeGroups(ctx context.Context) {
	for s.placeGroupsOnce(ctx) {
	}
}

// placeGroupsOnce makes one pass; it reports whether a placement was
// released because it did not take.
func (s placer) placeGroupsOnce(ctx context.Context) (released bool) {
	s.gangMu.Lock()
	if s.gang.len() == 0 {
		s.gangMu.Unlock()
		return false
	}
	start := time.Now()
	done, err := s.cluster.c.ScheduleQueues(s.gang.order, s.now())
	if s.cfg.Metrics != nil {
		s.cfg.Metrics.Scheduled(time.Since(start), len(done) > 0)
	}
	for _, d := range done {
		delete(s.gang.ids, d.Group.ID)
	}
	if err != nil {
		// A group the pass dropped (scheduler.ScheduleQueues) waits no
		// more: its instances go to the one-by-one placer.
		queued := map[string]bool{}
		for _, q := range s.gang.order {
			for _, id := range q.IDs() {
				queued[id] = true
			}
		}
		for id := range s.gang.ids {
			if !queued[id] {
				delete(s.gang.ids, id)
			}
		}
	}
	s.gangMu.Unlock()
	if err != nil {
		s.log.Warn("gang queue", "err", err)
	}
	for _, d := range done {
		// The instances evicted for the group (scheduler.Cluster.PlaceGroup
		// released them already) are deleted; its creates on their nodes
		// wait for that.
		s.evict(d.Plan.Evicted)
		for _, pl := range d.Plan.Placements {
			got, _, err := s.apply(ctx, pl.Instance, reconciler.Event{Kind: reconciler.Placed, Provider: pl.Provider, Node: pl.Node, Ports: pl.Ports})
			if err != nil || got.Provider != pl.Provider || got.Node != pl.Node || !got.Phase.HoldsNode() {
				s.cluster.release(pl.Instance)
				released = true
			}
		}
		s.deleteVictims(ctx, d.Plan.Evicted)
	}
	return released && ctx.Err() == nil
}
