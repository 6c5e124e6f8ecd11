package control

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"time"

	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/provider"
	"github.com/berth-dev/berth/reconciler"
	"github.com/berth-dev/berth/scheduler"
	"github.com/berth-dev/berth/store"
)

// syncLoop reads every provider's nodes and instances each SyncInterval:
// node changes feed the scheduler and the lifecycle (node offline), listings
// update observed states and find leaks, and pools are topped up. A round
// that takes more than a quarter of SyncInterval (a listing of a million
// instances) stretches the wait before the next to four times its length,
// so that syncing never takes more than a fifth of the time.
func (s syncer) syncLoop(ctx context.Context, rt *runtime) {
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		began := time.Now()
		s.syncOnce(ctx, rt)
		took := time.Since(began)
		t.Reset(max(s.cfg.SyncInterval-took, 4*took))
	}
}

// syncOnce does one round of the sync loop.
func (s syncer) syncOnce(ctx context.Context, rt *runtime) {
	for _, name := range s.provNames {
		if ctx.Err() != nil {
			return
		}
		p := s.provs[name]
		s.syncNodes(ctx, rt, p)
		s.syncInstances(ctx, rt, p)
	}
	s.verbs.syncPools(ctx)
	if s.cfg.Metrics != nil {
		s.mu.RLock()
		n := s.queued
		s.mu.RUnlock()
		s.cfg.Metrics.QueueDepth(n)
		if q, err := s.verbs.quotas(ctx); err == nil {
			for _, u := range q {
				s.cfg.Metrics.QuotaUse(u)
			}
		}
	}
}

// syncNodes reads p's nodes, hands them to the scheduler, records status
// changes in the store and tells the instances on nodes that went offline.
// Each round it also tells the instances whose retry is stuck deleting a
// failed copy on a node that is offline, so that they are placed again
// now rather than when the node returns.
func (s syncer) syncNodes(ctx context.Context, rt *runtime, p *provider.Provider) {
	ps, err := s.placer.readNodes(ctx, p)
	if err != nil {
		if ctx.Err() == nil {
			s.log.Warn("provider state", "provider", p.Name(), "err", err)
		}
		return
	}
	s.placer.kickPlacer()
	type change struct {
		n     driver.Node
		prev  nodeSeen
		known bool
	}
	var changes []change
	var changed []driver.Node
	rt.mu.Lock()
	for _, n := range ps.Nodes {
		key := p.Name() + "/" + n.Name
		prev, known := rt.nodes[key]
		if known && prev.status == n.Status && prev.reason == n.Reason {
			continue
		}
		rt.nodes[key] = nodeSeen{status: n.Status, reason: n.Reason}
		changed = append(changed, n)
		if !known || prev.status != n.Status {
			changes = append(changes, change{n, prev, known})
		}
	}
	rt.mu.Unlock()
	s.recordNodes(ctx, p.Name(), changed)
	// offline holds p's offline nodes, true for those that just went.
	offline := map[string]bool{}
	for _, n := range ps.Nodes {
		if n.Status == driver.NodeOffline {
			offline[n.Name] = false
		}
	}
	for _, c := range changes {
		n, prev, known := c.n, c.prev, c.known
		switch {
		case n.Status == driver.NodeOffline:
			s.log.Warn("node offline", "provider", p.Name(), "node", n.Name, "reason", n.Reason)
			offline[n.Name] = true
		case known && prev.status == driver.NodeOffline:
			s.log.Info("node back", "provider", p.Name(), "node", n.Name, "status", n.Status)
			// Tick every instance with a stale copy there so it is deleted.
			for _, in := range s.snapshot(func(in *rec) bool {
				return slices.ContainsFunc(in.Stale(), func(r reconciler.Ref) bool { return r.Provider == p.Name() && r.Node == n.Name })
			}) {
				s.runner.tickAt(rt, in.ID, s.now())
			}
		}
	}
	if len(offline) == 0 {
		return
	}
	// The event names the node: an instance that moved since the snapshot
	// ignores it.
	for _, in := range s.snapshot(func(in *rec) bool {
		just, off := offline[in.Node]
		return off && in.Provider == p.Name() &&
			((just && in.Phase.HoldsNode()) || (in.Phase == reconciler.Deleting && in.After() == reconciler.Pending))
	}) {
		ev := reconciler.Event{Kind: reconciler.NodeOffline, Provider: in.Provider, Node: in.Node}
		if _, _, err := s.apply(ctx, in.ID, ev); err != nil && ctx.Err() == nil {
			s.log.Warn("node offline", "instance", in.ID, "err", err)
		}
	}
}

