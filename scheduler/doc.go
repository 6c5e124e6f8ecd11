// Package scheduler places instances on nodes. It does no I/O: the nodes of
// every provider (driver.Node readings) plus Berth's own allocations go in,
// with a Request or a Group; a Plan (instance → node) comes out and, for
// whatever cannot be placed, how many nodes each filter rejected and why
// ("4,812 nodes: not enough memory (reservations); 188: constraint
// disk==ssd").
//
// # The cluster
//
// Cluster is the authoritative state that approves placements. A control
// plane uses it like this:
//
//	c := scheduler.NewCluster()
//	c.SetCapabilities("aws", driver.Capabilities(drv))
//	c.UpdateNodes("aws", state.Nodes)       // after every platform reading
//	c.Reserve(existing...)                  // once, at start-up
//	plan, err := c.Place(&req)              // plan and commit in one step
//	plan, err := c.PlaceGroup(&group)       // a gang: all or none
//	c.Release(instanceID)                   // after a delete
//
// Several schedulers may instead plan in parallel, each on its own Snapshot,
// and commit with Snapshot.Commit (or Snapshot.Place, which retries
// conflicts): the cluster accepts a placement only if what it counted is
// still free on the node, so no node is ever double-booked (optimistic
// concurrency, as in Citadel's cluster manager and Omega).
//
// # Placement
//
// A request is compiled once: its constraints and affinities are parsed
// (Swarm's syntax, see Expr) and matched against each distinct label value,
// not each node, and the nodes passing the static filters (status, provider,
// capabilities, constraints) are cached per topology and request shape.
// Dynamic filters then check the instance cap, cpu, memory, disk, GPUs,
// named resources, host ports, the per-request cap and affinities, in that
// order (cheapest and most selective first; see dynCheck). Feasible nodes
// are ranked by the request's strategy (binpack, spread, random, waterfill,
// average) plus weighted soft constraints, soft affinities and a penalty for
// replicas of a service on the same node. Heavily used candidate lists are
// indexed by free capacity so that binpack and spread look at a few nodes
// instead of all of them.
//
// # Overcommit
//
// By default a node admits an instance when its reservations plus the
// instance's fit its capacity. A provider may instead admit cpu and memory
// by measured usage (SetOvercommit with PolicyUsage): the control plane
// hands in what each node's instances were measured using (SetMeasured),
// and a node takes an instance when measured use plus a headroom plus the
// instance's reservation fit the capacity and the reservations stay within
// a ratio of it. The policy is folded into each node's free amounts, so the
// scan, the free-capacity index and Commit's recheck all apply it, and a
// rejection names the rule that refused ("not enough cpu (usage, ratio
// 2)").
//
// Groups are Zoe applications or Nodepool node sets: essential instances
// are placed all or none, elastic ones best effort, and elastic instances
// of lower priority may be evicted to make room (Cluster.PlaceGroup). A
// Queue holds groups that do not fit yet, in priority classes ordered by
// FIFO, SIZE or DYNSIZE, and Cluster.Schedule places what fits, skipping
// over a big group at the head that does not (backfill).
package scheduler
