package etcd_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/store"
	"github.com/berth-dev/berth/store/etcd"
	"github.com/berth-dev/berth/store/etcd/etcdtest"
)

// TestGroupCommit sends many transactions at once, as many submissions
// do: each compares a key they all share at its revision (as a leader's
// fence) and creates a key of its own; every eighth also compares a key
// that does not hold what it expects. The ones whose comparisons hold are
// stored, the others change nothing, and the calls went out in fewer etcd
// transactions than there were calls.
func TestGroupCommit(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s := etcd.New(etcdtest.Client(t, etcdtest.Member(t)), etcd.Options{Prefix: "/test"})
	t.Cleanup(func() { _ = s.Close() })
	fence, err := s.Txn(ctx, nil, []store.Op{store.Put("/fence", []byte("term"))})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Txn(ctx, nil, []store.Op{store.Put("/other", []byte("x"))}); err != nil {
		t.Fatal(err)
	}
	const calls = 64
	type result struct {
		res store.TxnResult
		err error
	}
	results := make([]result, calls)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range calls {
		wg.Go(func() {
			<-start
			cmps := []store.Cmp{{Key: "/fence", ModRevision: fence.Revision}, {Key: fmt.Sprintf("/own/%d", i)}}
			if i%8 == 0 {
				cmps = append(cmps, store.Cmp{Key: "/other", ModRevision: fence.Revision})
			}
			res, err := s.Txn(ctx, cmps, []store.Op{store.Put(fmt.Sprintf("/own/%d", i), fmt.Appendf(nil, "%d", i))})
			results[i] = result{res, err}
		})
	}
	close(start)
	wg.Wait()
	revs := map[int64]bool{}
	for i, r := range results {
		if r.err != nil {
			t.Fatalf("call %d: %v", i, r.err)
		}
		if want := i%8 != 0; r.res.Succeeded != want {
			t.Errorf("call %d: succeeded %v, want %v", i, r.res.Succeeded, want)
			continue
		}
		kv, err := s.Get(ctx, fmt.Sprintf("/own/%d", i))
		switch {
		case i%8 == 0 && err == nil:
			t.Errorf("call %d failed its comparison, yet its key was written", i)
		case i%8 != 0 && (err != nil || string(kv.Value) != fmt.Sprint(i) || kv.ModRevision != r.res.Revision):
			t.Errorf("call %d: its key %v %v, want %d at revision %d", i, kv, err, i, r.res.Revision)
		}
		if r.res.Succeeded {
			revs[r.res.Revision] = true
		}
	}
	t.Logf("%d successful calls stored at %d revisions", calls-calls/8, len(revs))
	if len(revs) >= calls-calls/8 {
		t.Errorf("%d successful calls stored at %d revisions: none were merged", calls-calls/8, len(revs))
	}
}

// TestGroupCommitOverTheClusterLimit tells the Store the cluster takes
// larger transactions than it does: calls that each fit but together do
// not are merged, refused, and then sent alone, so every one of them is
// stored.
func TestGroupCommitOverTheClusterLimit(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s := etcd.New(etcdtest.Client(t, etcdtest.Member(t)), etcd.Options{Prefix: "/test", MaxRequestBytes: 4 * etcd.DefaultMaxRequestBytes})
	t.Cleanup(func() { _ = s.Close() })
	// Each call carries a little over half of what the member takes.
	value := make([]byte, store.MaxValueSize)
	ops := etcd.DefaultMaxRequestBytes/len(value)/2 + 1
	const calls = 3
	errs := make([]error, calls)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range calls {
		wg.Go(func() {
			<-start
			puts := make([]store.Op, ops)
			for k := range puts {
				puts[k] = store.Put(fmt.Sprintf("/big/%d/%d", i, k), value)
			}
			res, err := s.Txn(ctx, nil, puts)
			// A member on a loaded machine may take longer than etcd's
			// request timeout to store tens of megabytes (the call may or
			// may not have been stored): these puts may be sent again.
			for errors.Is(err, driver.ErrRetryable) && ctx.Err() == nil {
				t.Logf("call %d: %v: sent again", i, err)
				res, err = s.Txn(ctx, nil, puts)
			}
			if err == nil && !res.Succeeded {
				err = fmt.Errorf("not stored")
			}
			errs[i] = err
		})
	}
	close(start)
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("call %d of %d values of %d bytes: %v", i, ops, len(value), err)
		}
	}
	for i := range calls {
		kvs, _, err := s.List(ctx, fmt.Sprintf("/big/%d/", i))
		if err != nil {
			t.Fatal(err)
		}
		if len(kvs) != ops {
			t.Errorf("call %d: %d keys stored, want %d", i, len(kvs), ops)
		}
	}
}
