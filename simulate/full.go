package simulate

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/berth-dev/berth/control"
	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/drivers/sim"
	"github.com/berth-dev/berth/provider"
	"github.com/berth-dev/berth/reconciler"
	"github.com/berth-dev/berth/scheduler"
	"github.com/berth-dev/berth/store"
	"github.com/berth-dev/berth/store/bolt"
	"github.com/berth-dev/berth/store/memory"
)

// Path names what a run replays a workload through.
type Path string

// Paths.
const (
	// PathScheduler replays the requests through the scheduler alone.
	PathScheduler Path = "scheduler"
	// PathFull replays them through the whole control plane: Submit,
	// scheduler, store, reconciler and the sim back-end's creates.
	PathFull Path = "full"
)

// Stores a run through the control plane can use.
const (
	StoreMemory = "memory"
	StoreBolt   = "bolt"
)

// PlaneResult is what only a run through the control plane (PathFull)
// measures.
type PlaneResult struct {
	// Store is the store the plane used: memory or bolt.
	Store string `json:"store"`
	// Running and Failed count the workload's instances in those phases
	// when the run ended (preplaced instances are not counted).
	Running int `json:"running"`
	Failed  int `json:"failed"`
	// SecondsToRunning is the wall time from the first submission until
	// every instance was running, failed or pending with a reason.
	SecondsToRunning float64 `json:"seconds_to_running"`
	// CapacityRefusals counts creates the back-end refused because the
	// node lacked room: the plane counted room the node did not have. The
	// instance is placed again, so this is not a double booking, but it
	// should stay 0.
	CapacityRefusals int `json:"capacity_refusals"`
	// Misplaced counts instances the sim back-end holds on a node that
	// breaks a hard constraint of their request (checked independently of
	// the plane, as double_booked is). It must be 0.
	Misplaced int `json:"misplaced"`
	// BackendInstances is how many instances the sim back-end held at the
	// end (preplaced ones included): with nothing leaked, the preplaced
	// and running instances.
	BackendInstances int `json:"backend_instances"`
}

// fullSettlePoll is how often a run through the control plane reads the
// plane's phase counts while it waits for the instances to settle.
const fullSettlePoll = 10 * time.Millisecond

// goneWait is how often a departure reads the phase of an instance it
// waits to see deleted.
const goneWait = 200 * time.Microsecond

// fullCheckEvery is the least wall time between two independent
// double-booking checks (a listing of the sim back-end) during a run
// through the control plane; the gap grows to ten times what the last
// check took, so that checking never costs more than a tenth of the run.
// One more check ends every run.
const fullCheckEvery = time.Second

// transitional are the phases in which an instance is still on its way.
var transitional = []reconciler.Phase{reconciler.Scheduled, reconciler.Creating, reconciler.Stopping, reconciler.Deleting}

// checkFull refuses the options a run through the control plane cannot
// honour; every error names its option.
func checkFull(opt Options) error {
	var es driver.FieldErrors
	add := func(path, reason string) { es = append(es, &driver.FieldError{Path: path, Reason: reason}) }
	if opt.Schedulers > 1 || opt.Optimistic {
		add("schedulers", "the control plane places with one scheduler; parallel schedulers need the scheduler path")
	}
	if opt.Sample != 0 {
		add("sample", "the control plane scores every feasible node; sampling needs the scheduler path")
	}
	if opt.Seed != 0 {
		add("seed", "the control plane's scheduler takes no seed; seeding needs the scheduler path")
	}
	if opt.Queue != "" {
		add("queue", "the control plane keeps what does not fit pending by itself; --queue needs the scheduler path")
	}
	if !slices.Contains([]string{"", StoreMemory, StoreBolt}, opt.Store) {
		add("store", fmt.Sprintf("%q: want memory or bolt", opt.Store))
	}
	return es.Err()
}

