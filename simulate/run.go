package simulate

import (
	"bufio"
	"cmp"
	"context"
	"fmt"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/drivers/sim"
	"github.com/berth-dev/berth/scheduler"
)

// Provider is the provider name the simulated nodes belong to.
const Provider = "sim"

// Options control a run.
type Options struct {
	// Schedulers is how many schedulers plan in parallel on snapshots
	// (optimistic commits). 0 or 1 places through Cluster.Place, serially.
	Schedulers int
	// Optimistic uses snapshots and Commit even with one scheduler.
	Optimistic bool
	// Seed seeds the scheduler's random choices.
	Seed uint64
	// Sample bounds how many feasible nodes are scored (0: all).
	Sample int
	// Strategy, when set, overrides every request's strategy.
	Strategy scheduler.Strategy
	// Queue, when set, makes every request a gang (all its instances, or
	// its essential ones, or none) and keeps those that do not fit in a
	// queue with this policy, tried again whenever something arrives or
	// leaves (with backfill). Only with one scheduler.
	Queue scheduler.Policy
	// Progress, when set, is called now and then with how many requests
	// were handled out of how many.
	Progress func(done, total int)
	// Path is what the requests go through: PathScheduler (the default)
	// or PathFull, the whole control plane (see Run).
	Path Path
	// Store is the control plane's store with PathFull: StoreMemory (the
	// default) or StoreBolt, a bbolt file in a temporary directory that is
	// removed after the run.
	Store string
	// Backend, when set, opens the back-end of a PathFull run in place of
	// the in-process sim: a driver with the workload's nodes, such as the
	// sim served by a plugin. The safety check then reads its listing.
	Backend func(ctx context.Context, nodes []sim.Pool) (driver.Driver, error)
}

// Result is what a run measured. Placements are instances; requests are
// the workload's requests (a gang of 1,000 instances is one request).
type Result struct {
	Workload   string `json:"workload"`
	Nodes      int    `json:"nodes"`
	Schedulers int    `json:"schedulers"`
	Strategy   string `json:"strategy,omitempty"`
	Sample     int    `json:"sample,omitempty"`
	Requests   int    `json:"requests"`
	// Instances is how many instances the requests asked for.
	Instances int `json:"instances"`
	Placed    int `json:"placed"`
	Unplaced  int `json:"unplaced"`
	// Preplaced instances were reserved before the run.
	Preplaced int `json:"preplaced"`
	Released  int `json:"released"`
	// Seconds is the wall time of the placement phase alone.
	Seconds           float64 `json:"seconds"`
	PlacementsPerSec  float64 `json:"placements_per_sec"`
	P50Micros         float64 `json:"p50_us"`
	P99Micros         float64 `json:"p99_us"`
	MaxMicros         float64 `json:"max_us"`
	NodesUsed         int     `json:"nodes_used"`
	LowerBoundNodes   int     `json:"lower_bound_nodes"`
	PackingRatio      float64 `json:"packing_ratio"`
	Conflicts         uint64  `json:"conflicts"`
	ConflictRate      float64 `json:"conflict_rate"`
	DoubleBooked      int     `json:"double_booked"`
	PeakRSSBytes      int64   `json:"peak_rss_bytes"`
	UnplacedReason    string  `json:"unplaced_reason,omitempty"`
	RelaxedPlacements int     `json:"relaxed_placements,omitempty"`
	Evicted           int     `json:"evicted,omitempty"`
	// With a queue: requests that had to wait, those still waiting at the
	// end, and the simulated wait (seconds) of those that waited.
	Queued      int     `json:"queued,omitempty"`
	QueueLeft   int     `json:"queue_left,omitempty"`
	WaitP50Secs float64 `json:"wait_p50_s,omitempty"`
	WaitMaxSecs float64 `json:"wait_max_s,omitempty"`
	// Path is the path the requests went through.
	Path Path `json:"path"`
	// PlaneResult is set by a run through the control plane (PathFull)
	// alone; its fields then appear in the JSON.
	*PlaneResult
}

// event is one arrival: a request (item) or a group (grp).
type event struct {
	at   float64
	item *Item
	grp  *GroupItem
	id   string
}

// n is how many instances the event asks for.
func (e *event) n() int {
	if e.grp != nil {
		return e.grp.N()
	}
	return e.item.N()
}

// duration is how long the event's instances run (0: to the end).
func (e *event) duration() float64 {
	if e.grp != nil {
		return e.grp.Duration
	}
	return e.item.Duration
}

