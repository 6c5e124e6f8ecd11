// Package sim is Berth's simulated back-end: a cluster of 1 to 100,000 nodes
// held in memory, whose instances "run" after a configurable latency. It is
// a product feature — scale runs, what-if planning, `berth sim` — and the
// worked example of how to write a driver.
//
// # Using it
//
// Import the package for its side effect and select it by name:
//
//	import _ "github.com/berth-dev/berth/drivers/sim"
//
//	providers:
//	  - name: lab
//	    driver: sim
//	    options:
//	      pools: [{count: 4000, name_prefix: "std-", cpus: 4, memory: 32Gi, zones: [a, b, c]},
//	              {count: 1000, name_prefix: "gpu-", cpus: 32, memory: 256Gi, gpus: 4}]
//	      create_latency: 2s
//	      fail_retryable: 0.01
//	      seed: 42
//
// or with flags: --sim-nodes 500 --sim-create-latency 2s. Embedders and
// tests skip the registry and call New with an Options value, which also
// takes a Clock (a *ManualClock makes time explicit).
//
// # Semantics
//
// Nodes come from nodes and shape, or from pools (not both). Node names are
// the prefix and a zero-padded number ("node-01"). Zones and racks become the
// node attributes "zone" and "rack"; labels are copied onto every node of
// the pool; images are present from the start.
//
// Create validates the spec (ErrInvalid) and the node (ErrNotFound) at once;
// everything else is reported by the operation, in this order: an offline or
// draining node (ErrRetryable), a flavor (ErrUnsupported), a taken name
// (ErrAlreadyExists), a missing image with strict_images (ErrPermanent,
// naming image and node), an injected fault (fail_retryable,
// fail_permanent, fail_quota; hang_rate makes a create that never finishes
// until its context ends, then reports ErrTimeout and leaves a failed
// instance to delete), and lack of room (ErrInsufficientCapacity: cpus,
// memory, disk, GPUs, other resources, max_instances, host ports; with
// overcommit a node admits that multiple of its cpus and memory). The
// instance holds its resources from Create until its delete finishes; a
// stopped instance keeps them.
//
// With zero latency a create finishes on the first Advance. Otherwise
// Advance reports a Wait hint until create_latency (plus up to
// latency_jitter) has passed on the sim's Clock. The sim has no timers and
// starts no goroutines: every call first performs whatever has come due, so
// a million instances cost no goroutines at all, and a run on a ManualClock
// is exactly reproducible.
//
// Under a seed every random choice — injected faults, jitter, which nodes
// offline_rate takes offline in each flap period, usage readings — is the
// same for the same sequence of calls. Calls made concurrently are
// deterministic only as far as their order is.
//
// Instances print: every start writes the value of the environment variable
// SIM_STDOUT (default "started") as one line to stdout and SIM_STDERR, if
// set, to stderr. Kill understands KILL (exit 137), TERM (exit 0), HUP, INT
// and QUIT (128 plus the signal); USR1, USR2 and WINCH are handled and the
// instance keeps running; other signals are ErrInvalid. Kill and Suspend of
// an instance that is not running are ErrPermanent. Faults can be driven directly from tests:
// SetNodeStatus takes a node offline or drains it, SetNodeUnlisted makes
// List partial (it leaves out a node's instances and returns a
// *driver.PartialListError naming the node), and Calls returns the most
// recent changes asked of the sim.
//
// # Writing a driver: the shape of this package
//
// A driver is a package under drivers/ that imports only package driver
// (and its back-end's client library). This one is laid out the way every
// driver should be:
//
//   - options.go: the Options struct. Each exported field with an
//     `option:"name"` tag is an option, settable in the config file and as
//     --<driver>-<name>; the `help` tag documents it. DefaultOptions returns
//     the defaults and Validate checks what types cannot, returning
//     driver.FieldErrors whose paths name the keys ("pools[1].cpus").
//     Decoding is done for you by driver.Definition.Decode: unknown keys and
//     wrong types are already errors naming the driver and the key.
//   - sim.go: init registers the driver with
//     driver.Register(driver.Define("sim", summary, DefaultOptions, open)),
//     followed by the interface guards (var _ driver.Resizer = (*Sim)(nil))
//     for every capability, so that a missing method is a compile error.
//     New builds the back-end and releases everything if it fails.
//   - instance.go: the required interface. Create validates with
//     spec.Validate (never write your own), stores spec.Tags on the
//     resource so that List finds it after a crash, and returns an
//     Operation whose Advance never blocks. A back-end whose create is one
//     blocking call wraps it with driver.Async instead; a multi-step one
//     uses driver.Steps. Delete of something gone finishes with
//     driver.ErrNotFound.
//   - caps.go: the optional capabilities, each one small interface. Declare
//     only what works; the provider layer supplies the documented fallback
//     for the rest.
//   - faults.go: what is particular to this back-end (here, fault
//     injection and the call log).
//
// Every error is one of the driver package's sentinels, wrapped with %w
// (driver.Errorf(driver.ErrRetryable, "node %s is offline", n)); callers
// test with errors.Is and never read the text. Every blocking call takes a
// context.Context first, and no context is kept in a struct: this sim
// watches a create's context with context.AfterFunc instead.
//
// Finally the driver's tests call the conformance suite, which checks the
// whole contract and every declared capability, and that Close leaks no
// goroutine:
//
//	func TestConformance(t *testing.T) {
//		drivertest.Run(t, drivertest.Harness{
//			Open: func(t *testing.T) driver.Driver { ... },
//			Spec: func() *driver.Spec { ... },  // prints "hello stdout" and "hello stderr"
//			MissingImage: func() *driver.Spec { ... },
//			PreloadImage: "sim/preload:1",
//		})
//	}
//
// # Performance
//
// Instances live in fixed-size chunks of a slot table indexed by the id
// ("sim-<slot>.<generation>", base 36), so an id lookup is arithmetic and a
// freed slot is reused without ever reusing an id. A slot is 64 bytes and
// holds no pointers (but one to the rare extras: labels, ports, log lines);
// its image, kind and size are an index into a table of the few there are;
// its name and own tags are bytes in its chunk's arena, which drops the
// bytes of deleted instances when it grows, and the tags it shares with
// other instances are kept once (an instance tag that is the name is not
// written twice). Names are found through an open-addressing table of hashes
// and slots. The garbage collector thus has next to nothing to scan however
// many instances run. One mutex guards the whole sim.
//
// BenchmarkCreate1M creates 1,000,000 instances on 5,000 nodes, from one
// goroutine and from one per processor:
//
//	go test -run '^$' -bench Create1M -benchtime 1x ./drivers/sim/
package sim
