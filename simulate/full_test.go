package simulate

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/driver/drivertest"
)

// fullWorkload has preplaced instances, a gang, instances that leave and
// make room for later arrivals, and more than fits.
//
// 10 nodes of 4 cpus: 40 cpus. Preplaced: 10 × 1 cpu (one per node).
// Then a gang of 8 × 1 cpu, 20 requests of 0.5 cpu that run for 10 s
// (arriving at 0..19), and at 30 s, after those left, 44 requests of 0.5
// cpu: 22 cpus free, so 44 fit; at 40 s 3 requests of 2 cpus, none fit.
const fullWorkload = `{
	"name": "full",
	"nodes": [{"count": 10, "cpus": 4, "memory": "8Gi", "max_instances": 20}],
	"requests": [
		{"image": "pre", "cpus": 1, "memory": 256, "repeat": 10, "preplaced": true},
		{"image": "gang", "type": "batch", "cpus": 1, "memory": 256, "count": 8, "essential": 8},
		{"image": "short", "cpus": 0.5, "memory": 256, "repeat": 20, "interval": 1, "duration": 10},
		{"image": "late", "type": "batch", "cpus": 0.5, "memory": 256, "repeat": 44, "arrival": 30},
		{"image": "big", "cpus": 2, "memory": 256, "repeat": 3, "arrival": 40}
	]}`

func TestFullPath(t *testing.T) {
	for _, st := range []string{StoreMemory, StoreBolt} {
		t.Run(st, func(t *testing.T) {
			// The bolt file's directory goes under TMPDIR; it must be gone
			// after the run.
			tmp := t.TempDir()
			t.Setenv("TMPDIR", tmp)
			w, err := Decode(strings.NewReader(fullWorkload))
			if err != nil {
				t.Fatal(err)
			}
			calls, last := 0, -1
			res := run(t, w, Options{Path: PathFull, Store: st, Progress: func(done, total int) {
				if done < last || done > total {
					t.Errorf("progress %d of %d after %d", done, total, last)
				}
				calls, last = calls+1, done
			}})
			if res.Path != PathFull || res.PlaneResult == nil || res.Store != st {
				t.Fatalf("path %q, plane result %+v", res.Path, res.PlaneResult)
			}
			if calls == 0 || last != res.Requests {
				t.Fatalf("%d progress calls, last %d of %d", calls, last, res.Requests)
			}
			if res.Preplaced != 10 || res.Requests != 1+20+44+3 || res.Instances != 8+20+44+3 {
				t.Fatalf("preplaced %d, requests %d, instances %d", res.Preplaced, res.Requests, res.Instances)
			}
			if res.Placed != 8+20+44 || res.Unplaced != 3 || res.Released != 20 {
				t.Fatalf("placed %d, unplaced %d (%s), released %d", res.Placed, res.Unplaced, res.UnplacedReason, res.Released)
			}
			if res.Running != 8+44 || res.Failed != 0 || res.CapacityRefusals != 0 {
				t.Fatalf("running %d, failed %d, refused for capacity %d", res.Running, res.Failed, res.CapacityRefusals)
			}
			if res.BackendInstances != res.Preplaced+res.Running {
				t.Fatalf("the back-end holds %d instances, want %d preplaced + %d running", res.BackendInstances, res.Preplaced, res.Running)
			}
			if res.UnplacedReason == "" {
				t.Fatal("no reason given for the unplaced instances")
			}
			// At the peak (after the late arrivals) 10 + 8 + 22 = 40 cpus
			// are used: every node, and the bound is every node.
			if res.NodesUsed != 10 || res.LowerBoundNodes != 10 {
				t.Fatalf("nodes used %d, lower bound %d", res.NodesUsed, res.LowerBoundNodes)
			}
			if res.Seconds <= 0 || res.SecondsToRunning < res.Seconds || res.P50Micros <= 0 || res.P99Micros < res.P50Micros || res.PeakRSSBytes <= 0 {
				t.Fatalf("timings not filled in: %+v", res)
			}
			left, err := os.ReadDir(tmp)
			if err != nil {
				t.Fatal(err)
			}
			if len(left) != 0 {
				t.Fatalf("the run left %s behind in TMPDIR", left[0].Name())
			}
		})
	}
}