// openStore opens the plane's store; close releases it and removes the
// bbolt file's directory.
func openStore(kind string) (st store.Store, close func(), err error) {
	if kind != StoreBolt {
		st := memory.New(memory.Options{})
		return st, func() { _ = st.Close() }, nil
	}
	dir, err := os.MkdirTemp("", "berth-sim-")
	if err != nil {
		return nil, nil, fmt.Errorf("bolt store: %w", err)
	}
	b, err := bolt.Open(filepath.Join(dir, "berth.db"), bolt.Options{})
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, nil, fmt.Errorf("bolt store: %w", err)
	}
	return b, func() {
		_ = b.Close()
		_ = os.RemoveAll(dir)
	}, nil
}

// planeMetrics counts what the plane reports that a run needs.
type planeMetrics struct {
	refused atomic.Int64
}

func (m *planeMetrics) Scheduled(time.Duration, bool) {}
func (m *planeMetrics) QueueDepth(int)                {}
func (m *planeMetrics) QuotaUse(control.QuotaUse)     {}
func (m *planeMetrics) LeakFound(string)              {}
func (m *planeMetrics) Conflicts(int)                 {}
func (m *planeMetrics) Launched(_ string, err error) {
	if errors.Is(err, driver.ErrInsufficientCapacity) {
		m.refused.Add(1)
	}
}

var _ control.Metrics = (*planeMetrics)(nil)

// runFull is Run with PathFull.
func runFull(ctx context.Context, w *Workload, opt Options) (*Result, error) {
	if err := checkFull(opt); err != nil {
		return nil, err
	}
	var back driver.Driver
	var err error
	if opt.Backend != nil {
		back, err = opt.Backend(ctx, w.Nodes)
	} else {
		back, err = sim.New(sim.Options{Pools: w.Nodes})
	}
	if err != nil {
		return nil, fmt.Errorf("sim back-end: %w", err)
	}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	prov, err := provider.New(back, provider.Config{Name: Provider, Logger: quiet})
	if err != nil {
		_ = back.Close(context.WithoutCancel(ctx))
		return nil, err
	}
	defer prov.Close(context.WithoutCancel(ctx))
	ps, err := back.State(ctx)
	if err != nil {
		return nil, fmt.Errorf("sim back-end: %w", err)
	}
	kind := cmp.Or(opt.Store, StoreMemory)
	st, closeStore, err := openStore(kind)
	if err != nil {
		return nil, err
	}
	defer closeStore()
	metrics := &planeMetrics{}
	plane, err := control.New(ctx, control.Config{Store: st, Providers: []*provider.Provider{prov}, Cluster: "berth-sim", Logger: quiet, Metrics: metrics})
	if err != nil {
		return nil, err
	}
	runCtx, stop := context.WithCancel(ctx)
	ran := make(chan error, 1)
	go func() { ran <- plane.Run(runCtx) }()
	defer func() {
		stop()
		<-ran
	}()

	f := &fullRunner{
		plane: plane, back: back, opt: opt, lg: newLedger(ps.Nodes),
		res: &Result{Workload: w.Name, Nodes: len(ps.Nodes), Schedulers: 1, Strategy: string(opt.Strategy),
			PlaneResult: &PlaneResult{Store: kind}},
		pending: map[string]bool{}, elastic: map[string]bool{}, gone: map[string]bool{}, reasons: map[string]int{}, bad: map[string]bool{}, misplaced: map[string]bool{},
		svcRules: map[string][]scheduler.Expr{},
	}
	if f.rules, err = hardRules(w); err != nil {
		return nil, err
	}
	if err := f.preplace(ctx, w, ps.Nodes); err != nil {
		return nil, err
	}
	events, instances := arrivals(w)
	f.res.Requests, f.res.Instances, f.total = len(events), instances, len(events)
	f.lg.resetPeaks()
	f.lg.sample()

	t0 := time.Now()
	if err := f.replay(ctx, events); err != nil {
		return nil, err
	}
	f.res.Seconds = time.Since(t0).Seconds()
	if err := f.settle(ctx); err != nil {
		return nil, err
	}
	f.res.SecondsToRunning = time.Since(t0).Seconds()
	if err := f.finish(ctx); err != nil {
		return nil, err
	}
	f.res.CapacityRefusals = int(metrics.refused.Load())
	return f.res, nil
}

