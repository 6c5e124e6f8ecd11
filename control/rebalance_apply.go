package control

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/reconciler"
	"github.com/berth-dev/berth/scheduler"
	"github.com/berth-dev/berth/store"
)

// KeyRebalance holds the latest rebalance run (RebalanceRun), written
// before each of its steps: the intent a restarted plane settles.
const KeyRebalance = "/berth/rebalance/run"

// Bounds and defaults of ApplyOptions.
const (
	MaxApplyMoves        = 500
	DefaultApplyParallel = 4
	MaxApplyParallel     = 64
	DefaultApplyRate     = 2.0
	DefaultGroupBudget   = "1"
)

// ApplyOptions ask Plane.ApplyRebalance to plan and carry out a rebalance.
type ApplyOptions struct {
	RebalanceOptions
	// GroupBudget is how many instances of one group (of one request,
	// outside groups) may move at once: a count ("2") or a share of the
	// group's instances ("25%", at least one). Default "1".
	GroupBudget string `json:"group_budget,omitempty"`
	// NamespaceBudget is how many instances of one namespace may move at
	// once; 0 means no bound but Parallel.
	NamespaceBudget int `json:"namespace_budget,omitempty"`
	// Parallel is how many moves may be under way at once (1 to
	// MaxApplyParallel; default DefaultApplyParallel); Rate how many may
	// start per second (default DefaultApplyRate).
	Parallel int     `json:"parallel,omitempty"`
	Rate     float64 `json:"rate,omitempty"`
	// MoveTimeout bounds how long a new copy has to run, and an old copy
	// to be deleted, before the move fails; at most an hour, default the
	// launch timeout. In JSON it is MoveTimeoutSeconds.
	MoveTimeout        time.Duration `json:"-"`
	MoveTimeoutSeconds float64       `json:"move_timeout_seconds,omitempty"`
}

// Run states.
const (
	RunRunning   = "running"
	RunDone      = "done"
	RunAborted   = "aborted"
	RunAbandoned = "abandoned"
)

// Move states.
const (
	MovePlanned  = "planned"
	MoveCreating = "creating"
	MoveDeleting = "deleting-old"
	MoveDone     = "done"
	MoveUndone   = "undone"
)

// RebalanceRun is a rebalance being carried out, or the last one.
type RebalanceRun struct {
	ID      string        `json:"id"`
	State   string        `json:"state"`
	Error   string        `json:"error,omitempty"`
	Options ApplyOptions  `json:"options"`
	Moves   []MoveRun     `json:"moves"`
	Started time.Time     `json:"started"`
	Updated time.Time     `json:"updated"`
	Plan    *PlanSummary  `json:"plan,omitempty"`
	Check   *CheckSummary `json:"check,omitempty"`
}

// PlanSummary is what the plan of a run promised.
type PlanSummary struct {
	NodesBefore int      `json:"nodes_before"`
	NodesAfter  int      `json:"nodes_after"`
	Freed       []string `json:"freed"`
	OverBefore  int      `json:"over_before"`
	OverAfter   int      `json:"over_after"`
}

// CheckSummary is the replay of a run's plan.
type CheckSummary struct {
	Moved int  `json:"moved"`
	OK    bool `json:"ok"`
}

// MoveRun is one move of a run: the planned move, the id of its new copy
// once made, where it stands and what went wrong.
type MoveRun struct {
	scheduler.Move
	New   string `json:"new,omitempty"`
	State string `json:"state"`
	Error string `json:"error,omitempty"`
}

// rebalancing is the plane's one rebalance run; runMu guards it. Lock
// order: a leaf, taken with no other lock of the plane held.
type rebalancing struct {
	runMu sync.Mutex
	run   *RebalanceRun
	// starts hands a run to the loop that carries it out (Run's).
	startOnce sync.Once
	starts    chan *RebalanceRun
}

func (s rebalancer) startsChan() chan *RebalanceRun {
	s.reb.startOnce.Do(func() { s.reb.starts = make(chan *RebalanceRun) })
	return s.reb.starts
}