// TestFullMatchesScheduler replays the same workload, without departures,
// on both paths: the control plane must place what the scheduler alone
// places.
func TestFullMatchesScheduler(t *testing.T) {
	w, err := Builtin("w1", 50)
	if err != nil {
		t.Fatal(err)
	}
	// 50 nodes of 4 cpus hold 2,000 instances of 0.1 cpu; 1,000 are
	// preplaced, so 1,000 of the 1,200 fit.
	w.Requests[1].Repeat = 1200
	sched := run(t, w, Options{})
	full := run(t, w, Options{Path: PathFull})
	if sched.Placed != 1000 || full.Placed != sched.Placed || full.Unplaced != sched.Unplaced {
		t.Fatalf("scheduler placed %d (unplaced %d), full path %d (unplaced %d)", sched.Placed, sched.Unplaced, full.Placed, full.Unplaced)
	}
	if full.Running != 1000 || full.Preplaced != 1000 {
		t.Fatalf("full path: running %d, preplaced %d", full.Running, full.Preplaced)
	}
	if full.NodesUsed != sched.NodesUsed || full.LowerBoundNodes != sched.LowerBoundNodes {
		t.Fatalf("full path used %d nodes (bound %d), scheduler %d (bound %d)", full.NodesUsed, full.LowerBoundNodes, sched.NodesUsed, sched.LowerBoundNodes)
	}
	b, err := json.Marshal(full)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"workload", "nodes", "requests", "placed", "unplaced", "seconds", "placements_per_sec", "p50_us", "p99_us",
		"nodes_used", "lower_bound_nodes", "conflicts", "double_booked", "peak_rss_bytes", "running", "failed", "seconds_to_running"} {
		if _, ok := m[k]; !ok {
			t.Errorf("JSON lacks %q", k)
		}
	}
	b, _ = json.Marshal(sched)
	if strings.Contains(string(b), `"running"`) {
		t.Errorf("scheduler path JSON reports running: %s", b)
	}
}

func TestFullOptionErrors(t *testing.T) {
	w, _ := Builtin("w2", 10)
	tests := []struct {
		opt  Options
		path string
	}{
		{Options{Path: PathFull, Schedulers: 2}, "schedulers"},
		{Options{Path: PathFull, Sample: 4}, "sample"},
		{Options{Path: PathFull, Seed: 3}, "seed"},
		{Options{Path: PathFull, Queue: "fifo"}, "queue"},
		{Options{Path: PathFull, Store: "etcd"}, "store"},
		{Options{Store: StoreBolt}, "store"},
		{Options{Path: "all"}, "path"},
	}
	for _, tt := range tests {
		_, err := Run(context.Background(), w, tt.opt)
		if !drivertest.HasField(err, tt.path) || !errors.Is(err, driver.ErrInvalid) {
			t.Errorf("%+v: err %v, want ErrInvalid naming %s", tt.opt, err, tt.path)
		}
	}
}

func TestFullStopsWithContext(t *testing.T) {
	w, _ := Builtin("w2", 100)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := Run(ctx, w, Options{Path: PathFull}); !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
}

func TestOverbooked(t *testing.T) {
	node := func(name string, cpus float64, maxInst int) driver.Node {
		return driver.Node{Name: name, Capacity: driver.Resources{CPU: driver.CPUs(cpus), Memory: 4 * driver.GiB}, MaxInstances: maxInst}
	}
	in := func(node string, cpus float64, mem driver.Bytes) *driver.Instance {
		return &driver.Instance{Node: node, Resources: driver.Resources{CPU: driver.CPUs(cpus), Memory: mem}}
	}
	nodes := []driver.Node{node("a", 2, 0), node("b", 2, 2), node("c", 2, 0)}
	tests := []struct {
		name string
		ins  []*driver.Instance
		want []string
	}{
		{"empty", nil, nil},
		{"full to the brim", []*driver.Instance{in("a", 1, driver.GiB), in("a", 1, 3*driver.GiB)}, nil},
		{"cpu over", []*driver.Instance{in("a", 1.5, driver.MiB), in("a", 0.6, driver.MiB)}, []string{"a"}},
		{"memory over", []*driver.Instance{in("c", 0.1, 3*driver.GiB), in("c", 0.1, 2*driver.GiB)}, []string{"c"}},
		{"instance cap", []*driver.Instance{in("b", 0.1, driver.MiB), in("b", 0.1, driver.MiB), in("b", 0.1, driver.MiB)}, []string{"b"}},
		{"per node", []*driver.Instance{in("a", 2, driver.MiB), in("c", 2, driver.MiB), in("b", 3, driver.MiB)}, []string{"b"}},
	}
	for _, tt := range tests {
		if got := overbooked(nodes, tt.ins); !slices.Equal(got, tt.want) {
			t.Errorf("%s: %v, want %v", tt.name, got, tt.want)
		}
	}
}

