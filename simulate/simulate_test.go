package simulate

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/driver/drivertest"
	"github.com/berth-dev/berth/drivers/sim"
	"github.com/berth-dev/berth/scheduler"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func run(t *testing.T, w *Workload, opt Options) *Result {
	t.Helper()
	res, err := Run(context.Background(), w, opt)
	if err != nil {
		t.Fatal(err)
	}
	if res.DoubleBooked != 0 {
		t.Fatalf("%d nodes double-booked", res.DoubleBooked)
	}
	if res.PlaneResult != nil && res.Misplaced != 0 {
		t.Fatalf("%d instances on nodes that break their constraints", res.Misplaced)
	}
	return res
}

func TestPackingBatchOneShape(t *testing.T) {
	w, err := Decode(strings.NewReader(`{
		"name": "batch",
		"nodes": [{"count": 120, "cpus": 4, "memory": "16Gi"}],
		"requests": [
			{"image": "job", "type": "batch", "cpus": 0.35, "memory": 1024, "count": 500, "essential": 500},
			{"image": "job", "type": "batch", "cpus": 0.7, "memory": "3Gi", "count": 100, "repeat": 2},
			{"image": "job", "type": "batch", "cpus": 0.2, "memory": 512, "repeat": 300}
		]}`))
	if err != nil {
		t.Fatal(err)
	}
	res := run(t, w, Options{})
	if res.Unplaced != 0 || res.Placed != 500+200+300 {
		t.Fatalf("placed %d, unplaced %d (%s)", res.Placed, res.Unplaced, res.UnplacedReason)
	}
	t.Logf("nodes used %d, lower bound %d", res.NodesUsed, res.LowerBoundNodes)
	if float64(res.NodesUsed) > 1.05*float64(res.LowerBoundNodes) {
		t.Fatalf("batch packing: %d nodes used, lower bound %d (> 1.05x)", res.NodesUsed, res.LowerBoundNodes)
	}
}

// onlineWorkload has requests of mixed sizes arriving one at a time, each
// running for a while.
func onlineWorkload(seed uint64) *Workload {
	rng := rand.New(rand.NewPCG(seed, 1))
	w := &Workload{Name: "online", Nodes: []sim.Pool{{Count: 300, NamePrefix: "n",
		Shape: sim.Shape{Resources: driver.Resources{CPU: driver.CPUs(8), Memory: 32 * driver.GiB}}}}}
	sizes := []struct {
		cpus float64
		mem  driver.Bytes
	}{{0.25, 1 * driver.GiB}, {0.5, 2 * driver.GiB}, {1, 4 * driver.GiB}, {2, 6 * driver.GiB}}
	for k := range 4000 {
		s := sizes[rng.IntN(len(sizes))]
		w.Requests = append(w.Requests, Item{
			Request: scheduler.Request{Spec: driver.Spec{Image: "svc", Type: driver.TypeBatch,
				Resources: driver.Resources{CPU: driver.CPUs(s.cpus), Memory: s.mem}}},
			Arrival:  float64(k) * 0.1,
			Duration: 60 + rng.Float64()*240,
		})
	}
	return w
}

func TestPackingOnlineArrivals(t *testing.T) {
	for seed := range uint64(3) {
		res := run(t, onlineWorkload(seed), Options{})
		if res.Unplaced != 0 || res.Released == 0 {
			t.Fatalf("seed %d: unplaced %d, released %d", seed, res.Unplaced, res.Released)
		}
		t.Logf("seed %d: peak nodes used %d, peak lower bound %d", seed, res.NodesUsed, res.LowerBoundNodes)
		if float64(res.NodesUsed) > 1.15*float64(res.LowerBoundNodes) {
			t.Fatalf("seed %d: online packing: %d nodes used, lower bound %d (> 1.15x)", seed, res.NodesUsed, res.LowerBoundNodes)
		}
	}
}

