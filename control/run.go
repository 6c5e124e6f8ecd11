package control

import (
	"container/heap"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/provider"
	"github.com/berth-dev/berth/reconciler"
	"github.com/berth-dev/berth/scheduler"
)

// taskKind says what a task does.
type taskKind uint8

const (
	taskTick    taskKind = iota // step the instance with a Tick
	taskCreate                  // drive a create operation
	taskDelete                  // drive a delete operation
	taskStale                   // delete a stale copy of an instance
	taskLeak                    // delete a leaked resource
	taskStop                    // stop an instance (resumed after a crash)
	taskStart                   // start an instance
	taskSuspend                 // suspend an instance
)

// task is one unit of reconciler work, due at a time. Operations are
// driven by re-queueing their task after each Advance, so a few workers
// drive any number of them. While creates wait for workers there are
// hundreds of thousands of them: a task is 64 bytes, a create's operation
// state (112 bytes) is made only when a worker first takes it, and so is
// its instance's tick (see perform).
type task struct {
	id  string // instance id
	due time.Time
	seq uint64
	// taskOp is nil for a tick (which every instance being created or
	// deleted has, besides its operation's task: most tasks are ticks)
	// and for a create no worker has taken yet (opOf makes it), set for
	// every other kind.
	*taskOp
	index int32
	kind  taskKind
	// createAdopt is the adopt of a create whose taskOp is not made yet.
	createAdopt bool
}

// taskOp is the state of a task that drives operations on a back-end.
type taskOp struct {
	prov *provider.Provider
	// ref is the resource a stale, leak, stop or start task acts on; nil
	// for creates and deletes.
	ref *reconciler.Ref
	ops []driver.Operation // operations in flight (a delete by tag may have several)
	// rest are the back-end ids a delete is still to start on, held back
	// by the provider's write budget (startDeletes).
	rest []string
	// cancel ends the context the operations were started with; aborted
	// says the task was abandoned. Both are guarded by runtime.mu.
	cancel  context.CancelFunc
	issued  time.Time     // when the back-end was asked to create; zero until then, and while the operation is Queued
	poll    time.Duration // backoff when an operation gives no Wait hint
	start   time.Time
	adopt   bool
	aborted bool
}

type taskHeap []*task

func (h taskHeap) Len() int { return len(h) }
func (h taskHeap) Less(i, j int) bool {
	if !h[i].due.Equal(h[j].due) {
		return h[i].due.Before(h[j].due)
	}
	return h[i].seq < h[j].seq
}
func (h taskHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].index = int32(i)
	h[j].index = int32(j)
}
func (h *taskHeap) Push(x any) { t := x.(*task); t.index = int32(len(*h)); *h = append(*h, t) }
func (h *taskHeap) Pop() any {
	old := *h
	t := old[len(old)-1]
	old[len(old)-1] = nil // a popped task must not stay reachable
	*h = old[:len(old)-1]
	t.index = -1
	return t
}

// peek returns the task due first.
func (h taskHeap) peek() (*task, bool) {
	if len(h) == 0 {
		return nil, false
	}
	return h[0], true
}

// runtime is the reconciler's in-memory state while Run runs.
type runtime struct {
	wake chan struct{}

	mu     sync.Mutex
	heap   taskHeap
	seq    uint64
	ticks  map[string]*task    // pending tick per instance
	ops    map[string]*task    // create or delete in flight per instance
	side   map[string]*task    // stale, leak, stop and start tasks by key
	leaks  map[string]sighting // unknown tagged resources, by provider/id
	misses map[string]int      // listings missing an instance, by instance id
	nodes  map[string]nodeSeen // node statuses, by provider/node
	// creating counts the back-end Create calls in flight, by instance
	// id. A delete that looks for an instance's copies by its tags waits
	// until none is, or a create abandoned by the delete could make its
	// copy after the delete looked and found nothing; a call that returns
	// drops the shared listing (listings) for the same reason.
	creating map[string]int

	// outcomes carries the results of finished operations to the writers,
	// which store many of them in one transaction.
	outcomes chan outcome
	// long are the stops with a long grace, made off the workers; Run
	// waits for them (they end with its context).
	long sync.WaitGroup
}

type nodeSeen struct {
	status driver.NodeStatus
	reason string
}

// push queues t; rt.mu must be held.
func (rt *runtime) push(t *task) {
	rt.seq++
	t.seq = rt.seq
	heap.Push(&rt.heap, t)
	rt.signal()
}

// signal wakes the dispatcher to look at the heap again.
func (rt *runtime) signal() {
	select {
	case rt.wake <- struct{}{}:
	default:
	}
}