func TestMisplaced(t *testing.T) {
	w, err := Decode(strings.NewReader(`{
		"nodes": [{"count": 2, "cpus": 4, "memory": "8Gi", "labels": {"disk": "ssd"}, "zones": ["a"]}],
		"requests": [
			{"image": "pre", "cpus": 1, "memory": 256, "repeat": 2, "preplaced": true},
			{"image": "x", "cpus": 1, "memory": 256, "constraints": ["disk==ssd", "zone!=b", "node!=n2", "rack==~r1"]},
			{"image": "y", "cpus": 1, "memory": 256, "count": 2, "constraints": ["zone==/[ab]/", "gpu!=yes"], "essential": 2}
		]}`))
	if err != nil {
		t.Fatal(err)
	}
	rules, err := hardRules(w)
	if err != nil {
		t.Fatal(err)
	}
	f := &fullRunner{rules: rules}
	nodes := []driver.Node{
		{Name: "n1", Labels: map[string]string{"disk": "ssd"}, Attributes: map[string]string{"zone": "a"}},
		{Name: "n2", Labels: map[string]string{"disk": "hdd", "zone": "b"}, Attributes: map[string]string{"zone": "a"}},
	}
	on := func(node, id string) *driver.Instance {
		return &driver.Instance{Node: node, Tags: map[string]string{driver.TagInstance: id}}
	}
	tests := []struct {
		name string
		ins  []*driver.Instance
		want []string
	}{
		{"where they belong", []*driver.Instance{on("n1", "pre0-0"), on("n2", "pre0-1"), on("n1", "r1.0"), on("n1", "r2.0.s0-1")}, nil},
		{"preplaced moved", []*driver.Instance{on("n1", "pre0-1")}, []string{"pre0-1"}},
		// n2's label zone=b wins over its attribute zone=a.
		{"label over attribute", []*driver.Instance{on("n2", "r2.0.s0-0")}, nil},
		{"hard constraint broken", []*driver.Instance{on("n2", "r1.0")}, []string{"r1.0"}},
		{"unknown node", []*driver.Instance{on("n9", "r1.0")}, []string{"r1.0"}},
		{"unknown instance", []*driver.Instance{on("n1", "x")}, []string{"x"}},
	}
	for _, tt := range tests {
		if got := f.misplacedOn(nodes, tt.ins); !slices.Equal(got, tt.want) {
			t.Errorf("%s: %v, want %v", tt.name, got, tt.want)
		}
	}
}

// TestFullConstrained replays w2 on nodes that hold every request: each
// instance must run on a disk=ssd node.
func TestFullConstrained(t *testing.T) {
	w, err := Builtin("w2", 60)
	if err != nil {
		t.Fatal(err)
	}
	w.Requests[0].Repeat = 200
	res := run(t, w, Options{Path: PathFull})
	if res.Placed != 200 || res.Running != 200 || res.Misplaced != 0 || res.BackendInstances != 200 {
		t.Fatalf("placed %d, running %d, misplaced %d, on the back-end %d", res.Placed, res.Running, res.Misplaced, res.BackendInstances)
	}
	if res.NodesUsed > 30 {
		t.Fatalf("%d nodes used: only 30 have disk=ssd", res.NodesUsed)
	}
}

// TestFullEviction: a gang of higher priority evicts elastic instances
// through the plane; the run must account them as the scheduler path does.
func TestFullEviction(t *testing.T) {
	w, err := Decode(strings.NewReader(`{
		"nodes": [{"count": 2, "cpus": 4, "memory": "8Gi"}],
		"requests": [
			{"image": "low", "cpus": 1, "memory": 256, "count": 8, "essential": 2, "priority": 1},
			{"image": "high", "cpus": 3, "memory": 256, "count": 2, "essential": 2, "priority": 5, "arrival": 1}
		]}`))
	if err != nil {
		t.Fatal(err)
	}
	sched := run(t, w, Options{})
	full := run(t, w, Options{Path: PathFull})
	if full.Placed != 10 || full.Evicted != 6 || full.Running != 4 || full.BackendInstances != 4 {
		t.Fatalf("placed %d, evicted %d, running %d, on the back-end %d", full.Placed, full.Evicted, full.Running, full.BackendInstances)
	}
	if full.Evicted != sched.Evicted || full.LowerBoundNodes != sched.LowerBoundNodes || full.NodesUsed != sched.NodesUsed {
		t.Fatalf("full path: evicted %d, bound %d, used %d; scheduler: %d, %d, %d", full.Evicted, full.LowerBoundNodes, full.NodesUsed,
			sched.Evicted, sched.LowerBoundNodes, sched.NodesUsed)
	}
}
