package control_test

import (
	"context"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/berth-dev/berth/control"
	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/drivers/sim"
	"github.com/berth-dev/berth/reconciler"
	"github.com/berth-dev/berth/store/bolt"
	"github.com/berth-dev/berth/store/memory"
)

// TestBoltRestartResumes runs the plane on the durable store, closes
// everything mid-launch, reopens the file and checks that the new plane
// finishes every accepted instance with exactly one copy each.
func TestBoltRestartResumes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "berth.db")
		_, prov := newSim(t, 4, func(o *sim.Options) { o.CreateLatency = 20 * time.Millisecond; o.LatencyJitter = 30 * time.Millisecond })
		st1, err := bolt.Open(path, bolt.Options{})
		if err != nil {
			t.Fatal(err)
		}
		p1, stop1 := start(t, config(st1, prov))
		const n = 30
		r := req("job", n)
		r.CPU = driver.CPUs(0.25)
		if _, err := p1.Submit(context.Background(), r, "ops"); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "some launches under way", func() bool {
			return len(tagged(t, prov, map[string]string{driver.TagCluster: testCluster})) >= 3
		})
		stop1()
		if err := st1.Close(); err != nil {
			t.Fatal(err)
		}

		st2, err := bolt.Open(path, bolt.Options{})
		if err != nil {
			t.Fatal(err)
		}
		defer st2.Close()
		p2, stop2 := start(t, config(st2, prov))
		for i := range n {
			in := waitPhase(t, p2, fmt.Sprintf("job-%d", i), reconciler.Running)
			if in.Owner != "ops" {
				t.Fatalf("%s lost its owner: %+v", in.ID, in)
			}
		}
		waitFor(t, "exactly one copy of each instance", func() bool {
			return len(tagged(t, prov, map[string]string{driver.TagCluster: testCluster})) == n
		})
		stop2()
	})
}

// recorder is a control.Metrics that keeps what it is told.
type recorder struct {
	mu        sync.Mutex
	scheduled int
	depth     []int
	launched  map[string]int
	failed    map[string]int
	quotas    int
	leaks     int
	conflicts int
}

func (r *recorder) Scheduled(time.Duration, bool) { r.mu.Lock(); r.scheduled++; r.mu.Unlock() }
func (r *recorder) QueueDepth(n int)              { r.mu.Lock(); r.depth = append(r.depth, n); r.mu.Unlock() }
func (r *recorder) Launched(p string, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err != nil {
		r.failed[p]++
	} else {
		r.launched[p]++
	}
}
func (r *recorder) QuotaUse(control.QuotaUse) { r.mu.Lock(); r.quotas++; r.mu.Unlock() }
func (r *recorder) LeakFound(string)          { r.mu.Lock(); r.leaks++; r.mu.Unlock() }
func (r *recorder) Conflicts(n int)           { r.mu.Lock(); r.conflicts += n; r.mu.Unlock() }

func (r *recorder) get(fn func()) { r.mu.Lock(); defer r.mu.Unlock(); fn() }

func TestMetricsHooks(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, prov := newSim(t, 2, func(o *sim.Options) { o.FailRetryable = 0.5; o.Seed = 7 })
		ctx := context.Background()
		// The sim fails half the creates: try until the leak exists.
		for made := false; !made; {
			op, err := s.Create(ctx, "node-1", &driver.Spec{Image: "busybox", Tags: map[string]string{driver.TagManaged: "true", driver.TagCluster: testCluster, driver.TagInstance: "ghost"}})
			if err != nil {
				t.Fatal(err)
			}
			_, err = driver.Drive(ctx, op)
			made = err == nil
		}
		rec := &recorder{launched: map[string]int{}, failed: map[string]int{}}
		cfg := config(newMemory(), prov)
		cfg.Metrics = rec
		cfg.MaxAttempts = 10
		cfg.Quotas = []control.Quota{{Owner: "m", Instances: 100}}
		p, _ := start(t, cfg)
		if _, err := p.Submit(ctx, req("m", 6), "m"); err != nil {
			t.Fatal(err)
		}
		for i := range 6 {
			waitPhase(t, p, fmt.Sprintf("m-%d", i), reconciler.Running)
		}
		waitFor(t, "the leak to be counted", func() bool {
			n := 0
			rec.get(func() { n = rec.leaks })
			return n == 1
		})
		rec.get(func() {
			if rec.launched["sim"] != 6 || rec.failed["sim"] == 0 || rec.scheduled == 0 || len(rec.depth) == 0 || rec.quotas == 0 {
				t.Fatalf("metrics: %+v", rec)
			}
		})
	})
}

func newMemory() *memory.Store { return memory.New(memory.Options{}) }