func TestBuiltinsSmall(t *testing.T) {
	tests := []struct {
		name   string
		nodes  int
		k      int
		placed int
	}{
		{"w2", 300, 1, 1000},
		{"w5", 2000, 1, 7000},
		{"w5", 2000, 4, 7000},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%s-%d-k%d", tt.name, tt.nodes, tt.k), func(t *testing.T) {
			w, err := Builtin(tt.name, tt.nodes)
			if err != nil {
				t.Fatal(err)
			}
			if tt.name == "w5" {
				w.Requests[1].Repeat = 7000
			}
			res := run(t, w, Options{Schedulers: tt.k, Optimistic: tt.k > 1})
			if res.Placed != tt.placed {
				t.Fatalf("placed %d, want %d (unplaced %d: %s)", res.Placed, tt.placed, res.Unplaced, res.UnplacedReason)
			}
			if res.Requests == 0 || res.P99Micros <= 0 || res.LowerBoundNodes == 0 || res.PeakRSSBytes <= 0 {
				t.Fatalf("result not filled in: %+v", res)
			}
		})
	}
}

func TestW1OverflowReasons(t *testing.T) {
	// 100 nodes of 4 cpus take 4,000 instances of 0.1 cpu; 1,000 are
	// preplaced, so 3,000 of the 50,000 fit.
	w, _ := Builtin("w1", 100)
	res := run(t, w, Options{})
	if res.Placed != 3000 || res.Unplaced != 47000 {
		t.Fatalf("placed %d unplaced %d", res.Placed, res.Unplaced)
	}
	if res.UnplacedReason != "100 nodes: not enough cpu (reservations)" {
		t.Fatalf("reason %q", res.UnplacedReason)
	}
}

func TestParallelSchedulersNeverDoubleBook(t *testing.T) {
	for _, k := range []int{1, 2, 4, 8} {
		w, _ := Builtin("w5", 1500)
		// 1,500 nodes with 0.4 cpus free take 6,000 instances: ask for more.
		w.Requests[1].Repeat = 6500
		calls, last := 0, -1
		progress := func(done, total int) {
			if done < last || done > total {
				t.Errorf("progress %d of %d after %d", done, total, last)
			}
			calls, last = calls+1, done
		}
		res := run(t, w, Options{Schedulers: k, Optimistic: true, Seed: 1, Progress: progress})
		if calls == 0 || last != res.Requests {
			t.Fatalf("K=%d: %d progress calls, last %d of %d", k, calls, last, res.Requests)
		}
		if res.Placed != 6000 {
			t.Fatalf("K=%d: placed %d, want 6000 (%s)", k, res.Placed, res.UnplacedReason)
		}
		t.Logf("K=%d: conflicts %d (%.2f%%)", k, res.Conflicts, 100*res.ConflictRate)
	}
}

func TestDecodeErrors(t *testing.T) {
	tests := []struct {
		in, path string
	}{
		{`{"nodes": [{"count": 0, "cpus": 1, "memory": 1}], "requests": [{"image": "x"}]}`, "nodes[0].count"},
		{`{"nodes": [{"count": 1, "cpus": 1, "memory": 1}], "requests": [{"image": "x", "constraints": ["zone"]}]}`, "requests[0].constraints[0]"},
		{`{"nodes": [{"count": 1, "cpus": 1, "memory": 1}], "requests": [{"image": "x", "duration": -1}]}`, "requests[0].duration"},
		{`{"nodes": [{"count": 1, "cpus": 1, "memory": 1}], "requests": [{"image": "x", "count": 2, "essential": 3}]}`, "requests[0].essential"},
		{`{"nodes": [{"count": 1, "cpus": 1, "memory": 1}], "requests": []}`, "requests"},
	}
	for _, tt := range tests {
		_, err := Decode(strings.NewReader(tt.in))
		if !drivertest.HasField(err, tt.path) || !errors.Is(err, driver.ErrInvalid) {
			t.Errorf("%s: err %v, want field %s", tt.in, err, tt.path)
		}
	}
	_, err := Decode(strings.NewReader(`{"nodes": [{"count": 1, "cpus": 1, "memory": 1}], "requests": [{"image": "x", "colour": 1}]}`))
	if !errors.Is(err, driver.ErrInvalid) || !drivertest.HasField(err, "requests[0].colour") {
		t.Errorf("unknown field: %v, want ErrInvalid naming requests[0].colour", err)
	}
	for _, tt := range []struct{ in, path string }{
		{`{"nodes": [{"count": 1, "cpus": 1, "memory": 1}], "requests": [{"image": "x", "count": "two"}]}`, "requests[0].count"},
		{`{"nodes": [{"count": 1, "cpus": 1, "memory": 1}], "nodes": []}`, "nodes"},
		{`{"nodes": [{"count": 1, "cpus": 1, "memory": 1}]} {}`, "workload"},
		{``, "workload"},
	} {
		if _, err := Decode(strings.NewReader(tt.in)); !drivertest.HasField(err, tt.path) {
			t.Errorf("%q: %v, want an error naming %s", tt.in, err, tt.path)
		}
	}
	if _, err := Builtin("w9", 0); !errors.Is(err, driver.ErrInvalid) {
		t.Errorf("unknown builtin: %v", err)
	}
}

