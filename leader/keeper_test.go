package leader

import (
	"context"
	"errors"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/berth-dev/berth/store"
	"github.com/berth-dev/berth/store/etcd"
	"github.com/berth-dev/berth/store/etcd/etcdtest"
)

// manual is a clock that moves only when told.
type manual struct {
	mu sync.Mutex
	t  time.Time
}

func (c *manual) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }

func (c *manual) add(d time.Duration) { c.mu.Lock(); c.t = c.t.Add(d); c.mu.Unlock() }

// The lease is known to hold until four fifths of the TTL after the send
// of the latest acknowledged renewal, whatever order the acknowledgements
// come in, and never once etcd could have let it expire: etcd renews a
// lease for the TTL from the renewal's arrival, never before its send.
func TestHeldUntilBeforeTheEarliestExpiry(t *testing.T) {
	const ttl = time.Second
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	type renewal struct{ sent, acked time.Duration } // after t0; acked < 0: never
	for _, tc := range []struct {
		name     string
		renewals []renewal
		until    time.Duration // after t0, for the grant sent at t0
	}{
		{"the grant only", nil, 800 * time.Millisecond},
		{"renewed in time", []renewal{{200 * time.Millisecond, 210 * time.Millisecond}, {400 * time.Millisecond, 410 * time.Millisecond}}, 1200 * time.Millisecond},
		{"acknowledged out of order", []renewal{{400 * time.Millisecond, 450 * time.Millisecond}, {200 * time.Millisecond, 700 * time.Millisecond}}, 1200 * time.Millisecond},
		{"renewals unanswered", []renewal{{200 * time.Millisecond, -1}, {400 * time.Millisecond, -1}}, 800 * time.Millisecond},
		{"an answer too late", []renewal{{200 * time.Millisecond, 900 * time.Millisecond}}, 800 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := &manual{t: t0}
			k := newKeeper(c.now, t0, ttl, nil)
			// Events in time order, every 10 ms, up to 3 s.
			for at := time.Duration(0); at <= 3*time.Second; at += 10 * time.Millisecond {
				c.t = t0.Add(at)
				for _, r := range tc.renewals {
					if r.acked == at {
						k.acked(t0.Add(r.sent), ttl)
					}
				}
				// etcd's expiry can come no earlier than the TTL after
				// the latest send it acknowledged (the grant's included).
				earliest := ttl
				for _, r := range tc.renewals {
					if r.acked >= 0 && r.acked <= at {
						earliest = max(earliest, r.sent+ttl)
					}
				}
				held := k.held()
				if at >= earliest && held {
					t.Fatalf("held at %s, when etcd may have let the lease expire at %s", at, earliest)
				}
				if held != (at < tc.until) {
					t.Fatalf("held at %s = %v, want held until %s", at, held, tc.until)
				}
			}
		})
	}
}

// On a fake clock, a leader whose renewals are answered in time keeps its
// term; once they are delayed past the lease, its term ends before etcd
// could let the lease expire (and so before any other server could be
// elected), and never comes back when a late answer arrives.
func TestKeeperEndsTheTermBeforeTheLeaseCanExpire(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const ttl = time.Second
		var (
			mu      sync.Mutex
			slow    bool
			expiry  time.Time // the earliest etcd may expire the lease
			renewed int
		)
		start := time.Now()
		expiry = start.Add(ttl)
		renew := func(ctx context.Context) (time.Duration, error) {
			mu.Lock()
			s := slow
			mu.Unlock()
			if s {
				// Held up on the way there for two TTLs.
				select {
				case <-time.After(2 * ttl):
				case <-ctx.Done():
					return 0, ctx.Err()
				}
			}
			time.Sleep(5 * time.Millisecond) // on the way to etcd
			mu.Lock()
			expiry = time.Now().Add(ttl)
			renewed++
			mu.Unlock()
			time.Sleep(5 * time.Millisecond) // the answer's way back
			return ttl, nil
		}
		k := newKeeper(time.Now, start, ttl, renew)
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		done := make(chan struct{})
		go func() { k.run(ctx); close(done) }()

		time.Sleep(5 * ttl)
		synctest.Wait()
		if !k.held() {
			t.Fatalf("the term ended although every renewal was answered in 10 ms (%d renewals)", renewed)
		}
		mu.Lock()
		slow = true
		mu.Unlock()
		<-k.done // the keeper ends the term itself
		ended := time.Now()
		if k.held() {
			t.Fatal("held after the keeper ended")
		}
		<-done
		mu.Lock()
		defer mu.Unlock()
		if !ended.Before(expiry) {
			t.Fatalf("the term ended at %s, not before the lease could expire (%s)", ended.Sub(start), expiry.Sub(start))
		}
		// An answer that comes in after the end does not bring it back.
		k.acked(time.Now(), ttl)
		if k.held() {
			t.Fatal("held again after it ended")
		}
	})
}

// A leader whose term is over by its own clock sends no write: Fenced
// refuses it, calls deposed, and etcd is left as it was.
func TestFencedSendsNothingOnceTheTermIsOver(t *testing.T) {
	m := etcdtest.Member(t)
	st := etcd.New(etcdtest.Client(t, m), etcd.Options{Prefix: "/f"})
	t.Cleanup(func() { _ = st.Close() })
	ctx := t.Context()
	res, err := st.Txn(ctx, nil, []store.Op{store.Put("/term", []byte("a"))})
	if err != nil {
		t.Fatal(err)
	}
	c := &manual{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	k := newKeeper(c.now, c.now(), time.Second, nil)
	term := Term{Fence: store.Cmp{Key: "/term", ModRevision: res.Revision}, Rev: res.Revision + 1, k: k}
	deposed := 0
	f := Fenced(st, term, func() { deposed++ })
	if _, err := f.Txn(ctx, nil, []store.Op{store.Put("/x", []byte("in time"))}); err != nil {
		t.Fatal(err)
	}
	// No renewal acknowledged for four fifths of the TTL.
	c.add(800 * time.Millisecond)
	_, err = f.Txn(ctx, nil, []store.Op{store.Put("/x", []byte("late"))})
	if !errors.Is(err, ErrDeposed) || deposed != 1 || term.Held() {
		t.Fatalf("a write after the term's end: %v (deposed called %d times, held %v), want ErrDeposed, once, not held", err, deposed, term.Held())
	}
	if kv, err := st.Get(ctx, "/x"); err != nil || string(kv.Value) != "in time" {
		t.Fatalf("/x = %q %v, want the write made in time only", kv.Value, err)
	}
	select {
	case <-k.done:
	default:
		t.Fatal("the keeper did not end with the term")
	}
}