// fullRunner replays a workload through a control plane.
type fullRunner struct {
	plane *control.Plane
	back  driver.Driver
	opt   Options
	lg    *ledger
	res   *Result
	total int
	lat   []time.Duration
	deps  []departure
	// pending holds the ids of instances answered as pending that have not
	// been seen on a node yet.
	pending map[string]bool
	// elastic holds the ids of placed elastic instances of gangs, which a
	// later gang of higher priority may evict; gone those evicted.
	elastic map[string]bool
	gone    map[string]bool
	// reasons counts why instances were not placed.
	reasons map[string]int
	// preRunning is how many preplaced instances run.
	preRunning int
	// bad holds the nodes an independent check found over capacity.
	bad map[string]bool
	// rules holds the hard constraints of each workload item, by index.
	rules [][]scheduler.Expr
	// svcRules holds the hard constraints of each service of the groups
	// submitted, by the service's request id.
	svcRules  map[string][]scheduler.Expr
	misplaced map[string]bool
	lastCheck time.Time
	checkGap  time.Duration
}

// preplace submits the preplaced instances through the plane, each pinned
// to its node (round-robin over the nodes, as the scheduler path reserves
// them), and waits until they settle.
func (f *fullRunner) preplace(ctx context.Context, w *Workload, nodes []driver.Node) error {
	next := 0
	for i := range w.Requests {
		it := &w.Requests[i]
		if !it.Preplaced {
			continue
		}
		// How many of this item land on each node.
		per := make([]int, len(nodes))
		for range max(it.Repeat, 1) * it.N() {
			per[next%len(nodes)]++
			next++
		}
		for k, c := range per {
			if c == 0 {
				continue
			}
			if k&255 == 0 {
				if err := ctx.Err(); err != nil {
					return err
				}
			}
			r := scheduler.Request{ID: "pre" + strconv.Itoa(i) + "-" + strconv.Itoa(k), Spec: it.Spec, Count: c,
				Constraints: []string{"node==" + nodes[k].Name}}
			ans, err := f.plane.Submit(ctx, r, "")
			if err != nil {
				return fmt.Errorf("preplaced requests[%d] on node %s: %w", i, nodes[k].Name, err)
			}
			for _, p := range ans.Instances {
				if p.Node != nil {
					f.lg.add("", p.Node.Name, p.Instance.Spec.Resources)
				}
			}
		}
	}
	if next == 0 {
		return nil
	}
	if err := f.settle(ctx); err != nil {
		return err
	}
	c, err := f.plane.Counts(ctx)
	if err != nil {
		return err
	}
	f.preRunning = c[reconciler.Running]
	f.res.Preplaced = f.preRunning
	return nil
}

// replay submits the events in order. Before each arrival, the instances
// whose duration has ended by then in simulated time are deleted through
// the plane.
func (f *fullRunner) replay(ctx context.Context, events []event) error {
	for j := range events {
		e := &events[j]
		if err := ctx.Err(); err != nil {
			return err
		}
		if j > 0 && e.at != events[j-1].at {
			f.lg.sample()
		}
		if err := f.depart(ctx, e.at); err != nil {
			return err
		}
		if err := f.submit(ctx, e); err != nil {
			return err
		}
		if f.opt.Progress != nil && j&63 == 0 {
			f.opt.Progress(j, f.total)
		}
		if f.checkDue() {
			if err := f.check(ctx); err != nil {
				return err
			}
		}
	}
	f.lg.sample()
	if f.opt.Progress != nil {
		f.opt.Progress(len(events), f.total)
	}
	return nil
}

