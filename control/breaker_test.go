package control_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/drivers/sim"
	"github.com/berth-dev/berth/provider"
	"github.com/berth-dev/berth/reconciler"
	"github.com/berth-dev/berth/store/memory"
)

// restarting is the sim back-end behind a connection that fails while
// down is set, as a driver plugin's does while its process is restarted:
// every read fails with driver.ErrRetryable, which opens the provider's
// breaker. Create and the operations it returns go through to the sim, so
// a create the breaker lets through (its half-open trial) succeeds and
// every failure a launch sees is a refusal of the breaker.
type restarting struct {
	*sim.Sim
	down atomic.Bool
}

var errRestarting = fmt.Errorf("%w: the back-end is restarting", driver.ErrRetryable)

func (r *restarting) State(ctx context.Context) (*driver.PlatformState, error) {
	if r.down.Load() {
		return nil, errRestarting
	}
	return r.Sim.State(ctx)
}

func (r *restarting) Get(ctx context.Context, id string) (*driver.Instance, error) {
	if r.down.Load() {
		return nil, errRestarting
	}
	return r.Sim.Get(ctx, id)
}

func (r *restarting) List(ctx context.Context, tags map[string]string) ([]*driver.Instance, error) {
	if r.down.Load() {
		return nil, errRestarting
	}
	return r.Sim.List(ctx, tags)
}

func (r *restarting) Walk(ctx context.Context, tags map[string]string, fn func(*driver.Instance) error) error {
	if r.down.Load() {
		return errRestarting
	}
	return r.Sim.Walk(ctx, tags, fn)
}

// refusals counts the creates the provider refused without passing them
// on (*driver.NotAttemptedError).
type refusals struct {
	mu sync.Mutex
	n  int
}

func (c *refusals) Call(_, op string, _ time.Duration, err error) {
	if _, ok := errors.AsType[*driver.NotAttemptedError](err); ok && op == "create" {
		c.mu.Lock()
		c.n++
		c.mu.Unlock()
	}
}

func (c *refusals) BreakerChanged(string, string, string) {}

func (c *refusals) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n
}

// Launches submitted while the provider's breaker is open wait, saying
// why and until when, without using their attempts (one each here), and
// all run once the back-end is back and the breaker lets calls through.
func TestLaunchesWaitForAnOpenBreaker(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		opts := *sim.DefaultOptions()
		opts.Nodes = 2
		opts.Shape = sim.Shape{Resources: driver.Resources{CPU: driver.CPUs(4), Memory: 8 * driver.GiB}}
		s, err := sim.New(opts)
		if err != nil {
			t.Fatal(err)
		}
		back := &restarting{Sim: s}
		refused := &refusals{}
		prov, err := provider.New(back, provider.Config{
			Name: "sim", Logger: quiet, StateTTL: time.Millisecond, Observer: refused,
			BreakerFailures: 2, BreakerOpenFor: 2 * time.Second,
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = prov.Close(context.Background()) })
		cfg := config(memory.New(memory.Options{}), prov)
		cfg.MaxAttempts = 1
		// A create the half-open breaker let through waits for its
		// progress while the breaker is open again: that wait is not what
		// this test is about.
		cfg.LaunchTimeout = time.Hour
		p, _ := start(t, cfg)
		ctx := context.Background()

		back.down.Store(true)
		for prov.Health().Breaker != "open" {
			if _, err := prov.Get(ctx, "any"); !errors.Is(err, driver.ErrRetryable) {
				t.Fatalf("Get while the back-end is down: %v, want a retryable error", err)
			}
		}
		const n = 6
		if _, err := p.Submit(ctx, req("web", n), ""); err != nil {
			t.Fatal(err)
		}
		ids := make([]string, n)
		for i := range ids {
			ids[i] = fmt.Sprintf("web-%d", i)
		}
		// Each instance keeps trying: refused, it waits until the breaker
		// lets a call through, and is placed again. It must never fail nor
		// count an attempt, and while it waits it says why.
		waiting := false
		waitFor(t, "an instance waiting for the open breaker and more refusals than instances", func() bool {
			for _, id := range ids {
				in, err := p.Instance(ctx, id)
				if err != nil {
					t.Fatal(err)
				}
				if in.Phase == reconciler.Failed || in.Attempts != 0 {
					t.Fatalf("instance %s while the breaker is open: %s, %d attempts (%s)", id, in.Phase, in.Attempts, in.Message)
				}
				if in.Phase == reconciler.Pending && strings.Contains(in.Message, "did not attempt the create") {
					if !strings.Contains(in.Message, "circuit breaker is open") && !strings.Contains(in.Message, "half-open") {
						t.Fatalf("pending instance %s says %q, want why it waits", id, in.Message)
					}
					waiting = true
				}
			}
			return waiting && refused.count() > n
		})

		back.down.Store(false)
		for _, id := range ids {
			in := waitPhase(t, p, id, reconciler.Running)
			if in.Attempts != 0 {
				t.Errorf("instance %s runs after %d counted attempts (%s), want 0", id, in.Attempts, in.Message)
			}
		}
		if h := prov.Health(); h.Breaker != "closed" {
			t.Errorf("breaker is %s once every launch ran, want closed", h.Breaker)
		}
	})
}