// ApplyRebalance plans a rebalance (PlanRebalance, at most MaxApplyMoves
// moves), refuses a plan whose replay is not valid, records the run in the
// store and hands it to Run, which carries the moves out in order and
// returns at once with the run. Each move is make-before-break: a new copy
// of the instance (a new id and name, the same request, group and
// namespace) is placed on the target node, the move waits until it runs,
// then deletes the old copy through the ordinary delete. Budgets: at most
// GroupBudget instances of a group and NamespaceBudget of a namespace
// move at once, at most Parallel in all, at most Rate started a second;
// a group whose running instances are fewer than its essential count
// moves nothing. The first failure aborts the run: no move starts after
// it, the moves under way end (a new copy that does not run is deleted,
// its old copy left as it was), and the run says why. One run at a time:
// another is driver.ErrAlreadyExists. Without Run, nothing is carried out
// and the answer is an error.
func (p *Plane) ApplyRebalance(ctx context.Context, opt ApplyOptions) (*RebalanceRun, error) {
	if err := p.refuse(); err != nil {
		return nil, err
	}
	run, err := p.prepareRun(ctx, opt, nil)
	if err != nil {
		return nil, err
	}
	if run.State == RunRunning {
		if p.runner.runtimeOf() == nil {
			p.rebalancer.endRun(RunAborted, "the control plane is not running")
			_ = p.rebalancer.saveRun(ctx)
			return nil, errors.New("control: the control plane is not running; nothing was moved")
		}
		select {
		case p.rebalancer.startsChan() <- run:
		case <-ctx.Done():
			p.rebalancer.endRun(RunAborted, "the request ended before the run started")
			_ = p.rebalancer.saveRun(context.WithoutCancel(ctx))
			return nil, ctx.Err()
		}
	}
	return p.RebalanceStatus(ctx)
}

// prepareRun checks opt, fills in its defaults, plans, refuses a plan
// whose replay is not valid, and records the run it makes of the plan as
// the plane's run; nil when accept, if set, turns the plan down.
func (p *state) prepareRun(ctx context.Context, opt ApplyOptions, accept func(*RebalanceAnswer) bool) (*RebalanceRun, error) {
	if err := opt.Check(); err != nil {
		return nil, err
	}
	if opt.MaxMoves == 0 {
		opt.MaxMoves = MaxApplyMoves
	}
	if opt.Parallel == 0 {
		opt.Parallel = DefaultApplyParallel
	}
	if opt.Rate == 0 {
		opt.Rate = DefaultApplyRate
	}
	if opt.GroupBudget == "" {
		opt.GroupBudget = DefaultGroupBudget
	}
	if opt.MoveTimeout == 0 && opt.MoveTimeoutSeconds > 0 {
		opt.MoveTimeout = time.Duration(opt.MoveTimeoutSeconds * float64(time.Second))
	}
	if opt.MoveTimeout == 0 {
		opt.MoveTimeout = p.m.LaunchTimeout
		if opt.MoveTimeout == 0 {
			opt.MoveTimeout = 5 * time.Minute
		}
	}
	p.reb.runMu.Lock()
	busy := p.reb.run != nil && p.reb.run.State == RunRunning
	p.reb.runMu.Unlock()
	if busy {
		return nil, driver.Errorf(driver.ErrAlreadyExists, "a rebalance is under way; wait for it to end (berth rebalance --status)")
	}
	ans, err := p.planRebalance(ctx, opt.RebalanceOptions)
	if err != nil {
		return nil, err
	}
	if !ans.Check.OK() {
		return nil, fmt.Errorf("control: the plan's replay is not valid (%d refused, %d overbooked, %d misplaced); nothing was moved",
			len(ans.Check.Refused), len(ans.Check.Overbooked), len(ans.Check.Misplaced))
	}
	if accept != nil && !accept(ans) {
		return nil, nil
	}
	now := p.now()
	run := &RebalanceRun{ID: newID(), State: RunRunning, Options: opt, Moves: make([]MoveRun, len(ans.Moves)), Started: now, Updated: now,
		Plan:  &PlanSummary{NodesBefore: ans.NodesBefore, NodesAfter: ans.NodesAfter, Freed: ans.Freed, OverBefore: ans.OverBefore, OverAfter: ans.OverAfter},
		Check: &CheckSummary{Moved: ans.Check.Moved, OK: ans.Check.OK()}}
	for k, m := range ans.Moves {
		run.Moves[k] = MoveRun{Move: m, State: MovePlanned}
	}
	if len(run.Moves) == 0 {
		run.State = RunDone
	}
	p.reb.runMu.Lock()
	if p.reb.run != nil && p.reb.run.State == RunRunning {
		p.reb.runMu.Unlock()
		return nil, driver.Errorf(driver.ErrAlreadyExists, "a rebalance is under way; wait for it to end (berth rebalance --status)")
	}
	p.reb.run = run
	p.reb.runMu.Unlock()
	if err := p.rebalancer.saveRun(ctx); err != nil {
		p.rebalancer.endRun(RunAborted, err.Error())
		return nil, err
	}
	return run, nil
}