// run is Plane.Run.
func (s runner) run(ctx context.Context) error {
	s.rtMu.Lock()
	if s.running {
		s.rtMu.Unlock()
		return errors.New("control: Run is already running")
	}
	s.running = true
	if s.cfg.ReadOnly {
		s.rtMu.Unlock()
		defer func() {
			s.rtMu.Lock()
			s.running = false
			s.rtMu.Unlock()
		}()
		s.followStore(ctx)
		return ctx.Err()
	}
	ctx, cancel := context.WithCancel(ctx)
	rt := &runtime{
		wake:  make(chan struct{}, 1),
		ticks: map[string]*task{}, ops: map[string]*task{}, side: map[string]*task{},
		leaks: map[string]sighting{}, misses: map[string]int{}, nodes: map[string]nodeSeen{},
		creating: map[string]int{}, outcomes: make(chan outcome, 4096),
	}
	s.rt = rt
	s.rtMu.Unlock()
	defer func() {
		cancel()
		s.rtMu.Lock()
		s.rt, s.running = nil, false
		s.rtMu.Unlock()
	}()

	// A rebalance run the previous plane left under way is settled first:
	// a move's new copy it undoes is deleted before the resume below could
	// create it again.
	s.rebalancer.settleRun(ctx)
	// Resume interrupted work before the first listing, so that instances
	// mid-create are looked up by tag rather than counted as leaks.
	for _, in := range s.snapshot(func(in *rec) bool { return !in.Phase.Terminal() }) {
		if _, _, err := s.apply(ctx, in.ID, reconciler.Event{Kind: reconciler.Resume}); err != nil && ctx.Err() == nil {
			s.log.Warn("resume", "instance", in.ID, "err", err)
		}
	}
	s.placer.kickPlacer()

	var wg sync.WaitGroup
	ready := make(chan *task)
	wg.Go(func() { s.dispatch(ctx, rt, ready) })
	for range s.cfg.Workers {
		wg.Go(func() {
			for {
				select {
				case <-ctx.Done():
					return
				case t := <-ready:
					s.work(ctx, rt, t)
				}
			}
		})
	}
	for range s.cfg.Writers {
		wg.Go(func() { s.writer(ctx, rt) })
	}
	wg.Go(func() { s.watchStore(ctx, rt) })
	wg.Go(func() { s.placer.placeLoop(ctx) })
	wg.Go(func() { s.syncer.syncLoop(ctx, rt) })
	wg.Go(func() { s.syncer.collector(ctx) })
	wg.Go(func() { s.measurer.usageLoop(ctx) })
	wg.Go(func() { s.rebalancer.rebalanceLoop(ctx) })
	wg.Wait()
	rt.long.Wait()
	// Operations still in flight ended with ctx; the next Run resumes
	// them.
	return ctx.Err()
}

// runtime returns the running reconciler, or nil.
func (s runner) runtimeOf() *runtime {
	s.rtMu.Lock()
	defer s.rtMu.Unlock()
	return s.rt
}

// dispatch hands due tasks to the workers.
func (s runner) dispatch(ctx context.Context, rt *runtime, ready chan<- *task) {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		rt.mu.Lock()
		t, ok := rt.heap.peek()
		var wait time.Duration
		if ok {
			wait = t.due.Sub(s.now())
			if wait <= 0 {
				heap.Pop(&rt.heap)
				if t.kind == taskTick && rt.ticks[t.id] == t {
					delete(rt.ticks, t.id)
				}
			}
		}
		rt.mu.Unlock()
		if ok && wait <= 0 {
			select {
			case ready <- t:
				continue
			case <-ctx.Done():
				return
			}
		}
		if !ok {
			wait = time.Hour
		}
		timer.Reset(wait)
		select {
		case <-ctx.Done():
			return
		case <-rt.wake:
		case <-timer.C:
		}
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
	}
}

// perform carries out the actions of one transition of in, except those
// in direct, which it returns. It never blocks: work is queued.
func (s runner) perform(in reconciler.Instance, acts []reconciler.Action, direct []reconciler.ActionKind) []reconciler.Action {
	var out []reconciler.Action
	rt := s.runtimeOf()
	if rt != nil && in.Deadline.IsZero() {
		// Every wake is at the instance's deadline: one it no longer has
		// is not needed.
		s.untick(rt, in.ID)
	}
	// held is the earliest wake held back while the instance's create
	// waits for a worker: the worker arms it when it takes the create
	// (takeCreate), as the launch timeout counts from then anyway.
	var held time.Time
	for _, a := range acts {
		if slices.Contains(direct, a.Kind) {
			out = append(out, a)
			continue
		}
		if a.Kind == reconciler.Wake && rt != nil && rt.createWaits(in.ID) {
			if held.IsZero() || a.At.Before(held) {
				held = a.At
			}
			continue
		}
		switch a.Kind {
		case reconciler.Release:
			// The ledger gave the node back when the record was stored
			// (applyStored).
			s.placer.victimGone(in.ID)
			s.placer.kickPlacer()
		case reconciler.Place:
			s.placer.kickPlacer()
		}
		if rt == nil {
			// Without a running reconciler the work waits for Run, which
			// resumes every instance.
			continue
		}
		switch a.Kind {
		case reconciler.Wake:
			s.tickAt(rt, in.ID, a.At)
		case reconciler.Create:
			s.startOp(rt, &in, taskCreate, a.Adopt)
		case reconciler.Delete:
			s.startOp(rt, &in, taskDelete, false)
		case reconciler.Cancel:
			rt.mu.Lock()
			if t, ok := rt.ops[in.ID]; ok && t.kind == taskCreate {
				rt.abortLocked(t)
				delete(rt.ops, in.ID)
			}
			rt.mu.Unlock()
		case reconciler.DeleteStale:
			for _, r := range in.Stale {
				s.startSide(rt, &in, taskStale, r)
			}
		case reconciler.Stop:
			s.startSide(rt, &in, taskStop, reconciler.Ref{})
		case reconciler.Start:
			s.startSide(rt, &in, taskStart, reconciler.Ref{})
		case reconciler.Suspend:
			s.startSide(rt, &in, taskSuspend, reconciler.Ref{})
		}
	}
	if !held.IsZero() && !rt.createWaits(in.ID) {
		// The create was abandoned by a later action: no worker will arm
		// the wake.
		s.tickAt(rt, in.ID, held)
	}
	return out
}

