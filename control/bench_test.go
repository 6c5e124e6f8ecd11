package control_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/berth-dev/berth/control"
	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/reconciler"
	"github.com/berth-dev/berth/store"
	"github.com/berth-dev/berth/store/bolt"
)

func benchStores(b *testing.B) map[string]func() store.Store {
	return map[string]func() store.Store{
		"memory": func() store.Store { return newMemory() },
		"bolt": func() store.Store {
			st, err := bolt.Open(filepath.Join(b.TempDir(), "berth.db"), bolt.Options{})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { st.Close() })
			return st
		},
	}
}

// BenchmarkSubmit measures Submit (validate, place, commit placement and
// intent in one transaction) on a 1,000-node sim cluster with the
// reconciler running, and reports the latency percentiles.
func BenchmarkSubmit(b *testing.B) {
	for _, name := range []string{"memory", "bolt"} {
		b.Run(name, func(b *testing.B) {
			_, prov := newSim(&testing.T{}, 1000, nil)
			defer prov.Close(context.Background())
			cfg := config(benchStores(b)[name](), prov)
			cfg.SyncInterval = time.Second
			p, err := control.New(context.Background(), cfg)
			if err != nil {
				b.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- p.Run(ctx) }()
			lat := make([]time.Duration, 0, b.N)
			r := req("", 1)
			r.CPU = driver.CPUs(0.01)
			r.Memory = driver.MiB
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				r.ID = fmt.Sprintf("b%d", i)
				t0 := time.Now()
				if _, err := p.Submit(ctx, r, ""); err != nil {
					b.Fatal(err)
				}
				lat = append(lat, time.Since(t0))
			}
			b.StopTimer()
			cancel()
			<-done
			slices.Sort(lat)
			b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50_us")
			b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99_us")
		})
	}
}

// BenchmarkEndToEnd submits groups of requests and waits until every
// instance runs on the sim: API call → scheduler → store → reconciler →
// back-end. It reports instances per second.
func BenchmarkEndToEnd(b *testing.B) {
	const perRequest = 1000
	for _, name := range []string{"memory", "bolt"} {
		b.Run(name, func(b *testing.B) {
			_, prov := newSim(&testing.T{}, 5000, nil)
			defer prov.Close(context.Background())
			cfg := config(benchStores(b)[name](), prov)
			cfg.SyncInterval = time.Second
			cfg.Workers = benchWorkers
			cfg.LaunchTimeout = 5 * time.Minute
			if n, err := strconv.Atoi(os.Getenv("BERTH_BENCH_WRITERS")); err == nil {
				cfg.Writers = n
			}
			p, err := control.New(context.Background(), cfg)
			if err != nil {
				b.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- p.Run(ctx) }()
			r := req("", perRequest)
			r.CPU = driver.CPUs(0.001)
			r.Memory = driver.MiB
			b.ResetTimer()
			t0 := time.Now()
			for i := 0; i < b.N; i++ {
				r.ID = fmt.Sprintf("g%d", i)
				if _, err := p.Submit(ctx, r, ""); err != nil {
					b.Fatal(err)
				}
			}
			for {
				c, _ := p.Counts(ctx)
				if c[reconciler.Running] == b.N*perRequest {
					break
				}
				time.Sleep(10 * time.Millisecond)
			}
			el := time.Since(t0)
			b.StopTimer()
			cancel()
			<-done
			b.ReportMetric(float64(b.N*perRequest)/el.Seconds(), "instances/s")
		})
	}
}

// BenchmarkPlaceRound measures the placer's round over 4,000 waiting
// single-instance requests (half a cpu each) on a 1,000-node sim cluster
// of 4-cpu nodes: for each request, the plan, the ledger's commit and the
// store transaction that records it. Services spread, so schedulers
// sharing the round rarely meet; batch work packs, so they all aim at the
// same nodes and conflict. The requests are submitted while every node is
// offline, which keeps them waiting; the round starts once the nodes are
// back and Run is not running, so nothing else competes. It reports
// placements per second of the rounds alone and the conflicts per round,
// for one scheduler and for several sharing the round.
func BenchmarkPlaceRound(b *testing.B) {
	for _, typ := range []driver.WorkloadType{driver.TypeService, driver.TypeBatch} {
		for _, k := range []int{1, 2, 4} {
			b.Run(fmt.Sprintf("%s/schedulers=%d", typ, k), func(b *testing.B) {
				benchPlaceRound(b, 1000, 4000, typ, k)
			})
		}
	}
}

func benchPlaceRound(b *testing.B, nodes, requests int, typ driver.WorkloadType, k int) {
	ctx := context.Background()
	var took time.Duration
	var placed int
	var conflicts uint64
	for range b.N {
		b.StopTimer()
		s, prov := newSim(&testing.T{}, nodes, nil)
		names := make([]string, 0, nodes)
		for _, n := range simNodes(&testing.T{}, s) {
			names = append(names, n.Name)
			if err := s.SetNodeStatus(n.Name, driver.NodeOffline, "bench"); err != nil {
				b.Fatal(err)
			}
		}
		cfg := config(newMemory(), prov)
		cfg.Schedulers = k
		p, err := control.New(ctx, cfg)
		if err != nil {
			b.Fatal(err)
		}
		for i := range requests {
			r := req(fmt.Sprintf("r%d", i), 1)
			r.Type = typ
			if _, err := p.Submit(ctx, r, ""); err != nil {
				b.Fatal(err)
			}
		}
		for _, n := range names {
			if err := s.SetNodeStatus(n, driver.NodeOnline, ""); err != nil {
				b.Fatal(err)
			}
		}
		time.Sleep(5 * time.Millisecond) // past the provider's state cache
		p.RefreshNodes(ctx)
		b.StartTimer()
		t0 := time.Now()
		p.PlaceOnce(ctx)
		took += time.Since(t0)
		b.StopTimer()
		st, err := p.Scheduler(ctx)
		if err != nil {
			b.Fatal(err)
		}
		c, _ := p.Counts(ctx)
		if c[reconciler.Pending] != 0 {
			b.Fatalf("%d instances still pending after the round", c[reconciler.Pending])
		}
		placed += requests
		conflicts += st.Conflicts
		_ = prov.Close(ctx)
	}
	b.ReportMetric(float64(placed)/took.Seconds(), "placements/s")
	b.ReportMetric(float64(conflicts)/float64(b.N), "conflicts/round")
}

// benchWorkers is the reconciler's worker count in the benchmarks.
var benchWorkers = func() int {
	if n, err := strconv.Atoi(os.Getenv("BERTH_BENCH_WORKERS")); err == nil {
		return n
	}
	return 4
}()
