package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/berth-dev/berth/scheduler"
	"github.com/berth-dev/berth/simulate"
)

// simFlags are the flags of `berth sim`.
type simFlags struct {
	workload   string
	nodes      int
	schedulers int
	seed       uint64
	sample     int
	strategy   string
	queue      string
	full       bool
	path       string
	storeKind  string
	asJSON     bool
	advised    bool
	cpuProfile string
	memProfile string
}

// newSimCmd returns `berth sim`, which replays a workload through the
// scheduler on a cluster of the sim back-end, without a server.
func newSimCmd() *cobra.Command {
	var o simFlags
	cmd := &cobra.Command{
		Use:   "sim --workload w1|w2|w3|w5|FILE [--full [--store memory|bolt]]",
		Short: "Replay a workload through the scheduler on a simulated cluster",
		Long: `Replay a workload through Berth's scheduler on a cluster built by the sim
back-end, and report speed, packing and safety. No server is needed.

With --full (--path full) the workload goes through the whole control plane
instead: its nodes become a sim provider, requests are submitted as the API
would, stored (in memory, or in a temporary bbolt file with --store bolt),
and created on the sim by the reconciler; the run ends when every instance
runs, has failed or is pending with a reason.

Built-in workloads:
  w1  5,000 nodes (4 cpus, 32 GiB, 110 instances); 1,000 instances preplaced;
      50,000 requests of 0.1 cpu / 500 MiB, one at a time
  w2  10,000 nodes (4 cpus, 32 GiB), half labelled disk=ssd; 1,000 requests
      of 0.5 cpu / 256 MiB with constraint disk==ssd, each committed before the next
  w3  5,000 nodes (32 cpus, 128 GiB, 10 zones); 1,000 batch groups of 1,000
      instances placed all or none, one zone constraint each
  w5  100,000 nodes 90% full; 20,000 requests of 0.1 cpu / 256 MiB, for
      several parallel schedulers (--schedulers)

FILE is a JSON workload: {"nodes": [{"count", "cpus", "memory", "labels", ...}],
"requests": [{"image", "cpus", "memory", "constraints", "count", "repeat",
"arrival", "interval", "duration", "essential", "preplaced", "used", ...}],
"groups": [{"id", "services", "repeat", "arrival", "duration", ...}]}.
See docs/sim.md for how to read the output to size a cluster.`,
		Args: nArgs(0, 0),
		RunE: func(cmd *cobra.Command, args []string) error { return o.run(cmd) },
	}
	f := cmd.Flags()
	f.StringVar(&o.workload, "workload", "", "w1, w2, w3, w5 or a JSON workload file")
	f.IntVar(&o.nodes, "nodes", 0, "node count for a built-in workload (default: the workload's own)")
	f.IntVar(&o.schedulers, "schedulers", 1, "schedulers planning in parallel on snapshots (optimistic commits when more than 1)")
	f.Uint64Var(&o.seed, "seed", 0, "seed for the scheduler's random choices")
	f.IntVar(&o.sample, "sample", 0, "score only this many feasible nodes per placement (0: all)")
	f.StringVar(&o.strategy, "strategy", "", "override every request's strategy: binpack, spread, random, waterfill or average")
	f.StringVar(&o.queue, "queue", "", "queue what does not fit (fifo, size or dynsize) and retry it as room frees up; every request is then all or none")
	f.BoolVar(&o.full, "full", false, "replay through the whole control plane (same as --path full)")
	f.StringVar(&o.path, "path", string(simulate.PathScheduler), "what the requests go through: scheduler (the scheduler alone) or full (the whole control plane)")
	f.StringVar(&o.storeKind, "store", simulate.StoreMemory, "the control plane's store with --full: memory, or bolt (a temporary bbolt file, removed after)")
	f.BoolVar(&o.asJSON, "json", false, "print one JSON object with the results")
	f.StringVar(&o.cpuProfile, "cpuprofile", "", "write a CPU profile of the run to this file")
	f.StringVar(&o.memProfile, "memprofile", "", "write to this file the heap profile of the largest live heap of the run (read every second)")
	f.BoolVar(&o.advised, "advised", false, "replay also with the sizes `berth advise` would suggest for the requests that give their measured use (\"used\"), and compare")
	return cmd
}