// createWaits reports whether instance id has a create no worker took yet.
func (rt *runtime) createWaits(id string) bool {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	t, ok := rt.ops[id]
	return ok && t.kind == taskCreate && t.taskOp == nil
}

// tickAt schedules a Tick of instance id at (or before) at.
func (s runner) tickAt(rt *runtime, id string, at time.Time) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	rt.tickLocked(id, at)
}

// tickLocked is tickAt with rt.mu held.
func (rt *runtime) tickLocked(id string, at time.Time) {
	if t, ok := rt.ticks[id]; ok {
		if !t.due.After(at) {
			return
		}
		t.due = at
		heap.Fix(&rt.heap, int(t.index))
		rt.signal()
		return
	}
	t := &task{kind: taskTick, id: id, due: at}
	rt.ticks[id] = t
	rt.push(t)
}

// untick drops the tick of instance id scheduled for later, if any.
func (s runner) untick(rt *runtime, id string) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if t, ok := rt.ticks[id]; ok && t.due.After(s.now()) {
		heap.Remove(&rt.heap, int(t.index))
		delete(rt.ticks, id)
	}
}

// startOp queues a create or delete for in unless one of the same kind is
// in flight.
func (s runner) startOp(rt *runtime, in *reconciler.Instance, kind taskKind, adopt bool) {
	p, ok := s.provs[in.Provider]
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if t, busy := rt.ops[in.ID]; busy {
		if t.kind == kind {
			return
		}
		rt.abortLocked(t)
	}
	t := &task{kind: kind, id: in.ID, due: s.now()}
	switch {
	case kind == taskCreate:
		// Creates may wait long for a worker: the operation's state is
		// made when one takes it (createOp), its start being due.
		t.createAdopt = adopt
	case ok:
		t.taskOp = &taskOp{prov: p, start: t.due}
	default:
		t.taskOp = &taskOp{start: t.due}
	}
	rt.ops[in.ID] = t
	rt.push(t)
}

// startSide queues a stale delete, stop or start unless the same is queued.
func (s runner) startSide(rt *runtime, in *reconciler.Instance, kind taskKind, ref reconciler.Ref) {
	key := fmt.Sprintf("%d/%s/%s/%s", kind, in.ID, ref.Provider, ref.BackendID)
	prov := in.Provider
	if kind == taskStale {
		prov = ref.Provider
	}
	p, ok := s.provs[prov]
	if !ok {
		return
	}
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if _, busy := rt.side[key]; busy {
		return
	}
	t := &task{kind: kind, id: in.ID, due: s.now(), taskOp: &taskOp{prov: p, ref: &ref, start: s.now()}}
	rt.side[key] = t
	rt.push(t)
}

func sideKey(t *task) string {
	return fmt.Sprintf("%d/%s/%s/%s", t.kind, t.id, t.ref.Provider, t.ref.BackendID)
}

// again re-queues t after its operations reported wait (0: back off).
func (s runner) again(rt *runtime, t *task, wait time.Duration) {
	if wait <= 0 {
		if t.poll == 0 {
			t.poll = 5 * time.Millisecond
		} else {
			t.poll = min(t.poll*2, 250*time.Millisecond)
		}
		wait = t.poll
	}
	t.due = s.now().Add(wait)
	rt.mu.Lock()
	rt.push(t)
	rt.mu.Unlock()
}

// current reports whether t is still the operation in flight for its
// instance.
func (rt *runtime) current(t *task) bool {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	switch t.kind {
	case taskCreate, taskDelete:
		return rt.ops[t.id] == t
	case taskStale, taskLeak, taskStop, taskStart, taskSuspend:
		return rt.side[sideKey(t)] == t
	}
	return true
}

// finish forgets t.
func (rt *runtime) finish(t *task) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	switch t.kind {
	case taskCreate, taskDelete:
		if rt.ops[t.id] == t {
			delete(rt.ops, t.id)
		}
	case taskStale, taskLeak, taskStop, taskStart, taskSuspend:
		if rt.side[sideKey(t)] == t {
			delete(rt.side, sideKey(t))
		}
	}
	rt.abortLocked(t)
}

// abortLocked abandons t: its operations' context ends and its results are
// ignored. rt.mu must be held.
func (rt *runtime) abortLocked(t *task) {
	if t.taskOp == nil {
		if t.kind == taskTick {
			return
		}
		// A create no worker took: none will, nor arm the wakes held
		// back for it (perform). A tick now wakes the instance again at
		// its deadline.
		t.taskOp = &taskOp{}
		rt.tickLocked(t.id, t.due)
	}
	t.aborted = true
	if t.cancel != nil {
		t.cancel()
	}
}

// aborted reports whether t was abandoned.
func (rt *runtime) aborted(t *task) bool {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	return t.taskOp != nil && t.aborted
}