// submit hands one request to the plane and records its answer.
func (f *fullRunner) submit(ctx context.Context, e *event) error {
	t := time.Now()
	var placed []control.Placed
	var err error
	if e.gang() {
		g := e.group(f.opt.Strategy, false)
		f.groupRules(g)
		var ans *control.GroupAnswer
		ans, err = f.plane.SubmitGroup(ctx, *g, "")
		if err == nil {
			placed = ans.Instances
		}
	} else {
		var ans *control.Answer
		ans, err = f.plane.Submit(ctx, e.request(f.opt.Strategy), "")
		if err == nil {
			placed = ans.Instances
		}
	}
	f.lat = append(f.lat, time.Since(t))
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		// A refused request is not placed; its reason is the error.
		f.reasons[err.Error()] += e.n()
		return nil
	}
	if e.gang() && len(f.elastic) > 0 {
		if err := f.evicted(ctx); err != nil {
			return err
		}
	}
	elastic, dur := e.elastic(), e.duration()
	var ids []string
	for _, p := range placed {
		id := p.Instance.ID
		if dur > 0 {
			ids = append(ids, id)
		}
		if p.Node == nil {
			f.pending[id] = true
			continue
		}
		f.res.Placed++
		lid := ""
		if dur > 0 || elastic {
			lid = id
		}
		if elastic {
			f.elastic[id] = true
		}
		f.lg.add(lid, p.Node.Name, p.Instance.Spec.Resources)
	}
	if len(ids) > 0 {
		d := departure{at: e.at + dur, ids: ids}
		k, _ := slices.BinarySearchFunc(f.deps, d.at, func(x departure, t float64) int {
			if x.at <= t {
				return -1
			}
			return 1
		})
		f.deps = slices.Insert(f.deps, k, d)
	}
	return nil
}

// evicted accounts the elastic instances a gang's submission evicted: the
// plane deletes them to make room for the gang's essential ones.
func (f *fullRunner) evicted(ctx context.Context) error {
	for id := range f.elastic {
		in, err := f.plane.Instance(ctx, id)
		if err != nil {
			return fmt.Errorf("elastic instance %s: %w", id, err)
		}
		if in.Phase == reconciler.Deleting || in.Phase == reconciler.Deleted {
			delete(f.elastic, id)
			f.gone[id] = true
			f.lg.remove(id)
			f.res.Evicted++
		}
	}
	return nil
}

// depart deletes, through the plane, every instance due to end by at, and
// waits until they are gone, as simulated time would: the next arrival
// then finds their room free, as on the scheduler path. An instance still
// pending then is deleted too: its time is over.
func (f *fullRunner) depart(ctx context.Context, at float64) error {
	for len(f.deps) > 0 && f.deps[0].at <= at {
		d := f.deps[0]
		f.deps = f.deps[1:]
		for _, id := range d.ids {
			if f.pending[id] {
				// Placed after its answer, or still waiting?
				in, err := f.plane.Instance(ctx, id)
				if err != nil {
					return fmt.Errorf("departure of %s: %w", id, err)
				}
				delete(f.pending, id)
				if in.Node != "" {
					f.res.Placed++
					f.res.Released++
				}
			} else if f.gone[id] {
				// Evicted before its time: nothing left to release.
				delete(f.gone, id)
				continue
			} else {
				f.lg.remove(id)
				f.res.Released++
			}
			delete(f.elastic, id)
			if err := f.plane.Delete(ctx, id); err != nil {
				return fmt.Errorf("departure of %s: %w", id, err)
			}
		}
		if err := f.waitGone(ctx, d.ids); err != nil {
			return err
		}
		f.lg.sample()
	}
	return nil
}