// check checks the flags, settling --full into --path.
func (o *simFlags) check(cmd *cobra.Command) error {
	changed := cmd.Flags().Changed
	switch {
	case o.workload == "":
		return usagef("--workload is required: one of %s or a JSON file", strings.Join(simulate.Builtins, ", "))
	case o.schedulers < 1:
		return usagef("--schedulers %d: want 1 or more", o.schedulers)
	case o.sample < 0:
		return usagef("--sample %d: want 0 (score every node) or more", o.sample)
	case o.strategy != "" && !slices.Contains(scheduler.Strategies, scheduler.Strategy(o.strategy)):
		return usagef("--strategy %q: want binpack, spread, random, waterfill or average", o.strategy)
	case o.queue != "" && o.schedulers > 1:
		return usagef("--queue works with one scheduler")
	}
	if o.full {
		if changed("path") && o.path != string(simulate.PathFull) {
			return usagef("--full and --path %s disagree", o.path)
		}
		o.path = string(simulate.PathFull)
	}
	if o.path != string(simulate.PathScheduler) && o.path != string(simulate.PathFull) {
		return usagef("--path %q: want scheduler or full", o.path)
	}
	if o.path != string(simulate.PathFull) {
		if changed("store") {
			return usagef("--store applies to --full only")
		}
		return nil
	}
	for _, name := range []string{"schedulers", "seed", "sample", "queue"} {
		if changed(name) {
			return usagef("--%s applies to the scheduler path, not to --full", name)
		}
	}
	if o.storeKind != simulate.StoreMemory && o.storeKind != simulate.StoreBolt {
		return usagef("--store %q: want memory or bolt", o.storeKind)
	}
	return nil
}

// load returns the workload the flags name.
func (o *simFlags) load(cmd *cobra.Command) (*simulate.Workload, error) {
	if slices.Contains(simulate.Builtins, o.workload) {
		if o.nodes < 0 || o.nodes > 100_000 {
			return nil, usagef("--nodes %d: want 1 to 100000", o.nodes)
		}
		return simulate.Builtin(o.workload, o.nodes)
	}
	if cmd.Flags().Changed("nodes") {
		return nil, usagef("--nodes applies to the built-in workloads; set the node counts in %s", o.workload)
	}
	return simulate.Load(o.workload)
}

// options returns the run's options.
func (o *simFlags) options() simulate.Options {
	opt := simulate.Options{
		Schedulers: o.schedulers, Optimistic: o.schedulers > 1, Seed: o.seed,
		Sample: o.sample, Strategy: scheduler.Strategy(o.strategy), Queue: scheduler.Policy(o.queue),
		Path: simulate.Path(o.path),
	}
	if opt.Path == simulate.PathFull {
		opt.Store = o.storeKind
	}
	return opt
}

// run is `berth sim`.
func (o *simFlags) run(cmd *cobra.Command) (err error) {
	if err := o.check(cmd); err != nil {
		return err
	}
	w, err := o.load(cmd)
	if err != nil {
		return err
	}
	opt := o.options()
	if o.cpuProfile != "" {
		stop, err := startCPUProfile(o.cpuProfile)
		if err != nil {
			return err
		}
		defer func() { err = errors.Join(err, stop()) }()
	}
	if o.memProfile != "" {
		stop := watchHeap(cmd.Context(), o.memProfile)
		defer func() { err = errors.Join(err, stop()) }()
	}
	res, err := runSim(cmd, w, opt)
	if err != nil {
		return err
	}
	if !o.advised {
		if o.asJSON {
			return printJSONLine(cmd.OutOrStdout(), res)
		}
		printSimSummary(cmd.OutOrStdout(), res)
		return nil
	}
	return o.compareAdvised(cmd, w, opt, res)
}

// runSim runs w with a progress bar on a terminal.
func runSim(cmd *cobra.Command, w *simulate.Workload, opt simulate.Options) (*simulate.Result, error) {
	stderr := cmd.ErrOrStderr()
	var bar *progressbar.ProgressBar
	if f, ok := stderr.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
		bar = progressbar.NewOptions(-1, progressbar.OptionSetWriter(stderr),
			progressbar.OptionSetDescription("placing "+w.Name), progressbar.OptionShowCount(),
			progressbar.OptionThrottle(100*time.Millisecond), progressbar.OptionClearOnFinish())
		opt.Progress = func(done, total int) {
			bar.ChangeMax(total)
			_ = bar.Set(done)
		}
	}
	res, err := simulate.Run(cmd.Context(), w, opt)
	if bar != nil {
		_ = bar.Finish()
	}
	return res, err
}