// gang reports whether the event is placed all or none.
func (e *event) gang() bool { return e.grp != nil || e.item.Essential != nil }

// elastic reports whether some of the event's instances are elastic.
func (e *event) elastic() bool {
	if e.grp != nil {
		for k := range e.grp.Services {
			if s := &e.grp.Services[k]; s.EssentialCount() < s.N() {
				return true
			}
		}
		return false
	}
	return e.item.Essential != nil && *e.item.Essential < e.item.N()
}

// request is the event's request, with strategy overriding its own when
// set.
func (e *event) request(strategy scheduler.Strategy) scheduler.Request {
	q := e.item.Request
	q.ID = e.id
	if strategy != "" {
		q.Strategy = strategy
	}
	return q
}

// group is the event's group: a workload group, or a gang request as a
// group of one service. With all set, every instance is essential.
func (e *event) group(strategy scheduler.Strategy, all bool) *scheduler.Group {
	var g scheduler.Group
	if e.grp != nil {
		g = e.grp.Group
		g.Services = slices.Clone(g.Services)
	} else {
		q := e.request(strategy)
		q.ID = ""
		g = scheduler.Group{Priority: q.Priority, Services: []scheduler.Service{{Request: q, Essential: e.item.Essential}}}
	}
	g.ID = e.id
	for k := range g.Services {
		s := &g.Services[k]
		if strategy != "" {
			s.Strategy = strategy
		}
		if all {
			n := s.N()
			s.Essential = &n
		}
	}
	return &g
}

// Run builds the workload's cluster with the sim back-end and replays its
// requests through the scheduler. Time in the workload is simulated: arrival
// times order the requests and durations release instances, without
// waiting. The run stops early when ctx ends.
//
// With PathFull the nodes become a sim provider of a control.Plane on a
// fresh store, and the requests go through Plane.Submit (SubmitGroup for
// gangs), in order of arrival; preplaced instances are submitted first,
// pinned to their nodes, and run before the clock starts. An instance whose
// duration has ended by the next arrival (in simulated time) is deleted
// through Plane.Delete before that arrival is submitted. The run ends when
// no instance is on its way any more: each runs, has failed or is pending
// with a reason. Seconds then measures the submissions, SecondsToRunning
// the whole, latencies are per Submit call, and double_booked comes from an
// independent sum of the sim back-end's instances on each node.
func Run(ctx context.Context, w *Workload, opt Options) (*Result, error) {
	if err := w.Validate(); err != nil {
		return nil, err
	}
	switch opt.Path {
	case "", PathScheduler:
	case PathFull:
		res, err := runFull(ctx, w, opt)
		if err == nil {
			res.Path = PathFull
		}
		return res, err
	default:
		return nil, &driver.FieldError{Path: "path", Reason: fmt.Sprintf("%q: want scheduler or full", opt.Path)}
	}
	if opt.Store != "" {
		return nil, &driver.FieldError{Path: "store", Reason: "a store is used by the full path only"}
	}
	if opt.Queue != "" && opt.Schedulers > 1 {
		return nil, &driver.FieldError{Path: "schedulers", Reason: "a queue works with one scheduler"}
	}
	if err := opt.Queue.Check("queue"); err != nil {
		return nil, err
	}
	start := time.Unix(0, 0)
	back, err := sim.New(sim.Options{Pools: w.Nodes, Clock: sim.NewManualClock(start)})
	if err != nil {
		return nil, fmt.Errorf("sim back-end: %w", err)
	}
	defer back.Close(context.WithoutCancel(ctx))
	ps, err := back.State(ctx)
	if err != nil {
		return nil, fmt.Errorf("sim back-end: %w", err)
	}
	cl := scheduler.NewCluster(scheduler.WithOptions(scheduler.Options{Seed: opt.Seed, Sample: opt.Sample}))
	cl.SetCapabilities(Provider, driver.Capabilities(back))
	if err := cl.UpdateNodes(Provider, ps.Nodes); err != nil {
		return nil, err
	}
	lg := newLedger(ps.Nodes)
	res := &Result{Workload: w.Name, Nodes: len(ps.Nodes), Schedulers: max(opt.Schedulers, 1), Strategy: string(opt.Strategy), Sample: opt.Sample, Path: PathScheduler}

	// Preplaced instances, round-robin over the nodes.
	next := 0
	for i := range w.Requests {
		it := &w.Requests[i]
		n := max(it.Repeat, 1)
		if it.Preplaced {
			as := make([]scheduler.Allocation, 0, n*it.N())
			for k := range n * it.N() {
				node := ps.Nodes[next%len(ps.Nodes)].Name
				next++
				id := fmt.Sprintf("pre%d-%d", i, k)
				as = append(as, scheduler.Allocation{ID: id, Provider: Provider, Node: node, Resources: it.Resources, Image: it.Image})
				lg.add("", node, it.Resources)
			}
			if err := cl.Reserve(as...); err != nil {
				return nil, err
			}
			res.Preplaced += len(as)
		}
	}
	events, instances := arrivals(w)
	res.Instances = instances
	res.Requests = len(events)
	lg.resetPeaks()

	k := max(opt.Schedulers, 1)
	r := &runner{cl: cl, lg: lg, opt: opt, res: res, total: len(events)}
	if opt.Queue != "" {
		r.q = &scheduler.Queue{Policy: opt.Queue}
		r.waiting = map[string]*event{}
	}
	r.snaps = make([]*scheduler.Snapshot, k)
	if k > 1 || opt.Optimistic {
		for j := range r.snaps {
			r.snaps[j] = cl.Snapshot(scheduler.Options{Seed: opt.Seed + uint64(j), Sample: opt.Sample})
		}
	}
	t0 := time.Now()
	err = r.run(ctx, events)
	res.Seconds = time.Since(t0).Seconds()
	if err != nil {
		return nil, err
	}
	r.finish()
	return res, nil
}

