package simulate

import (
	"context"
	"fmt"
	"testing"
)

func benchWorkload(b *testing.B, name string, nodes int, opt Options) {
	w, err := Builtin(name, nodes)
	if err != nil {
		b.Fatal(err)
	}
	var last *Result
	for b.Loop() {
		last, err = Run(context.Background(), w, opt)
		if err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(last.PlacementsPerSec, "placements/s")
	b.ReportMetric(last.P50Micros, "p50_us")
	b.ReportMetric(last.P99Micros, "p99_us")
	b.ReportMetric(float64(last.NodesUsed), "nodes_used")
	b.ReportMetric(float64(last.LowerBoundNodes), "lower_bound")
	b.ReportMetric(float64(last.Conflicts), "conflicts")
	b.ReportMetric(float64(last.DoubleBooked), "double_booked")
	b.ReportMetric(float64(last.PeakRSSBytes)/(1<<20), "peak_rss_MiB")
	if p := last.PlaneResult; p != nil {
		b.ReportMetric(p.SecondsToRunning, "s_to_running")
		b.ReportMetric(float64(p.Running), "running")
		b.ReportMetric(float64(p.CapacityRefusals), "capacity_refusals")
		b.ReportMetric(float64(p.Misplaced), "misplaced")
		if p.Failed != 0 || p.CapacityRefusals != 0 || p.Misplaced != 0 || last.Unplaced != 0 {
			b.Fatalf("full path: %d failed, %d refused for capacity, %d misplaced, %d unplaced (%s)", p.Failed, p.CapacityRefusals, p.Misplaced, last.Unplaced, last.UnplacedReason)
		}
	}
	if last.DoubleBooked != 0 {
		b.Fatalf("%d nodes double-booked", last.DoubleBooked)
	}
}

func BenchmarkW1(b *testing.B) { benchWorkload(b, "w1", 0, Options{}) }
func BenchmarkW2(b *testing.B) { benchWorkload(b, "w2", 0, Options{}) }
func BenchmarkW3(b *testing.B) { benchWorkload(b, "w3", 0, Options{}) }
func BenchmarkW5(b *testing.B) {
	for _, k := range []int{1, 2, 4, 8} {
		b.Run(fmt.Sprintf("K=%d", k), func(b *testing.B) { benchWorkload(b, "w5", 0, Options{Schedulers: k, Optimistic: true}) })
	}
}

// BenchmarkFull replays w1 (with each store) and w3 (in memory) through
// the whole control plane (see PathFull). Run one at a time with
// -benchtime 1x: w3 places a million instances.
func BenchmarkFull(b *testing.B) {
	for _, c := range []struct{ name, store string }{{"w1", StoreMemory}, {"w1", StoreBolt}, {"w3", StoreMemory}} {
		b.Run(c.name+"/"+c.store, func(b *testing.B) { benchWorkload(b, c.name, 0, Options{Path: PathFull, Store: c.store}) })
	}
}

// BenchmarkSampling measures what bounded sampling costs in packing: the
// ratio of nodes used to the lower bound, for batch work arriving online,
// scoring every feasible node (sample 0) or only a few.
func BenchmarkSampling(b *testing.B) {
	for _, k := range []int{0, 2, 8, 64} {
		b.Run(fmt.Sprintf("sample=%d", k), func(b *testing.B) {
			var last *Result
			for b.Loop() {
				var err error
				last, err = Run(context.Background(), onlineWorkload(1), Options{Sample: k, Seed: 1})
				if err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(last.PackingRatio, "used/bound")
			b.ReportMetric(last.PlacementsPerSec, "placements/s")
			b.ReportMetric(float64(last.Unplaced), "unplaced")
		})
	}
}
