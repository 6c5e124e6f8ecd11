package control

import (
	"context"
	"errors"
	"iter"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/provider"
	"github.com/berth-dev/berth/reconciler"
)

// Usage measures the instance's live cpu and memory use through its
// provider; a provider that cannot measure answers driver.ErrUnsupported,
// an instance with no back-end resource driver.ErrInvalid. A read-only
// plane measures only the instances ReadsBackend names.
func (p *Plane) Usage(ctx context.Context, ref string) (*driver.Usage, error) {
	in, prov, err := p.verbs.reading(ref)
	if err != nil {
		return nil, err
	}
	return prov.Usage(ctx, in.BackendID)
}

// UsageHistory returns the recent samples of the instance's usage that the
// usage loop collected (Config.UsageInterval), oldest first, at most
// UsageSamples of them; none when its provider cannot measure or the
// loop has not measured it yet. Samples are kept in memory only: a
// restarted plane starts afresh.
func (p *Plane) UsageHistory(ctx context.Context, ref string) ([]driver.Usage, error) {
	if err := p.refuse(); err != nil {
		return nil, err
	}
	in, err := p.find(ref)
	if err != nil {
		return nil, err
	}
	return p.meter.samples(in.ID), nil
}

// UsageSamples is how many samples of each instance's usage the plane
// keeps.
const UsageSamples = 64

// Usage collection bounds: the Usage calls in flight at once, and the
// longest one call may take. A round's calls all end before the next
// round is due: the interval runs from the end of a round.
const (
	usageWorkers     = 8
	usageCallTimeout = 5 * time.Second
)

// UsagePerRound bounds the instances of one provider the usage loop
// measures in a round: beyond it, each round takes the next ones in id
// order, so that a provider with many instances costs the same per round
// and each instance is measured every ceil(n / UsagePerRound) rounds. A
// node's measured use counts each instance at its latest sample, however
// old.
const UsagePerRound = 2000

// NodeUsage is what the instances on a node were measured using, as of
// the latest round of the usage loop: the sum of the latest sample of
// each (see UsagePerRound), an instance without one (not running yet, not
// measured yet, or its measurements failed) counted at its reservation.
type NodeUsage struct {
	CPU         driver.MilliCPU `json:"cpus"`
	MemoryBytes int64           `json:"memory_bytes"`
	// Instances is how many instances were counted, Sampled how many of
	// them by a sample rather than their reservation.
	Instances int       `json:"instances"`
	Sampled   int       `json:"sampled"`
	Time      time.Time `json:"time"`
}

// sample is one measurement, kept small: a ring holds UsageSamples of
// them for every running instance.
type sample struct {
	at, cpu, mem int64 // unix nanoseconds, MilliCPU, bytes
}

// ring is one instance's recent samples, the oldest overwritten first. It
// grows to UsageSamples as samples come.
type ring struct {
	buf []sample
	n   int // samples ever written
	// backend is the back-end resource the samples are of: an instance
	// placed again starts afresh.
	backend string
	// hour is the instance's hour of use (HistoryStep).
	hour hour
}

// latest returns the newest sample.
func (r *ring) latest() sample { return r.buf[(r.n-1)%len(r.buf)] }

func (r *ring) add(u driver.Usage) {
	s := sample{at: u.Time.UnixNano(), cpu: int64(u.CPU), mem: int64(u.Memory)}
	if len(r.buf) < UsageSamples {
		r.buf = append(r.buf, s)
	} else {
		r.buf[r.n%UsageSamples] = s
	}
	r.n++
}

// all returns the samples kept, oldest first.
func (r *ring) all() []driver.Usage {
	out := make([]driver.Usage, 0, len(r.buf))
	k := 0
	if r.n > len(r.buf) {
		k = r.n % len(r.buf)
	}
	for j := range r.buf {
		s := r.buf[(k+j)%len(r.buf)]
		out = append(out, driver.Usage{CPU: driver.MilliCPU(s.cpu), Memory: driver.Bytes(s.mem), Time: time.Unix(0, s.at)})
	}
	return out
}

// meter is the usage loop's memory: the recent samples of every measured
// instance and the latest measured use of every node. It is never stored:
// samples are cheap to take again. usageMu guards it.
type meter struct {
	usageMu sync.Mutex
	rings   map[string]*ring     // by instance id
	nodes   map[string]NodeUsage // by provider/node
	// nodeHours is the hour of use of up to NodeHistories nodes, by
	// provider/node; cluster is theirs together.
	nodeHours map[string]*hour
	cluster   hour
	// measured is closed, and replaced, when a provider's round ends.
	measured chan struct{}
}

