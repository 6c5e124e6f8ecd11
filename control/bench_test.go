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

// benchWorkers is the reconciler's worker count in the benchmarks.
var benchWorkers = func() int {
	if n, err := strconv.Atoi(os.Getenv("BERTH_BENCH_WORKERS")); err == nil {
		return n
	}
	return 4
}()