// RebalanceStatus returns the current or latest rebalance run, from
// memory or, after a restart, the store; driver.ErrNotFound when there
// was none.
func (p *Plane) RebalanceStatus(ctx context.Context) (*RebalanceRun, error) {
	p.reb.runMu.Lock()
	run := p.reb.run
	var cp RebalanceRun
	if run != nil {
		cp = *run
		cp.Moves = slices.Clone(run.Moves)
	}
	p.reb.runMu.Unlock()
	if run != nil {
		return &cp, nil
	}
	kv, err := p.st.Get(ctx, KeyRebalance)
	if errors.Is(err, store.ErrNotFound) {
		return nil, driver.Errorf(driver.ErrNotFound, "no rebalance has run")
	}
	if err != nil {
		return nil, fmt.Errorf("control: read rebalance: %w", err)
	}
	var r RebalanceRun
	if err := json.Unmarshal(kv.Value, &r); err != nil {
		return nil, fmt.Errorf("control: decode rebalance: %w", err)
	}
	return &r, nil
}

// Check checks o's fields; every error names its field.
func (o *ApplyOptions) Check() error {
	so := scheduler.RebalanceOptions{Goal: o.Goal, Threshold: o.Threshold, Load: o.Load, MaxMoves: o.MaxMoves, MaxStays: o.MaxStays}
	var es driver.FieldErrors
	if err := so.Check(); err != nil {
		var fe driver.FieldErrors
		if errors.As(err, &fe) {
			es = append(es, fe...)
		}
	}
	if o.MaxMoves > MaxApplyMoves {
		es.Add("max_moves", "%d: a run carries out at most %d moves", o.MaxMoves, MaxApplyMoves)
	}
	if _, _, err := parseBudget(o.GroupBudget); err != nil {
		es.Add("group_budget", "%q: %v", o.GroupBudget, err)
	}
	if o.NamespaceBudget < 0 {
		es.Add("namespace_budget", "%d: must not be negative", o.NamespaceBudget)
	}
	if o.Parallel < 0 || o.Parallel > MaxApplyParallel {
		es.Add("parallel", "%d: want 1 to %d (0 means %d)", o.Parallel, MaxApplyParallel, DefaultApplyParallel)
	}
	if math.IsNaN(o.Rate) || o.Rate < 0 || o.Rate > 1000 {
		es.Add("rate", "%v: want more than 0 and at most 1000 moves a second", o.Rate)
	}
	if o.MoveTimeout < 0 || o.MoveTimeout > time.Hour {
		es.Add("move_timeout", "%s: want at most an hour", o.MoveTimeout)
	}
	if math.IsNaN(o.MoveTimeoutSeconds) || o.MoveTimeoutSeconds < 0 || o.MoveTimeoutSeconds > 3600 {
		es.Add("move_timeout_seconds", "%v: want at most 3600", o.MoveTimeoutSeconds)
	}
	return es.Err()
}

