package control

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"time"

	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/provider"
	"github.com/berth-dev/berth/reconciler"
	"github.com/berth-dev/berth/scheduler"
	"github.com/berth-dev/berth/store"
)

// Config configures a Plane. Store and at least one provider are required;
// zero knobs take the defaults documented on each field.
type Config struct {
	Store     store.Store
	Providers []*provider.Provider
	// Cluster is this installation's id, written on every back-end resource
	// as driver.TagCluster. Leak cleanup only ever touches resources carrying
	// it. Default "berth".
	Cluster string
	// Pools are Nodepool pools: labels mapped to specs, with warm instances.
	Pools []Pool
	// Quotas limit instances, cpus and memory per provider, pool or owner.
	Quotas []Quota
	// RunAs are the namespaces' policies of who their workloads may run
	// as; a namespace without one runs non-root workloads only. They bind
	// the callers that are not admins (see Submit).
	RunAs []RunAs
	// Logger receives the plane's logs; nil means slog.Default().
	Logger *slog.Logger
	// Metrics receives measurements; nil means none.
	Metrics Metrics
	// Now is the clock; nil means time.Now.
	Now func() time.Time

	// LaunchTimeout bounds one create attempt; default 5m.
	LaunchTimeout time.Duration
	// MaxAttempts is how many failed create attempts an instance gets before
	// it is failed; quota refusals are not counted, nor is a retryable
	// refusal by a node the instance does not avoid yet (the node is
	// avoided for ExcludeFor instead). Default 3.
	MaxAttempts int
	// RetryBackoff is the first wait before a requeued instance is placed
	// again; it doubles per attempt up to a minute. Default 1s.
	RetryBackoff time.Duration
	// LeakSightings is how many consecutive listings must show an unknown
	// tagged resource before it is deleted. Default 2.
	LeakSightings int
	// SyncInterval is how often each provider is listed and its state read
	// (observed states, node changes, leaks). A round that takes longer
	// than a quarter of it is followed by a pause four times its length
	// instead. Default 2s.
	SyncInterval time.Duration
	// Workers is how many goroutines drive create and delete operations.
	// Default 4.
	Workers int
	// QueuePolicy orders the groups waiting to be placed whole within a
	// priority class: fifo (default), size or dynsize (Zoe).
	QueuePolicy scheduler.Policy
	// Schedulers is how many schedulers share a placement round of the
	// pending instances, each planning on its own snapshot of the
	// scheduler's ledger and committing optimistically: the ledger
	// re-checks every placement and refuses one whose room another
	// scheduler took first (a conflict, planned again). One (the default)
	// places through the ledger under its lock, where no conflict can
	// happen. At most MaxSchedulers.
	Schedulers int
	// Writers is how many goroutines store the outcomes of operations,
	// each committing up to 512 in one transaction. Default 2.
	Writers int
	// ExcludeFor is how long a node that went offline under an instance,
	// refused its create with a retryable error or lacked capacity for it,
	// is avoided when the instance is placed again; an avoided node is
	// still used when no other fits. Default 10m.
	ExcludeFor time.Duration
	// Retention is how long a deleted instance stays visible (Filter.All,
	// inspect by name) before its record is removed from the store; a
	// request's and a group's records go with their last instance.
	// Failed instances are kept until they are deleted. Default 1h.
	Retention time.Duration
	// MaxRetained caps the deleted instances kept for Retention: beyond
	// it the oldest are removed first. Default 10000.
	MaxRetained int
	// UsageInterval is how often the instances of every provider that can
	// measure them (driver.UsageReporter) are measured: the samples are
	// kept in memory (Plane.UsageHistory) and each node's sum goes to the
	// scheduler. Default 10s.
	UsageInterval time.Duration
	// Overcommit is the overcommit policy of each provider, by name; a
	// provider not named keeps the default (admission by reservations).
	Overcommit map[string]scheduler.Overcommit
	// Rebalance, when its Every is set, has the plane rebalance by itself
	// (AutoRebalance); off by default.
	Rebalance AutoRebalance
	// ReadOnly makes a plane that only reads, for a server that does not
	// lead: New loads the state and writes nothing (the cluster's id must
	// be stored already to be known) nor calls a provider, and Run
	// follows the store's changes of instances and requests without
	// acting on them. Every method that would change state or reach a
	// back-end (submissions, plans, operations on instances, nodes,
	// providers, images) returns ErrReadOnly; the reads of the records
	// (Instances, Instance, Counts, Group, Events, Quotas) answer from the
	// copy, as of Followed. Logs and Usage read an instance's back-end
	// resource when its provider is a shared back-end (ReadsBackend), and
	// return ErrReadOnly otherwise.
	ReadOnly bool
}

