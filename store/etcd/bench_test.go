package etcd_test

import (
	"context"
	"flag"
	"fmt"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/berth-dev/berth/store"
	"github.com/berth-dev/berth/store/etcd"
	"github.com/berth-dev/berth/store/etcd/etcdtest"
)

var w3Records = flag.Int("w3-records", 1_000_000, "records BenchmarkW3Writes writes")

// BenchmarkW3Writes writes what the control plane writes for workload w3
// (api's BenchmarkW3EndToEnd), with no plane: -w3-records records of the
// size of an instance's (a 24-byte key, a 75-byte value), each written
// twice, as an admission stores it and as its launch's outcome updates
// it. The admissions are transactions of 1,000 new records, four at a
// time, each compared as new; the updates are transactions of 500, four
// at a time, each compared at its revision. The three members run in
// this process with fsync on and the servers' Raft timings, so that
// cpu_s is the CPU time of the whole cluster and its client: the floor
// of the end-to-end figure on this store. Run with -benchtime 1x.
func BenchmarkW3Writes(b *testing.B) {
	st := threeMembers(b)
	ctx := context.Background()
	value := []byte(strings.Repeat("v", 75))
	n := *w3Records
	for b.Loop() {
		var before syscall.Rusage
		_ = syscall.Getrusage(syscall.RUSAGE_SELF, &before)
		start := time.Now()
		revs := make([]int64, n)
		write := func(batch, offset int, ops func(i int) (store.Cmp, store.Op)) {
			var wg sync.WaitGroup
			next := make(chan int)
			for range 4 {
				wg.Go(func() {
					for first := range next {
						last := min(first+batch, n)
						cmps := make([]store.Cmp, 0, last-first)
						puts := make([]store.Op, 0, last-first)
						for i := first; i < last; i++ {
							c, o := ops(i)
							cmps, puts = append(cmps, c), append(puts, o)
						}
						res, err := st.Txn(ctx, cmps, puts)
						if err != nil || !res.Succeeded {
							b.Errorf("records %d to %d: %v, succeeded %t", first+offset, last+offset, err, res.Succeeded)
							continue
						}
						for i := first; i < last; i++ {
							revs[i] = res.Revision
						}
					}
				})
			}
			for first := 0; first < n && !b.Failed(); first += batch {
				next <- first
			}
			close(next)
			wg.Wait()
		}
		key := func(i int) string { return fmt.Sprintf("/instances/g%03d.s.%06d", i/1000, i%1000) }
		write(1000, 0, func(i int) (store.Cmp, store.Op) {
			return store.Cmp{Key: key(i)}, store.Put(key(i), value)
		})
		admitted := time.Since(start)
		write(500, n, func(i int) (store.Cmp, store.Op) {
			return store.Cmp{Key: key(i), ModRevision: revs[i]}, store.Put(key(i), value)
		})
		elapsed := time.Since(start)
		var after syscall.Rusage
		_ = syscall.Getrusage(syscall.RUSAGE_SELF, &after)
		cpu := time.Duration(after.Utime.Nano() + after.Stime.Nano() - before.Utime.Nano() - before.Stime.Nano())
		b.ReportMetric(admitted.Seconds(), "admitted_s")
		b.ReportMetric(elapsed.Seconds(), "written_s")
		b.ReportMetric(cpu.Seconds(), "cpu_s")
		b.ReportMetric(float64(n), "records")
	}
}

// threeMembers starts three etcd members in this process, with fsync on
// and the servers' Raft timings, and returns a Store on a client of the
// first.
func threeMembers(b *testing.B) store.Store {
	members, _ := startMembers(b, []string{"a", "b", "c"}, func(c *etcd.MemberConfig) {
		c.Heartbeat, c.ElectionTimeout = etcd.DefaultHeartbeat, etcd.DefaultElectionTimeout
	})
	// Run last, once the members are closed.
	b.Cleanup(func() { etcdtest.AwaitClosed(b) })
	for _, m := range members {
		b.Cleanup(m.Close)
	}
	st := etcd.New(etcdtest.Client(b, members[0]), etcd.Options{})
	b.Cleanup(func() { _ = st.Close() })
	return st
}
