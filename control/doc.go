// Package control is Berth's control plane: it accepts requests, places them
// with the scheduler, records every placement and its intent in the store,
// and runs the reconciler that drives the back-ends until what runs matches
// what the store says.
//
// Data flows one way: API → scheduler → store → reconciler → driver. Every
// change of state is a store transaction that compares revisions, so the
// Plane can be stopped at any moment (kill -9 included) and a new Plane on the
// same store resumes the work: it adopts what the back-ends already run,
// never creates a second copy, and deletes leaked resources that carry this
// cluster's tags.
//
// # Parts
//
// The plane's state (state.go) is one struct; its methods are split by
// concern into types a part's name says (parts.go), each a view of the
// state with at most a few dozen methods, in files of its own:
//
//	state       the store side: commit, applyStored, load, the watch,
//	            following, identity, quarantine, stepping an instance
//	            (state.go, commit.go, apply.go, watch.go, follow.go,
//	            identity.go, quarantine.go)
//	records     the records in memory, their indexes and reads (records.go)
//	admitter    checks and admits requests and groups (submit.go, accept.go,
//	            tenancy.go, groupstate.go)
//	placer      node readings, placement, the gang queue, evictions
//	            (place.go, gang.go, evict.go)
//	runner      the reconciler's workers and writers (run.go)
//	syncer      listings, lost instances, leaks, the collector (sync.go,
//	            gc.go, listing.go)
//	verbs       operations on instances, reads of the back-ends (ops.go)
//	measurer    usage sampling and history (usage.go)
//	rebalancer  rebalance runs (rebalance.go, rebalance_apply.go)
//
// A part calls another through the state's field of that part
// (s.placer.kickPlacer()).
//
//   - Plane (plane.go) is the API the server and the CLI call: submit,
//     groups, plans, reads, operations on instances, Run.
//   - Admission (accept.go, submit.go) checks a request, asks the scheduler
//     for a plan and stores the request with its instances in one
//     transaction.
//   - The commit path (commit.go): commit is the only function that writes
//     the store. It compares the revisions the change was decided on and
//     writes in one transaction. A store that guards its writes (a
//     leader's fence) therefore sees every write of the plane.
//   - One apply (apply.go): applyStored is the only way a stored change
//     reaches memory: the records, names and tallies, the scheduler's
//     ledger (which follows from the records: a record that holds a node
//     holds its allocation) and the usage meter. Commit calls it after its
//     transaction, the store watch for every change it sees, a read-only
//     plane for every change it follows, load at start-up, reload and the
//     resyncs for what they read again; a change applied already, or older than a removal
//     applied (tombstones), is skipped, so one change arriving twice or a
//     lagging watch changes nothing. Two things enter memory ahead of the
//     store, and leave it if their transaction fails: a request being
//     admitted (the placer must find it when its instances are watched)
//     and a placement's reservation in the ledger (Place reserves as it
//     plans; the stored record then holds that same reservation, which
//     the placement's own commit does not check again: txn.placed).
//   - Records (records.go, record.go): the store's instances and requests in
//     memory with their indexes. An instance is stored as a record, a
//     fifth of its JSON or less: the spec lives once, in its request, and
//     the fields nearly every record sets are binary. In memory it is a
//     rec, in a B-tree by id (recIndex): the fields the plane reads of
//     every instance, its times as 8-byte instants, the rest
//     (and most of what the back-end showed) behind pointers that few
//     instances set, the name and group left out when the id and the
//     request's id give them, the spec shared with the other instances
//     of its request. Names are per namespace (the owner), as
//     Kubernetes' are: the names index is keyed by namespace and name, and
//     Lookup resolves a name within a caller's namespaces. An instance
//     named by its id holds its name through the records alone: the names
//     index keeps only the others.
//   - One type per role, each with one conversion from the lifecycle's
//     reconciler.Instance, the form that is stepped and committed: record
//     is the stored form (encodeRecord, decodeRecord back), rec the
//     memory's (newRec, rec.instance back) and Instance the answer
//     (viewOf), which leaves out the lifecycle's bookkeeping (After) and
//     gives the caller a spec of its own. An answer is made when it is
//     given, never kept: the plane holds only recs.
//   - Placement (place.go, gang.go): the scheduler's Cluster is the one
//     ledger of what every node and every quota holds. Quotas, nodes a
//     launch just failed on, nodes that refused an instance are typed
//     scheduler filters (scheduler.Quota, scheduler.Avoid) with their
//     rejection reasons; the gang queue places groups all or none, in the
//     server's queue or in the queue of the pool they belong to. The
//     placer's round may be shared by several schedulers
//     (Config.Schedulers): each plans on a scheduler.Snapshot of its own
//     and commits optimistically; the Cluster re-checks every placement
//     and counts the ones it refuses as conflicts, which are planned
//     again.
//   - The runtime (run.go, sync.go, watch.go, gc.go): while Run runs,
//     workers perform the reconciler's actions (create, delete, stop...),
//     a writer stores their outcomes in batches, the placer places what
//     waits, sync compares the back-ends with the records (lost instances,
//     leaks), the store watch takes other writers' changes, the
//     collector removes old deleted records, and the usage loop (usage.go)
//     measures the running instances, keeps their recent samples and an
//     hour of use per instance, node and the cluster (history.go) in
//     memory, and hands each node's measured use to the scheduler, where a
//     provider under the usage policy (scheduler.Overcommit) admits
//     instances by it.
//   - Rebalancing (rebalance.go, rebalance_apply.go): a plan from the
//     scheduler's ledger (scheduler.Cluster.PlanRebalance), replayed on a
//     fresh ledger, then carried out move by move, make-before-break,
//     through the admission and delete paths, with each step recorded in
//     the store first (KeyRebalance) so that a restarted plane settles a
//     run it finds under way.
//   - The read-only plane (follow.go, Config.ReadOnly), for a server that
//     does not lead: New writes nothing and calls no provider, Run only
//     follows the store's changes of instances and requests into the
//     records and the scheduler's ledger, and every method that would
//     write or reach a back-end returns ErrReadOnly (commit refuses too),
//     except the reads of a shared back-end (logs, usage: ops.go's
//     reading, driver.SharedBackend).
//   - Start-up (state.go's load, quarantine.go): New reads every request,
//     instance and group. A record that does not decode or breaks an
//     invariant (a number beyond the range its field declares, an
//     instance whose spec is stored nowhere) is moved aside under
//     PrefixQuarantine, kept and logged, and the plane starts with the
//     rest; Plane.Quarantined lists them (berth doctor), and sync leaves
//     their back-end resources alone.
//
// Every number of an input has one range (driver.Range), declared next to
// its field and checked by validation before anything is stored; the
// records rely on them (a rec keeps some numbers in 32 bits), and
// encodeRecord refuses, as an error, what is beyond them.
//
// The lifecycle of one instance is reconciler.Machine.Step, a pure function
// of the record, an event and the time; this package only feeds it events
// and performs the actions it returns.
//
// # Locks
//
// The lock order is written on state (state.go), and holds for every part
// alike, since they share the state's locks: the per-instance stripes
// (taken by state's apply and applyBatch, the verbs and the rebalancer's
// moves), then the gang queue's lock (admitter, placer), then the
// records' lock (records; applyStored holds it while it changes the
// ledger), then the scheduler cluster's own (inside scheduler.Cluster);
// the runtime's locks (runner, syncer) and the usage meter's (measurer)
// are leaves. The store is called with no lock held but the stripes of
// the instances being changed.
//
// The placer's schedulers add no lock: each owns its snapshot, its
// commits take the cluster's lock inside Snapshot.Commit (last in the
// order), and what it places is stored through commit like every other
// change, under the instance's stripe.
//
// # One request, from the API to a running instance
//
//  1. The API decodes and authorises POST /v1/requests and calls
//     Plane.Submit with the caller's namespace as owner.
//  2. submit validates the request (checkRequest: ids, names, sizes, the
//     features its spec needs and whether any provider can run it) and
//     refuses what no node could ever take (checkEverPlaceable).
//  3. accept makes a pending record per instance, claims their names and
//     asks the scheduler's Cluster to place them. Place plans and reserves
//     in one step under the cluster's lock, keeping to the quotas.
//  4. Each placed instance takes its next phase: creating, with its create
//     action, when the runtime runs. commit stores the request and every
//     record in one transaction; a failure gives back the reservations and
//     the names.
//  5. The create action starts a task: a worker calls the provider's
//     Create (rate-limited, behind a circuit breaker) and advances its
//     Operation until the back-end reports the instance.
//  6. The outcome (created, failed, refused) goes to the writer, which
//     steps the record and commits a batch of such changes at once. The
//     instance is running; sync keeps checking that it still is.
//
// An instance that cannot be placed stays pending with the reason; the
// placer tries again when room frees up or nodes change.
package control