// parseBudget reads "N" or "N%": a count, or a share in percent.
func parseBudget(b string) (n int, pct float64, err error) {
	if b == "" {
		return 1, 0, nil
	}
	if v, ok := strings.CutSuffix(b, "%"); ok {
		f, err := strconv.ParseFloat(v, 64)
		if err != nil || math.IsNaN(f) || f <= 0 || f > 100 {
			return 0, 0, errors.New("want a count from 1, or a share from 0 to 100 followed by %")
		}
		return 0, f, nil
	}
	n, err = strconv.Atoi(b)
	if err != nil || n < 1 {
		return 0, 0, errors.New("want a count from 1, or a share from 0 to 100 followed by %")
	}
	return n, 0, nil
}

// saveRun writes the run as it is now to the store.
func (s rebalancer) saveRun(ctx context.Context) error {
	s.reb.runMu.Lock()
	s.reb.run.Updated = s.now()
	b, err := json.Marshal(s.reb.run)
	s.reb.runMu.Unlock()
	if err != nil {
		return fmt.Errorf("control: encode rebalance: %w", err)
	}
	ok, _, err := s.commit(ctx, &txn{ops: []store.Op{store.Put(KeyRebalance, b)}})
	if err == nil && !ok {
		err = errors.New("control: store refused the rebalance record")
	}
	return err
}

// endRun sets the run's final state.
func (s rebalancer) endRun(st, why string) {
	s.reb.runMu.Lock()
	defer s.reb.runMu.Unlock()
	s.reb.run.State = st
	if s.reb.run.Error == "" {
		s.reb.run.Error = why
	}
}

// setMove changes move k of the run.
func (s rebalancer) setMove(k int, fn func(m *MoveRun)) {
	s.reb.runMu.Lock()
	defer s.reb.runMu.Unlock()
	fn(&s.reb.run.Moves[k])
}

// AutoRebalance is the continuous mode (Config.Rebalance): at most once
// every Every, when no run is under way, the plane plans a rebalance with
// Options and carries it out when the gain is worth it: for the binpack
// goal, at least MinFreed nodes freed (default 1); for spread, at least
// MinUnloaded nodes brought under the threshold (default 1). Off while
// Every is 0, the default.
type AutoRebalance struct {
	Every       time.Duration
	MinFreed    int
	MinUnloaded int
	Options     ApplyOptions
}

// RebalanceMetrics may be implemented by Config.Metrics, to count the
// continuous mode's rounds and every run's end.
type RebalanceMetrics interface {
	// RebalanceRound records one round of the continuous mode: whether
	// its plan was carried out, its moves and the nodes it frees.
	RebalanceRound(applied bool, moves, freed int)
	// RebalanceEnded records the end of a run: its state, and its moves
	// done and undone.
	RebalanceEnded(state string, done, undone int)
}

// rebalanceLoop carries out the runs ApplyRebalance hands it, and the
// continuous mode's rounds, until ctx ends (run settles a run a previous
// plane left under way before it starts).
func (s rebalancer) rebalanceLoop(ctx context.Context) {
	var tick <-chan time.Time
	if every := s.cfg.Rebalance.Every; every > 0 {
		t := time.NewTicker(every)
		defer t.Stop()
		tick = t.C
	}
	for {
		select {
		case <-ctx.Done():
			return
		case run := <-s.startsChan():
			s.execute(ctx, run)
		case <-tick:
			s.autoRound(ctx)
		}
	}
}

// autoRound is one round of the continuous mode.
func (s rebalancer) autoRound(ctx context.Context) {
	a := s.cfg.Rebalance
	var moves, freed int
	run, err := s.prepareRun(ctx, a.Options, func(ans *RebalanceAnswer) bool {
		moves, freed = len(ans.Moves), len(ans.Freed)
		if len(ans.Moves) == 0 {
			return false
		}
		if ans.Goal == scheduler.RebalanceSpread {
			return ans.OverBefore-ans.OverAfter >= max(a.MinUnloaded, 1)
		}
		return len(ans.Freed) >= max(a.MinFreed, 1)
	})
	m, _ := s.cfg.Metrics.(RebalanceMetrics)
	if m != nil {
		m.RebalanceRound(run != nil, moves, freed)
	}
	if err != nil {
		if !errors.Is(err, driver.ErrAlreadyExists) && ctx.Err() == nil {
			s.log.Warn("rebalance: a round of the continuous mode", "err", err)
		}
		return
	}
	if run == nil {
		s.log.Debug("rebalance: no gain worth moving for", "moves", moves, "freed", freed)
		return
	}
	s.log.Info("rebalance: the continuous mode starts a run", "run", run.ID, "moves", moves, "freed", freed)
	if run.State == RunRunning {
		s.execute(ctx, run)
	}
}

