package driver_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/berth-dev/berth/driver"
)

// fakeClock is a clock the test moves by hand.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func TestListCacheTTL(t *testing.T) {
	clock := &fakeClock{t: time.Unix(1000, 0)}
	var fetches atomic.Int32
	c := &driver.ListCache[int]{
		TTL: 10 * time.Second,
		Now: clock.Now,
		Fetch: func(context.Context) (int, error) {
			return int(fetches.Add(1)), nil
		},
	}
	ctx := context.Background()
	get := func() int {
		t.Helper()
		v, err := c.Get(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	if v := get(); v != 1 {
		t.Fatalf("first Get = %d", v)
	}
	clock.Advance(9 * time.Second)
	if v := get(); v != 1 {
		t.Errorf("Get within TTL = %d, want the cached 1", v)
	}
	clock.Advance(time.Second)
	if v := get(); v != 2 {
		t.Errorf("Get at TTL = %d, want a new fetch", v)
	}
	c.Invalidate()
	if v := get(); v != 3 {
		t.Errorf("Get after Invalidate = %d, want a new fetch", v)
	}
}

func TestListCacheErrorNotCached(t *testing.T) {
	fail := true
	c := &driver.ListCache[string]{
		TTL: time.Hour,
		Fetch: func(context.Context) (string, error) {
			if fail {
				return "", driver.Errorf(driver.ErrRetryable, "back-end down")
			}
			return "ok", nil
		},
	}
	if _, err := c.Get(context.Background()); !errors.Is(err, driver.ErrRetryable) {
		t.Fatalf("failing fetch: %v", err)
	}
	fail = false
	if v, err := c.Get(context.Background()); err != nil || v != "ok" {
		t.Errorf("Get after a failed fetch: %q %v, want a new fetch", v, err)
	}
}

func TestListCacheSingleFlight(t *testing.T) {
	defer goleak.VerifyNone(t)
	release := make(chan struct{})
	entered := make(chan struct{}, 100)
	var fetches atomic.Int32
	c := &driver.ListCache[int]{
		TTL: time.Hour,
		Fetch: func(ctx context.Context) (int, error) {
			fetches.Add(1)
			entered <- struct{}{}
			<-release
			return 42, nil
		},
	}
	const n = 50
	var wg sync.WaitGroup
	results := make(chan int, n)
	wg.Add(1)
	go func() {
		defer wg.Done()
		v, _ := c.Get(context.Background())
		results <- v
	}()
	<-entered // the first caller is fetching; everyone else must wait for it
	for range n - 1 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			v, _ := c.Get(context.Background())
			results <- v
		}()
	}
	// A caller whose context ends stops waiting with the context's error.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := c.Get(ctx); !errors.Is(err, context.Canceled) {
		t.Errorf("waiting caller with a cancelled context: %v", err)
	}
	close(release)
	wg.Wait()
	close(results)
	for v := range results {
		if v != 42 {
			t.Errorf("a caller got %d", v)
		}
	}
	if f := fetches.Load(); f != 1 {
		t.Errorf("%d fetches for %d concurrent callers, want 1", f, n)
	}
}

// TestListCacheInvalidateDuringFetch: a caller that comes after Invalidate
// does not get a fetch that began before it (it may not show the change
// the invalidation was for), and that fetch is not cached.
func TestListCacheInvalidateDuringFetch(t *testing.T) {
	defer goleak.VerifyNone(t)
	var fetches atomic.Int32
	first := make(chan struct{})
	entered := make(chan struct{})
	c := &driver.ListCache[int32]{
		TTL: time.Hour,
		Fetch: func(ctx context.Context) (int32, error) {
			n := fetches.Add(1)
			if n == 1 {
				close(entered)
				<-first // the old reading, held up
			}
			return n, nil
		},
	}
	old := make(chan int32, 1)
	go func() {
		v, _ := c.Get(context.Background())
		old <- v
	}()
	<-entered
	c.Invalidate()
	// The Get after Invalidate must not wait for the held-up fetch. The
	// limit only guards against a hung test: joined to that fetch, it
	// would wait for ever.
	got := make(chan int32, 1)
	go func() {
		v, _ := c.Get(context.Background())
		got <- v
	}()
	select {
	case v := <-got:
		if v != 2 {
			t.Errorf("Get after Invalidate, while an older fetch runs: %d, want the new fetch's 2", v)
		}
	case <-time.After(time.Minute):
		close(first)
		<-got
		<-old
		t.Fatal("Get after Invalidate waited for the fetch begun before it")
	}
	close(first)
	if v := <-old; v != 1 {
		t.Errorf("the first caller got %d, want its own fetch's 1", v)
	}
	if v, _ := c.Get(context.Background()); v != 2 {
		t.Errorf("cached %d, want 2: the fetch begun before Invalidate must not be cached", v)
	}
}