// MaxSchedulers bounds Config.Schedulers.
const MaxSchedulers = 64

// Metrics receives the plane's measurements. Implementations must be safe
// for concurrent use and must not block.
type Metrics interface {
	// Scheduled records how long one placement decision took.
	Scheduled(d time.Duration, placed bool)
	// QueueDepth reports how many instances wait for placement.
	QueueDepth(n int)
	// Launched records the end of one create attempt on a provider; err is
	// nil on success.
	Launched(provider string, err error)
	// QuotaUse reports the use of one quota.
	QuotaUse(q QuotaUse)
	// LeakFound records one leaked resource deleted from a provider.
	LeakFound(provider string)
	// Conflicts records n placements the scheduler's ledger refused
	// because another scheduler had taken the room first
	// (Config.Schedulers); they are planned again.
	Conflicts(n int)
}

// Pool is a Nodepool pool: named labels, each a spec kept warm on one
// provider. Ready instances of a label are handed out to node-set requests
// that ask for that label.
type Pool struct {
	Name     string  `json:"name" yaml:"name"`
	Provider string  `json:"provider" yaml:"provider"`
	Labels   []Label `json:"labels" yaml:"labels"`
	// MaxInstances caps the pool's instances in every phase that holds a
	// back-end resource; 0 means no cap.
	MaxInstances int `json:"max_instances,omitempty" yaml:"max_instances"`
	// QueuePolicy, when set, orders the groups of this pool (those all of
	// whose services belong to it: node sets naming it) that wait to be
	// placed whole, in a queue of their own; empty leaves them in the
	// server's queue (Config.QueuePolicy). A pass over the queues takes
	// the highest priority class first across all of them.
	QueuePolicy scheduler.Policy `json:"queue_policy,omitempty" yaml:"queue_policy"`
}

// Label is one kind of instance a pool provides.
type Label struct {
	Name string      `json:"name" yaml:"name"`
	Spec driver.Spec `json:"spec" yaml:"spec"`
	// MinReady is how many unassigned running instances the pool keeps.
	MinReady int `json:"min_ready,omitempty" yaml:"min_ready"`
	// Max caps this label's instances; 0 means no cap.
	Max int `json:"max,omitempty" yaml:"max"`
}

// Quota limits what a scope may hold at once (scheduler.Quota): the
// scheduler keeps to it as a filter.
type Quota = scheduler.Quota

// QuotaUse is a quota with what its scope holds now.
type QuotaUse = scheduler.QuotaUse