// recordNodes stores the statuses of nodes that changed under
// PrefixNodes, all in one transaction.
func (s syncer) recordNodes(ctx context.Context, prov string, nodes []driver.Node) {
	if len(nodes) == 0 {
		return
	}
	for range 3 {
		kvs, _, err := s.st.List(ctx, PrefixNodes+prov+"/")
		if err != nil {
			return
		}
		old := make(map[string]store.KV, len(kvs))
		for _, kv := range kvs {
			old[kv.Key] = kv
		}
		var cmps []store.Cmp
		var ops []store.Op
		for _, n := range nodes {
			key := PrefixNodes + prov + "/" + n.Name
			kv, ok := old[key]
			if ok {
				var st NodeState
				if json.Unmarshal(kv.Value, &st) == nil && st.Status == n.Status && st.Reason == n.Reason {
					continue
				}
			}
			b, _ := json.Marshal(NodeState{Provider: prov, Name: n.Name, Status: n.Status, Reason: n.Reason, Since: s.now()})
			cmps = append(cmps, store.Cmp{Key: key, ModRevision: kv.ModRevision})
			ops = append(ops, store.Put(key, b))
		}
		if len(ops) == 0 {
			return
		}
		if ok, _, err := s.commit(ctx, &txn{cmps: cmps, ops: ops}); err != nil || ok {
			return
		}
	}
}

// syncInstances lists p's resources that carry this cluster's tags and
// reconciles them with the store: observed states, lost instances, and
// leaks (tagged resources the store does not account for), deleted after
// LeakSightings consecutive sightings.
func (s syncer) syncInstances(ctx context.Context, rt *runtime, p *provider.Provider) {
	listedAt := s.now()
	l, err := s.skimListing(ctx, p)
	// A partial listing is complete for the nodes it covers: it updates
	// their instances and leak sightings; the nodes it misses are neither
	// searched for lost instances nor counted for leaks.
	var partial *driver.PartialListError
	if err != nil {
		if ctx.Err() == nil {
			s.log.Warn("provider list", "provider", p.Name(), "err", err)
		}
		if !errors.As(err, &partial) {
			return
		}
	}
	for _, c := range l.changed {
		s.mu.RLock()
		cur := s.recs.get(c.id)
		s.mu.RUnlock()
		if cur != nil && cur.Updated().After(listedAt) {
			// A verb changed the record while the listing ran (a
			// restart, a stop): what the listing shows may be older
			// than the record, and the next listing tells.
			continue
		}
		if _, _, err := s.apply(ctx, c.id, reconciler.Event{Kind: reconciler.Observed, Instance: c.f}); err != nil && ctx.Err() == nil {
			s.log.Warn("observe", "instance", c.id, "err", err)
		}
	}
	s.countLeaks(rt, p, l.others, partial)
	if partial == nil {
		// What the cluster's instances shared (the docker driver's
		// networks) and none uses now goes, after a complete listing
		// only: one that missed a node could miss a user.
		if err := p.Sweep(ctx, map[string]string{driver.TagCluster: s.clusterID}); err != nil && ctx.Err() == nil {
			s.log.Warn("provider sweep", "provider", p.Name(), "err", err)
		}
	}
	s.findLost(ctx, rt, p, l.seen, listedAt, partial)
}

// listing is what syncInstances keeps of one listing of a provider.
type listing struct {
	// seen holds the ids of the instances listed (a set: 39 MB for a
	// million, 55 with bool values).
	seen map[string]struct{}
	// changed are known instances whose state changed; others are the
	// rest of this cluster's resources (strangers, leaks, second copies).
	changed, others []listed
}