// opContext returns the context t's operations are started with: derived
// from ctx (Run's), it bounds the whole operation and ends when t is
// abandoned or finished. ok is false when t is abandoned already.
func (rt *runtime) opContext(ctx context.Context, t *task) (opCtx context.Context, undo func(), ok bool) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if t.aborted {
		return nil, nil, false
	}
	opCtx, cancel := context.WithCancel(ctx)
	prev := t.cancel
	t.cancel = func() {
		cancel()
		if prev != nil {
			prev()
		}
	}
	// undo ends the context when no operation was started on it.
	undo = func() {
		rt.mu.Lock()
		t.cancel = prev
		rt.mu.Unlock()
		cancel()
	}
	return opCtx, undo, true
}

// launchQueued reports whether instance id has a create that has not been
// issued long enough for its launch timeout to count, and if so when to
// look again: the timeout runs from when the back-end is asked.
func (s runner) launchQueued(rt *runtime, id string) (time.Time, bool) {
	in, ok := s.get(id)
	if !ok || in.Phase != reconciler.Creating || s.now().Before(in.Deadline) {
		return time.Time{}, false
	}
	rt.mu.Lock()
	defer rt.mu.Unlock()
	t, busy := rt.ops[id]
	if !busy || t.kind != taskCreate {
		return time.Time{}, false
	}
	if t.taskOp == nil {
		// No worker took the create yet: it started when it was due.
		return s.now().Add(in.Deadline.Sub(t.due)), true
	}
	timeout := in.Deadline.Sub(t.start)
	if t.issued.IsZero() {
		return s.now().Add(timeout), true
	}
	if end := t.issued.Add(timeout); s.now().Before(end) {
		return end, true
	}
	return time.Time{}, false
}

// staleRetry is how long after a failed delete of a stale copy (its node
// away, say) the instance's tick tries again.
const staleRetry = 10 * time.Second

// callTimeout bounds one synchronous back-end call made by a worker; a
// stop's grace adds to it.
const callTimeout = 30 * time.Second

// defaultStopGrace is the grace of a stop the reconciler makes for a stop
// asked without one it kept (StopLater keeps its grace): one resumed after
// a restart of the plane, or asked before the instance was created.
const defaultStopGrace = 10 * time.Second

// stopGrace keeps grace for the next stop the reconciler makes of
// instance id.
func (s runner) stopGrace(id string, grace time.Duration) { s.graces.Store(id, grace) }

// work performs one task.
func (s runner) work(ctx context.Context, rt *runtime, t *task) {
	switch t.kind {
	case taskTick:
		if later, ok := s.launchQueued(rt, t.id); ok {
			// The launch timeout bounds the back-end's work, not the time
			// the create waited for a worker: look again later.
			s.tickAt(rt, t.id, later)
			return
		}
		if _, _, err := s.apply(ctx, t.id, reconciler.Event{Kind: reconciler.Tick}); err != nil && !errors.Is(err, driver.ErrNotFound) && ctx.Err() == nil {
			s.log.Warn("tick", "instance", t.id, "err", err)
			s.tickAt(rt, t.id, s.now().Add(time.Second))
		}
	case taskCreate:
		s.workCreate(ctx, rt, t)
	case taskDelete:
		s.workDelete(ctx, rt, t)
	case taskStale:
		s.workStale(ctx, rt, t)
	case taskLeak:
		s.workLeak(ctx, rt, t)
	case taskStop, taskStart, taskSuspend:
		s.workStopStart(ctx, rt, t)
	}
}

// feed applies ev to t's instance if t is still current, then forgets t
// when it is over.
func (s runner) feed(ctx context.Context, rt *runtime, t *task, ev reconciler.Event, over bool) {
	if !rt.current(t) {
		return
	}
	apply := func() {
		if _, _, err := s.apply(ctx, t.id, ev); err != nil && ctx.Err() == nil && !errors.Is(err, driver.ErrNotFound) {
			s.log.Warn("apply", "instance", t.id, "event", ev.Kind, "err", err)
		}
	}
	if !over {
		apply()
		return
	}
	// The outcome of an operation goes to the writers, which store many
	// in one transaction, so that the workers keep driving operations
	// while the store commits.
	rt.finish(t)
	select {
	case rt.outcomes <- outcome{id: t.id, ev: ev}:
	case <-ctx.Done():
	}
}

// outcome is the result of a finished operation, to be stored.
type outcome struct {
	id string
	ev reconciler.Event
}

// maxBatch bounds how many outcomes one transaction stores.
const maxBatch = 512

// batchLinger is how long a writer holding fewer than maxBatch outcomes
// waits for more before storing them. Outcomes of single creates arrive
// one by one; storing each in its own commit would spend a write and an
// fsync on each and keep submissions queued behind them.
const batchLinger = 10 * time.Millisecond

// writer stores outcomes in batches until ctx ends. Outcomes not stored
// when Run stops are found again by the next Run, which resumes the
// instances they concern.
func (s runner) writer(ctx context.Context, rt *runtime) {
	batch := make([]outcome, 0, maxBatch)
	var scratch batchScratch
	linger := time.NewTimer(batchLinger)
	linger.Stop()
	defer linger.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case o := <-rt.outcomes:
			batch = append(batch[:0], o)
		}
		linger.Reset(batchLinger)
	collect:
		for len(batch) < maxBatch {
			select {
			case o := <-rt.outcomes:
				batch = append(batch, o)
			case <-linger.C:
				break collect
			case <-ctx.Done():
				break collect
			}
		}
		linger.Stop()
		s.applyBatch(ctx, batch, &scratch)
	}
}