// samples returns instance id's samples, oldest first.
func (m *meter) samples(id string) []driver.Usage {
	m.usageMu.Lock()
	defer m.usageMu.Unlock()
	if r := m.rings[id]; r != nil {
		return r.all()
	}
	return []driver.Usage{}
}

// drop forgets instance id's samples (it was deleted).
func (m *meter) drop(id string) {
	m.usageMu.Lock()
	defer m.usageMu.Unlock()
	delete(m.rings, id)
}

// node returns the latest measured use of provider's node.
func (m *meter) node(prov, node string) (NodeUsage, bool) {
	m.usageMu.Lock()
	defer m.usageMu.Unlock()
	u, ok := m.nodes[reconciler.NodeID(prov, node)]
	return u, ok
}

// usageLoop measures, every UsageInterval, the instances of every provider
// that can measure them (driver.UsageReporter), keeps the samples and
// hands each node's sum to the scheduler (scheduler.Cluster.SetMeasured),
// where providers under the usage policy admit instances by it.
func (s measurer) usageLoop(ctx context.Context) {
	var provs []*provider.Provider
	for _, name := range s.provNames {
		if p := s.provs[name]; slices.Contains(p.Capabilities(), driver.CapUsage) {
			provs = append(provs, p)
		}
	}
	if len(provs) == 0 {
		return
	}
	t := time.NewTimer(0)
	defer t.Stop()
	// next is, by provider, the id the next round starts measuring from.
	next := map[string]string{}
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		for _, p := range provs {
			if ctx.Err() != nil {
				return
			}
			next[p.Name()] = s.measure(ctx, p, next[p.Name()])
		}
		s.forgetGone()
		t.Reset(s.cfg.UsageInterval)
	}
}

// target is one instance the usage loop measures.
type target struct {
	id, backendID, node string
	// cpu and mem are the instance's reservation.
	cpu, mem int64
}

// batch returns up to UsagePerRound instances of p with a back-end
// resource, in id order from the id from (wrapping around), and the id to
// start from next time.
func (s measurer) batch(p *provider.Provider, from string) ([]target, string) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	var out []target
	next := ""
	take := func(recs iter.Seq[*rec]) {
		for in := range recs {
			if len(out) == UsagePerRound {
				next = in.ID
				return
			}
			if in.Provider == p.Name() && in.Phase.HoldsNode() && in.Phase != reconciler.Deleting && in.BackendID != "" {
				t := target{id: in.ID, backendID: in.BackendID, node: in.Node}
				if in.Spec != nil {
					t.cpu, t.mem = int64(in.Spec.CPU), int64(in.Spec.Memory)
				}
				out = append(out, t)
			}
		}
	}
	take(s.recs.from(from))
	if next == "" && from != "" {
		take(s.recs.before(from))
	}
	return out, next
}

// measure takes one sample of a batch of p's instances (from the id from,
// see batch), usageWorkers at a time, then sets the measured use of each
// of p's nodes, and returns where the next batch starts. The instances
// counted on each node are read again after the samples are taken, so that
// one placed meanwhile counts at its reservation.
func (s measurer) measure(ctx context.Context, p *provider.Provider, from string) string {
	targets, next := s.batch(p, from)
	got := s.sample(ctx, p, targets)
	if ctx.Err() != nil {
		return from
	}
	now := s.now()
	s.keepSamples(targets, got, now)
	s.sumNodes(p, now)
	if o := s.cfg.Overcommit[p.Name()]; o.Usage() {
		// Idle nodes may take what waits now.
		s.placer.kickPlacer()
	}
	return next
}

// sample measures targets on p, usageWorkers at a time; got[k] is
// targets[k]'s sample, nil when it has none.
func (s measurer) sample(ctx context.Context, p *provider.Provider, targets []target) []*driver.Usage {
	got := make([]*driver.Usage, len(targets))
	sem := make(chan struct{}, usageWorkers)
	var wg sync.WaitGroup
	var unsupported atomic.Bool
loop:
	for k := range targets {
		if targets[k].backendID == "" {
			continue
		}
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			break loop
		}
		if unsupported.Load() {
			<-sem
			break
		}
		wg.Go(func() {
			defer func() { <-sem }()
			cctx, cancel := context.WithTimeout(ctx, usageCallTimeout)
			u, err := p.Usage(cctx, targets[k].backendID)
			cancel()
			switch {
			case err == nil:
				got[k] = u
			case errors.Is(err, driver.ErrUnsupported):
				// Asked of a back-end that cannot measure after all: the
				// rest of this round would fail alike.
				unsupported.Store(true)
			case ctx.Err() == nil && !errors.Is(err, driver.ErrNotFound):
				s.log.Debug("usage", "provider", p.Name(), "instance", targets[k].id, "err", err)
			}
		})
	}
	wg.Wait()
	return got
}