// skimListing lists p's resources of this cluster. The listing is
// skimmed: most listed instances are known and unchanged, told by their
// glance alone, and only the others are taken whole and kept for the work
// after, so that a million instances cost neither a listing of a million
// in memory nor a million instances' garbage. What is kept is kept without
// its tags (the largest part of a listed instance, read no further than
// here): while creates finish faster than their outcomes are stored, a
// listing finds hundreds of thousands changed.
func (s syncer) skimListing(ctx context.Context, p *provider.Provider) (listing, error) {
	l := listing{seen: map[string]struct{}{}}
	var known *rec // the record of the instance skimmed last, when it is changed
	err := p.Skim(ctx, map[string]string{driver.TagCluster: s.clusterID}, func(g *driver.Glance) bool {
		s.mu.RLock()
		cached := s.recs.get(g.Instance)
		s.mu.RUnlock()
		known = nil
		if cached != nil && cached.Provider == p.Name() && cached.BackendID == g.ID && cached.Phase != reconciler.Deleted {
			if state, code, ok := cached.seenState(); ok && state == g.State && sameExit(code, g.ExitCode) {
				// Unchanged. It carries this cluster's tags, as the
				// listing asked (ours). The record's id, not the
				// glance's, is kept: the record holds it anyway.
				l.seen[cached.ID] = struct{}{}
				return false
			}
			known = cached
		}
		return true
	}, func(f *driver.Instance) error {
		if !s.ours(f) {
			// Not Berth's, or another installation's: never touched.
			return nil
		}
		if known != nil && known.ID == f.Tags[driver.TagInstance] && known.BackendID == f.ID {
			l.seen[known.ID] = struct{}{}
			l.changed = append(l.changed, untagged(known.ID, f))
			return nil
		}
		l.others = append(l.others, untagged(f.Tags[driver.TagInstance], f))
		return ctx.Err()
	})
	return l, err
}

// countLeaks counts a sighting of each of others that no record accounts
// for, and deletes those sighted LeakSightings times; a leak not sighted
// again is forgotten, unless the partial listing missed its node.
func (s syncer) countLeaks(rt *runtime, p *provider.Provider, others []listed, partial *driver.PartialListError) {
	leakSeen := map[string]bool{}
	for _, l := range others {
		id, f := l.id, l.f
		s.mu.RLock()
		cached := s.recs.get(id)
		s.mu.RUnlock()
		if cached != nil {
			if in := cached.instance(); s.accountedFor(rt, &in, p.Name(), f) {
				continue
			}
		} else if s.aside[id] {
			// Its record is moved aside, not gone: the resource is left
			// to whoever mends the record (berth doctor).
			continue
		}
		// A leak: unknown to the store, deleted there, or a second copy.
		key := p.Name() + "/" + f.ID
		leakSeen[key] = true
		rt.mu.Lock()
		sg := rt.leaks[key]
		sg.n++
		sg.node = f.Node
		rt.leaks[key] = sg
		n := sg.n
		rt.mu.Unlock()
		if n >= s.cfg.LeakSightings {
			s.log.Warn("leak", "provider", p.Name(), "backend_id", f.ID, "instance", id, "sightings", n)
			s.startLeak(rt, p, id, f.ID)
		}
	}
	rt.mu.Lock()
	defer rt.mu.Unlock()
	for key, sg := range rt.leaks {
		if !leakSeen[key] && strings.HasPrefix(key, p.Name()+"/") && (partial == nil || !partial.Missing(sg.node)) {
			delete(rt.leaks, key)
		}
	}
}

// findLost looks for the instances of p the listing (seen, begun at
// listedAt) should have shown but did not: lost after two listings and a
// direct read, unless their node is offline (handled as node offline) or
// the partial listing missed it.
func (s syncer) findLost(ctx context.Context, rt *runtime, p *provider.Provider, seen map[string]struct{}, listedAt time.Time, partial *driver.PartialListError) {
	var missing []*reconciler.Instance
	s.mu.RLock()
	for in := range s.recs.all() {
		switch in.Phase {
		case reconciler.Running, reconciler.Stopped, reconciler.Exited, reconciler.Held, reconciler.Suspended:
			if in.Provider == p.Name() && in.BackendID != "" && !has(seen, in.ID) && in.Updated().Before(listedAt) {
				x := in.instance()
				missing = append(missing, &x)
			}
		}
	}
	s.mu.RUnlock()
	rt.mu.Lock()
	for id := range rt.misses {
		if has(seen, id) {
			delete(rt.misses, id)
		}
	}
	rt.mu.Unlock()
	for _, in := range missing {
		rt.mu.Lock()
		ns, known := rt.nodes[p.Name()+"/"+in.Node]
		if has(seen, in.ID) || (known && ns.status == driver.NodeOffline) || (partial != nil && partial.Missing(in.Node)) {
			delete(rt.misses, in.ID)
			rt.mu.Unlock()
			continue
		}
		rt.misses[in.ID]++
		n := rt.misses[in.ID]
		rt.mu.Unlock()
		if n == 1 {
			// Gone from its back-end without a delete, it may be missing
			// from a reading of its node already.
			s.cluster.presence(in.ID, scheduler.Untracked)
		}
		if n >= 2 {
			s.confirmLost(ctx, rt, p, in)
		}
	}
}

