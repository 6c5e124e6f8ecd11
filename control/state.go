package control

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/berth-dev/berth/auth"
	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/provider"
	"github.com/berth-dev/berth/reconciler"
	"github.com/berth-dev/berth/scheduler"
	"github.com/berth-dev/berth/store"
)

// Store keys. Every object is JSON under its prefix; the layout suits an
// etcd store as well as the embedded ones.
const (
	// PrefixInstances holds one Instance per id.
	PrefixInstances = "/berth/instances/"
	// PrefixRequests holds each accepted scheduler.Request with its owner,
	// used to place its instances again.
	PrefixRequests = "/berth/requests/"
	// PrefixGroups holds each accepted scheduler.Group.
	PrefixGroups = "/berth/groups/"
	// PrefixNodes holds the last recorded status of every node, as
	// /berth/nodes/<provider>/<node>.
	PrefixNodes = "/berth/nodes/"
)

// storedRequest is a request as kept under PrefixRequests.
type storedRequest struct {
	Request scheduler.Request `json:"request"`
	Owner   string            `json:"owner,omitempty"`
	Time    time.Time         `json:"time"`
	// spec is the spec its instances share in memory (the request's,
	// without its name); their records leave it out.
	spec *driver.Spec
}

// instanceSpec returns the spec r's instances share: r's own without its
// name.
func (r *storedRequest) instanceSpec() *driver.Spec {
	spec := r.Request.Spec
	spec.Name = ""
	return &spec
}

// stripes is the number of per-instance locks: every change of one instance
// (Step, transaction, scheduling its actions) happens under its stripe, so
// the actions of successive transitions are issued in order.
const stripes = 256

// state is the control plane, split by concern into the parts below, each
// with its own lock or none.
//
// Lock order. A goroutine may hold several of these locks only in this
// order, top first:
//
//  1. the instance stripes (locks), several only in index order
//     (applyBatch);
//  2. gangMu (gangs);
//  3. mu (records);
//  4. the scheduler cluster's own lock (inside scheduler.Cluster, taken by
//     its methods);
//
// rtMu, the runtime's mu, usageMu (meter) and victims.mu are leaves:
// nothing else is taken while one is held. The placer's schedulers (Config.Schedulers)
// hold none of these between placements: each plans on a snapshot it alone
// uses. The store is called with no lock of this list held but the
// stripes of the instances being changed.
type state struct {
	cfg       Config
	st        store.Store // written by commit only
	log       *slog.Logger
	now       func() time.Time
	m         reconciler.Machine
	provs     map[string]*provider.Provider
	provNames []string
	// cluster is the scheduler's ledger: every node's reading and every
	// instance's reservation. Placement asks it; commit keeps it in step
	// with the records.
	cluster *cluster
	locks   [stripes]sync.Mutex

	records
	gangs
	runtimeRef

	lists listings // shared listings of tagged resources, per provider

	// reb is the rebalance run (rebalance_apply.go).
	reb rebalancing

	// meter is the usage loop's samples and node sums, in memory only.
	meter meter
	// victims are evicted instances whose room their evictors wait for.
	victims victims
	// follow is a read-only plane's progress along the store's changes.
	follow follower
	// graces are the graces of stops the reconciler carries out
	// (Plane.StopLater), by instance id, until it does.
	graces sync.Map

	// The plane's parts by concern (doc.go): each is a view of the state
	// with the methods of its concern.
	admitter   admitter
	placer     placer
	runner     runner
	syncer     syncer
	verbs      verbs
	measurer   measurer
	rebalancer rebalancer

	// clusterID is written on every back-end resource (driver.TagCluster);
	// set once by loadIdentity.
	clusterID string
	// placeKick wakes the placer.
	placeKick chan struct{}
	// placeNow asks the placer for one round; it closes the channel it
	// receives when that round is over.
	placeNow chan chan struct{}
}

// gangs is the queue of groups placed all or none; gangMu guards it.
type gangs struct {
	gangMu sync.Mutex
	gang   gang
}