// Instance is one instance as the plane answers it (and the API with it):
// what was asked, where it was placed, its lifecycle phase and what the
// back-end last reported. It is a copy made when answering (viewOf); the
// plane's own forms are the reconciler.Instance the lifecycle steps, the
// record it stores and the rec it keeps in memory.
type Instance struct {
	ID       string `json:"id"`
	Name     string `json:"name,omitempty"`
	Provider string `json:"provider,omitempty"`
	Node     string `json:"node,omitempty"`
	// Spec is what the instance runs; the caller's own copy, never nil
	// for an instance that is stored.
	Spec  *driver.Spec `json:"spec"`
	Phase Phase        `json:"phase"`
	// HostPorts are the host ports the scheduler chose for the spec's
	// published "any port" ports, in order.
	HostPorts []int `json:"host_ports,omitempty"`
	// BackendID is the back-end's id of the resource; empty until the
	// back-end reports it.
	BackendID string `json:"backend_id,omitempty"`
	// Observed is what the back-end showed of the instance when last seen.
	Observed *Seen  `json:"observed,omitempty"`
	Owner    string `json:"owner,omitempty"`
	Pool     string `json:"pool,omitempty"`
	Label    string `json:"label,omitempty"`
	Group    string `json:"group,omitempty"`
	// Request is the id of the request the instance came from.
	Request  string `json:"request,omitempty"`
	Priority int    `json:"priority,omitempty"`
	// Attempts counts failed create attempts (quota refusals and creates
	// the provider refused without trying them excluded).
	Attempts int `json:"attempts"`
	// Incarnation counts the times the instance was placed again after its
	// node or its back-end lost it; each copy has a back-end name of its
	// own.
	Incarnation int `json:"incarnation,omitempty"`
	// Message says why the instance is pending, failed, or what last went
	// wrong.
	Message string `json:"message,omitempty"`
	// Want is what a user asked that the instance's phase cannot take
	// yet: stopped or suspended (asked before it was created: done once
	// it is), running (a start while it stops: done once it stopped).
	Want Phase `json:"want,omitempty"`
	// Exclude lists the nodes ("provider/node") the instance is not placed
	// on again until ExcludeUntil: nodes that went offline under it,
	// refused a create with a retryable error or lacked capacity.
	Exclude      []string  `json:"exclude,omitempty"`
	ExcludeUntil time.Time `json:"exclude_until,omitzero"`
	// Refused lists the nodes that refused the instance for good, each
	// with its reason ("provider/node: reason"); it is never placed on
	// them again.
	Refused []string `json:"refused,omitempty"`
	// Stale are older copies of the instance on nodes that went offline,
	// deleted as soon as their node answers.
	Stale []Ref `json:"stale,omitempty"`
	// Deadline is the launch deadline while creating, the hold's expiry
	// while held, and the earliest next attempt while pending or deleting.
	Deadline time.Time `json:"deadline,omitzero"`
	Created  time.Time `json:"created"`
	Updated  time.Time `json:"updated"`
	// Revision is the store revision of the instance as answered: Events
	// since it shows the changes that follow.
	Revision int64 `json:"revision"`
}

// viewOf is in as the plane answers it, with a copy of its spec (which the
// plane shares between the instances of a request): what a caller does
// with an instance it was given never reaches the plane. It is the one
// conversion to Instance, made when answering.
func viewOf(in *reconciler.Instance) Instance {
	v := Instance{
		ID: in.ID, Name: in.Name, Provider: in.Provider, Node: in.Node, Spec: in.Spec, Phase: in.Phase,
		HostPorts: in.HostPorts, BackendID: in.BackendID, Observed: in.Observed, Owner: in.Owner, Pool: in.Pool,
		Label: in.Label, Group: in.Group, Request: in.Request, Priority: in.Priority, Attempts: in.Attempts,
		Incarnation: in.Incarnation, Message: in.Message, Want: in.Want, Exclude: in.Exclude, ExcludeUntil: in.ExcludeUntil,
		Refused: in.Refused, Stale: in.Stale, Deadline: in.Deadline, Created: in.Created, Updated: in.Updated,
		Revision: in.Revision,
	}
	if in.Spec != nil {
		spec := *in.Spec
		v.Spec = &spec
	}
	return v
}

// Phase is an instance's lifecycle phase.
type Phase = reconciler.Phase

// Seen is what a back-end showed of an instance.
type Seen = reconciler.Seen

// Ref names one back-end resource: a stale copy of an instance.
type Ref = reconciler.Ref

// NodeRef is the node an answer names: id (provider/node), address and total
// capacity (Citadel's answer).
type NodeRef struct {
	ID       string          `json:"id"`
	Provider string          `json:"provider"`
	Name     string          `json:"name"`
	Address  string          `json:"address,omitempty"`
	CPUs     driver.MilliCPU `json:"cpus"`
	Memory   driver.Bytes    `json:"memory"`
}

// Placed is one instance of an answer with the node it was given; Node is
// nil while the instance is pending.
type Placed struct {
	Instance Instance `json:"instance"`
	Node     *NodeRef `json:"node,omitempty"`
}