func (s runner) workCreate(ctx context.Context, rt *runtime, t *task) {
	if !rt.current(t) {
		return
	}
	first, live := rt.takeCreate(t)
	if !live {
		return // abandoned before a worker took it, or since: ignored
	}
	in, ok := s.get(t.id)
	if first && ok {
		// Read after the take: every wake held back for the create
		// (perform) is at this deadline or later.
		t.prov = s.provs[in.Provider]
		if !in.Deadline.IsZero() {
			s.tickAt(rt, t.id, in.Deadline)
		}
	}
	if !ok || in.Phase != reconciler.Creating {
		rt.finish(t)
		return
	}
	if t.prov == nil {
		s.feed(ctx, rt, t, reconciler.Event{Kind: reconciler.CreateFailed, Err: driver.Errorf(driver.ErrPermanent, "provider %q is not configured", in.Provider)}, true)
		return
	}
	if len(t.ops) == 0 && !s.issueCreate(ctx, rt, t, &in) {
		return
	}
	s.advanceCreate(ctx, rt, t, &in)
}

// issueCreate asks t's provider to create instance in (or finds the copy
// to adopt) and keeps the operation in t. It returns false when there is
// nothing to advance now: the create failed, waits its turn, or the
// instance was adopted or moved on.
func (s runner) issueCreate(ctx context.Context, rt *runtime, t *task, in *reconciler.Instance) bool {
	if t.adopt {
		found, err := s.lookup(ctx, t.prov, in)
		if err != nil {
			s.createFailed(ctx, rt, t, in, err, nil)
			return false
		}
		if found != nil {
			s.log.Info("adopting", "instance", in.ID, "provider", in.Provider, "backend_id", found.ID, "state", found.State)
			s.adopt(ctx, rt, t, found)
			return false
		}
	}
	if s.placer.victimsOn(reconciler.NodeID(in.Provider, in.Node)) && s.now().Before(in.Deadline) {
		// Instances evicted for this one still hold its room in the
		// back-end: its create waits for their deletes, at most until
		// its launch deadline (then it is tried; its launch timeout
		// counts from the create).
		s.again(rt, t, victimPoll)
		return false
	}
	spec := withPorts(*in.Spec, in.HostPorts)
	spec.Name = in.BackendName()
	spec.Tags = s.verbs.tags(in)
	opCtx, undo, ok := rt.opContext(ctx, t)
	if !ok {
		return false
	}
	rt.mu.Lock()
	if t.aborted {
		// A delete came first: no create may start now.
		rt.mu.Unlock()
		return false
	}
	t.issued = s.now()
	rt.creating[t.id]++
	rt.mu.Unlock()
	s.cluster.presence(t.id, scheduler.Changing)
	op, err := t.prov.Create(opCtx, in.Node, &spec)
	// A listing of the tagged resources taken before the call may
	// lack the copy it made: a delete that looks for the instance's
	// copies by tag (once the call has returned) must not be given it.
	s.lists[t.prov.Name()].Invalidate()
	busy, held := errors.AsType[*provider.Busy](err)
	rt.mu.Lock()
	if rt.creating[t.id]--; rt.creating[t.id] == 0 {
		delete(rt.creating, t.id)
	}
	if held {
		t.issued = time.Time{} // the back-end was not asked
	}
	rt.mu.Unlock()
	if held {
		// The write budget has no change to spare: the worker goes
		// on with other operations, and this one waits its turn.
		undo()
		s.again(rt, t, busy.Wait)
		return false
	}
	if err != nil {
		s.createFailed(ctx, rt, t, in, err, nil)
		return false
	}
	t.ops = []driver.Operation{op}
	return true
}

// advanceCreate advances the create operation of t and feeds its outcome
// to instance in.
func (s runner) advanceCreate(ctx context.Context, rt *runtime, t *task, in *reconciler.Instance) {
	actx, cancel := context.WithTimeout(ctx, callTimeout)
	p, err := t.ops[0].Advance(actx)
	cancel()
	switch {
	case err != nil && (rt.aborted(t) || ctx.Err() != nil):
		// Cancelled: the instance moved on; nothing to report.
		rt.finish(t)
	case err != nil:
		s.createFailed(ctx, rt, t, in, err, p.Instance)
	case p.Done && p.Instance != nil && p.Instance.State == driver.StateCreating:
		// An adopted copy still being built: wait for it.
		t.ops = []driver.Operation{s.awaitOp(t.prov, p.Instance.ID)}
		s.again(rt, t, 0)
	case p.Done && p.Instance != nil && p.Instance.State == driver.StateFailed && t.adopt:
		s.launched(t, nil)
		s.feed(ctx, rt, t, reconciler.Event{Kind: reconciler.Abandoned, Instance: p.Instance}, true)
	case p.Done:
		s.launched(t, nil)
		s.cluster.presence(t.id, scheduler.Present)
		s.feed(ctx, rt, t, reconciler.Event{Kind: reconciler.Created, Instance: p.Instance}, true)
	default:
		rt.mu.Lock()
		switch {
		case p.Queued:
			// Nothing has reached the back-end: the launch timeout
			// counts from when something does (launchQueued).
			t.issued = time.Time{}
		case t.issued.IsZero():
			t.issued = s.now()
		}
		rt.mu.Unlock()
		if p.Instance != nil && p.Instance.ID != "" && in.BackendID != p.Instance.ID {
			s.feed(ctx, rt, t, reconciler.Event{Kind: reconciler.Progress, Instance: p.Instance}, false)
		}
		if rt.current(t) {
			s.again(rt, t, p.Wait)
		}
	}
}

