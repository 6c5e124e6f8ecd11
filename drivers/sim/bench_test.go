package sim_test

import (
	"context"
	"fmt"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/drivers/sim"
)

// benchSim opens a sim of nodes nodes big enough for perNode instances of
// 0.1 cpu and 256 MiB each.
func benchSim(b *testing.B, nodes, perNode int) *sim.Sim {
	opts := sim.DefaultOptions()
	opts.Nodes = nodes
	opts.Shape = sim.Shape{
		Resources:    driver.Resources{CPU: driver.CPUs(float64(perNode)/10 + 1), Memory: driver.Bytes(perNode+4) * 256 * driver.MiB},
		MaxInstances: perNode + 10,
		Images:       []string{"app:1"},
	}
	opts.StrictImages = true
	s, err := sim.New(*opts)
	if err != nil {
		b.Fatal(err)
	}
	return s
}

// benchSpec is the spec of instance i, built the way the control plane
// builds one: named after its Berth id, which its instance tag carries.
func benchSpec(i int) *driver.Spec {
	id := "i" + strconv.Itoa(i)
	return &driver.Spec{
		Name:      id,
		Image:     "app:1",
		Resources: driver.Resources{CPU: 100, Memory: 256 * driver.MiB},
		Tags: map[string]string{
			driver.TagManaged:  "true",
			driver.TagCluster:  "bench",
			driver.TagProvider: "sim",
			driver.TagInstance: id,
		},
	}
}

// createAll creates instances [from, to) round-robin on nodes and advances
// each create until it is done.
func createAll(ctx context.Context, s *sim.Sim, nodeNames []string, from, to int) error {
	for i := from; i < to; i++ {
		op, err := s.Create(ctx, nodeNames[i%len(nodeNames)], benchSpec(i))
		if err != nil {
			return err
		}
		p, err := op.Advance(ctx)
		if err != nil {
			return err
		}
		if !p.Done {
			return fmt.Errorf("create %d not done on the first Advance", i)
		}
	}
	return nil
}

func nodeNames(b *testing.B, s *sim.Sim) []string {
	st, err := s.State(context.Background())
	if err != nil {
		b.Fatal(err)
	}
	names := make([]string, len(st.Nodes))
	for i, n := range st.Nodes {
		names[i] = n.Name
	}
	return names
}

// peakHeap samples the live heap every few milliseconds until stop is
// closed and returns the largest reading.
func peakHeap(stop <-chan struct{}) <-chan uint64 {
	out := make(chan uint64, 1)
	go func() {
		var peak uint64
		var ms runtime.MemStats
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			runtime.ReadMemStats(&ms)
			peak = max(peak, ms.HeapInuse)
			select {
			case <-stop:
				runtime.ReadMemStats(&ms)
				out <- max(peak, ms.HeapInuse)
				return
			case <-tick.C:
			}
		}
	}()
	return out
}

// cpuTime returns the processor time the process has used, user and
// system, so that a run on a busy machine can be read beside its wall time.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkCreate1M creates 1,000,000 instances on 5,000 nodes with zero
// latency, one Create and one Advance each, from one goroutine and from one
// per processor (as the reconciler drives creates from a few goroutines).
// It reports the time per create, the seconds for the million, the
// processor time, the peak in-use heap, the live heap the sim keeps per
// instance and the memory the process got from the OS.
func BenchmarkCreate1M(b *testing.B) {
	for _, workers := range []int{1, runtime.GOMAXPROCS(0)} {
		b.Run(fmt.Sprintf("workers=%d", workers), func(b *testing.B) { benchCreate1M(b, workers) })
	}
}

func benchCreate1M(b *testing.B, workers int) {
	const nodes, total = 5_000, 1_000_000
	for b.Loop() {
		runtime.GC()
		var before runtime.MemStats
		runtime.ReadMemStats(&before)
		stop := make(chan struct{})
		peak := peakHeap(stop)
		cpu0 := cpuTime()
		start := time.Now()
		s := benchSim(b, nodes, total/nodes)
		names := nodeNames(b, s)
		errs := make(chan error, workers)
		for w := range workers {
			go func() { errs <- createAll(context.Background(), s, names, w*total/workers, (w+1)*total/workers) }()
		}
		for range workers {
			if err := <-errs; err != nil {
				b.Fatal(err)
			}
		}
		elapsed := time.Since(start)
		cpu := cpuTime() - cpu0
		close(stop)
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		var live runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&live)
		b.ReportMetric(float64(live.HeapAlloc-before.HeapAlloc)/total, "live-B/instance")
		b.ReportMetric(float64(elapsed.Nanoseconds())/total, "ns/create")
		b.ReportMetric(elapsed.Seconds(), "s/1M")
		b.ReportMetric(cpu.Seconds(), "cpu-s/1M")
		b.ReportMetric(float64(<-peak)/(1<<20), "peak-heap-MiB")
		b.ReportMetric(float64(ms.Sys)/(1<<20), "sys-MiB")
		b.ReportMetric(float64(ms.Mallocs-before.Mallocs)/total, "allocs/create")
		b.ReportMetric(float64(ms.TotalAlloc-before.TotalAlloc)/total, "B/create")
		b.ReportMetric(float64(ms.NumGC-before.NumGC), "gc-cycles")
		st, err := s.State(context.Background())
		if err != nil {
			b.Fatal(err)
		}
		count := 0
		for _, n := range st.Nodes {
			count += n.Instances
		}
		if count != total {
			b.Fatalf("State counts %d instances, want %d", count, total)
		}
		runtime.KeepAlive(s)
	}
}

// BenchmarkCreateDelete measures one create and one delete on a cluster that
// already runs 100,000 instances on 5,000 nodes.
func BenchmarkCreateDelete(b *testing.B) {
	s := benchSim(b, 5_000, 25)
	names := nodeNames(b, s)
	ctx := context.Background()
	if err := createAll(ctx, s, names, 0, 100_000); err != nil {
		b.Fatal(err)
	}
	i := 100_000
	for b.Loop() {
		op, err := s.Create(ctx, names[i%len(names)], benchSpec(i))
		if err != nil {
			b.Fatal(err)
		}
		p, err := op.Advance(ctx)
		if err != nil {
			b.Fatal(err)
		}
		dop, err := s.Delete(ctx, p.Instance.ID)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := dop.Advance(ctx); err != nil {
			b.Fatal(err)
		}
		i++
	}
}

// BenchmarkCreateParallel creates instances from GOMAXPROCS goroutines at
// once, to show what the sim's single lock costs under contention.
func BenchmarkCreateParallel(b *testing.B) {
	s := benchSim(b, 5_000, 300)
	names := nodeNames(b, s)
	ctx := context.Background()
	var next atomic.Int64
	var once sync.Once
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			i := int(next.Add(1))
			op, err := s.Create(ctx, names[i%len(names)], benchSpec(i))
			if err == nil {
				_, err = op.Advance(ctx)
			}
			if err != nil {
				once.Do(func() { b.Error(err) })
				return
			}
		}
	})
}
