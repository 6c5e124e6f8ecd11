package memory

import (
	"context"
	"fmt"
	"runtime"
	"testing"

	"github.com/berth-dev/berth/store"
)

// BenchmarkHeapPerKey puts a million keys shaped like the control plane's
// instance records, with values of about 130 bytes, a thousand per Txn, and
// reports the live heap the store holds per key, its history included.
func BenchmarkHeapPerKey(b *testing.B) {
	const keys, batch = 1_000_000, 1000
	ctx := context.Background()
	for b.Loop() {
		before := liveHeap()
		s := New(Options{})
		ops := make([]store.Op, 0, batch)
		for g := range keys / batch {
			ops = ops[:0]
			for i := range batch {
				key := fmt.Sprintf("/berth/instances/g%04d.s-%06d", g, i)
				value := fmt.Appendf(nil, `{"id":"g%04d.s-%06d","group":"g%04d","node":"sim-%05d","state":"running","resources":{"cpu":500,"memory":268435456},"seq":%d}`, g, i, g, i%4096, g*batch+i)
				ops = append(ops, store.Put(key, value))
			}
			if _, err := s.Txn(ctx, nil, ops); err != nil {
				b.Fatal(err)
			}
		}
		clear(ops)
		b.ReportMetric(float64(liveHeap()-before)/keys, "B/key")
		s.Close()
	}
}

// liveHeap returns the bytes of live heap objects after a full collection.
func liveHeap() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}