// takeCreate makes the operation state of t, a create in flight, when a
// worker first takes it, and reports whether it did (first: then the
// worker sets its provider, read by the worker alone, and arms the wakes
// perform held back; the create started when it was first due) and
// whether t is still to be worked on (live: not abandoned, by a later
// operation of its instance or by finish, before or since).
func (rt *runtime) takeCreate(t *task) (first, live bool) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	switch {
	case t.taskOp != nil:
		return false, !t.aborted
	case rt.ops[t.id] != t:
		rt.abortLocked(t) // arms the wake held back for it
		return false, false
	}
	t.taskOp = &taskOp{adopt: t.createAdopt, start: t.due}
	return true, true
}

// adopt takes over found, an existing copy of t's instance: a running or
// ended copy is the instance; one still being built is waited for; a broken
// one is deleted and the launch retried.
func (s runner) adopt(ctx context.Context, rt *runtime, t *task, found *driver.Instance) {
	t.adopt = true
	switch found.State {
	case driver.StateCreating:
		t.ops = []driver.Operation{s.awaitOp(t.prov, found.ID)}
		s.again(rt, t, 0)
	case driver.StateFailed, driver.StateDeleting, driver.StateUnknown:
		s.feed(ctx, rt, t, reconciler.Event{Kind: reconciler.Abandoned, Instance: found}, true)
	default:
		s.launched(t, nil)
		s.cluster.presence(t.id, scheduler.Present)
		s.feed(ctx, rt, t, reconciler.Event{Kind: reconciler.Created, Instance: found}, true)
	}
}

// createFailed reports a failed create; a name conflict with a copy of this
// same instance (made by an earlier attempt) is adopted instead.
func (s runner) createFailed(ctx context.Context, rt *runtime, t *task, in *reconciler.Instance, err error, partial *driver.Instance) {
	if errors.Is(err, driver.ErrAlreadyExists) {
		got, ferr := t.prov.Find(ctx, in.BackendName())
		switch {
		case ferr == nil && s.syncer.owns(in, got):
			s.adopt(ctx, rt, t, got)
			return
		case errors.Is(ferr, driver.ErrNotFound):
			// Held by something the back-end cannot show: try again under
			// another name.
			s.launched(t, err)
			s.feed(ctx, rt, t, reconciler.Event{Kind: reconciler.NameTaken, Err: fmt.Errorf("%w: the name %q is held by a resource provider %s cannot show: %w", driver.ErrRetryable, in.BackendName(), in.Provider, err)}, true)
			return
		case ferr == nil && s.syncer.ours(got) && s.releasedName(got.Tags[driver.TagInstance]):
			// Held by the resource of an earlier instance of the same name
			// that is being deleted: try again under another name.
			s.launched(t, err)
			s.feed(ctx, rt, t, reconciler.Event{Kind: reconciler.NameTaken, Err: fmt.Errorf("%w: the name %q is held by the resource of deleted instance %s: %w", driver.ErrRetryable, in.BackendName(), got.Tags[driver.TagInstance], err)}, true)
			return
		case ferr == nil && s.syncer.ours(got) && !s.sameNamespace(got.Tags[driver.TagInstance], in.Owner):
			// Names are per namespace; the back-end's are not: held by an
			// instance of the same name in another namespace, try again
			// under another name (and never say whose).
			s.launched(t, err)
			s.feed(ctx, rt, t, reconciler.Event{Kind: reconciler.NameTaken, Err: fmt.Errorf("%w: the name %q is held in provider %s by an instance of another namespace: %w", driver.ErrRetryable, in.BackendName(), in.Provider, err)}, true)
			return
		}
		err = fmt.Errorf("%w: the name %q is taken in provider %s by a resource that is not this instance: %w", driver.ErrPermanent, in.BackendName(), in.Provider, err)
	}
	if rt.aborted(t) || ctx.Err() != nil {
		rt.finish(t)
		return
	}
	if errors.Is(err, driver.ErrRetryable) {
		// The node may be gone: the next read of the provider's state asks
		// the back-end instead of the cache.
		t.prov.InvalidateState()
	}
	s.launched(t, err)
	s.feed(ctx, rt, t, reconciler.Event{Kind: reconciler.CreateFailed, Err: err, Instance: partial, Provider: in.Provider, Node: in.Node}, true)
}

// adoptGrace is how long an adopted copy may stay in the creating state:
// its builder was the previous reconciler (before a crash, or the leader
// before this one), which finishes a create within seconds if it still
// runs at all. A copy still being built after that was left half-built
// (a container created and never started): it is deleted and the
// instance launched again; a copy that ever ran is always adopted.
const adoptGrace = 10 * time.Second

// awaitOp returns an Operation that waits for the back-end's instance id to
// leave the creating state (an adopted copy whose create the previous
// reconciler was driving). A copy still creating after adoptGrace is
// reported failed, and so abandoned. So is one that the back-end listed but
// cannot show for that long: a create still in flight in the back-end
// (listed before it can be read) or one that it undid when its caller went
// away; its launch is then made again, never failed for it.
func (s runner) awaitOp(p *provider.Provider, id string) driver.Operation {
	since := s.now()
	return driver.Steps(func(ctx context.Context) (bool, *driver.Instance, error) {
		got, err := p.Get(ctx, id)
		if errors.Is(err, driver.ErrNotFound) {
			if s.now().Sub(since) > adoptGrace {
				return true, &driver.Instance{ID: id, State: driver.StateFailed, Message: "listed by an interrupted launch, never to be read"}, nil
			}
			return false, nil, nil
		}
		if err != nil {
			return false, nil, err
		}
		if got.State == driver.StateCreating && s.now().Sub(since) > adoptGrace {
			left := *got
			left.State, left.Message = driver.StateFailed, "left half-built by an interrupted launch"
			return true, &left, nil
		}
		return got.State != driver.StateCreating, got, nil
	})
}

