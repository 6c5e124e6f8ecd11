package control

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/provider"
	"github.com/berth-dev/berth/reconciler"
	"github.com/berth-dev/berth/scheduler"
)

// cluster wraps the scheduler's authoritative Cluster: it approves every
// placement, fed with the providers' node readings and the store's
// instances.
type cluster struct {
	c *scheduler.Cluster
}

// newCluster builds the placement state: the providers' capabilities, the
// quotas and overcommit policies. It holds no instance yet: load's
// records bring their reservations (applyStored).
func newCluster(s *state) *cluster {
	c := &cluster{c: scheduler.NewCluster()}
	for _, name := range s.provNames {
		c.c.SetCapabilities(name, append(s.provs[name].Capabilities(), s.provs[name].Features()...))
	}
	if err := c.c.SetQuotas(quotas(&s.cfg)); err != nil {
		// newState checked them.
		s.log.Error("quotas", "err", err)
	}
	for name, o := range s.cfg.Overcommit {
		if err := c.c.SetOvercommit(name, o); err != nil {
			// newState checked them.
			s.log.Error("overcommit", "provider", name, "err", err)
		}
	}
	return c
}

func allocationOf(in *reconciler.Instance) scheduler.Allocation {
	var ports []int
	for _, p := range withPorts(*in.Spec, in.HostPorts).Ports {
		if p.HostPort > 0 {
			ports = append(ports, p.HostPort)
		}
	}
	return scheduler.Allocation{
		ID: in.ID, Name: in.Name, Provider: in.Provider, Node: in.Node,
		Resources: in.Spec.Resources, Ports: ports, Group: in.Group, Request: in.Request, Owner: in.Owner, Pool: in.Pool,
		Image: in.Spec.Image, Labels: in.Spec.Labels, Priority: in.Priority,
	}
}

func (c *cluster) release(id string) { _ = c.c.Release(id) }

// presence tells the scheduler what instance id's back-end holds of it
// (scheduler.Presence), so that a node reading that counts an instance
// the back-end has let go does not hold its room. An instance that holds
// no node has nothing to tell.
func (c *cluster) presence(id string, p scheduler.Presence) { _ = c.c.SetPresence(id, p) }

// readNodes reads p's nodes and hands them to the scheduler.
func (s placer) readNodes(ctx context.Context, p *provider.Provider) (*driver.PlatformState, error) {
	since := s.cluster.c.ReadBegin()
	ps, err := p.State(ctx)
	if err != nil {
		return nil, err
	}
	s.updateNodes(p, ps.Nodes, since)
	return ps, nil
}