// runtimeRef is the running reconciler, if any; rtMu guards both fields.
type runtimeRef struct {
	rtMu sync.Mutex
	rt   *runtime // set while Run runs
	// running is set while Run runs, to refuse a second Run.
	running bool
}

func (s *state) lockOf(id string) *sync.Mutex { return &s.locks[s.stripeOf(id)] }

func (s *state) stripeOf(id string) int {
	h := fnv.New32a()
	h.Write([]byte(id))
	return int(h.Sum32() % stripes)
}

func newState(ctx context.Context, cfg Config) (*state, error) {
	provs, err := checkConfig(&cfg)
	if err != nil {
		return nil, err
	}
	cfg.setDefaults()
	s := &state{
		cfg:   cfg,
		st:    cfg.Store,
		log:   cfg.Logger,
		now:   cfg.Now,
		m:     reconciler.Machine{LaunchTimeout: cfg.LaunchTimeout, MaxAttempts: cfg.MaxAttempts, Backoff: cfg.RetryBackoff, ExcludeFor: cfg.ExcludeFor},
		provs: provs,
		records: records{
			recs:     newRecIndex(),
			requests: map[string]*storedRequest{},
			names:    map[nameKey]string{},
			nameNS:   map[string]int{},
			phases:   map[reconciler.Phase]int{},
			pending:  map[string]bool{},
			aside:    map[string]bool{},
			nodeInfo: map[string]driver.Node{},
			largest:  map[string]driver.Resources{},
		},
		placeKick: make(chan struct{}, 1),
		placeNow:  make(chan chan struct{}),
	}
	s.admitter, s.placer, s.runner, s.syncer = admitter{s}, placer{s}, runner{s}, syncer{s}
	s.verbs, s.measurer, s.rebalancer = verbs{s}, measurer{s}, rebalancer{s}
	for n := range provs {
		s.provNames = append(s.provNames, n)
	}
	slices.Sort(s.provNames)
	s.lists = s.syncer.newListings()
	s.meter.rings, s.meter.nodes = map[string]*ring{}, map[string]NodeUsage{}
	s.meter.nodeHours, s.meter.measured = map[string]*hour{}, make(chan struct{})
	s.gang.init(cfg.QueuePolicy, cfg.Pools)
	s.cluster = newCluster(s)
	if err := s.load(ctx); err != nil {
		return nil, err
	}
	if err := s.loadGroups(ctx); err != nil {
		return nil, err
	}
	if err := s.loadIdentity(ctx); err != nil {
		return nil, err
	}
	if cfg.ReadOnly {
		// Nothing is written and no provider is called: the nodes are
		// the leader's to read.
		return s, nil
	}
	if err := s.dropOrphans(ctx); err != nil {
		return nil, err
	}
	s.placer.refreshNodes(ctx)
	return s, nil
}

// checkConfig checks cfg and returns its providers by name.
func checkConfig(cfg *Config) (map[string]*provider.Provider, error) {
	var es driver.FieldErrors
	if cfg.Store == nil {
		es = append(es, &driver.FieldError{Path: "store", Reason: "required"})
	}
	if len(cfg.Providers) == 0 {
		es = append(es, &driver.FieldError{Path: "providers", Reason: "at least one provider is required"})
	}
	provs := map[string]*provider.Provider{}
	for i, p := range cfg.Providers {
		if p == nil {
			es = append(es, &driver.FieldError{Path: fmt.Sprintf("providers[%d]", i), Reason: "nil provider"})
			continue
		}
		if _, dup := provs[p.Name()]; dup {
			es = append(es, &driver.FieldError{Path: fmt.Sprintf("providers[%d]", i), Reason: fmt.Sprintf("provider name %q used twice", p.Name())})
		}
		provs[p.Name()] = p
	}
	es = append(es, CheckPools(cfg.Pools, cfg.Quotas, func(name string) bool { _, ok := provs[name]; return ok })...)
	es = append(es, CheckRunAs(cfg.RunAs)...)
	var fe *driver.FieldError
	if err := cfg.QueuePolicy.Check("queue_policy"); errors.As(err, &fe) {
		es = append(es, fe)
	}
	rangeCounts.Check(&es, "max_attempts", int64(cfg.MaxAttempts))
	if cfg.Schedulers < 0 || cfg.Schedulers > MaxSchedulers {
		es = append(es, &driver.FieldError{Path: "schedulers", Reason: fmt.Sprintf("%d: want 1 to %d, or 0 for the default (1)", cfg.Schedulers, MaxSchedulers)})
	}
	for _, name := range slices.Sorted(maps.Keys(cfg.Overcommit)) {
		path := "overcommit[" + name + "]"
		if _, ok := provs[name]; !ok {
			es = append(es, &driver.FieldError{Path: path, Reason: fmt.Sprintf("no provider named %q", name)})
		}
		o := cfg.Overcommit[name]
		es = append(es, o.Check(path)...)
	}
	if err := es.Err(); err != nil {
		return nil, fmt.Errorf("control: %w", err)
	}
	return provs, nil
}