func (s runner) launched(t *task, err error) {
	if s.cfg.Metrics != nil && t.prov != nil {
		s.cfg.Metrics.Launched(t.prov.Name(), err)
	}
	if err != nil {
		s.log.Warn("launch failed", "instance", t.id, "provider", t.prov.Name(), "err", err)
	}
}

// lookup finds the resource of in by its instance tag; nil when none.
func (s runner) lookup(ctx context.Context, p *provider.Provider, in *reconciler.Instance) (*driver.Instance, error) {
	found, err := s.syncer.tagged(ctx, p, in.ID)
	if err != nil {
		return nil, err
	}
	if len(found) == 0 {
		return nil, nil
	}
	// Keep the first; any other copy is deleted as a duplicate by the sync.
	return found[0], nil
}

func (s runner) workDelete(ctx context.Context, rt *runtime, t *task) {
	if !rt.current(t) {
		return
	}
	in, ok := s.get(t.id)
	if !ok || in.Phase != reconciler.Deleting {
		rt.finish(t)
		return
	}
	if t.prov == nil {
		// Nothing can exist on an unknown provider.
		s.cluster.presence(t.id, scheduler.Gone)
		s.feed(ctx, rt, t, reconciler.Event{Kind: reconciler.Gone}, true)
		return
	}
	if t.ops == nil || t.rest != nil {
		s.cluster.presence(t.id, scheduler.Changing)
		ids := t.rest
		if t.ops == nil {
			ids = []string{in.BackendID}
		}
		if t.ops == nil && in.BackendID == "" {
			rt.mu.Lock()
			calls := rt.creating[t.id]
			rt.mu.Unlock()
			if calls > 0 {
				// Its create, abandoned, may still make a copy: look once
				// that call has returned.
				s.again(rt, t, createCallWait)
				return
			}
			var err error
			if ids, err = s.taggedIDs(ctx, t.prov, in.ID, ""); err != nil {
				s.feed(ctx, rt, t, reconciler.Event{Kind: reconciler.DeleteFailed, Err: err}, true)
				return
			}
		}
		ok, wait, err := s.startDeletes(ctx, rt, t, ids)
		if !ok {
			return
		}
		if err != nil {
			s.feed(ctx, rt, t, reconciler.Event{Kind: reconciler.DeleteFailed, Err: err}, true)
			return
		}
		if wait > 0 {
			s.again(rt, t, wait)
			return
		}
	}
	done, wait, err := s.advanceAll(ctx, t)
	switch {
	case err != nil && (rt.aborted(t) || ctx.Err() != nil):
		rt.finish(t)
	case err != nil:
		s.feed(ctx, rt, t, reconciler.Event{Kind: reconciler.DeleteFailed, Err: err}, true)
	case done:
		s.cluster.presence(t.id, scheduler.Gone)
		s.feed(ctx, rt, t, reconciler.Event{Kind: reconciler.Gone}, true)
	default:
		s.again(rt, t, wait)
	}
}

// createCallWait is how long a delete waits before it looks again whether
// the abandoned create of its instance has returned.
const createCallWait = 10 * time.Millisecond

// taggedIDs returns the back-end ids of the resources tagged with instance
// id, except the one with back-end id except.
func (s runner) taggedIDs(ctx context.Context, prov *provider.Provider, id, except string) ([]string, error) {
	found, err := s.syncer.tagged(ctx, prov, id)
	if err != nil {
		return nil, err
	}
	var ids []string
	for _, f := range found {
		if f.ID != except {
			ids = append(ids, f.ID)
		}
	}
	return ids, nil
}

// startDeletes starts one delete per back-end id as t's operations,
// skipping ids already gone. ok is false when Run is stopping; then nothing
// was started. When the provider's write budget holds a delete back, wait
// says when to call startDeletes again, with t.rest (the ids not started;
// none started at all leaves t.ops nil, for the caller to look again).
func (s runner) startDeletes(ctx context.Context, rt *runtime, t *task, ids []string) (ok bool, wait time.Duration, err error) {
	opCtx, undo, ok := rt.opContext(ctx, t)
	if !ok {
		return false, 0, nil
	}
	t.rest = nil
	started := false
	if t.ops == nil {
		t.ops = []driver.Operation{}
	}
	for k, id := range ids {
		op, err := t.prov.Delete(opCtx, id)
		if busy, held := errors.AsType[*provider.Busy](err); held {
			if !started {
				undo()
			}
			if len(t.ops) == 0 {
				t.ops = nil
			} else {
				t.rest = ids[k:]
			}
			return true, busy.Wait, nil
		}
		if errors.Is(err, driver.ErrNotFound) {
			continue
		}
		if err != nil {
			return true, 0, err
		}
		started = true
		t.ops = append(t.ops, op)
	}
	return true, 0, nil
}