// arrivals returns the workload's requests that are not preplaced, in
// order of arrival (file order for equal times), and how many instances
// they ask for.
func arrivals(w *Workload) ([]event, int) {
	var events []event
	instances := 0
	for i := range w.Requests {
		it := &w.Requests[i]
		if it.Preplaced {
			continue
		}
		for k := range max(it.Repeat, 1) {
			events = append(events, event{at: it.Arrival + float64(k)*it.Interval, item: it, id: "r" + strconv.Itoa(i) + "." + strconv.Itoa(k)})
			instances += it.N()
		}
	}
	for i := range w.Groups {
		g := &w.Groups[i]
		for k := range max(g.Repeat, 1) {
			id := g.ID
			if g.Repeat > 1 {
				id += "-" + strconv.Itoa(k)
			}
			events = append(events, event{at: g.Arrival + float64(k)*g.Interval, grp: g, id: id})
			instances += g.N()
		}
	}
	slices.SortStableFunc(events, func(a, b event) int { return cmp.Compare(a.at, b.at) })
	return events, instances
}

// runner replays events.
type runner struct {
	cl    *scheduler.Cluster
	lg    *ledger
	opt   Options
	res   *Result
	snaps []*scheduler.Snapshot
	total int
	done  int
	lat   []time.Duration
	// departures, ordered by time
	deps    []departure
	reasons map[string]int
	// queue mode
	q       *scheduler.Queue
	waiting map[string]*event // queued groups by id
	waits   []float64
}

type departure struct {
	at  float64
	ids []string
}

// outcome is what one request did.
type outcome struct {
	accepted []scheduler.Placement
	unplaced int
	reason   string
	relaxed  bool
	lat      time.Duration
	dur      float64
	at       float64
	evicted  []string
}

func (r *runner) run(ctx context.Context, events []event) error {
	r.reasons = map[string]int{}
	for b := 0; b < len(events); {
		if err := ctx.Err(); err != nil {
			return err
		}
		// A batch is the requests arriving at the same time; with several
		// schedulers they are planned in parallel.
		e := b + 1
		for e < len(events) && events[e].at == events[b].at {
			e++
		}
		r.depart(events[b].at)
		if len(r.snaps) == 1 && r.snaps[0] == nil {
			for j := b; j < e; j++ {
				if j%256 == 0 {
					if err := ctx.Err(); err != nil {
						return err
					}
				}
				o := r.placeSerial(&events[j])
				r.record(o)
				if r.opt.Progress != nil && j&63 == 0 {
					r.opt.Progress(j, r.total)
				}
			}
		} else if err := r.parallel(ctx, events[b:e]); err != nil {
			return err
		}
		r.lg.sample()
		if r.opt.Progress != nil {
			r.opt.Progress(e, r.total)
		}
		b = e
	}
	if r.q != nil {
		// Let what runs end, so that queued requests get their turn.
		r.depart(math.Inf(1))
	}
	return nil
}