// moveResult is the end of one move.
type moveResult struct {
	k   int
	err error
}

// execute carries out run's moves in order within the budgets, and stops
// starting moves at the first failure.
func (s rebalancer) execute(ctx context.Context, run *RebalanceRun) {
	opt := run.Options
	perN, perPct, _ := parseBudget(opt.GroupBudget)
	size, essential, running := s.groupCounts(ctx, run)
	budget := func(g string) int {
		if perPct > 0 {
			return max(1, int(math.Floor(perPct*float64(size[g])/100)))
		}
		return perN
	}
	byGroup, byNS := map[string]int{}, map[string]int{}
	results := make(chan moveResult)
	inflight, next := 0, 0
	var failure error
	gap := time.Duration(float64(time.Second) / opt.Rate)
	var last time.Time
	for {
		for failure == nil && ctx.Err() == nil && next < len(run.Moves) && inflight < opt.Parallel {
			m := run.Moves[next].Move
			g, ns := groupKey(m), m.Owner
			if byGroup[g] >= budget(g) || (opt.NamespaceBudget > 0 && byNS[ns] >= opt.NamespaceBudget) {
				break
			}
			if running[g] < essential[g] {
				failure = fmt.Errorf("group %s runs %d instances, fewer than its %d essential: nothing of it moves", g, running[g], essential[g])
				break
			}
			if wait := gap - time.Since(last); !last.IsZero() && wait > 0 {
				t := time.NewTimer(wait)
				select {
				case <-ctx.Done():
				case <-t.C:
				}
				t.Stop()
				if ctx.Err() != nil {
					break
				}
			}
			last = time.Now()
			byGroup[g]++
			byNS[ns]++
			inflight++
			k := next
			next++
			go func() { results <- moveResult{k, s.moveOne(ctx, k, opt.MoveTimeout)} }()
		}
		if inflight == 0 {
			break
		}
		r := <-results
		inflight--
		m := run.Moves[r.k].Move
		byGroup[groupKey(m)]--
		byNS[m.Owner]--
		if r.err != nil && failure == nil {
			failure = fmt.Errorf("move of %s from %s to %s: %w", m.Instance, m.From, m.To, r.err)
		}
	}
	switch {
	case ctx.Err() != nil:
		// The plane stops: the run stays under way in the store, and the
		// next plane settles it.
		return
	case failure != nil:
		s.endRun(RunAborted, failure.Error())
	default:
		s.endRun(RunDone, "")
	}
	if err := s.saveRun(ctx); err != nil {
		s.log.Warn("rebalance: record the run's end", "err", err)
	}
	s.reb.runMu.Lock()
	st, done, undone := run.State, 0, 0
	for _, mr := range run.Moves {
		switch mr.State {
		case MoveDone:
			done++
		case MoveUndone:
			undone++
		}
	}
	s.reb.runMu.Unlock()
	s.log.Info("rebalance: the run ended", "run", run.ID, "state", st, "done", done, "undone", undone, "error", run.Error)
	if m, ok := s.cfg.Metrics.(RebalanceMetrics); ok {
		m.RebalanceEnded(st, done, undone)
	}
}

// groupKey is the budget's group of a move: its group, else its request.
func groupKey(m scheduler.Move) string {
	if m.Group != "" {
		return m.Group
	}
	return "request " + m.Request
}