// waitGone waits until every instance of ids is deleted or failed.
func (f *fullRunner) waitGone(ctx context.Context, ids []string) error {
	for _, id := range ids {
		for {
			in, err := f.plane.Instance(ctx, id)
			if err != nil {
				return fmt.Errorf("departure of %s: %w", id, err)
			}
			if in.Phase.Terminal() {
				break
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(goneWait):
			}
		}
	}
	return nil
}

// settle waits until no instance is on its way: none is scheduled,
// creating, stopping or deleting, none waits for a retry of a failed create,
// and a whole placement round that started after the counts were read placed
// nothing (the counts are the same after it). Every instance then runs, has
// failed, or is pending with a reason that a round has just confirmed. It
// depends on no timing: a slow machine only makes it wait longer.
func (f *fullRunner) settle(ctx context.Context) error {
	t := time.NewTicker(fullSettlePoll)
	defer t.Stop()
	for {
		c, err := f.plane.Counts(ctx)
		if err != nil {
			return err
		}
		if busy(c) == 0 {
			retry, err := f.nextRetry(ctx, c[reconciler.Pending])
			if err != nil {
				return err
			}
			if retry.IsZero() {
				if err := f.plane.PlaceRound(ctx); err != nil {
					return err
				}
				after, err := f.plane.Counts(ctx)
				if err != nil {
					return err
				}
				if maps.Equal(c, after) {
					if retry, err = f.nextRetry(ctx, after[reconciler.Pending]); err != nil {
						return err
					}
					if retry.IsZero() {
						return nil
					}
				}
			}
			if !retry.IsZero() {
				// A retry is due then; the round after it decides.
				select {
				case <-ctx.Done():
					return ctx.Err()
				case <-time.After(time.Until(retry)):
				}
			}
		}
		if f.checkDue() {
			if err := f.check(ctx); err != nil {
				return err
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}

// busy counts the instances of c that are on their way.
func busy(c map[reconciler.Phase]int) int {
	n := 0
	for _, ph := range transitional {
		n += c[ph]
	}
	return n
}

// nextRetry returns when a pending instance waiting for a retry of a failed
// create becomes due (its Deadline; the latest of them), or zero when none
// waits for one. pending is how many instances are pending.
func (f *fullRunner) nextRetry(ctx context.Context, pending int) (time.Time, error) {
	if pending == 0 {
		return time.Time{}, nil
	}
	ins, err := f.plane.Instances(ctx, control.Filter{Phases: []reconciler.Phase{reconciler.Pending}})
	if err != nil {
		return time.Time{}, err
	}
	var latest time.Time
	now := time.Now()
	for _, in := range ins {
		if in.Deadline.After(now) && in.Deadline.After(latest) {
			latest = in.Deadline
		}
	}
	return latest, nil
}

// check is the independent safety check, made on what the sim back-end
// really holds, not on what the plane says: it sums the resources and the
// number of the instances on each node against the node's capacity and
// instance cap (double booking), and matches each instance's node against
// its request's hard constraints (misplacement).
func (f *fullRunner) check(ctx context.Context) error {
	start := time.Now()
	defer func() {
		f.lastCheck = time.Now()
		f.checkGap = max(fullCheckEvery, 10*f.lastCheck.Sub(start))
	}()
	ps, err := f.back.State(ctx)
	if err != nil {
		return fmt.Errorf("sim back-end: %w", err)
	}
	// The back-end's instances are checked one at a time as it walks
	// their placements: a listing of a million would be the run's largest
	// allocation, and a walk of a million snapshots 850 MB of garbage.
	t := newTally(ps.Nodes)
	n := 0
	err = placements(ctx, f.back, func(p *sim.Placement) error {
		t.add(p.Node, p.Resources)
		if bad := f.misplaced1(t.byName, ps.Nodes, string(p.Instance), p.Node); bad {
			f.misplaced[string(p.Instance)] = true
		}
		n++
		return nil
	})
	if err != nil {
		return fmt.Errorf("sim back-end: %w", err)
	}
	for _, name := range t.overbooked(ps.Nodes) {
		f.bad[name] = true
	}
	f.res.Misplaced = len(f.misplaced)
	f.res.BackendInstances = n
	return nil
}

// placements walks the placements of what back holds: the sim's own walk,
// or any other back-end's listing.
func placements(ctx context.Context, back driver.Driver, fn func(*sim.Placement) error) error {
	if s, ok := back.(*sim.Sim); ok {
		return s.Placements(ctx, fn)
	}
	list, err := back.List(ctx, nil)
	if err != nil {
		return err
	}
	for _, in := range list {
		if err := fn(&sim.Placement{Node: in.Node, Resources: in.Resources, Instance: []byte(in.Tags[driver.TagInstance])}); err != nil {
			return err
		}
	}
	return nil
}

// misplacedOn returns the Berth ids of the instances in ins whose node
// breaks a hard constraint of their request (misplaced1).
func (f *fullRunner) misplacedOn(nodes []driver.Node, ins []*driver.Instance) []string {
	byName := nodesByName(nodes)
	var out []string
	for _, in := range ins {
		if id := in.Tags[driver.TagInstance]; f.misplaced1(byName, nodes, id, in.Node) {
			out = append(out, id)
		}
	}
	return out
}

// nodesByName indexes nodes by name.
func nodesByName(nodes []driver.Node) map[string]*driver.Node {
	byName := make(map[string]*driver.Node, len(nodes))
	for i := range nodes {
		byName[nodes[i].Name] = &nodes[i]
	}
	return byName
}

// misplaced1 reports whether node breaks a hard constraint of the request
// of the instance whose Berth id is id. A preplaced instance must be on the node it
// was pinned to; a workload request's constraints are matched as the
// scheduler matches them: "node" is the node's name, "provider" the
// provider's, any other key a label or, failing that, an attribute; a
// node without the key fails == and passes !=. byName indexes nodes.
func (f *fullRunner) misplaced1(byName map[string]*driver.Node, nodes []driver.Node, id, node string) bool {
	n := byName[node]
	if n == nil {
		return true
	}
	if rest, ok := strings.CutPrefix(id, "pre"); ok {
		// pre<item>-<node index>[-<k>]
		k := -1
		if _, after, ok := strings.Cut(rest, "-"); ok {
			index, _, _ := strings.Cut(after, "-")
			k, _ = strconv.Atoi(index)
		}
		return k < 0 || k >= len(nodes) || nodes[k].Name != node
	}
	var rules []scheduler.Expr
	if r, ok := f.svcRules[id]; ok {
		rules = r
	} else if r, ok := f.svcRules[id[:max(strings.LastIndexByte(id, '-'), 0)]]; ok {
		rules = r
	} else {
		// r<item>.<repeat>...
		num, _, _ := strings.Cut(strings.TrimPrefix(id, "r"), ".")
		item, err := strconv.Atoi(num)
		if err != nil || item < 0 || item >= len(f.rules) {
			return true
		}
		rules = f.rules[item]
	}
	for k := range rules {
		e := &rules[k]
		var v string
		var has bool
		switch e.Key {
		case "node":
			v, has = n.Name, true
		case "provider":
			v, has = Provider, true
		default:
			if v, has = n.Labels[e.Key]; !has {
				v, has = n.Attributes[e.Key]
			}
		}
		if (has && e.MatchValue(v)) == e.Negate {
			return true
		}
	}
	return false
}

// groupRules keeps the hard constraints of g's services for the
// independent check; g has passed the workload's validation.
func (f *fullRunner) groupRules(g *scheduler.Group) {
	for k := range g.Services {
		r := g.ServiceRequest(k)
		var rules []scheduler.Expr
		for _, c := range r.Constraints {
			if e, err := scheduler.ParseExpr(c); err == nil && !e.Soft {
				rules = append(rules, e)
			}
		}
		f.svcRules[r.ID] = rules
	}
}

// hardRules parses the hard constraints of every item of w.
func hardRules(w *Workload) ([][]scheduler.Expr, error) {
	rules := make([][]scheduler.Expr, len(w.Requests))
	for i := range w.Requests {
		for j, c := range w.Requests[i].Constraints {
			e, err := scheduler.ParseExpr(c)
			if err != nil {
				return nil, &driver.FieldError{Path: fmt.Sprintf("requests[%d].constraints[%d]", i, j), Reason: err.Error()}
			}
			if !e.Soft {
				rules[i] = append(rules[i], e)
			}
		}
	}
	return rules, nil
}

// checkDue reports whether the next independent check is due.
func (f *fullRunner) checkDue() bool { return time.Since(f.lastCheck) >= f.checkGap }

// overbooked returns the names of the nodes whose instances, summed, need
// more than the node's capacity or outnumber its instance cap.
func overbooked(nodes []driver.Node, ins []*driver.Instance) []string {
	t := newTally(nodes)
	for _, in := range ins {
		t.add(in.Node, in.Resources)
	}
	return t.overbooked(nodes)
}

// tally sums what the instances on each node need, one instance at a
// time.
type tally struct {
	byName map[string]*driver.Node
	used   map[string]*nodeUse
}

// nodeUse is what the instances on one node need, and how many they are.
type nodeUse struct {
	r driver.Resources
	n int
}

func newTally(nodes []driver.Node) *tally {
	return &tally{byName: nodesByName(nodes), used: make(map[string]*nodeUse, len(nodes))}
}

// add counts an instance holding r on node.
func (t *tally) add(node string, r driver.Resources) {
	u := t.used[node]
	if u == nil {
		u = &nodeUse{}
		t.used[node] = u
	}
	u.r = u.r.Add(r)
	u.n++
}

// overbooked returns the names of the nodes, in the order of nodes, whose
// instances need more than the node's capacity or outnumber its instance
// cap.
func (t *tally) overbooked(nodes []driver.Node) []string {
	var out []string
	for _, n := range nodes {
		u := t.used[n.Name]
		if u == nil {
			continue
		}
		if !u.r.Fits(n.Capacity) || (n.MaxInstances > 0 && u.n > n.MaxInstances) {
			out = append(out, n.Name)
		}
	}
	return out
}

// finish fills in the result.
func (f *fullRunner) finish(ctx context.Context) error {
	res := f.res
	if err := f.check(ctx); err != nil {
		return err
	}
	// Instances answered as pending: placed since, or still waiting.
	for id := range f.pending {
		in, err := f.plane.Instance(ctx, id)
		if err != nil {
			return err
		}
		switch {
		case in.Node != "":
			res.Placed++
			if in.Phase.HoldsNode() {
				f.lg.add("", in.Node, in.Spec.Resources)
			}
		default:
			f.reasons[cmp.Or(in.Message, string(in.Phase))]++
		}
	}
	f.lg.sample()
	res.Unplaced = res.Instances - res.Placed
	c, err := f.plane.Counts(ctx)
	if err != nil {
		return err
	}
	res.Running = c[reconciler.Running] - f.preRunning
	res.Failed = c[reconciler.Failed]
	if res.Seconds > 0 {
		res.PlacementsPerSec = float64(res.Placed) / res.Seconds
	}
	res.P50Micros, res.P99Micros, res.MaxMicros = percentiles(f.lat)
	res.NodesUsed = f.lg.peakUsed
	res.LowerBoundNodes = f.lg.peakLB
	if res.LowerBoundNodes > 0 {
		res.PackingRatio = float64(res.NodesUsed) / float64(res.LowerBoundNodes)
	}
	res.DoubleBooked = len(f.bad)
	res.PeakRSSBytes = peakRSS()
	best, bestN := "", 0
	for k, v := range f.reasons {
		if v > bestN || (v == bestN && k < best) {
			best, bestN = k, v
		}
	}
	res.UnplacedReason = best
	return nil
}