// Answer is Citadel's answer to a request: every instance accepted, with its
// node when it was placed at once. Pending instances stay queued and carry
// the reason in their Message.
type Answer struct {
	Request   string   `json:"request"`
	Instances []Placed `json:"instances"`
}

// GroupAnswer answers a group submission.
type GroupAnswer struct {
	Group     string   `json:"group"`
	Instances []Placed `json:"instances"`
}

// PlanAnswer is a dry run: where each instance would go, and for what could
// not be placed, why not.
type PlanAnswer struct {
	Placements []PlanPlacement `json:"placements"`
	Unplaced   int             `json:"unplaced"`
	// Reasons summarises why nodes were rejected ("12 nodes: not enough
	// memory").
	Reasons []string `json:"reasons,omitempty"`
}

// PlanPlacement is one instance of a dry run and its node.
type PlanPlacement struct {
	Instance string  `json:"instance"`
	Node     NodeRef `json:"node"`
}

// Filter selects instances; empty fields match everything.
type Filter struct {
	Provider string `json:"provider,omitempty"`
	Node     string `json:"node,omitempty"`
	Owner    string `json:"owner,omitempty"`
	// Owners keeps only the instances of these owners (namespaces), when
	// not empty.
	Owners  []string `json:"owners,omitempty"`
	Pool    string   `json:"pool,omitempty"`
	Group   string   `json:"group,omitempty"`
	Request string   `json:"request,omitempty"`
	Name    string   `json:"name,omitempty"`
	Phases  []Phase  `json:"phases,omitempty"`
	// All includes deleted instances, which are hidden otherwise.
	All bool `json:"all,omitempty"`
	// Limit caps how many instances are returned (the ones with the
	// smallest ids); 0 means no limit, a negative value is invalid.
	Limit int `json:"limit,omitempty"`
	// After keeps only the instances whose id sorts after it: pass the
	// last id of one page to get the next.
	After string `json:"after,omitempty"`
}

// EventKind says what an Event is about.
type EventKind string

// Event kinds.
const (
	EventInstance EventKind = "instance"
	EventNode     EventKind = "node"
)

// Event is one change of Berth's state, read from the store. Revision orders
// events; pass the last one seen to Events to resume after it.
type Event struct {
	Revision int64      `json:"revision"`
	Kind     EventKind  `json:"kind"`
	Deleted  bool       `json:"deleted,omitempty"`
	Instance *Instance  `json:"instance,omitempty"`
	Node     *NodeState `json:"node,omitempty"`
}

// NodeState is the last status Berth recorded for a node.
type NodeState struct {
	Provider string            `json:"provider"`
	Name     string            `json:"name"`
	Status   driver.NodeStatus `json:"status"`
	Reason   string            `json:"reason,omitempty"`
	Since    time.Time         `json:"since"`
}

// NodeView is one node as its provider reports it, with what Berth has
// reserved there.
type NodeView struct {
	Provider string `json:"provider"`
	driver.Node
	// Berth is the sum of the resources of Berth's instances placed on the
	// node, and Count their number.
	Berth      driver.Resources `json:"berth_reserved"`
	BerthCount int              `json:"berth_instances"`
	// Measured is what Berth's instances on the node were last measured
	// using; nil until the usage loop has measured the node.
	Measured *NodeUsage `json:"measured,omitempty"`
	// Overcommit names the policy that admits instances on the node:
	// "reservations", or "usage, ratio R, headroom H"
	// (scheduler.Overcommit).
	Overcommit string `json:"overcommit"`
}

// ProviderView describes one provider.
type ProviderView struct {
	Name         string   `json:"name"`
	Driver       string   `json:"driver"`
	Capabilities []string `json:"capabilities"`
	// Features are the kinds and features the provider runs
	// (driver.Features): placement sends it only specs needing no other.
	Features []string        `json:"features"`
	Health   provider.Health `json:"health"`
	Nodes    int             `json:"nodes"`
	Error    string          `json:"error,omitempty"`
}

// Plane is the control plane. Its methods are safe for concurrent use; Run
// drives the reconciler.
type Plane struct {
	*state
}

