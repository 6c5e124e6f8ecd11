package control

// The plane's parts, one type per concern, each a view of the one state
// (doc.go, Parts): a part's methods are in the files its comment names,
// and it calls another part's through that part's field of the state
// (s.placer.kickPlacer()). The fields they share and the lock order are
// the state's (state.go).

// admitter checks requests and groups and admits them: validation, the
// first placement, and storing them with their instances, or queueing
// a group for the gang queue (submit.go, accept.go, tenancy.go,
// groupstate.go).
type admitter struct{ *state }

// placer keeps the scheduler's view of the nodes and places what waits:
// node readings, the placement loop and its rounds, the gang queue and
// evictions (place.go, gang.go, evict.go).
type placer struct{ *state }

// runner is the running reconciler: it performs the lifecycle's actions
// with workers (creates, deletes, stops, leaks) and stores their outcomes
// (run.go).
type runner struct{ *state }

// syncer compares the back-ends with the records: listings, lost
// instances, leaks, node readings, and the collector of old deleted
// records (sync.go, gc.go, listing.go).
type syncer struct{ *state }

// verbs are the operations on instances and the reads of the back-ends:
// stop, start, kill, resize, delete, logs, nodes, images... (ops.go).
type verbs struct{ *state }

// measurer samples the running instances' use and keeps the node sums
// and their hour (usage.go).
type measurer struct{ *state }

// rebalancer plans and carries out rebalance runs (rebalance.go,
// rebalance_apply.go).
type rebalancer struct{ *state }
