package leader

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// errLeaseGone is a renewal's answer that the lease no longer exists in
// etcd (it expired, or was revoked).
var errLeaseGone = errors.New("leader: the lease is gone")

// heldUntil returns until when a server knows, from its own clock, that
// its lease of ttl still holds after a renewal it sent at sent was
// acknowledged: margin(ttl) before the earliest time etcd can expire it.
//
// etcd's leader sets a lease's expiry to the time it renews it plus the
// TTL, and it renews it once the renewal arrived, never before it was
// sent: the lease cannot expire before sent + ttl, whatever the delays on
// the way (only durations are compared: the clocks need only run at the
// same rate). A later leader can only be elected once the lease expired
// or was revoked, so a server that stops acting at heldUntil stops before
// any other server starts.
func heldUntil(sent time.Time, ttl time.Duration) time.Time {
	return sent.Add(ttl - margin(ttl))
}

// margin is how long before the earliest expiry of its lease a leader
// takes it for lost: the time it has to stop its loops, and a bound on
// the difference between its clock's rate and etcd's.
func margin(ttl time.Duration) time.Duration { return ttl / 5 }

// renewEvery is how often a lease of ttl is renewed: four renewals may
// go unanswered before the lease is taken for lost.
func renewEvery(ttl time.Duration) time.Duration { return ttl / 5 }

// keeper renews one lease, each renewal in its own goroutine so that a
// slow one delays no other, and ends (done) when no renewal sent in the
// last TTL − margin was acknowledged (heldUntil), when etcd says the
// lease is gone, or when its run's context ends. It shares no lock with
// its readers: held is an atomic load and a clock reading.
type keeper struct {
	// now is the clock (time.Now but in tests).
	now func() time.Time
	// renew renews the lease once and returns its TTL, or errLeaseGone.
	renew func(ctx context.Context) (time.Duration, error)
	// every is how often it renews.
	every time.Duration

	base  time.Time    // the origin of until
	until atomic.Int64 // nanoseconds after base until which the lease holds
	done  chan struct{}
	once  sync.Once
	why   atomic.Pointer[string] // why it ended, when not because its run's context did
}

// newKeeper returns a keeper of a lease whose grant, sent at sent, was
// answered with ttl.
func newKeeper(now func() time.Time, sent time.Time, ttl time.Duration, renew func(ctx context.Context) (time.Duration, error)) *keeper {
	k := &keeper{now: now, renew: renew, every: renewEvery(ttl), base: sent, done: make(chan struct{})}
	k.acked(sent, ttl)
	return k
}

// acked records that a renewal sent at sent was acknowledged with ttl.
// Acknowledgements may come in any order: the latest sent counts.
func (k *keeper) acked(sent time.Time, ttl time.Duration) {
	u := int64(heldUntil(sent, ttl).Sub(k.base))
	for {
		old := k.until.Load()
		if u <= old || k.until.CompareAndSwap(old, u) {
			return
		}
	}
}

// deadline is when the lease stops being known to hold, unless another
// renewal is acknowledged before.
func (k *keeper) deadline() time.Time {
	return k.base.Add(time.Duration(k.until.Load()))
}

// held reports whether the lease is known to hold now: the keeper has not
// ended and its deadline is to come. Once false, it stays false.
func (k *keeper) held() bool {
	select {
	case <-k.done:
		return false
	default:
	}
	if !k.now().Before(k.deadline()) {
		k.lapse("no renewal acknowledged in time")
		return false
	}
	return true
}

// end ends the keeper: the lease is not held any more.
func (k *keeper) end() { k.once.Do(func() { close(k.done) }) }

// lapse ends the keeper for the reason why.
func (k *keeper) lapse(why string) {
	if late := k.now().Sub(k.deadline()); late >= 0 {
		why += fmt.Sprintf(" (the renewals acknowledged held it until %s ago)", late.Round(time.Millisecond))
	}
	k.why.CompareAndSwap(nil, &why)
	k.end()
}

// reason says why the keeper ended, or "" when its run's context ended
// first (or it runs still).
func (k *keeper) reason() string {
	if w := k.why.Load(); w != nil {
		return *w
	}
	return ""
}

// run renews the lease every k.every until the keeper ends, and ends it
// at its deadline, when the lease is gone, or when ctx ends. It returns
// once its renewals have returned.
func (k *keeper) run(ctx context.Context) {
	var renewals sync.WaitGroup
	defer renewals.Wait()
	rctx, stop := context.WithCancel(ctx)
	defer stop()
	defer k.end()
	next := k.now().Add(k.every)
	t := time.NewTimer(k.every)
	defer t.Stop()
	for {
		now := k.now()
		left := k.deadline().Sub(now)
		if left <= 0 {
			k.lapse("no renewal acknowledged in time")
			return
		}
		if !now.Before(next) {
			next = now.Add(k.every)
			renewals.Go(func() {
				// An answer after the deadline comes too late to count.
				cctx, cancel := context.WithTimeout(rctx, left)
				defer cancel()
				ttl, err := k.renew(cctx)
				switch {
				case err == nil:
					k.acked(now, ttl)
				case errors.Is(err, errLeaseGone):
					k.lapse("etcd says the lease is gone (it expired, or was revoked)")
				}
			})
		}
		t.Reset(min(next.Sub(now), left))
		select {
		case <-ctx.Done():
			return
		case <-k.done:
			return
		case <-t.C:
		}
	}
}