// groupCounts counts, for the groups run's moves touch, their live
// instances, their essential count (a stored group's services' essential
// counts; 0 outside groups) and how many run.
func (s rebalancer) groupCounts(ctx context.Context, run *RebalanceRun) (size, essential, running map[string]int) {
	size, essential, running = map[string]int{}, map[string]int{}, map[string]int{}
	want := map[string]bool{}
	for _, m := range run.Moves {
		want[groupKey(m.Move)] = true
	}
	for _, in := range s.snapshot(func(r *rec) bool { return r.Phase.HoldsNode() }) {
		g := groupKey(scheduler.Move{Group: in.Group, Request: in.Request})
		if !want[g] {
			continue
		}
		size[g]++
		if in.Phase == reconciler.Running || in.Phase == reconciler.Held || in.Phase == reconciler.Suspended {
			running[g]++
		}
	}
	for g := range want {
		if strings.HasPrefix(g, "request ") {
			continue
		}
		kv, err := s.st.Get(ctx, PrefixGroups+g)
		if err != nil {
			continue
		}
		var sg scheduler.Group
		if json.Unmarshal(kv.Value, &sg) == nil {
			for i := range sg.Services {
				essential[g] += sg.Services[i].EssentialCount()
			}
		}
	}
	return size, essential, running
}

// copySuffix is the suffix a move adds to an instance's id and name.
var copySuffix = regexp.MustCompile(`\.m[0-9a-f]{6}$`)

// copyName returns name with a fresh move suffix in place of any it has.
func copyName(name, suffix string) string {
	return copySuffix.ReplaceAllString(name, "") + suffix
}

// moveOne carries out move k of the run make-before-break, recording each
// step in the store before it is taken.
func (s rebalancer) moveOne(ctx context.Context, k int, timeout time.Duration) error {
	s.reb.runMu.Lock()
	m := s.reb.run.Moves[k].Move
	s.reb.runMu.Unlock()
	old, ok := s.get(m.Instance)
	if !ok || old.Phase != reconciler.Running || old.Provider != m.Provider || old.Node != m.From {
		err := errors.New("the instance is no longer running where the plan found it")
		s.setMove(k, func(mr *MoveRun) { mr.State, mr.Error = MoveUndone, err.Error() })
		_ = s.saveRun(ctx)
		return err
	}
	var b [3]byte
	_, _ = rand.Read(b[:])
	suffix := ".m" + hex.EncodeToString(b[:])
	cp := &reconciler.Instance{
		ID: copyName(old.ID, suffix), Name: copyName(old.Name, suffix), Spec: old.Spec, Phase: reconciler.Pending,
		Owner: old.Owner, Pool: old.Pool, Label: old.Label, Group: old.Group, Request: old.Request, Priority: old.Priority,
		Created: s.now(), Updated: s.now(),
	}
	if old.Name == old.ID {
		cp.Name = cp.ID
	}
	if len(cp.Name) > maxNameLen {
		err := fmt.Errorf("the new copy's name %q would be longer than %d characters", cp.Name, maxNameLen)
		s.setMove(k, func(mr *MoveRun) { mr.State, mr.Error = MoveUndone, err.Error() })
		_ = s.saveRun(ctx)
		return err
	}
	if spec := s.requestSpec(old.Request); spec != nil {
		cp.Spec = spec
	}
	// The intent first: a plane killed from here on finds the copy's id.
	s.setMove(k, func(mr *MoveRun) { mr.New, mr.State = cp.ID, MoveCreating })
	if err := s.saveRun(ctx); err != nil {
		return err
	}
	if err := s.createCopy(ctx, &old, cp, m.To); err != nil {
		s.setMove(k, func(mr *MoveRun) { mr.State, mr.Error = MoveUndone, err.Error() })
		_ = s.saveRun(ctx)
		return err
	}
	if err := s.waitRunning(ctx, cp.ID, m.Provider, m.To, timeout); err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		// Undo: the old copy was never touched.
		derr := s.verbs.delete(ctx, cp.ID)
		s.setMove(k, func(mr *MoveRun) {
			mr.State, mr.Error = MoveUndone, err.Error()
			if derr != nil {
				mr.Error += "; deleting the new copy: " + derr.Error()
			}
		})
		_ = s.saveRun(ctx)
		return err
	}
	s.setMove(k, func(mr *MoveRun) { mr.State = MoveDeleting })
	if err := s.saveRun(ctx); err != nil {
		return err
	}
	if err := s.verbs.delete(ctx, old.ID); err != nil && !errors.Is(err, driver.ErrNotFound) {
		s.setMove(k, func(mr *MoveRun) { mr.Error = "deleting the old copy: " + err.Error() })
		_ = s.saveRun(ctx)
		return err
	}
	if err := s.waitGone(ctx, old.ID, timeout); err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		s.setMove(k, func(mr *MoveRun) { mr.Error = err.Error() })
		_ = s.saveRun(ctx)
		return err
	}
	// The new copy replaces the old one: its record goes at once (the run
	// says which copy replaced it), so that its group does not count a
	// deleted member.
	if gone, ok := s.get(old.ID); ok && gone.Phase == reconciler.Deleted {
		if _, err := s.syncer.removeInstances(ctx, []*reconciler.Instance{&gone}); err != nil {
			s.log.Warn("rebalance: remove the moved instance's record", "instance", old.ID, "err", err)
		}
	}
	s.setMove(k, func(mr *MoveRun) { mr.State = MoveDone })
	return s.saveRun(ctx)
}