// confirmLost reads missing instance in directly before declaring it
// lost. What the back-end holds under its id must be this instance's:
// another's (the id given again by a restarted back-end) is not adopted.
func (s syncer) confirmLost(ctx context.Context, rt *runtime, p *provider.Provider, in *reconciler.Instance) {
	if got, err := p.Get(ctx, in.BackendID); err == nil && s.owns(in, got) {
		_, _, _ = s.apply(ctx, in.ID, reconciler.Event{Kind: reconciler.Observed, Instance: got})
		return
	} else if !errors.Is(err, driver.ErrNotFound) {
		return
	}
	rt.mu.Lock()
	delete(rt.misses, in.ID)
	rt.mu.Unlock()
	s.log.Warn("instance lost", "instance", in.ID, "provider", p.Name(), "backend_id", in.BackendID)
	lost := reconciler.Event{Kind: reconciler.Observed, Ref: reconciler.Ref{Provider: p.Name(), BackendID: in.BackendID}}
	if _, _, err := s.apply(ctx, in.ID, lost); err != nil && ctx.Err() == nil {
		s.log.Warn("lost", "instance", in.ID, "err", err)
	}
}

// listed is an instance a listing showed, kept without its tags, and the
// id of the instance it was tagged with.
type listed struct {
	id string
	f  *driver.Instance
}

// untagged returns f without its tags, as a listed of instance id. It
// copies f: a driver without a Walk may hand out the instances of a
// listing it shares.
func untagged(id string, f *driver.Instance) listed {
	g := *f
	g.Tags = nil
	return listed{id, &g}
}

// sighting counts the listings in a row that showed a leak, on node.
type sighting struct {
	n    int
	node string
}

func sameExit(code, seen *int) bool {
	if (code == nil) != (seen == nil) {
		return false
	}
	return code == nil || *code == *seen
}

// accountedFor reports whether resource f, tagged with in's id but not in's
// current resource, is work in progress rather than a leak: the create or
// delete of in that has not reported its id yet, or a stale copy already
// scheduled for deletion.
func (s syncer) accountedFor(rt *runtime, in *reconciler.Instance, prov string, f *driver.Instance) bool {
	switch {
	case in.Phase == reconciler.Creating && in.BackendID == "" && in.Provider == prov:
		return true
	case in.Phase == reconciler.Deleting && in.Provider == prov && (in.BackendID == "" || in.BackendID == f.ID):
		return true
	}
	for _, r := range in.Stale {
		if r.Provider == prov && (r.BackendID == f.ID || r.BackendID == "") {
			return true
		}
	}
	rt.mu.Lock()
	defer rt.mu.Unlock()
	t, busy := rt.ops[in.ID]
	return busy && t.kind == taskCreate && in.Provider == prov
}

// startLeak queues the deletion of a leaked resource.
func (s syncer) startLeak(rt *runtime, p *provider.Provider, instID, backendID string) {
	ref := reconciler.Ref{Provider: p.Name(), BackendID: backendID}
	t := &task{kind: taskLeak, id: instID, due: s.now(), taskOp: &taskOp{ref: &ref, prov: p, start: s.now()}}
	rt.mu.Lock()
	defer rt.mu.Unlock()
	key := sideKey(t)
	if _, busy := rt.side[key]; busy {
		return
	}
	rt.side[key] = t
	delete(rt.leaks, p.Name()+"/"+backendID)
	rt.push(t)
}

// has reports whether set holds key.
func has(set map[string]struct{}, key string) bool {
	_, ok := set[key]
	return ok
}

// owns is the one adoption rule: a back-end resource is in's only when it is
// Berth's, carries this cluster's id and in's id. Launch, sync and resume
// all ask it before treating a resource as a record's; anything else is
// never adopted, stopped or deleted as in's.
func (s syncer) owns(in *reconciler.Instance, got *driver.Instance) bool {
	return got != nil && got.Tags[driver.TagManaged] == "true" &&
		got.Tags[driver.TagCluster] == s.clusterID && got.Tags[driver.TagInstance] == in.ID
}

// ours reports whether a back-end resource carries this cluster's id (it
// may still be no record's: a leak).
func (s syncer) ours(got *driver.Instance) bool {
	return got.Tags[driver.TagManaged] == "true" && got.Tags[driver.TagCluster] == s.clusterID
}