// New checks cfg, loads the store's instances and returns a Plane. It starts
// no goroutine; call Run.
func New(ctx context.Context, cfg Config) (*Plane, error) {
	s, err := newState(ctx, cfg)
	if err != nil {
		return nil, err
	}
	return &Plane{s}, nil
}

// Run drives the reconciler until ctx ends: it launches and deletes
// instances, retries pending ones, watches the providers' nodes, adopts what
// already exists and deletes leaks. A read-only plane (Config.ReadOnly)
// only follows the store's changes. It returns ctx's error after every
// goroutine it started has ended.
func (p *Plane) Run(ctx context.Context) error { return p.runner.run(ctx) }

// PlaceRound has the placer try every pending instance that is due once,
// in a round that starts after PlaceRound is called, and returns when that
// round is over. It needs Run: without it, it waits until ctx ends.
func (p *Plane) PlaceRound(ctx context.Context) error {
	if err := p.refuse(); err != nil {
		return err
	}
	done := make(chan struct{})
	select {
	case p.placeNow <- done:
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Submit validates req, places its instances and commits the placements and
// their intent (id, provider, node; the back-end tags follow from them) to
// the store in one transaction, then returns Citadel's answer. Placed
// instances are answered as creating — their create starts once they are
// stored — or as scheduled when Run is not running. Instances that cannot
// be placed now are accepted as pending, with the reason in their Message,
// and are placed when capacity frees up. A request that could never fit a
// quota is refused with driver.ErrQuotaExceeded naming the quota; one whose
// instances ask for more of a resource than any known node of the eligible
// providers has in total with driver.ErrInsufficientCapacity naming the
// resource (a provider that has listed no node yet refuses nothing); bad
// input with driver.FieldErrors (matching driver.ErrInvalid) naming the
// field; an id in use, or a name held by an instance that is not deleted,
// with driver.ErrAlreadyExists.
//
// A request without an id gets a fresh one. Ids are never reused: a
// request id given by the client is refused while any record of that
// request is kept (see Config.Retention). Names are per namespace (owner)
// and reusable once their holder is deleted or being deleted.
//
// A submission may not set Berth's own labels, tags ("berth.") or
// variables ("BERTH_"): a *driver.FieldError naming the field. When ctx
// carries a caller (auth.NewContext) that is not an admin, its user and
// group must be allowed by the namespace's run-as policy (Config.RunAs):
// auth.ErrForbidden with a *driver.FieldError naming the field.
func (p *Plane) Submit(ctx context.Context, req scheduler.Request, owner string) (*Answer, error) {
	if err := p.refuse(); err != nil {
		return nil, err
	}
	return p.admitter.submit(ctx, req, owner)
}

// CheckSubmitter answers what Submit would of spec by the caller ctx
// carries in namespace owner: Berth's own fields and the run-as policy. A
// surface that takes a spec long before it submits it (the Docker
// endpoint's create) refuses it at once with it.
func (p *Plane) CheckSubmitter(ctx context.Context, spec *driver.Spec, owner string) error {
	return p.admitter.checkSubmitted(ctx, spec, owner, "")
}

// SubmitGroup places a group: its essential instances all or none. A node
// set first reuses ready pool instances of its labels. A group whose
// essential instances do not fit now waits, whole, in the gang queue
// (Config.QueuePolicy, priority classes, backfill) and is placed all at
// once when it fits. A group whose essential instances together could never
// fit a quota of owner is refused with driver.ErrQuotaExceeded naming the
// quota. Members whose node goes offline are placed again, restart policy
// or not; Group tells whether the group is degraded meanwhile.
func (p *Plane) SubmitGroup(ctx context.Context, g scheduler.Group, owner string) (*GroupAnswer, error) {
	if err := p.refuse(); err != nil {
		return nil, err
	}
	return p.admitter.submitGroup(ctx, g, owner)
}

// Plan is a dry run of Submit: where req's instances would go now and why
// the rest could not be placed. Nothing is stored.
func (p *Plane) Plan(ctx context.Context, req scheduler.Request) (*PlanAnswer, error) {
	if err := p.refuse(); err != nil {
		return nil, err
	}
	return p.admitter.plan(ctx, req)
}

// Instances returns the instances matching f, sorted by id, at most
// f.Limit of them. A negative f.Limit is a *driver.FieldError on "limit".
func (p *Plane) Instances(ctx context.Context, f Filter) ([]Instance, error) {
	return p.instances(ctx, f)
}

// Counts returns how many instances are in each phase (phases with none
// are left out). It is cheap: it reads counters, not the instances.
func (p *Plane) Counts(ctx context.Context) (map[Phase]int, error) { return p.counts(), nil }

// Instance returns the instance with id ref or, failing that, the instance
// that holds the name ref or, when every instance named ref is deleted, the
// newest of them; driver.ErrNotFound otherwise.
func (p *Plane) Instance(ctx context.Context, ref string) (Instance, error) {
	return p.instance(ctx, ref)
}

// Lookup is Instance within sc: the instance with id ref when it lives in
// sc, else the one that holds the name ref in one of sc's namespaces (a
// name held in several is a *driver.FieldError on "ref" naming them), else
// the newest deleted one named ref in sc; driver.ErrNotFound otherwise, as
// for what lives outside sc. Surfaces that act for a caller resolve refs
// with it (ScopeOf the caller), then act on the instance's id.
func (p *Plane) Lookup(ctx context.Context, ref string, sc Scope) (Instance, error) {
	in, err := p.findIn(ref, sc)
	if err != nil {
		return Instance{}, err
	}
	return viewOf(&in), nil
}

// Delete marks the instance for deletion and returns; the reconciler
// removes it from its back-end. Deleting a deleted instance is no error.
func (p *Plane) Delete(ctx context.Context, ref string) error {
	if err := p.refuse(); err != nil {
		return err
	}
	return p.verbs.delete(ctx, ref)
}

// Stop stops the instance gracefully (a forced stop after grace) and
// returns once it stopped. An instance not created yet is stopped once it
// is; one that does not run is stopped already (reconciler.Verb says what
// each verb does in each phase, and which it refuses).
func (p *Plane) Stop(ctx context.Context, ref string, grace time.Duration) error {
	return p.verbs.stop(ctx, ref, grace, false)
}

// StopLater is Stop that returns once the stop is stored: the reconciler
// makes it, with grace, as it makes a stop resumed after a restart. For a
// grace longer than the caller can wait.
func (p *Plane) StopLater(ctx context.Context, ref string, grace time.Duration) error {
	return p.verbs.stop(ctx, ref, grace, true)
}

// Start starts a stopped or exited instance, resumes a suspended one and
// creates a failed one again; one not created yet or stopping runs once it
// can (reconciler.Verb).
func (p *Plane) Start(ctx context.Context, ref string) error { return p.verbs.start(ctx, ref) }

// RestartLater is Restart for a grace longer than the caller can wait:
// StopLater, then a start, which the stopping instance takes once it has
// stopped (reconciler.Verb).
func (p *Plane) RestartLater(ctx context.Context, ref string, grace time.Duration) error {
	if err := p.verbs.stop(ctx, ref, grace, true); err != nil {
		return err
	}
	return p.verbs.start(ctx, ref)
}

// Restart restarts the instance (reconciler.Verb).
func (p *Plane) Restart(ctx context.Context, ref string, grace time.Duration) error {
	return p.verbs.restart(ctx, ref, grace)
}

// Suspend pauses a running instance in its back-end (docker pause,
// SIGSTOP): it keeps its node and its memory but uses no cpu, and its phase
// is suspended until Resume. An instance not created yet is suspended once
// it is; suspending one that does not run does nothing; a held or deleted
// one is driver.ErrInvalid (reconciler.Refusal), and a provider that cannot
// suspend answers driver.ErrUnsupported naming itself.
func (p *Plane) Suspend(ctx context.Context, ref string) error { return p.verbs.suspend(ctx, ref) }

// Resume continues a suspended instance; its phase is running again. A
// running one is resumed already; one not created yet forgets a suspend
// asked before; a stopped, exited or failed one is driver.ErrNotSuspended.
func (p *Plane) Resume(ctx context.Context, ref string) error { return p.verbs.resume(ctx, ref) }

// Kill sends signal to the instance.
func (p *Plane) Kill(ctx context.Context, ref, signal string) error {
	return p.verbs.kill(ctx, ref, signal)
}

// Resize changes the instance's live cpu and memory limits; zero fields of r
// are unchanged. Growing checks the node's free capacity first and fails
// with driver.ErrInsufficientCapacity when it does not fit.
func (p *Plane) Resize(ctx context.Context, ref string, r driver.Resources) error {
	return p.verbs.resize(ctx, ref, r)
}

// Logs copies the instance's output to stdout and stderr. A read-only
// plane reads only the instances ReadsBackend names.
func (p *Plane) Logs(ctx context.Context, ref string, opts driver.LogOptions, stdout, stderr io.Writer) error {
	return p.verbs.logs(ctx, ref, opts, stdout, stderr)
}

// ReadsBackend reports whether the plane reads the back-end resource of
// the instance named ref itself (Logs, Usage): a plane that leads always;
// a read-only plane when the instance's provider is a shared back-end
// (driver.SharedBackend), which it reaches as the leader does. Otherwise
// those reads are the leader's to serve.
func (p *Plane) ReadsBackend(ref string) bool {
	if !p.cfg.ReadOnly {
		return true
	}
	_, _, err := p.verbs.reading(ref)
	return !errors.Is(err, ErrReadOnly)
}

// Events calls fn for every change of instances and nodes after store
// revision since (0 means from now) until ctx ends, and returns ctx's error
// then. It returns an error wrapping store.ErrCompacted when since is too old.
func (p *Plane) Events(ctx context.Context, since int64, fn func(Event)) error {
	return p.verbs.events(ctx, since, fn)
}

// Nodes returns every provider's nodes with Berth's reservations on them,
// their measured use and their overcommit policy.
func (p *Plane) Nodes(ctx context.Context) ([]NodeView, error) {
	if err := p.refuse(); err != nil {
		return nil, err
	}
	return p.verbs.nodes(ctx)
}

// Providers describes every provider: driver, capabilities, health.
func (p *Plane) Providers(ctx context.Context) ([]ProviderView, error) {
	if err := p.refuse(); err != nil {
		return nil, err
	}
	return p.verbs.providers(ctx)
}

// Images lists the images present on a node of a provider.
func (p *Plane) Images(ctx context.Context, providerName, node string) ([]driver.Image, error) {
	return p.verbs.images(ctx, providerName, node)
}

// Preload makes image present on nodes of a provider (all when nodes is
// empty), reporting progress.
func (p *Plane) Preload(ctx context.Context, providerName, image string, nodes []string, progress func(driver.PreloadProgress)) error {
	return p.verbs.preload(ctx, providerName, image, nodes, progress)
}

// Hold keeps a running instance until until, then deletes it (Nodepool's
// hold with an expiry). Holding again moves the expiry.
func (p *Plane) Hold(ctx context.Context, ref string, until time.Time) error {
	if err := p.refuse(); err != nil {
		return err
	}
	return p.verbs.hold(ctx, ref, until)
}

// SchedulerStats counts what the scheduler's ledger approved since the
// plane was made.
type SchedulerStats struct {
	// Schedulers is how many schedulers share a placement round
	// (Config.Schedulers).
	Schedulers int `json:"schedulers"`
	// Committed counts placements accepted, Conflicts placements refused
	// because another scheduler had taken the room first; Instances is
	// how many reservations the ledger holds, Nodes how many nodes it
	// knows.
	scheduler.Stats
}

// Scheduler returns the scheduler's counters.
func (p *Plane) Scheduler(ctx context.Context) (SchedulerStats, error) {
	return SchedulerStats{Schedulers: p.cfg.Schedulers, Stats: p.cluster.c.Stats()}, nil
}

// Quotas returns every configured quota with its current use.
func (p *Plane) Quotas(ctx context.Context) ([]QuotaUse, error) { return p.verbs.quotas(ctx) }