// depart releases every instance due to end by at.
func (r *runner) depart(at float64) {
	for len(r.deps) > 0 && r.deps[0].at <= at {
		d := r.deps[0]
		r.deps = r.deps[1:]
		for _, id := range d.ids {
			if err := r.cl.Release(id); err == nil {
				r.lg.remove(id)
				r.res.Released++
			}
		}
		r.lg.sample()
		if r.q != nil && r.q.Len() > 0 {
			r.pass(d.at, "")
			r.lg.sample()
		}
	}
}

func (r *runner) request(e *event) scheduler.Request { return e.request(r.opt.Strategy) }

func (r *runner) group(e *event, all bool) *scheduler.Group { return e.group(r.opt.Strategy, all) }

func (r *runner) placeSerial(e *event) outcome {
	if r.q != nil {
		return r.enqueue(e)
	}
	o := outcome{dur: e.duration(), at: e.at}
	t := time.Now()
	var plan *scheduler.Plan
	var err error
	if e.gang() {
		plan, err = r.cl.PlaceGroup(r.group(e, false))
	} else {
		q := r.request(e)
		plan, err = r.cl.Place(&q)
	}
	o.lat = time.Since(t)
	if err != nil {
		o.unplaced, o.reason = e.n(), err.Error()
		return o
	}
	o.accepted = plan.Placements
	o.relaxed = len(plan.Relaxed) > 0
	o.evicted = plan.Evicted
	for _, u := range plan.Unplaced {
		o.unplaced += len(u.Indexes)
		o.reason = u.Reasons.String()
	}
	return o
}

func simTime(at float64) time.Time {
	return time.Unix(0, 0).Add(time.Duration(at * float64(time.Second)))
}

// enqueue queues e as a gang and makes a pass over the queue; the
// outcome is e's own (placed now, or queued).
func (r *runner) enqueue(e *event) outcome {
	g := r.group(e, e.grp == nil && e.item.Essential == nil)
	t := time.Now()
	if err := r.q.Push(g, simTime(e.at)); err != nil {
		return outcome{unplaced: e.n(), reason: err.Error(), lat: time.Since(t)}
	}
	r.waiting[g.ID] = e
	mine := r.pass(e.at, e.id)
	mine.lat = time.Since(t)
	if mine.accepted == nil {
		r.res.Queued++
	}
	return mine
}

// pass tries the queue at simulated time at; it records every group it
// places except the one called self, whose outcome it returns.
func (r *runner) pass(at float64, self string) outcome {
	var mine outcome
	done, err := r.cl.Schedule(r.q, simTime(at))
	if err != nil {
		r.reasons[err.Error()]++
	}
	for _, d := range done {
		e := r.waiting[d.Group.ID]
		delete(r.waiting, d.Group.ID)
		o := outcome{dur: e.duration(), at: at, accepted: d.Plan.Placements, evicted: d.Plan.Evicted, relaxed: len(d.Plan.Relaxed) > 0}
		for _, u := range d.Plan.Unplaced {
			o.unplaced += len(u.Indexes)
			o.reason = u.Reasons.String()
		}
		if d.Group.ID == self {
			mine = o
			continue
		}
		r.waits = append(r.waits, at-e.at)
		r.recordPlacements(o)
	}
	return mine
}

func (r *runner) placeOptimistic(s *scheduler.Snapshot, e *event) outcome {
	o := outcome{dur: e.duration(), at: e.at}
	t := time.Now()
	if e.gang() {
		plan, _, err := s.PlaceGroup(r.group(e, false))
		if err != nil {
			o.unplaced, o.reason = e.n(), err.Error()
		} else {
			o.accepted = plan.Placements
			for _, u := range plan.Unplaced {
				o.unplaced += len(u.Indexes)
				o.reason = u.Reasons.String()
			}
		}
	} else {
		q := r.request(e)
		plan, _, err := s.Place(&q)
		if err != nil {
			o.unplaced, o.reason = e.n(), err.Error()
		} else {
			o.accepted = plan.Placements
			o.relaxed = len(plan.Relaxed) > 0
			for _, u := range plan.Unplaced {
				o.unplaced += len(u.Indexes)
				o.reason = u.Reasons.String()
			}
		}
	}
	o.lat = time.Since(t)
	return o
}

