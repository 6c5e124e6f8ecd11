package plugin_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/driver/plugin"
	"github.com/berth-dev/berth/drivers/sim"
	"github.com/berth-dev/berth/provider"
	"github.com/berth-dev/berth/simulate"
)

// w1Options are the nodes of workload w1: 5,000 nodes of 4 cpus, 32 GiB
// and 110 instances.
func w1Options() map[string]any {
	return map[string]any{"pools": `[{"count": 5000, "name_prefix": "n", "cpus": 4, "memory": "32Gi", "max_instances": 110}]`}
}

// BenchmarkCreates makes w1's instances (0.1 cpu, 500 MiB) through the
// provider wrapper, 16 launches at a time as the reconciler's launch loop
// runs them, on the sim in process and on the same sim served by the
// example plugin. It reports creates per second.
func BenchmarkCreates(b *testing.B) {
	ctx := context.Background()
	open := map[string]func(b *testing.B) driver.Driver{
		"in-process": func(b *testing.B) driver.Driver {
			def, err := driver.Lookup("sim")
			if err != nil {
				b.Fatal(err)
			}
			d, err := def.Open(ctx, w1Options(), driver.Env{})
			if err != nil {
				b.Fatal(err)
			}
			return d
		},
		"plugin": func(b *testing.B) driver.Driver { return openSim(b, w1Options(), plugin.Config{}) },
	}
	for _, name := range []string{"in-process", "plugin"} {
		b.Run(name, func(b *testing.B) {
			d := open[name](b)
			p, err := provider.New(d, provider.Config{Name: "bench"})
			if err != nil {
				b.Fatal(err)
			}
			defer p.Close(ctx)
			st, err := p.State(ctx)
			if err != nil {
				b.Fatal(err)
			}
			const workers = 16
			var next atomic.Int64
			var wg sync.WaitGroup
			b.ResetTimer()
			start := time.Now()
			for range workers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for {
						i := int(next.Add(1)) - 1
						if i >= b.N {
							return
						}
						spec := &driver.Spec{Name: fmt.Sprintf("b%d", i), Image: "berth/sim",
							Resources: driver.Resources{CPU: driver.CPUs(0.1), Memory: 500 * driver.MiB},
							Tags:      map[string]string{driver.TagManaged: "true"}}
						op, err := p.Create(ctx, st.Nodes[i%len(st.Nodes)].Name, spec)
						if err == nil {
							_, err = driver.Drive(ctx, op)
						}
						if err != nil {
							b.Error(err)
							return
						}
					}
				}()
			}
			wg.Wait()
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "creates/s")
		})
	}
}

// BenchmarkW1Full replays workload w1 through the whole control plane
// (simulate.PathFull, memory store): 50,000 creates on the sim in
// process, then on the sim served by the example plugin. Run it once, with
// -benchtime 1x.
func BenchmarkW1Full(b *testing.B) {
	backends := map[string]func(ctx context.Context, nodes []sim.Pool) (driver.Driver, error){
		"in-process": nil,
		"plugin": func(ctx context.Context, nodes []sim.Pool) (driver.Driver, error) {
			pools, err := json.Marshal(nodes)
			if err != nil {
				return nil, err
			}
			return openSim(b, map[string]any{"pools": string(pools)}, plugin.Config{}), nil
		},
	}
	for _, name := range []string{"in-process", "plugin"} {
		b.Run(name, func(b *testing.B) {
			w, err := simulate.Builtin("w1", 0)
			if err != nil {
				b.Fatal(err)
			}
			var last *simulate.Result
			for b.Loop() {
				last, err = simulate.Run(context.Background(), w, simulate.Options{Path: simulate.PathFull, Backend: backends[name]})
				if err != nil {
					b.Fatal(err)
				}
			}
			p := last.PlaneResult
			if p.Failed != 0 || p.Misplaced != 0 || last.Unplaced != 0 || last.DoubleBooked != 0 {
				b.Fatalf("%d failed, %d misplaced, %d unplaced, %d double-booked", p.Failed, p.Misplaced, last.Unplaced, last.DoubleBooked)
			}
			b.ReportMetric(last.PlacementsPerSec, "placements/s")
			b.ReportMetric(p.SecondsToRunning, "s_to_running")
			b.ReportMetric(float64(p.Running), "running")
			b.ReportMetric(float64(p.Running)/p.SecondsToRunning, "creates/s")
		})
	}
}
