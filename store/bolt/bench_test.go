package bolt

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/berth-dev/berth/store"
)

// benchTxn measures create-if-absent Txns of a 256-byte value and reports
// the latency percentiles of individual Txns.
func benchTxn(b *testing.B, opts Options, parallel bool) {
	s := openTemp(b, opts)
	defer s.Close()
	ctx := context.Background()
	value := make([]byte, 256)
	var mu sync.Mutex
	var lat []time.Duration
	var seq int64
	one := func(n int64, local *[]time.Duration) {
		key := fmt.Sprintf("/bench/%012d", n)
		start := time.Now()
		res, err := s.Txn(ctx, []store.Cmp{{Key: key}}, []store.Op{store.Put(key, value)})
		*local = append(*local, time.Since(start))
		if err != nil || !res.Succeeded {
			b.Errorf("Txn: %+v %v", res, err)
		}
	}
	b.ResetTimer()
	if parallel {
		b.SetParallelism(16)
		b.RunParallel(func(pb *testing.PB) {
			var local []time.Duration
			for pb.Next() {
				mu.Lock()
				seq++
				n := seq
				mu.Unlock()
				one(n, &local)
			}
			mu.Lock()
			lat = append(lat, local...)
			mu.Unlock()
		})
	} else {
		for i := 0; b.Loop(); i++ {
			one(int64(i), &lat)
		}
	}
	b.StopTimer()
	slices.Sort(lat)
	if len(lat) > 0 {
		b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
		b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
	}
}

func BenchmarkTxnSequential(b *testing.B) { benchTxn(b, Options{}, false) }

func BenchmarkTxnParallel(b *testing.B) { benchTxn(b, Options{}, true) }

func BenchmarkTxnParallelNoGroupCommit(b *testing.B) {
	benchTxn(b, Options{NoGroupCommit: true}, true)
}

// BenchmarkList100k lists 100,000 keys of 256 bytes each.
func BenchmarkList100k(b *testing.B) {
	s := openTemp(b, Options{})
	defer s.Close()
	ctx := context.Background()
	value := make([]byte, 256)
	const n, per = 100_000, 1000
	for i := 0; i < n; i += per {
		ops := make([]store.Op, per)
		for j := range ops {
			ops[j] = store.Put(fmt.Sprintf("/instances/%08d", i+j), value)
		}
		if _, err := s.Txn(ctx, nil, ops); err != nil {
			b.Fatal(err)
		}
	}
	if _, err := s.Txn(ctx, nil, []store.Op{store.Put("/other", value)}); err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		kvs, _, err := s.List(ctx, "/instances/")
		if err != nil || len(kvs) != n {
			b.Fatalf("List: %d keys, %v", len(kvs), err)
		}
	}
}