// parallel plans a batch with one goroutine per scheduler, each on its own
// snapshot, all committing to the one cluster.
func (r *runner) parallel(ctx context.Context, batch []event) error {
	k := len(r.snaps)
	outs := make([][]outcome, k)
	var wg sync.WaitGroup
	var next atomic.Int64
	base := r.done
	for j := range k {
		s := r.snaps[j]
		wg.Go(func() {
			s.Refresh()
			for ctx.Err() == nil {
				i := int(next.Add(1) - 1)
				if i >= len(batch) {
					return
				}
				// One goroutine reports progress, so that the callback is
				// never called concurrently.
				if j == 0 && r.opt.Progress != nil && i&63 == 0 {
					r.opt.Progress(base+i, r.total)
				}
				outs[j] = append(outs[j], r.placeOptimistic(s, &batch[i]))
			}
		})
	}
	wg.Wait()
	for _, batch := range outs {
		for _, o := range batch {
			r.record(o)
		}
	}
	return ctx.Err()
}

// record accounts one request's outcome.
func (r *runner) record(o outcome) {
	r.done++
	r.lat = append(r.lat, o.lat)
	if r.q == nil {
		r.res.Unplaced += o.unplaced
		if o.unplaced > 0 && o.reason != "" {
			r.reasons[o.reason] += o.unplaced
		}
	}
	r.recordPlacements(o)
}

// recordPlacements accounts what an outcome placed and evicted.
func (r *runner) recordPlacements(o outcome) {
	r.res.Placed += len(o.accepted)
	for _, id := range o.evicted {
		r.lg.remove(id)
		r.res.Evicted++
	}
	if o.relaxed {
		r.res.RelaxedPlacements += len(o.accepted)
	}
	var ids []string
	for _, pl := range o.accepted {
		// Only instances that will leave (or may be evicted) need
		// remembering by id.
		id := ""
		if o.dur > 0 || pl.Elastic {
			id = pl.Instance
		}
		if o.dur > 0 {
			ids = append(ids, id)
		}
		r.lg.add(id, pl.Node, pl.Resources)
	}
	if o.dur > 0 && len(ids) > 0 {
		d := departure{at: o.at + o.dur, ids: ids}
		k, _ := slices.BinarySearchFunc(r.deps, d.at, func(x departure, t float64) int {
			if x.at <= t {
				return -1
			}
			return 1
		})
		r.deps = slices.Insert(r.deps, k, d)
	}
}

func (r *runner) finish() {
	res := r.res
	r.lg.sample()
	if r.q != nil {
		res.QueueLeft = r.q.Len()
		for _, e := range r.waiting {
			res.Unplaced += e.n()
		}
		if len(r.waits) > 0 {
			slices.Sort(r.waits)
			res.WaitP50Secs = r.waits[(len(r.waits)-1)/2]
			res.WaitMaxSecs = r.waits[len(r.waits)-1]
		}
	}
	if res.Seconds > 0 {
		res.PlacementsPerSec = float64(res.Placed) / res.Seconds
	}
	res.P50Micros, res.P99Micros, res.MaxMicros = percentiles(r.lat)
	res.NodesUsed = r.lg.peakUsed
	res.LowerBoundNodes = r.lg.peakLB
	if res.LowerBoundNodes > 0 {
		res.PackingRatio = float64(res.NodesUsed) / float64(res.LowerBoundNodes)
	}
	st := r.cl.Stats()
	res.Conflicts = st.Conflicts
	if st.Committed+st.Conflicts > 0 {
		res.ConflictRate = float64(st.Conflicts) / float64(st.Committed+st.Conflicts)
	}
	res.DoubleBooked = r.lg.overbooked()
	if n := len(r.cl.Overbooked()); n > res.DoubleBooked {
		res.DoubleBooked = n
	}
	res.PeakRSSBytes = peakRSS()
	best, bestN := "", 0
	for k, v := range r.reasons {
		if v > bestN || (v == bestN && k < best) {
			best, bestN = k, v
		}
	}
	res.UnplacedReason = best
	if r.q != nil && res.QueueLeft > 0 {
		res.UnplacedReason = fmt.Sprintf("%d requests still queued when the workload ended", res.QueueLeft)
	}
}

// percentiles sorts lat and returns its median, 99th percentile and
// maximum in microseconds (0 for none).
func percentiles(lat []time.Duration) (p50, p99, most float64) {
	if len(lat) == 0 {
		return 0, 0, 0
	}
	slices.Sort(lat)
	q := func(p float64) float64 {
		i := int(math.Ceil(p*float64(len(lat)))) - 1
		return float64(lat[max(i, 0)].Nanoseconds()) / 1e3
	}
	return q(0.50), q(0.99), q(1)
}

