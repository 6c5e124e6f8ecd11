package control_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/berth-dev/berth/control"
	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/drivers/sim"
	"github.com/berth-dev/berth/provider"
	"github.com/berth-dev/berth/reconciler"
	"github.com/berth-dev/berth/scheduler"
	"github.com/berth-dev/berth/store/memory"
)

// steady is a sim whose instances always measure cpu cpus and 256 MiB.
type steady struct {
	*sim.Sim
	cpu   driver.MilliCPU
	calls atomic.Int64
}

func (s *steady) Usage(ctx context.Context, id string) (*driver.Usage, error) {
	if _, err := s.Sim.Usage(ctx, id); err != nil {
		return nil, err
	}
	s.calls.Add(1)
	return &driver.Usage{CPU: s.cpu, Memory: 256 * driver.MiB, Time: time.Now()}, nil
}

// newSteady is newSim (one node of 4 cpus / 8 GiB) measuring cpu per
// instance; the node admits twice its capacity in reservations.
func newSteady(t *testing.T, cpu driver.MilliCPU) (*steady, *provider.Provider) {
	t.Helper()
	opts := *sim.DefaultOptions()
	opts.Nodes = 1
	opts.Shape = sim.Shape{Resources: driver.Resources{CPU: driver.CPUs(4), Memory: 8 * driver.GiB}}
	opts.Overcommit = 2
	s, err := sim.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	d := &steady{Sim: s, cpu: cpu}
	p, err := provider.New(d, provider.Config{Name: "sim", Logger: quiet, StateTTL: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close(context.Background()) })
	return d, p
}

func cpuReq(id string, cpus float64) scheduler.Request {
	r := req(id, 1)
	r.CPU = driver.CPUs(cpus)
	return r
}

// TestUsageIsCollectedAndReachesPlacement: the usage loop samples the
// running instances into a bounded ring, the node's sum reaches the
// scheduler and the nodes view, and under the usage policy a node whose
// cpus are all reserved but idle takes one more instance, which the default
// policy refuses.
func TestUsageIsCollectedAndReachesPlacement(t *testing.T) {
	for _, policy := range []string{scheduler.PolicyReservations, scheduler.PolicyUsage} {
		t.Run(policy, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				d, prov := newSteady(t, driver.CPUs(0.2))
				cfg := config(memory.New(memory.Options{}), prov)
				cfg.UsageInterval = 100 * time.Millisecond
				want := "reservations"
				if policy == scheduler.PolicyUsage {
					cfg.Overcommit = map[string]scheduler.Overcommit{"sim": {Policy: policy, Ratio: 2}}
					want = "usage, ratio 2, headroom 0"
				}
				p, _ := start(t, cfg)
				ctx := context.Background()
				if _, err := p.Submit(ctx, cpuReq("full", 4), ""); err != nil {
					t.Fatal(err)
				}
				waitPhase(t, p, "full", reconciler.Running)

				// More rounds than the ring holds: only the newest are kept.
				waitFor(t, "more samples than the ring holds", func() bool { return d.calls.Load() > control.UsageSamples+5 })
				hist, err := p.UsageHistory(ctx, "full")
				if err != nil {
					t.Fatal(err)
				}
				if len(hist) != control.UsageSamples {
					t.Fatalf("%d samples kept, want %d", len(hist), control.UsageSamples)
				}
				for k := 1; k < len(hist); k++ {
					if !hist[k].Time.After(hist[k-1].Time) || hist[k].CPU != driver.CPUs(0.2) {
						t.Fatalf("samples out of order or wrong: %+v then %+v", hist[k-1], hist[k])
					}
				}

				nodes, err := p.Nodes(ctx)
				if err != nil || len(nodes) != 1 {
					t.Fatalf("nodes %+v %v", nodes, err)
				}
				n := nodes[0]
				if n.Measured == nil || n.Measured.CPU != driver.CPUs(0.2) || n.Measured.MemoryBytes != int64(256*driver.MiB) || n.Measured.Sampled != 1 || n.Overcommit != want {
					t.Fatalf("node %+v, measured %+v", n, n.Measured)
				}

				ans, err := p.Submit(ctx, cpuReq("more", 1), "")
				if err != nil {
					t.Fatal(err)
				}
				in := ans.Instances[0]
				if policy == scheduler.PolicyUsage {
					if in.Node == nil {
						t.Fatalf("usage policy: %q, want placed", in.Instance.Message)
					}
					waitPhase(t, p, "more", reconciler.Running)
				} else if in.Node != nil || !strings.Contains(in.Instance.Message, "not enough cpu (reservations)") {
					t.Fatalf("default policy: node %v, message %q", in.Node, in.Instance.Message)
				}

				// A deleted instance's samples go with it.
				if err := p.Delete(ctx, "full"); err != nil {
					t.Fatal(err)
				}
				waitPhase(t, p, "full", reconciler.Deleted)
				waitFor(t, "the samples of a deleted instance to go", func() bool {
					h, err := p.UsageHistory(ctx, "full")
					return err == nil && len(h) == 0
				})
			})
		})
	}
}

func TestBadOvercommitIsRefused(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		_, prov := newSim(t, 1, nil)
		cfg := config(memory.New(memory.Options{}), prov)
		cfg.Overcommit = map[string]scheduler.Overcommit{"sim": {Policy: "usage", Ratio: 20}, "nope": {}}
		_, err := control.New(context.Background(), cfg)
		if err == nil || !strings.Contains(err.Error(), "overcommit[sim].ratio") || !strings.Contains(err.Error(), "overcommit[nope]") {
			t.Fatalf("New: %v, want errors naming overcommit[sim].ratio and overcommit[nope]", err)
		}
	})
}

// TestUsageRoundsAreBounded: with more instances than a round measures,
// a round asks for UsagePerRound of them, the next rounds for the rest in
// turn, and the node's measured use counts every instance by its latest
// sample once each has one.
func TestUsageRoundsAreBounded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d, prov := newSteady(t, driver.MilliCPU(1))
		cfg := config(memory.New(memory.Options{}), prov)
		cfg.UsageInterval = 100 * time.Millisecond
		p, _ := start(t, cfg)
		ctx := context.Background()
		n := control.UsagePerRound + 500
		r := req("many", n)
		r.CPU, r.Memory = 1, driver.MiB
		if _, err := p.Submit(ctx, r, ""); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "every instance running", func() bool {
			c, err := p.Counts(ctx)
			return err == nil && c[reconciler.Running] == n
		})
		// In the bubble a sleep ends with every other goroutine blocked,
		// so no round is half done; rounds are 100 ms apart, sleeps 10 ms:
		// the calls that come between two sleeps are one round's.
		time.Sleep(10 * time.Millisecond)
		before := d.calls.Load()
		for d.calls.Load() == before {
			time.Sleep(10 * time.Millisecond)
		}
		synctest.Wait()
		if got := d.calls.Load() - before; got > control.UsagePerRound {
			t.Fatalf("one round asked for %d samples, want at most %d", got, control.UsagePerRound)
		}
		waitFor(t, "every instance measured", func() bool {
			nodes, err := p.Nodes(ctx)
			return err == nil && len(nodes) == 1 && nodes[0].Measured != nil && nodes[0].Measured.Sampled == n
		})
	})
}