// updateNodes hands a reading of p's nodes, begun when the scheduler's
// ReadBegin returned since, to the scheduler.
func (s placer) updateNodes(p *provider.Provider, nodes []driver.Node, since uint64) {
	if err := s.cluster.c.UpdateNodesRead(p.Name(), nodes, since); err != nil {
		s.log.Warn("provider nodes", "provider", p.Name(), "err", err)
	}
	var top driver.Resources
	for _, n := range nodes {
		c := n.Capacity
		top.CPU, top.Memory, top.Disk, top.GPUs = max(top.CPU, c.CPU), max(top.Memory, c.Memory), max(top.Disk, c.Disk), max(top.GPUs, c.GPUs)
		for k, v := range c.Other {
			if top.Other == nil {
				top.Other = map[string]int64{}
			}
			top.Other[k] = max(top.Other[k], v)
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, n := range nodes {
		n.Images, n.Ports = nil, nil
		s.nodeInfo[reconciler.NodeID(p.Name(), n.Name)] = n
	}
	if len(nodes) > 0 {
		s.largest[p.Name()] = top
	}
}

// poolProvider returns the provider of the named pool, "" if none.
func (s placer) poolProvider(pool string) string {
	for _, pl := range s.cfg.Pools {
		if pl.Name == pool {
			return pl.Provider
		}
	}
	return ""
}

// tooLarge says why an instance asking r on prov (any provider when empty)
// could never fit any node, or "". Each resource is compared with the
// largest amount any node of the eligible providers has in total, online
// or not, as last listed. Nodes may join later: a provider that has not
// listed any node yet makes nothing too large, and a node larger than
// every one seen so far takes the requests declined before it joined only
// when they are submitted again.
func (s placer) tooLarge(r driver.Resources, prov string) string {
	s.mu.RLock()
	defer s.mu.RUnlock()
	var top driver.Resources
	for _, name := range s.provNames {
		if prov != "" && name != prov {
			continue
		}
		l, ok := s.largest[name]
		if !ok {
			return ""
		}
		top.CPU, top.Memory, top.Disk, top.GPUs = max(top.CPU, l.CPU), max(top.Memory, l.Memory), max(top.Disk, l.Disk), max(top.GPUs, l.GPUs)
		for k, v := range l.Other {
			if top.Other == nil {
				top.Other = map[string]int64{}
			}
			top.Other[k] = max(top.Other[k], v)
		}
	}
	switch {
	case r.CPU > top.CPU:
		return fmt.Sprintf("cpus: one instance asks for %s, the largest node has %s", r.CPU, top.CPU)
	case r.Memory > top.Memory:
		return fmt.Sprintf("memory: one instance asks for %s, the largest node has %s", r.Memory, top.Memory)
	case r.Disk > top.Disk:
		return fmt.Sprintf("disk: one instance asks for %s, the largest node has %s", r.Disk, top.Disk)
	case r.GPUs > top.GPUs:
		return fmt.Sprintf("gpus: one instance asks for %d, the largest node has %d", r.GPUs, top.GPUs)
	}
	for _, k := range slices.Sorted(maps.Keys(r.Other)) {
		if r.Other[k] > top.Other[k] {
			return fmt.Sprintf("other.%s: one instance asks for %d, the largest node has %d", k, r.Other[k], top.Other[k])
		}
	}
	return ""
}

// refreshNodes reads every provider's nodes once (used by New so that
// Submit can place before the first sync).
func (s placer) refreshNodes(ctx context.Context) {
	for _, name := range s.provNames {
		p := s.provs[name]
		if _, err := s.readNodes(ctx, p); err != nil {
			s.log.Warn("provider state", "provider", name, "err", err)
		}
	}
}

// kickPlacer wakes the placer.
func (s placer) kickPlacer() {
	select {
	case s.placeKick <- struct{}{}:
	default:
	}
}

// placeLoop places pending instances, highest priority first and oldest first
// within a priority, whenever something changed and at least every second.
// With Config.Schedulers above one it keeps one scheduler.Snapshot per
// scheduler for its rounds (see placePending).
func (s placer) placeLoop(ctx context.Context) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	snaps := s.snapshots()
	for {
		var done chan struct{}
		select {
		case <-ctx.Done():
			return
		case <-s.placeKick:
		case <-t.C:
		case done = <-s.placeNow:
		}
		s.placePending(ctx, snaps)
		if done != nil {
			close(done)
		}
	}
}

// snapshots returns a snapshot of the scheduler's ledger for each of the
// placer's schedulers, or none when there is one (it places through the
// ledger itself). Each plans with a seed of its own.
func (s placer) snapshots() []*scheduler.Snapshot {
	if s.cfg.Schedulers <= 1 {
		return nil
	}
	snaps := make([]*scheduler.Snapshot, s.cfg.Schedulers)
	for k := range snaps {
		snaps[k] = s.cluster.c.Snapshot(scheduler.Options{Seed: uint64(k) + 1})
	}
	return snaps
}

// placeFunc places one request on the scheduler's ledger: Cluster.Place,
// or a snapshot's optimistic Place (see optimistic).
type placeFunc func(r *scheduler.Request) (*scheduler.Plan, error)

// placePending tries once to place every pending instance that is due.
//
// Without snapshots the round is one scheduler placing through
// Cluster.Place, which plans and reserves under the cluster's lock. With
// snapshots (Config.Schedulers above one) the pending instances are shared
// out by request and each share is placed by a goroutine of its own,
// planning on its snapshot and committing through Snapshot.Place: the
// cluster re-checks every placement, and one another scheduler got to
// first is a conflict, planned again on a refreshed snapshot (at most
// scheduler.MaxRounds times); what is still unplaced then stays pending
// for the next round. Priority orders each share, not the round as a
// whole. Every snapshot is refreshed before any share starts.
func (s placer) placePending(ctx context.Context, snaps []*scheduler.Snapshot) {
	s.placeGroups(ctx)
	now := s.now()
	pending := s.pendingSnapshot(func(in *rec) bool {
		return !now.Before(in.deadline.time())
	})
	pending = slices.DeleteFunc(pending, func(in reconciler.Instance) bool { return s.admitter.gangQueued(in.Group) })
	slices.SortStableFunc(pending, func(a, b reconciler.Instance) int { return b.Priority - a.Priority })
	if s.cfg.Metrics != nil {
		s.cfg.Metrics.QueueDepth(len(pending))
	}
	if len(snaps) == 0 {
		s.placeShare(ctx, pending, s.cluster.c.Place)
		return
	}
	shares := shareOut(pending, len(snaps))
	for _, snap := range snaps {
		snap.Refresh()
	}
	var wg sync.WaitGroup
	for k, share := range shares {
		if len(share) == 0 {
			continue
		}
		place := s.optimistic(snaps[k])
		wg.Go(func() { s.placeShare(ctx, share, place) })
	}
	wg.Wait()
}

// shareOut splits pending, in its order, into n shares: every instance of
// one request in the same share (their plans see each other), each
// request to the share holding the fewest instances so far.
func shareOut(pending []reconciler.Instance, n int) [][]reconciler.Instance {
	shares := make([][]reconciler.Instance, n)
	of := map[string]int{}
	for _, in := range pending {
		key := in.Request
		if key == "" {
			key = "\x00" + in.ID
		}
		k, ok := of[key]
		if !ok {
			for j := range shares {
				if len(shares[j]) < len(shares[k]) {
					k = j
				}
			}
			of[key] = k
		}
		shares[k] = append(shares[k], in)
	}
	return shares
}

// optimistic places through snap: plans on it and commits with
// Snapshot.Place, counting the conflicts (Metrics.Conflicts).
func (s placer) optimistic(snap *scheduler.Snapshot) placeFunc {
	return func(r *scheduler.Request) (*scheduler.Plan, error) {
		plan, conflicts, err := snap.Place(r)
		if conflicts > 0 && s.cfg.Metrics != nil {
			s.cfg.Metrics.Conflicts(conflicts)
		}
		return plan, err
	}
}

// placeShare places the instances of pending in order with place.
func (s placer) placeShare(ctx context.Context, pending []reconciler.Instance, place placeFunc) {
	// An instance that does not fit tells why its siblings will not
	// either: the instances of one request ask for the same, and this round
	// only ever takes capacity away. Siblings with exclusions of their own
	// are placed one by one.
	declined := map[string]string{}
	for _, in := range pending {
		if ctx.Err() != nil {
			return
		}
		if why, ok := declined[in.Request]; ok && len(in.Exclude) == 0 {
			s.unplaceable(ctx, in, why)
			continue
		}
		if why := s.placeOne(ctx, in, place); why != "" && len(in.Exclude) == 0 && in.Request != "" {
			declined[in.Request] = why
		}
	}
}

// requestFor rebuilds the placement request of one instance: its stored
// request (or its pool label) narrowed to this instance, avoiding the
// nodes where its launch failed a moment ago or that refused it.
func (s placer) requestFor(in *reconciler.Instance) scheduler.Request {
	var r scheduler.Request
	s.mu.RLock()
	sr, ok := s.requests[in.Request]
	s.mu.RUnlock()
	if ok {
		r = sr.Request
	}
	r.Spec = *in.Spec
	r.Spec.Name = in.Name
	r.ID, r.Count, r.Group, r.Priority = in.ID, 1, in.Group, in.Priority
	if in.Pool != "" {
		r.Provider = s.poolProvider(in.Pool)
	}
	r.Owner, r.Pool = in.Owner, in.Pool
	r.Avoid = nil
	for _, x := range in.Excluded(s.now()) {
		prov, node, _ := strings.Cut(x, "/")
		r.Avoid = append(r.Avoid, scheduler.Avoid{Provider: prov, Node: node, Reason: "a launch failed there"})
	}
	for _, x := range in.Refused {
		id, why, _ := strings.Cut(x, ": ")
		prov, node, _ := strings.Cut(id, "/")
		r.Avoid = append(r.Avoid, scheduler.Avoid{Provider: prov, Node: node, Reason: "refused it: " + why})
	}
	return r
}

// placeOne places one pending instance and stores the placement (the
// cluster's reservation is released again if the store refuses it), or
// records why it cannot be placed and returns that reason.
func (s placer) placeOne(ctx context.Context, in reconciler.Instance, place placeFunc) string {
	r := s.requestFor(&in)
	start := time.Now()
	plan, err := place(&r)
	if err == nil && len(plan.Placements) == 0 && len(in.Excluded(s.now())) > 0 {
		// Exclusions steer, they never strand: when no other node fits, a
		// healthy excluded node beats waiting for the exclusions to expire.
		all := in
		all.Exclude = nil
		r = s.requestFor(&all)
		plan, err = place(&r)
	}
	if s.cfg.Metrics != nil {
		s.cfg.Metrics.Scheduled(time.Since(start), err == nil && len(plan.Placements) == 1)
	}
	if err != nil {
		reason := "cannot place: " + err.Error()
		s.unplaceable(ctx, in, reason)
		return reason
	}
	if len(plan.Placements) == 0 && len(in.Refused) > 0 && s.fitsRefusedOnly(in) {
		// Only nodes that refused it for good would take it: nothing is
		// left to try.
		why := fmt.Sprintf("every node that fits refused it: %s", strings.Join(in.Refused, "; "))
		_, _, _ = s.apply(ctx, in.ID, reconciler.Event{Kind: reconciler.Refused, Message: why})
		return why
	}
	if len(plan.Placements) == 0 {
		reason := "no node fits"
		if len(plan.Unplaced) > 0 {
			reason = "no node fits: " + plan.Unplaced[0].Reasons.String()
		}
		s.unplaceable(ctx, in, reason)
		return reason
	}
	pl := plan.Placements[0]
	got, _, err := s.apply(ctx, in.ID, reconciler.Event{Kind: reconciler.Placed, Provider: pl.Provider, Node: pl.Node, Ports: pl.Ports})
	if err != nil || got.Phase == reconciler.Pending || got.Provider != pl.Provider || got.Node != pl.Node || !got.Phase.HoldsNode() {
		s.cluster.release(in.ID)
	}
	return ""
}

// fitsRefusedOnly reports whether every node in could be placed on (of
// its provider, when it names one, with the features its spec needs) has
// refused it for good: then nothing is left to try.
func (s placer) fitsRefusedOnly(in reconciler.Instance) bool {
	refused := in.RefusedNodes()
	r := s.requestFor(&in)
	need := driver.SpecFeatures(in.Spec)
	s.mu.RLock()
	defer s.mu.RUnlock()
	for id := range s.nodeInfo {
		prov, _, _ := strings.Cut(id, "/")
		if (r.Provider != "" && prov != r.Provider) || slices.Contains(refused, id) {
			continue
		}
		if p, ok := s.provs[prov]; ok && !hasAll(p.Features(), need) {
			continue
		}
		return false
	}
	return true
}

// hasAll reports whether have holds every one of want.
func hasAll(have, want []string) bool {
	for _, w := range want {
		if !slices.Contains(have, w) {
			return false
		}
	}
	return true
}

// unplaceable records why pending instance in waits, unless that is what
// its record says already. The writers store it with other changes: a
// round over thousands of waiting instances whose reason changed costs a
// few commits, not one each.
func (s placer) unplaceable(ctx context.Context, in reconciler.Instance, reason string) {
	if in.Message == reason {
		return
	}
	ev := reconciler.Event{Kind: reconciler.Unplaceable, Message: reason}
	if rt := s.runner.runtimeOf(); rt != nil {
		select {
		case rt.outcomes <- outcome{id: in.ID, ev: ev}:
		case <-ctx.Done():
		}
		return
	}
	_, _, _ = s.apply(ctx, in.ID, ev)
}

// withPorts fills the "any port" ports of spec with the host ports the
// scheduler chose, in its order: fixed ports first, then published ones.
func withPorts(spec driver.Spec, chosen []int) driver.Spec {
	if len(chosen) == 0 {
		return spec
	}
	spec.Ports = slices.Clone(spec.Ports)
	k := 0
	for _, p := range spec.Ports {
		if p.HostPort > 0 {
			k++
		}
	}
	for i := range spec.Ports {
		if spec.Ports[i].HostPort == 0 && spec.Ports[i].Publish && k < len(chosen) {
			spec.Ports[i].HostPort = chosen[k]
			k++
		}
	}
	return spec
}

// quotaUse returns the configured quotas (and pool caps) with what their
// scopes hold, from the scheduler's ledger.
func (s placer) quotaUse() []QuotaUse { return s.cluster.c.QuotaUse() }

// quotas returns the quotas the scheduler keeps to: the configured ones and
// a pool's cap on its instances.
func quotas(cfg *Config) []Quota {
	out := slices.Clone(cfg.Quotas)
	for _, pl := range cfg.Pools {
		if pl.MaxInstances > 0 {
			out = append(out, Quota{Pool: pl.Name, Instances: pl.MaxInstances})
		}
	}
	return out
}