// advanceAll advances every operation of t once, dropping finished ones; a
// delete that finds the resource gone counts as done.
func (s runner) advanceAll(ctx context.Context, t *task) (done bool, wait time.Duration, err error) {
	rest := t.ops[:0]
	for _, op := range t.ops {
		actx, cancel := context.WithTimeout(ctx, callTimeout)
		p, e := op.Advance(actx)
		cancel()
		switch {
		case errors.Is(e, driver.ErrNotFound):
		case e != nil:
			return false, 0, e
		case p.Done:
		default:
			rest = append(rest, op)
			if wait == 0 || (p.Wait > 0 && p.Wait < wait) {
				wait = p.Wait
			}
		}
	}
	t.ops = rest
	return len(rest) == 0, wait, nil
}

func (s runner) workStale(ctx context.Context, rt *runtime, t *task) {
	if !rt.current(t) {
		return
	}
	if t.ops == nil || t.rest != nil {
		ids := t.rest
		if t.ops == nil {
			ids = []string{t.ref.BackendID}
		}
		if t.ops == nil && t.ref.BackendID == "" {
			// The copy was still being created when its node went away:
			// every tagged copy except the current one is stale.
			in, _ := s.get(t.id)
			var err error
			if ids, err = s.taggedIDs(ctx, t.prov, t.id, in.BackendID); err != nil {
				rt.finish(t)
				return
			}
		}
		ok, wait, err := s.startDeletes(ctx, rt, t, ids)
		if !ok {
			return
		}
		if err != nil {
			// The node may still be away: a tick tries again later.
			rt.finish(t)
			s.tickAt(rt, t.id, s.now().Add(staleRetry))
			return
		}
		if wait > 0 {
			s.again(rt, t, wait)
			return
		}
	}
	done, wait, err := s.advanceAll(ctx, t)
	switch {
	case err != nil:
		rt.finish(t)
		s.tickAt(rt, t.id, s.now().Add(staleRetry))
	case done:
		s.log.Info("stale copy deleted", "instance", t.id, "provider", t.ref.Provider, "backend_id", t.ref.BackendID)
		s.feed(ctx, rt, t, reconciler.Event{Kind: reconciler.StaleGone, Ref: *t.ref}, true)
	default:
		s.again(rt, t, wait)
	}
}

func (s runner) workLeak(ctx context.Context, rt *runtime, t *task) {
	if !rt.current(t) {
		return
	}
	if t.ops == nil {
		opCtx, undo, ok := rt.opContext(ctx, t)
		if !ok {
			return
		}
		op, err := t.prov.Delete(opCtx, t.ref.BackendID)
		if busy, held := errors.AsType[*provider.Busy](err); held {
			undo()
			s.again(rt, t, busy.Wait)
			return
		}
		if errors.Is(err, driver.ErrNotFound) {
			rt.finish(t)
			return
		}
		if err != nil {
			s.log.Warn("leak delete", "provider", t.ref.Provider, "backend_id", t.ref.BackendID, "err", err)
			rt.finish(t)
			return
		}
		t.ops = []driver.Operation{op}
	}
	done, wait, err := s.advanceAll(ctx, t)
	switch {
	case err != nil:
		s.log.Warn("leak delete", "provider", t.ref.Provider, "backend_id", t.ref.BackendID, "err", err)
		rt.finish(t)
	case done:
		s.log.Info("leak deleted", "provider", t.ref.Provider, "backend_id", t.ref.BackendID, "instance", t.id)
		if s.cfg.Metrics != nil {
			s.cfg.Metrics.LeakFound(t.ref.Provider)
		}
		rt.finish(t)
	default:
		s.again(rt, t, wait)
	}
}

func (s runner) workStopStart(ctx context.Context, rt *runtime, t *task) {
	if !rt.current(t) {
		return
	}
	in, ok := s.get(t.id)
	if !ok {
		rt.finish(t)
		return
	}
	if t.kind == taskStop {
		grace := defaultStopGrace
		g, kept := s.graces.LoadAndDelete(t.id)
		if kept {
			grace = g.(time.Duration)
		}
		stop := func() {
			cctx, cancel := context.WithTimeout(ctx, callTimeout+grace)
			defer cancel()
			err := t.prov.Stop(cctx, in.BackendID, grace)
			ev := reconciler.Event{Kind: reconciler.StopDone}
			if err != nil {
				ev = reconciler.Event{Kind: reconciler.StopFailed, Err: err}
			}
			s.feed(ctx, rt, t, ev, true)
		}
		if kept {
			// A grace kept by StopLater, for a stop too long to wait
			// for, does not hold a worker: creates and deletes go on
			// meanwhile.
			rt.long.Go(stop)
			return
		}
		stop()
		return
	}
	cctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	switch t.kind {
	case taskSuspend:
		err := t.prov.Suspend(cctx, in.BackendID)
		ev := reconciler.Event{Kind: reconciler.SuspendDone}
		if err != nil {
			ev = reconciler.Event{Kind: reconciler.SuspendFailed, Err: err}
		}
		s.feed(ctx, rt, t, ev, true)
		return
	}
	err := t.prov.Start(cctx, in.BackendID)
	ev := reconciler.Event{Kind: reconciler.StartDone}
	if err != nil {
		ev = reconciler.Event{Kind: reconciler.StartFailed, Err: err}
	}
	s.feed(ctx, rt, t, ev, true)
}