// ledger is the run's own account of what runs where, kept apart from the
// scheduler's so that it can catch a double booking the scheduler missed.
type ledger struct {
	idx      map[string]int
	cap      []driver.Node
	use      []driver.Resources
	count    []int
	where    map[string]ledgerEntry
	bad      map[int]bool
	used     int // nodes with at least one instance
	demand   driver.Resources
	inst     int
	peakUsed int
	peakLB   int
	maxShape driver.Resources
	maxInst  int
}

type ledgerEntry struct {
	node int
	res  driver.Resources
}

func newLedger(nodes []driver.Node) *ledger {
	l := &ledger{idx: make(map[string]int, len(nodes)), cap: nodes, use: make([]driver.Resources, len(nodes)),
		count: make([]int, len(nodes)), where: map[string]ledgerEntry{}, bad: map[int]bool{}}
	for i, n := range nodes {
		l.idx[n.Name] = i
		c := n.Capacity
		l.maxShape.CPU = max(l.maxShape.CPU, c.CPU)
		l.maxShape.Memory = max(l.maxShape.Memory, c.Memory)
		l.maxShape.Disk = max(l.maxShape.Disk, c.Disk)
		l.maxShape.GPUs = max(l.maxShape.GPUs, c.GPUs)
		if n.MaxInstances == 0 {
			l.maxInst = math.MaxInt
		} else if l.maxInst != math.MaxInt {
			l.maxInst = max(l.maxInst, n.MaxInstances)
		}
	}
	return l
}

func addRes(a, b driver.Resources, sign int64) driver.Resources {
	return driver.Resources{CPU: a.CPU + driver.MilliCPU(sign)*b.CPU, Memory: a.Memory + driver.Bytes(sign)*b.Memory,
		Disk: a.Disk + driver.Bytes(sign)*b.Disk, GPUs: a.GPUs + sign*b.GPUs}
}

// add records an instance on node; id may be empty for one that never
// leaves.
func (l *ledger) add(id, node string, r driver.Resources) {
	i := l.idx[node]
	if id != "" {
		l.where[id] = ledgerEntry{i, r}
	}
	l.use[i] = addRes(l.use[i], r, 1)
	if l.count[i] == 0 {
		l.used++
	}
	l.count[i]++
	l.demand = addRes(l.demand, r, 1)
	l.inst++
	n := &l.cap[i]
	if !l.use[i].Fits(n.Capacity) || (n.MaxInstances > 0 && l.count[i] > n.MaxInstances) {
		l.bad[i] = true
	}
}

func (l *ledger) remove(id string) {
	e, ok := l.where[id]
	if !ok {
		return
	}
	delete(l.where, id)
	l.use[e.node] = addRes(l.use[e.node], e.res, -1)
	l.count[e.node]--
	if l.count[e.node] == 0 {
		l.used--
	}
	l.demand = addRes(l.demand, e.res, -1)
	l.inst--
}

func (l *ledger) resetPeaks() { l.peakUsed, l.peakLB = 0, 0 }

// sample records the peaks of nodes used and of the lower bound.
func (l *ledger) sample() {
	l.peakUsed = max(l.peakUsed, l.used)
	l.peakLB = max(l.peakLB, l.lowerBound())
}

// lowerBound is the most, over resources, of ceil(demand / node size),
// with the largest node shape as the size.
func (l *ledger) lowerBound() int {
	lb := 0
	div := func(d, s int64) {
		if s > 0 && d > 0 {
			lb = max(lb, int((d+s-1)/s))
		}
	}
	div(int64(l.demand.CPU), int64(l.maxShape.CPU))
	div(int64(l.demand.Memory), int64(l.maxShape.Memory))
	div(int64(l.demand.Disk), int64(l.maxShape.Disk))
	div(l.demand.GPUs, l.maxShape.GPUs)
	if l.maxInst != math.MaxInt {
		div(int64(l.inst), int64(l.maxInst))
	}
	return lb
}

func (l *ledger) overbooked() int { return len(l.bad) }

// peakRSS reads the process's peak resident set size (VmHWM), or 0 where
// it is not available.
func peakRSS() int64 {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmHWM:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err == nil {
				return kb * 1024
			}
		}
	}
	return 0
}