// createCopy stores cp, a new copy of old, placed on node to of old's
// provider by the scheduler (every filter of placement applies), and
// starts its create: the path of an admission, for one instance of an
// existing request.
func (s rebalancer) createCopy(ctx context.Context, old, cp *reconciler.Instance, to string) error {
	if err := s.reserveNames([]*reconciler.Instance{cp}); err != nil {
		return err
	}
	stored := false
	defer func() {
		if !stored {
			s.unreserveNames([]*reconciler.Instance{cp})
		}
	}()
	// The old copy's request, without the nodes its launches failed on a
	// while ago (the plan chose the target), with those that refused it
	// for good.
	noExclude := *old
	noExclude.Exclude = nil
	r := s.placer.requestFor(&noExclude)
	r.ID, r.Count, r.Provider, r.Spec.Name = cp.ID, 1, old.Provider, cp.Name
	r.Constraints = append(slices.Clone(r.Constraints), scheduler.NodeIs(to))
	plan, err := s.cluster.c.Place(&r)
	if err != nil {
		return err
	}
	if len(plan.Placements) != 1 {
		why := "no room"
		if len(plan.Unplaced) > 0 {
			why = plan.Unplaced[0].Reasons.String()
		}
		return fmt.Errorf("%w: node %s no longer takes it: %s", driver.ErrInsufficientCapacity, to, why)
	}
	pl := plan.Placements[0]
	next, acts := s.m.Step(*cp, reconciler.Event{Kind: reconciler.Placed, Provider: pl.Provider, Node: pl.Node, Ports: pl.Ports}, s.now())
	*cp = next
	t := &txn{placed: true}
	t.put(0, cp)
	ok, _, err := s.commit(ctx, t)
	if err != nil || !ok {
		s.cluster.release(cp.ID)
		if err == nil {
			err = fmt.Errorf("%w: instance %s exists already", driver.ErrAlreadyExists, cp.ID)
		}
		return err
	}
	stored = true
	s.runner.perform(*cp, acts, nil)
	return nil
}

// pollEvery is how often a move looks at its copies.
const pollEvery = 20 * time.Millisecond

// waitRunning waits until instance id runs on provider/node; it fails as
// soon as the instance is anywhere else, in any other phase than on its
// way to running there, or after timeout.
func (s rebalancer) waitRunning(ctx context.Context, id, prov, node string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	t := time.NewTicker(pollEvery)
	defer t.Stop()
	for {
		in, ok := s.get(id)
		switch {
		case !ok:
			return errors.New("the new copy is gone")
		case in.Provider != prov || in.Node != node || !in.Phase.HoldsNode():
			return fmt.Errorf("the new copy did not start on %s (%s): %s", node, in.Phase, in.Message)
		case in.Phase == reconciler.Running:
			return nil
		case in.Phase != reconciler.Scheduled && in.Phase != reconciler.Creating:
			return fmt.Errorf("the new copy is %s: %s", in.Phase, in.Message)
		}
		select {
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return fmt.Errorf("the new copy did not run within %s", timeout)
			}
			return ctx.Err()
		case <-t.C:
		}
	}
}