func TestRunStopsWithContext(t *testing.T) {
	w, _ := Builtin("w2", 100)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := Run(ctx, w, Options{}); !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
}

func TestQueueWaitsAndBackfills(t *testing.T) {
	w, err := Decode(strings.NewReader(`{
		"nodes": [{"count": 1, "cpus": 4, "memory": "8Gi"}],
		"requests": [
			{"image": "a", "cpus": 3, "memory": 512, "duration": 10},
			{"image": "b", "cpus": 3, "memory": 512, "arrival": 1, "duration": 5},
			{"image": "c", "cpus": 1, "memory": 512, "arrival": 2, "duration": 1},
			{"image": "d", "cpus": 8, "memory": 512, "arrival": 3}
		]}`))
	if err != nil {
		t.Fatal(err)
	}
	// Without a queue b and d are dropped.
	res := run(t, w, Options{})
	if res.Placed != 2 || res.Unplaced != 2 {
		t.Fatalf("no queue: placed %d unplaced %d", res.Placed, res.Unplaced)
	}
	// With one, c is backfilled past b at once, b runs when a leaves at 10
	// (after waiting 9 s), and d (8 cpus on a 4-cpu node) never runs.
	res = run(t, w, Options{Queue: scheduler.PolicyFIFO})
	if res.Placed != 3 || res.Unplaced != 1 || res.Queued != 2 || res.QueueLeft != 1 {
		t.Fatalf("queue: %+v", res)
	}
	if res.WaitMaxSecs != 9 || res.WaitP50Secs != 9 {
		t.Fatalf("waits p50 %v max %v, want 9 s", res.WaitP50Secs, res.WaitMaxSecs)
	}
	if res.UnplacedReason != "1 requests still queued when the workload ended" {
		t.Fatalf("reason %q", res.UnplacedReason)
	}
	if _, err := Run(context.Background(), w, Options{Queue: "lifo"}); !errors.Is(err, driver.ErrInvalid) {
		t.Fatalf("bad policy: %v", err)
	}
	if _, err := Run(context.Background(), w, Options{Queue: scheduler.PolicySize, Schedulers: 2}); !errors.Is(err, driver.ErrInvalid) {
		t.Fatalf("queue with two schedulers: %v", err)
	}
}

func TestElasticEvictionInLedger(t *testing.T) {
	// A low priority gang with elastic instances fills the node; a high
	// priority gang evicts some. The ledger must follow, or it would see a
	// double booking.
	w, err := Decode(strings.NewReader(`{
		"nodes": [{"count": 2, "cpus": 4, "memory": "8Gi"}],
		"requests": [
			{"image": "low", "cpus": 1, "memory": 256, "count": 8, "essential": 2, "priority": 1},
			{"image": "high", "cpus": 3, "memory": 256, "count": 2, "essential": 2, "priority": 5, "arrival": 1}
		]}`))
	if err != nil {
		t.Fatal(err)
	}
	res := run(t, w, Options{})
	if res.Placed != 10 || res.Evicted != 6 || res.Unplaced != 0 {
		t.Fatalf("placed %d evicted %d unplaced %d", res.Placed, res.Evicted, res.Unplaced)
	}
}

// TestDocExamples decodes and runs every JSON workload in docs/sim.md, so
// that the guide never shows a file berth sim would refuse.
func TestDocExamples(t *testing.T) {
	doc, err := os.ReadFile("../docs/sim.md")
	if err != nil {
		t.Fatal(err)
	}
	blocks := 0
	for _, part := range strings.Split(string(doc), "```json")[1:] {
		src, _, _ := strings.Cut(part, "```")
		w, err := Decode(strings.NewReader(src))
		if err != nil {
			t.Fatalf("example %d: %v", blocks, err)
		}
		run(t, w, Options{})
		blocks++
	}
	if blocks < 2 {
		t.Fatalf("found %d JSON examples in docs/sim.md", blocks)
	}
}
