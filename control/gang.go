package control

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
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

// holdGroup marks group id as about to be queued (queueGroup), before its
// pending instances are stored: from then on the one-by-one placer never
// places them alone. release undoes it when they are not stored.
func (s admitter) holdGroup(id string) (release func()) {
	s.gangMu.Lock()
	s.gang.held[id] = true
	s.gangMu.Unlock()
	return func() {
		s.gangMu.Lock()
		delete(s.gang.held, id)
		s.gangMu.Unlock()
	}
}

// queueGroup adds g to the gang queue (and ends its hold).
func (s admitter) queueGroup(g *scheduler.Group, now time.Time) {
	s.gangMu.Lock()
	defer s.gangMu.Unlock()
	delete(s.gang.held, g.ID)
	if s.gang.ids[g.ID] {
		return
	}
	if err := s.gang.queueOf(g).Push(g, now); err != nil {
		s.log.Warn("gang queue", "group", g.ID, "err", err)
		return
	}
	s.gang.ids[g.ID] = true
}

// gangQueued reports whether group id waits in the gang queue, or is
// about to (holdGroup).
func (s admitter) gangQueued(id string) bool {
	if id == "" {
		return false
	}
	s.gangMu.Lock()
	defer s.gangMu.Unlock()
	return s.gang.ids[id] || s.gang.held[id]
}

// loadGroups queues again the stored groups none of whose instances has
// been placed (after a restart).
func (s *state) loadGroups(ctx context.Context) error {
	kvs, _, err := s.st.List(ctx, PrefixGroups)
	if err != nil {
		return fmt.Errorf("control: load groups: %w", err)
	}
	if len(kvs) == 0 {
		return nil
	}
	placed := map[string]bool{}
	members := map[string]bool{}
	owners := map[string]string{} // the group's owner, from its instances (not stored with the group)
	s.mu.RLock()
	for in := range s.recs.all() {
		g := in.Group()
		if g == "" {
			continue
		}
		members[g] = true
		owners[g] = in.Owner
		if in.Phase != reconciler.Pending {
			placed[g] = true
		}
	}
	s.mu.RUnlock()
	for _, kv := range kvs {
		var g scheduler.Group
		err := json.Unmarshal(kv.Value, &g)
		if err == nil {
			err = scheduler.RangePriority.Err("priority", int64(g.Priority))
		}
		if err != nil {
			if err := s.moveAside(ctx, kv, fmt.Errorf("group: %w", err)); err != nil {
				return err
			}
			continue
		}
		id := strings.TrimPrefix(kv.Key, PrefixGroups)
		g.Owner = owners[id]
		if members[id] && !placed[id] {
			s.admitter.queueGroup(&g, s.now())
		}
	}
	return nil
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