// setDefaults gives the settings cfg leaves at zero their defaults.
func (cfg *Config) setDefaults() {
	if cfg.Schedulers == 0 {
		cfg.Schedulers = 1
	}
	if cfg.Cluster == "" {
		cfg.Cluster = "berth"
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.LeakSightings <= 0 {
		cfg.LeakSightings = 2
	}
	if cfg.SyncInterval <= 0 {
		cfg.SyncInterval = 2 * time.Second
	}
	if cfg.Workers <= 0 {
		cfg.Workers = 4
	}
	if cfg.Writers <= 0 {
		cfg.Writers = 2
	}
	if cfg.Retention <= 0 {
		cfg.Retention = time.Hour
	}
	if cfg.MaxRetained <= 0 {
		cfg.MaxRetained = 10000
	}
	if cfg.UsageInterval <= 0 {
		cfg.UsageInterval = 10 * time.Second
	}
}

// dropOrphans removes the requests without instances that load found,
// or moves them aside when instance records were moved aside (one of
// them may hold such a record's spec).
func (s *state) dropOrphans(ctx context.Context) error {
	orphans := s.orphanRequests()
	if len(orphans) == 0 {
		return nil
	}
	if len(s.aside) == 0 {
		if _, _, err := s.commit(ctx, &txn{dropReqs: orphans}); err != nil {
			return fmt.Errorf("control: remove requests without instances: %w", err)
		}
		return nil
	}
	for _, id := range orphans {
		kv, err := s.st.Get(ctx, PrefixRequests+id)
		if err != nil {
			return fmt.Errorf("control: read request %s: %w", id, err)
		}
		if err := s.moveAside(ctx, kv, errors.New("request without instances, kept as instance records were moved aside")); err != nil {
			return err
		}
		s.applyStored([]change{{id: id, request: true}})
	}
	return nil
}

func appendPrefixed(es driver.FieldErrors, prefix string, err error) driver.FieldErrors {
	var fes driver.FieldErrors
	var fe *driver.FieldError
	switch {
	case errors.As(err, &fes):
		for _, e := range fes {
			es = append(es, &driver.FieldError{Path: prefix + e.Path, Reason: e.Reason})
		}
	case errors.As(err, &fe):
		es = append(es, &driver.FieldError{Path: prefix + fe.Path, Reason: fe.Reason})
	default:
		es = append(es, &driver.FieldError{Path: strings.TrimSuffix(prefix, "."), Reason: err.Error()})
	}
	return es
}

// loadChunk is how many records load applies at once.
const loadChunk = 1 << 16

// load reads every request and instance from the store into memory and
// the ledger, through applyStored.
func (s *state) load(ctx context.Context) error {
	kvs, _, err := s.st.List(ctx, PrefixRequests)
	if err != nil {
		return fmt.Errorf("control: load requests: %w", err)
	}
	// A record that cannot be read is moved aside (moveAside): the plane
	// starts with the rest.
	for _, kv := range kvs {
		r, err := decodeRequest(kv)
		if err != nil {
			if err := s.moveAside(ctx, kv, err); err != nil {
				return err
			}
			continue
		}
		s.applyStored([]change{{id: strings.TrimPrefix(kv.Key, PrefixRequests), request: true, req: r, rev: kv.ModRevision}})
	}
	kvs, rev, err := s.st.List(ctx, PrefixInstances)
	if err != nil {
		return fmt.Errorf("control: load instances: %w", err)
	}
	// No other goroutine runs yet: the requests are read without the lock.
	spec := func(id string) *driver.Spec {
		if r := s.requests[id]; r != nil {
			return r.spec
		}
		return nil
	}
	// Applied in chunks, as the watch would hand them over: memory and
	// the ledger take them through the one apply function.
	cs := make([]change, 0, min(len(kvs), loadChunk))
	for _, kv := range kvs {
		in, err := decodeRecord(kv, spec)
		if err != nil {
			if err := s.moveAside(ctx, kv, err); err != nil {
				return err
			}
			s.aside[strings.TrimPrefix(kv.Key, PrefixInstances)] = true
			continue
		}
		if cs = append(cs, change{id: in.ID, in: in, rev: kv.ModRevision}); len(cs) == loadChunk {
			s.applyStored(cs)
			cs = cs[:0]
		}
	}
	s.applyStored(cs)
	s.loadRev = rev
	kvs, _, err = s.st.List(ctx, quarantineKey(PrefixInstances))
	if err != nil {
		return fmt.Errorf("control: load quarantine: %w", err)
	}
	for _, kv := range kvs {
		s.aside[strings.TrimPrefix(kv.Key, quarantineKey(PrefixInstances))] = true
	}
	return nil
}

// nameKey is an instance's name within its namespace (its owner): names
// are per namespace, as Kubernetes' are, and two namespaces may each have
// an instance of the same name.
type nameKey struct{ owner, name string }

// holdsName reports whether an instance in phase (with After after) keeps
// its name from new instances: every instance does until it is deleted or
// being deleted for good (Docker's rm frees the name). A replacement that
// reuses the name while the old back-end resource is still being removed
// gets the next incarnation's back-end name if the back-end still holds
// the old one.
func holdsName(phase, after reconciler.Phase) bool {
	switch phase {
	case reconciler.Deleted:
		return false
	case reconciler.Deleting:
		return after != reconciler.Deleted
	}
	return true
}

// reload refreshes the cached instance id from the store.
func (s *state) reload(ctx context.Context, id string) error {
	kv, err := s.st.Get(ctx, PrefixInstances+id)
	if errors.Is(err, store.ErrNotFound) {
		// Gone at some revision after the one memory holds.
		s.mu.RLock()
		var rev int64
		if old := s.recs.get(id); old != nil {
			rev = old.Revision + 1
		}
		s.mu.RUnlock()
		if rev > 0 {
			s.applyStored([]change{{id: id, rev: rev}})
		}
		return driver.Errorf(driver.ErrNotFound, "instance %s", id)
	}
	if err != nil {
		return err
	}
	in, err := decodeRecord(kv, s.requestSpec)
	if err != nil {
		return err
	}
	s.applyStored([]change{{id: id, in: in, rev: kv.ModRevision}})
	return nil
}

// apply feeds ev to the instance id, stores the result with a transaction
// that compares the revision (re-reading and stepping again on a conflict)
// and then performs the actions. Actions listed in direct are not performed
// but returned, for callers that perform them themselves.
func (s *state) apply(ctx context.Context, id string, ev reconciler.Event, direct ...reconciler.ActionKind) (reconciler.Instance, []reconciler.Action, error) {
	mu := s.lockOf(id)
	mu.Lock()
	defer mu.Unlock()
	for range 100 {
		cur, ok := s.get(id)
		if !ok {
			return reconciler.Instance{}, nil, driver.Errorf(driver.ErrNotFound, "instance %s", id)
		}
		next, acts := s.m.Step(cur, ev, s.now())
		if !reconciler.Changed(cur, next) {
			// Nothing to store.
			return cur, s.runner.perform(next, acts, direct), nil
		}
		ok, _, err := s.commit(ctx, &txn{puts: []instPut{{base: cur.Revision, in: &next}}, placed: ev.Kind == reconciler.Placed})
		if err != nil {
			return cur, nil, fmt.Errorf("control: instance %s: %w", id, err)
		}
		if !ok {
			if err := s.reload(ctx, id); err != nil {
				return cur, nil, err
			}
			continue
		}
		return next, s.runner.perform(next, acts, direct), nil
	}
	return reconciler.Instance{}, nil, fmt.Errorf("control: instance %s: too many conflicting writes", id)
}

// batchResult is what applyBatch makes of one instance's outcomes.
type batchResult struct {
	base    int64 // the revision read
	changed bool  // some step changed the instance
	in      reconciler.Instance
	acts    []reconciler.Action
}

// batchScratch is the memory applyBatch reuses from one batch to the next:
// a writer's own, so that a batch allocates nothing per instance.
type batchScratch struct {
	results []batchResult
	index   map[string]int // into results, by instance id
}

// applyBatch applies the outcomes like apply, storing all the changes in
// one transaction. Should a comparison fail (someone else changed one of
// the instances) each outcome is applied on its own instead. scratch is
// the caller's, left for its next batch.
func (s *state) applyBatch(ctx context.Context, batch []outcome, scratch *batchScratch) {
	if len(batch) == 1 {
		s.applyOne(ctx, batch[0])
		return
	}
	// Lock the stripes of every instance, in order, so that no other change
	// interleaves.
	var held [stripes]bool
	for _, o := range batch {
		held[s.stripeOf(o.id)] = true
	}
	for i := range held {
		if held[i] {
			s.locks[i].Lock()
		}
	}
	unlock := func() {
		for i := range held {
			if held[i] {
				s.locks[i].Unlock()
			}
		}
	}
	if scratch.index == nil {
		scratch.index = make(map[string]int, maxBatch)
	}
	results := scratch.results[:0]
	defer func() {
		// Nothing outlives the batch: what the results point to is let go.
		clear(results)
		scratch.results = results[:0]
		clear(scratch.index)
	}()
	for _, o := range batch {
		k, ok := scratch.index[o.id]
		if !ok {
			cur, found := s.get(o.id)
			if !found {
				continue
			}
			k = len(results)
			scratch.index[o.id] = k
			results = append(results, batchResult{base: cur.Revision, in: cur})
		}
		r := &results[k]
		next, acts := s.m.Step(r.in, o.ev, s.now())
		r.changed = r.changed || reconciler.Changed(r.in, next)
		r.in = next
		r.acts = append(r.acts, acts...)
	}
	// One transaction and one critical section for the whole batch:
	// submissions wait for the cache lock once per batch, not once per
	// instance.
	t := &txn{}
	for k := range results {
		r := &results[k]
		if r.changed {
			t.put(r.base, &r.in)
		}
	}
	if ok, _, err := s.commit(ctx, t); err != nil || !ok {
		unlock()
		if err != nil && ctx.Err() != nil {
			return
		}
		for _, o := range batch {
			s.applyOne(ctx, o)
		}
		return
	}
	for k := range results {
		s.runner.perform(results[k].in, results[k].acts, nil)
	}
	unlock()
}

func (s *state) applyOne(ctx context.Context, o outcome) {
	if _, _, err := s.apply(ctx, o.id, o.ev); err != nil && ctx.Err() == nil && !errors.Is(err, driver.ErrNotFound) {
		s.log.Warn("apply", "instance", o.id, "event", o.ev.Kind, "err", err)
	}
}

// newID returns a fresh random id.
func newID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// Scope is the namespaces a lookup searches, and the only ones whose
// instances it finds: Namespaces, or every namespace (the cluster's own
// pool instances included) when All. An instance outside it is not found,
// exactly as one that does not exist.
type Scope struct {
	All        bool
	Namespaces []string
}

// Everywhere is the scope of every namespace.
var Everywhere = Scope{All: true}

// ScopeOf is the scope of what id sees (auth.Identity.Sees).
func ScopeOf(id auth.Identity) Scope {
	return Scope{All: id.All(), Namespaces: id.Namespaces}
}

// Has reports whether namespace is in sc.
func (sc Scope) Has(namespace string) bool {
	return sc.All || namespace != "" && slices.Contains(sc.Namespaces, namespace)
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