// compareAdvised runs w again with the advised sizes and prints both
// results.
func (o *simFlags) compareAdvised(cmd *cobra.Command, w *simulate.Workload, opt simulate.Options, res *simulate.Result) error {
	aw, resized := w.Advised(scheduler.AdviceOptions{})
	opt.Progress = nil
	ares, err := simulate.Run(cmd.Context(), aw, opt)
	if err != nil {
		return err
	}
	if o.asJSON {
		return printJSONLine(cmd.OutOrStdout(), struct {
			AsGiven *simulate.Result `json:"as_given"`
			Advised *simulate.Result `json:"advised"`
			Resized int              `json:"resized"`
		}{res, ares, resized})
	}
	out := cmd.OutOrStdout()
	fmt.Fprintln(out, "as given:")
	printSimSummary(out, res)
	fmt.Fprintln(out, "with the advised sizes:")
	printSimSummary(out, ares)
	fmt.Fprintf(out, "advised    %s requests resized; nodes used at peak %s -> %s, unplaced %s -> %s\n", groupDigits(int64(resized)),
		groupDigits(int64(res.NodesUsed)), groupDigits(int64(ares.NodesUsed)), groupDigits(int64(res.Unplaced)), groupDigits(int64(ares.Unplaced)))
	return nil
}

// printSimSummary writes the human summary of a run.
func printSimSummary(w io.Writer, r *simulate.Result) {
	n := func(v int) string { return groupDigits(int64(v)) }
	plural := func(v int, one, many string) string {
		if v == 1 {
			return one
		}
		return many
	}
	fmt.Fprintf(w, "workload %s: %s nodes, %s requests (%s instances), %d %s", r.Workload, n(r.Nodes), n(r.Requests),
		n(r.Instances), r.Schedulers, plural(r.Schedulers, "scheduler", "schedulers"))
	if r.PlaneResult != nil {
		fmt.Fprintf(w, ", full control plane (%s store)", r.Store)
	}
	if r.Sample > 0 {
		fmt.Fprintf(w, ", sampling %d nodes", r.Sample)
	}
	if r.Strategy != "" {
		fmt.Fprintf(w, ", strategy %s", r.Strategy)
	}
	fmt.Fprintln(w)
	if r.Preplaced > 0 {
		fmt.Fprintf(w, "preplaced  %s instances before the run\n", n(r.Preplaced))
	}
	fmt.Fprintf(w, "placed     %s, unplaced %s, released %s", n(r.Placed), n(r.Unplaced), n(r.Released))
	if r.Evicted > 0 {
		fmt.Fprintf(w, ", evicted %s", n(r.Evicted))
	}
	fmt.Fprintln(w)
	if r.Queued > 0 {
		fmt.Fprintf(w, "queue      %s requests waited (p50 %.1f s, max %.1f s), %s still waiting\n", n(r.Queued), r.WaitP50Secs, r.WaitMaxSecs, n(r.QueueLeft))
	}
	fmt.Fprintf(w, "speed      %s placements/s over %.3f s\n", groupDigits(int64(r.PlacementsPerSec)), r.Seconds)
	if p := r.PlaneResult; p != nil {
		fmt.Fprintf(w, "running    %s, failed %s, all settled after %.3f s; the sim holds %s instances\n", n(p.Running), n(p.Failed), p.SecondsToRunning, n(p.BackendInstances))
	}
	fmt.Fprintf(w, "latency    p50 %s, p99 %s, max %s per request\n", micros(r.P50Micros), micros(r.P99Micros), micros(r.MaxMicros))
	ratio := ""
	if r.LowerBoundNodes > 0 {
		ratio = fmt.Sprintf(" (%.2fx)", r.PackingRatio)
	}
	fmt.Fprintf(w, "packing    %s nodes used at peak, lower bound %s%s\n", n(r.NodesUsed), n(r.LowerBoundNodes), ratio)
	fmt.Fprintf(w, "safety     %s conflicts (%.2f%% of commits), %d double-booked nodes", groupDigits(int64(r.Conflicts)), 100*r.ConflictRate, r.DoubleBooked)
	if p := r.PlaneResult; p != nil {
		fmt.Fprintf(w, ", %d misplaced, %d creates refused for lack of room", p.Misplaced, p.CapacityRefusals)
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "memory     %.0f MiB peak resident\n", float64(r.PeakRSSBytes)/(1<<20))
	if r.Unplaced > 0 && r.UnplacedReason != "" {
		fmt.Fprintf(w, "unplaced   %s\n", r.UnplacedReason)
	}
}

func micros(us float64) string {
	if us >= 1000 {
		return strconv.FormatFloat(us/1000, 'f', 2, 64) + " ms"
	}
	return strconv.FormatFloat(us, 'f', 1, 64) + " µs"
}

// groupDigits writes v with thousands separators.
func groupDigits(v int64) string {
	s := strconv.FormatInt(v, 10)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	if neg {
		b.WriteByte('-')
	}
	for i := range len(s) {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