// keepSamples adds the samples got of targets, taken at now, to the
// instances' rings and hours.
func (s measurer) keepSamples(targets []target, got []*driver.Usage, now time.Time) {
	s.meter.usageMu.Lock()
	for k, t := range targets {
		u := got[k]
		if u == nil {
			continue
		}
		sample := driver.Usage{CPU: max(u.CPU, 0), Memory: max(u.Memory, 0), Time: u.Time}
		if sample.Time.IsZero() {
			sample.Time = now
		}
		r := s.meter.rings[t.id]
		if r == nil || r.backend != t.backendID {
			r = &ring{backend: t.backendID}
			s.meter.rings[t.id] = r
		}
		r.add(sample)
		r.hour.put(point{at: now.UnixNano(), cpu: int64(sample.CPU), mem: int64(sample.Memory), rcpu: t.cpu, rmem: t.mem})
	}
	s.meter.usageMu.Unlock()
}

// sumNodes sums the use of every instance on p's nodes, keeps the sums and
// their hour, and hands them to the scheduler.
func (s measurer) sumNodes(p *provider.Provider, now time.Time) {
	// Every instance on p's nodes counts, read afresh: one placed while
	// the samples were taken counts at its reservation. The records are
	// walked in place, with no copy of them: a provider may have millions.
	byNode := map[string]NodeUsage{}
	reserved := map[string][2]int64{} // cpu, memory by node
	s.mu.RLock()
	s.meter.usageMu.Lock()
	for in := range s.recs.all() {
		if in.Provider != p.Name() || !in.Phase.HoldsNode() {
			continue
		}
		n := byNode[in.Node]
		n.Instances++
		n.Time = now
		// An instance counts at its latest sample of the copy it runs
		// as now (a copy placed again starts afresh).
		if r := s.meter.rings[in.ID]; r != nil && in.BackendID != "" && in.Phase != reconciler.Deleting && r.backend == in.BackendID {
			l := r.latest()
			n.CPU += driver.MilliCPU(l.cpu)
			n.MemoryBytes += l.mem
			n.Sampled++
		} else if in.Spec != nil {
			n.CPU += in.Spec.CPU
			n.MemoryBytes += int64(in.Spec.Memory)
		}
		byNode[in.Node] = n
		if in.Spec != nil {
			r := reserved[in.Node]
			reserved[in.Node] = [2]int64{r[0] + int64(in.Spec.CPU), r[1] + int64(in.Spec.Memory)}
		}
	}
	s.mu.RUnlock()
	sums := make(map[string]NodeUsage, len(byNode))
	for node, n := range byNode {
		sums[reconciler.NodeID(p.Name(), node)] = n
	}
	var cleared []string
	for key := range s.meter.nodes {
		if prov, _ := splitNodeID(key); prov == p.Name() {
			if _, ok := sums[key]; !ok {
				cleared = append(cleared, key)
				delete(s.meter.nodes, key)
			}
		}
	}
	for key, n := range sums {
		s.meter.nodes[key] = n
	}
	s.meter.recordHours(p.Name(), now, sums, reserved)
	s.meter.usageMu.Unlock()
	// The scheduler's lock is taken with the meter's released: the
	// meter's lock is a leaf.
	for _, key := range cleared {
		_, node := splitNodeID(key)
		s.setMeasured(p.Name(), node, NodeUsage{})
	}
	for key, n := range sums {
		_, node := splitNodeID(key)
		s.setMeasured(p.Name(), node, n)
	}
}

func (s measurer) setMeasured(prov, node string, n NodeUsage) {
	err := s.cluster.c.SetMeasured(prov, node, driver.Resources{CPU: n.CPU, Memory: driver.Bytes(n.MemoryBytes)})
	if err != nil && !errors.Is(err, driver.ErrNotFound) {
		s.log.Warn("measured usage", "provider", prov, "node", node, "err", err)
	}
}

// forgetGone drops the samples of instances that no longer hold a node
// (deleted, or deleted by another writer).
func (s measurer) forgetGone() {
	s.meter.usageMu.Lock()
	ids := make([]string, 0, len(s.meter.rings))
	for id := range s.meter.rings {
		ids = append(ids, id)
	}
	s.meter.usageMu.Unlock()
	var gone []string
	s.mu.RLock()
	for _, id := range ids {
		if in := s.recs.get(id); in == nil || !in.Phase.HoldsNode() {
			gone = append(gone, id)
		}
	}
	s.mu.RUnlock()
	for _, id := range gone {
		s.meter.drop(id)
	}
}

// splitNodeID splits reconciler.NodeID's provider/node.
func splitNodeID(key string) (prov, node string) {
	prov, node, _ = strings.Cut(key, "/")
	return prov, node
}