// waitGone waits until instance id is deleted (or its record removed).
func (s rebalancer) waitGone(ctx context.Context, id string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	t := time.NewTicker(pollEvery)
	defer t.Stop()
	for {
		in, ok := s.get(id)
		if !ok || in.Phase == reconciler.Deleted {
			return nil
		}
		select {
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return fmt.Errorf("the old copy was not deleted within %s (%s: %s)", timeout, in.Phase, in.Message)
			}
			return ctx.Err()
		case <-t.C:
		}
	}
}

// settleRun settles a run a previous plane left under way (it was
// stopped or killed during an apply): a move whose new copy runs where
// planned is finished (its old copy deleted), a move whose new copy does
// not run yet is undone (the new copy deleted, the old one left as it
// is), no other move starts, and the run is marked abandoned. Every
// instance thus ends with exactly one copy.
func (s rebalancer) settleRun(ctx context.Context) {
	kv, err := s.st.Get(ctx, KeyRebalance)
	if err != nil {
		if !errors.Is(err, store.ErrNotFound) && ctx.Err() == nil {
			s.log.Warn("rebalance: read the last run", "err", err)
		}
		return
	}
	var run RebalanceRun
	if err := json.Unmarshal(kv.Value, &run); err != nil {
		s.log.Warn("rebalance: decode the last run", "err", err)
		return
	}
	s.reb.runMu.Lock()
	s.reb.run = &run
	s.reb.runMu.Unlock()
	if run.State != RunRunning {
		return
	}
	for k := range run.Moves {
		mr := run.Moves[k]
		switch mr.State {
		case MoveCreating:
			if in, ok := s.get(mr.New); ok && in.Phase == reconciler.Running && in.Node == mr.To && in.Provider == mr.Provider {
				if err := s.verbs.delete(ctx, mr.Instance); err != nil && !errors.Is(err, driver.ErrNotFound) {
					s.log.Warn("rebalance: finish a move", "instance", mr.Instance, "err", err)
				}
				s.setMove(k, func(m *MoveRun) { m.State = MoveDone })
				continue
			}
			if err := s.verbs.delete(ctx, mr.New); err != nil && !errors.Is(err, driver.ErrNotFound) {
				s.log.Warn("rebalance: undo a move", "instance", mr.New, "err", err)
			}
			s.setMove(k, func(m *MoveRun) { m.State, m.Error = MoveUndone, "the plane restarted before the new copy ran" })
		case MoveDeleting:
			if err := s.verbs.delete(ctx, mr.Instance); err != nil && !errors.Is(err, driver.ErrNotFound) {
				s.log.Warn("rebalance: finish a move", "instance", mr.Instance, "err", err)
			}
			s.setMove(k, func(m *MoveRun) { m.State = MoveDone })
		}
	}
	s.endRun(RunAbandoned, "the plane restarted during the run; the moves under way were settled and no other started")
	if err := s.saveRun(ctx); err != nil && ctx.Err() == nil {
		s.log.Warn("rebalance: record the abandoned run", "err", err)
	}
}

// For returns the run as a caller who sees the namespaces visible says
// yes to may see it: only the moves of those namespaces, and when a move
// of another namespace failed, an error that does not name its instance.
func (r *RebalanceRun) For(visible func(namespace string) bool) *RebalanceRun {
	cp := *r
	cp.Moves = []MoveRun{}
	for _, m := range r.Moves {
		if visible(m.Owner) {
			cp.Moves = append(cp.Moves, m)
		} else if m.Error != "" && cp.Error != "" {
			cp.Error = "a move of an instance of another namespace failed"
		}
	}
	return &cp
}
