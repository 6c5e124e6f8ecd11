// Package storetest is the conformance suite every store.Store
// implementation runs from its own tests:
//
//	func TestConformance(t *testing.T) {
//		storetest.Run(t, func(t *testing.T) store.Store { ... })
//	}
package storetest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/store"
)

// Run runs the conformance suite. open returns a new, empty store for each
// subtest, configured to remember at most 1000 revisions of history (the
// compaction test writes past that); the suite closes it. Subtests check
// goroutine leaks with goleak, so they do not run in parallel.
func Run(t *testing.T, open func(t *testing.T) store.Store) {
	tests := []struct {
		name string
		fn   func(t *testing.T, s store.Store)
	}{
		{"GetPutDelete", testGetPutDelete},
		{"RevisionsMonotonic", testRevisionsMonotonic},
		{"CreateModRevision", testCreateModRevision},
		{"TxnCompare", testTxnCompare},
		{"TxnCompareMissingKey", testTxnCompareMissing},
		{"TxnNoChange", testTxnNoChange},
		{"TxnInvalid", testTxnInvalid},
		{"TxnCanceledContext", testTxnCanceled},
		{"ConcurrentConflictingTxns", testConcurrentConflicts},
		{"ListPrefixSorted", testList},
		{"ValuesAreCopied", testCopies},
		{"WatchFromNow", testWatchFromNow},
		{"WatchFromPast", testWatchFromPast},
		{"WatchFromListRevision", testWatchFromList},
		{"WatchCompacted", testWatchCompacted},
		{"WatchSlowReader", testWatchSlowReader},
		{"WatchEndsOnCancel", testWatchCancel},
		{"WatchEndsOnClose", testWatchClose},
		{"Closed", testClosed},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ignore := goleak.IgnoreCurrent()
			// Registered first, so it runs last: after the store is closed.
			t.Cleanup(func() { goleak.VerifyNone(t, ignore) })
			s := open(t)
			t.Cleanup(func() { _ = s.Close() })
			tc.fn(t, s)
		})
	}
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func mustTxn(t *testing.T, s store.Store, cmps []store.Cmp, ops ...store.Op) store.TxnResult {
	t.Helper()
	res, err := s.Txn(ctxT(t), cmps, ops)
	if err != nil {
		t.Fatalf("Txn(%v, %v): %v", cmps, ops, err)
	}
	return res
}

func mustPut(t *testing.T, s store.Store, key, value string) int64 {
	t.Helper()
	res := mustTxn(t, s, nil, store.Put(key, []byte(value)))
	if !res.Succeeded {
		t.Fatalf("Put %q without compares did not succeed", key)
	}
	return res.Revision
}

func mustGet(t *testing.T, s store.Store, key string) store.KV {
	t.Helper()
	kv, err := s.Get(ctxT(t), key)
	if err != nil {
		t.Fatalf("Get(%q): %v", key, err)
	}
	return kv
}

func wantKV(t *testing.T, got store.KV, key, value string, create, mod int64) {
	t.Helper()
	if got.Key != key || !bytes.Equal(got.Value, []byte(value)) || got.CreateRevision != create || got.ModRevision != mod {
		t.Fatalf("got %s=%q create=%d mod=%d, want %s=%q create=%d mod=%d",
			got.Key, got.Value, got.CreateRevision, got.ModRevision, key, value, create, mod)
	}
}

func testGetPutDelete(t *testing.T, s store.Store) {
	ctx := ctxT(t)
	if _, err := s.Get(ctx, "/a"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("Get of missing key: err = %v, want ErrNotFound", err)
	}
	if _, err := s.Get(ctx, "/a"); !errors.Is(err, driver.ErrNotFound) {
		t.Fatalf("Get of missing key: err = %v, want it to wrap driver.ErrNotFound", err)
	}
	r1 := mustPut(t, s, "/a", "one")
	wantKV(t, mustGet(t, s, "/a"), "/a", "one", r1, r1)
	r2 := mustPut(t, s, "/a", "two")
	wantKV(t, mustGet(t, s, "/a"), "/a", "two", r1, r2)
	r3 := mustTxn(t, s, nil, store.Delete("/a")).Revision
	if r3 != r2+1 {
		t.Fatalf("delete revision = %d, want %d", r3, r2+1)
	}
	if _, err := s.Get(ctx, "/a"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("Get after delete: err = %v, want ErrNotFound", err)
	}
	// An empty value is a value, not a missing key.
	r4 := mustPut(t, s, "/empty", "")
	wantKV(t, mustGet(t, s, "/empty"), "/empty", "", r4, r4)
}

func testRevisionsMonotonic(t *testing.T, s store.Store) {
	_, rev0, err := s.List(ctxT(t), "")
	if err != nil {
		t.Fatal(err)
	}
	if rev0 != 0 {
		t.Fatalf("empty store revision = %d, want 0", rev0)
	}
	prev := rev0
	for i := range 50 {
		res := mustTxn(t, s, nil, store.Put(fmt.Sprintf("/k/%d", i%7), []byte{byte(i)}), store.Put(fmt.Sprintf("/j/%d", i), nil))
		if res.Revision != prev+1 {
			t.Fatalf("txn %d: revision %d, want %d (one per changing txn)", i, res.Revision, prev+1)
		}
		prev = res.Revision
	}
	_, rev, err := s.List(ctxT(t), "/nothing/")
	if err != nil {
		t.Fatal(err)
	}
	if rev != prev {
		t.Fatalf("List revision = %d, want %d", rev, prev)
	}
}

func testCreateModRevision(t *testing.T, s store.Store) {
	r1 := mustTxn(t, s, nil, store.Put("/x", []byte("1")), store.Put("/y", []byte("1"))).Revision
	wantKV(t, mustGet(t, s, "/x"), "/x", "1", r1, r1)
	wantKV(t, mustGet(t, s, "/y"), "/y", "1", r1, r1)
	r2 := mustPut(t, s, "/x", "2")
	wantKV(t, mustGet(t, s, "/x"), "/x", "2", r1, r2)
	wantKV(t, mustGet(t, s, "/y"), "/y", "1", r1, r1)
	mustTxn(t, s, nil, store.Delete("/x"))
	r4 := mustPut(t, s, "/x", "3")
	wantKV(t, mustGet(t, s, "/x"), "/x", "3", r4, r4)
}

func testTxnCompare(t *testing.T, s store.Store) {
	r1 := mustPut(t, s, "/a", "v1")
	mustPut(t, s, "/b", "v1")
	// Success: compare matches, all ops apply in one revision.
	res := mustTxn(t, s, []store.Cmp{{Key: "/a", ModRevision: r1}},
		store.Put("/a", []byte("v2")), store.Delete("/b"), store.Put("/c", []byte("new")))
	if !res.Succeeded {
		t.Fatal("Txn with a matching compare did not succeed")
	}
	wantKV(t, mustGet(t, s, "/a"), "/a", "v2", r1, res.Revision)
	wantKV(t, mustGet(t, s, "/c"), "/c", "new", res.Revision, res.Revision)
	if _, err := s.Get(ctxT(t), "/b"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("/b after delete: %v", err)
	}
	// Failure: a stale compare changes nothing, even with one good compare.
	before, beforeRev, err := s.List(ctxT(t), "")
	if err != nil {
		t.Fatal(err)
	}
	fail := mustTxn(t, s, []store.Cmp{{Key: "/c", ModRevision: res.Revision}, {Key: "/a", ModRevision: r1}},
		store.Put("/a", []byte("lost")), store.Put("/d", []byte("lost")), store.Delete("/c"))
	if fail.Succeeded {
		t.Fatal("Txn with a stale compare succeeded")
	}
	if fail.Revision != beforeRev {
		t.Fatalf("failed Txn revision = %d, want unchanged %d", fail.Revision, beforeRev)
	}
	after, afterRev, err := s.List(ctxT(t), "")
	if err != nil {
		t.Fatal(err)
	}
	if afterRev != beforeRev || !sameKVs(before, after) {
		t.Fatalf("failed Txn changed the store: before rev %d %v, after rev %d %v", beforeRev, before, afterRev, after)
	}
}

func testTxnCompareMissing(t *testing.T, s store.Store) {
	// ModRevision 0 means "must not exist": create-if-absent.
	res := mustTxn(t, s, []store.Cmp{{Key: "/lock", ModRevision: 0}}, store.Put("/lock", []byte("me")))
	if !res.Succeeded {
		t.Fatal("create-if-absent on a missing key failed")
	}
	res2 := mustTxn(t, s, []store.Cmp{{Key: "/lock", ModRevision: 0}}, store.Put("/lock", []byte("you")))
	if res2.Succeeded {
		t.Fatal("create-if-absent on an existing key succeeded")
	}
	wantKV(t, mustGet(t, s, "/lock"), "/lock", "me", res.Revision, res.Revision)
	// A missing key compared with a non-zero revision fails.
	res3 := mustTxn(t, s, []store.Cmp{{Key: "/ghost", ModRevision: res.Revision}}, store.Put("/ghost", []byte("x")))
	if res3.Succeeded {
		t.Fatal("compare of a missing key with a non-zero revision succeeded")
	}
	// After a delete the key is missing again: 0 matches.
	mustTxn(t, s, nil, store.Delete("/lock"))
	if !mustTxn(t, s, []store.Cmp{{Key: "/lock"}}, store.Put("/lock", []byte("again"))).Succeeded {
		t.Fatal("create-if-absent after delete failed")
	}
}

func testTxnNoChange(t *testing.T, s store.Store) {
	r := mustPut(t, s, "/a", "1")
	// A read-only Txn (compares, no ops) reports and changes nothing.
	res := mustTxn(t, s, []store.Cmp{{Key: "/a", ModRevision: r}})
	if !res.Succeeded || res.Revision != r {
		t.Fatalf("read-only Txn = %+v, want succeeded at %d", res, r)
	}
	// Deleting a missing key is no error and no new revision.
	res = mustTxn(t, s, nil, store.Delete("/missing"))
	if !res.Succeeded || res.Revision != r {
		t.Fatalf("delete of a missing key = %+v, want succeeded at %d", res, r)
	}
	if next := mustPut(t, s, "/b", "2"); next != r+1 {
		t.Fatalf("next revision = %d, want %d", next, r+1)
	}
}

func testTxnInvalid(t *testing.T, s store.Store) {
	ctx := ctxT(t)
	cases := []struct {
		name string
		cmps []store.Cmp
		ops  []store.Op
		path string
	}{
		{"empty op key", nil, []store.Op{store.Put("/ok", nil), store.Put("", []byte("x"))}, "ops[1].key"},
		{"empty cmp key", []store.Cmp{{Key: ""}}, []store.Op{store.Put("/ok", nil)}, "cmps[0].key"},
		{"negative cmp", []store.Cmp{{Key: "/a", ModRevision: -1}}, nil, "cmps[0].mod_revision"},
		{"unknown kind", nil, []store.Op{{Kind: 99, Key: "/a"}}, "ops[0].kind"},
		{"duplicate key", nil, []store.Op{store.Put("/a", nil), store.Delete("/a")}, "ops[1].key"},
		{"long key", nil, []store.Op{store.Put(string(make([]byte, store.MaxKeySize+1)), nil)}, "ops[0].key"},
		{"large value", nil, []store.Op{store.Put("/big", make([]byte, store.MaxValueSize+1))}, "ops[0].value"},
	}
	for _, c := range cases {
		_, err := s.Txn(ctx, c.cmps, c.ops)
		if !errors.Is(err, driver.ErrInvalid) {
			t.Fatalf("%s: err = %v, want driver.ErrInvalid", c.name, err)
		}
		var fe *driver.FieldError
		if !errors.As(err, &fe) || fe.Path != c.path {
			t.Fatalf("%s: err = %v, want a FieldError at %q", c.name, err, c.path)
		}
	}
	if _, err := s.Get(ctx, ""); !errors.Is(err, driver.ErrInvalid) {
		t.Fatalf("Get of empty key: err = %v, want driver.ErrInvalid", err)
	}
	if _, err := s.Watch(ctx, "", -1); !errors.Is(err, driver.ErrInvalid) {
		t.Fatalf("Watch from -1: err = %v, want driver.ErrInvalid", err)
	}
	_, rev, err := s.List(ctx, "")
	if err != nil || rev != 0 {
		t.Fatalf("after invalid Txns: rev %d err %v, want 0 and nothing written", rev, err)
	}
}

func testTxnCanceled(t *testing.T, s store.Store) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := s.Txn(ctx, nil, []store.Op{store.Put("/a", nil)}); !errors.Is(err, context.Canceled) {
		t.Fatalf("Txn with canceled ctx: err = %v, want context.Canceled", err)
	}
	if _, err := s.Get(ctxT(t), "/a"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("Txn with canceled ctx wrote: Get err = %v", err)
	}
}

// testConcurrentConflicts races many writers on one key, each doing a
// read-modify-write with a compare; exactly one wins each round and the
// counter ends at the number of successes.
func testConcurrentConflicts(t *testing.T, s store.Store) {
	ctx := ctxT(t)
	const writers = 8
	r0 := mustPut(t, s, "/counter", "0")
	for round := range 5 {
		kv := mustGet(t, s, "/counter")
		var wins, losses int
		var mu sync.Mutex
		var wg sync.WaitGroup
		errs := make(chan error, writers)
		start := make(chan struct{})
		for w := range writers {
			wg.Go(func() {
				<-start
				res, err := s.Txn(ctx, []store.Cmp{{Key: "/counter", ModRevision: kv.ModRevision}},
					[]store.Op{store.Put("/counter", fmt.Appendf(nil, "%d", round+1)), store.Put(fmt.Sprintf("/winner/%d", round), fmt.Appendf(nil, "%d", w))})
				if err != nil {
					errs <- err
					return
				}
				mu.Lock()
				defer mu.Unlock()
				if res.Succeeded {
					wins++
				} else {
					losses++
				}
			})
		}
		close(start)
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		if wins != 1 || losses != writers-1 {
			t.Fatalf("round %d: %d wins, %d losses; want exactly 1 win", round, wins, losses)
		}
		got := mustGet(t, s, "/counter")
		if string(got.Value) != fmt.Sprint(round+1) || got.CreateRevision != r0 {
			t.Fatalf("round %d: counter %q create %d", round, got.Value, got.CreateRevision)
		}
	}
	// Writers on different keys never conflict, and each writer's
	// changes carry increasing revisions (concurrent writers' may share
	// one: a store may merge their transactions).
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for w := range writers {
		wg.Go(func() {
			var last int64
			for i := range 10 {
				res, err := s.Txn(ctx, []store.Cmp{{Key: fmt.Sprintf("/own/%d/%d", w, i)}}, []store.Op{store.Put(fmt.Sprintf("/own/%d/%d", w, i), nil)})
				if err == nil && !res.Succeeded {
					err = fmt.Errorf("writer %d: create of its own key %d failed", w, i)
				}
				if err == nil && res.Revision <= last {
					err = fmt.Errorf("writer %d: create %d at revision %d, after one at %d", w, i, res.Revision, last)
				}
				if err != nil {
					errs <- err
					return
				}
				last = res.Revision
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	kvs, _, err := s.List(ctx, "/own/")
	if err != nil {
		t.Fatal(err)
	}
	if len(kvs) != writers*10 {
		t.Fatalf("List /own/ = %d keys, want %d", len(kvs), writers*10)
	}
}

func testList(t *testing.T, s store.Store) {
	keys := []string{"/b/2", "/a/1", "/b/10", "/b/1", "/c", "/b", "/bb/1", "/b/"}
	for _, k := range keys {
		mustPut(t, s, k, "v"+k)
	}
	last := mustPut(t, s, "/b/3", "x")
	mustTxn(t, s, nil, store.Delete("/b/3"))
	kvs, rev, err := s.List(ctxT(t), "/b/")
	if err != nil {
		t.Fatal(err)
	}
	if rev != last+1 {
		t.Fatalf("List revision = %d, want %d", rev, last+1)
	}
	want := []string{"/b/", "/b/1", "/b/10", "/b/2"}
	var got []string
	for _, kv := range kvs {
		got = append(got, kv.Key)
		if string(kv.Value) != "v"+kv.Key || kv.ModRevision == 0 {
			t.Fatalf("List entry %+v", kv)
		}
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("List(/b/) = %v, want %v", got, want)
	}
	// Values are separate: growing one never writes into another.
	_ = append(kvs[0].Value, "XXXXXXXX"...)
	if string(kvs[1].Value) != "v"+kvs[1].Key {
		t.Fatalf("appending to one listed value changed the next: %q", kvs[1].Value)
	}
	all, _, err := s.List(ctxT(t), "")
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != len(keys) || !sort.SliceIsSorted(all, func(i, j int) bool { return all[i].Key < all[j].Key }) {
		t.Fatalf("List(\"\") = %v, want all %d keys sorted", all, len(keys))
	}
	none, _, err := s.List(ctxT(t), "/zzz")
	if err != nil || len(none) != 0 {
		t.Fatalf("List of an unused prefix = %v, %v", none, err)
	}
}

func testCopies(t *testing.T, s store.Store) {
	v := []byte("orig")
	mustTxn(t, s, nil, store.Put("/a", v))
	v[0] = 'X'
	kv := mustGet(t, s, "/a")
	if string(kv.Value) != "orig" {
		t.Fatalf("store kept the caller's slice: %q", kv.Value)
	}
	kv.Value[0] = 'Y'
	if got := mustGet(t, s, "/a"); string(got.Value) != "orig" {
		t.Fatalf("store returned its own slice: %q", got.Value)
	}
}

// collect reads n events or fails.
func collect(t *testing.T, w store.Watcher, n int) []store.Event {
	t.Helper()
	var out []store.Event
	timeout := time.After(20 * time.Second)
	for len(out) < n {
		select {
		case ev, ok := <-w.Events():
			if !ok {
				t.Fatalf("watch ended after %d of %d events: %v", len(out), n, w.Err())
			}
			out = append(out, ev)
		case <-timeout:
			t.Fatalf("got %d of %d events, then nothing", len(out), n)
		}
	}
	return out
}

func wantEvent(t *testing.T, ev store.Event, typ store.EventType, key, value string, mod int64) {
	t.Helper()
	if ev.Type != typ || ev.KV.Key != key || string(ev.KV.Value) != value || ev.KV.ModRevision != mod {
		t.Fatalf("event %v %s=%q mod %d, want %v %s=%q mod %d", ev.Type, ev.KV.Key, ev.KV.Value, ev.KV.ModRevision, typ, key, value, mod)
	}
	if typ == store.EventDelete && (ev.KV.Value != nil || ev.KV.CreateRevision != 0) {
		t.Fatalf("delete event carries value %q create %d", ev.KV.Value, ev.KV.CreateRevision)
	}
}

// wantQuiet checks that no further event arrives before a marker write
// outside the watch's prefix is visible to a second watch.
func wantQuiet(t *testing.T, s store.Store, w store.Watcher) {
	t.Helper()
	ctx, cancel := context.WithCancel(ctxT(t))
	defer cancel()
	marker, err := s.Watch(ctx, "/~marker", 0)
	if err != nil {
		t.Fatal(err)
	}
	mustPut(t, s, "/~marker", "m")
	collect(t, marker, 1)
	// The marker's revision is the newest; a watch on another prefix has
	// had every earlier change offered already, but delivery is
	// asynchronous, so poll briefly.
	select {
	case ev, ok := <-w.Events():
		if ok {
			t.Fatalf("unexpected event %v %s", ev.Type, ev.KV.Key)
		}
	case <-time.After(50 * time.Millisecond):
	}
}

func testWatchFromNow(t *testing.T, s store.Store) {
	ctx := ctxT(t)
	mustPut(t, s, "/w/old", "before")
	w, err := s.Watch(ctx, "/w/", 0)
	if err != nil {
		t.Fatal(err)
	}
	r1 := mustPut(t, s, "/w/a", "1")
	mustPut(t, s, "/other", "x")
	r2 := mustTxn(t, s, nil, store.Put("/w/b", []byte("2")), store.Delete("/w/old"), store.Put("/w/c", []byte("3"))).Revision
	r3 := mustTxn(t, s, nil, store.Delete("/w/a")).Revision
	evs := collect(t, w, 5)
	wantEvent(t, evs[0], store.EventPut, "/w/a", "1", r1)
	if evs[0].KV.CreateRevision != r1 {
		t.Fatalf("put event create = %d, want %d", evs[0].KV.CreateRevision, r1)
	}
	wantEvent(t, evs[1], store.EventPut, "/w/b", "2", r2)
	wantEvent(t, evs[2], store.EventDelete, "/w/old", "", r2)
	wantEvent(t, evs[3], store.EventPut, "/w/c", "3", r2)
	wantEvent(t, evs[4], store.EventDelete, "/w/a", "", r3)
	wantQuiet(t, s, w)
	if w.Err() != nil {
		t.Fatalf("Err of a running watch = %v, want nil", w.Err())
	}
}

func testWatchFromPast(t *testing.T, s store.Store) {
	ctx := ctxT(t)
	var revs []int64
	for i := range 10 {
		revs = append(revs, mustPut(t, s, fmt.Sprintf("/p/%d", i), fmt.Sprint(i)))
	}
	// After revs[3]: events 4..9, then live ones.
	w, err := s.Watch(ctx, "/p/", revs[3])
	if err != nil {
		t.Fatal(err)
	}
	evs := collect(t, w, 6)
	for i, ev := range evs {
		wantEvent(t, ev, store.EventPut, fmt.Sprintf("/p/%d", i+4), fmt.Sprint(i+4), revs[i+4])
	}
	live := mustPut(t, s, "/p/live", "l")
	wantEvent(t, collect(t, w, 1)[0], store.EventPut, "/p/live", "l", live)
	// A watch from a future revision waits for it.
	fut, err := s.Watch(ctx, "/p/", live+1)
	if err != nil {
		t.Fatal(err)
	}
	mustPut(t, s, "/p/skipped", "s")
	r := mustPut(t, s, "/p/seen", "s")
	wantEvent(t, collect(t, fut, 1)[0], store.EventPut, "/p/seen", "s", r)
}

func testWatchFromList(t *testing.T, s store.Store) {
	ctx := ctxT(t)
	for i := range 5 {
		mustPut(t, s, fmt.Sprintf("/l/%d", i), "a")
	}
	// A writer keeps going while a reader does List then Watch: every key's
	// final state is the listing plus the events, with nothing missed. The
	// writer stops after 300 revisions, inside any test store's history.
	var wg sync.WaitGroup
	started := make(chan struct{})
	wg.Go(func() {
		signal := sync.OnceFunc(func() { close(started) })
		defer signal()
		for i := range 300 {
			if i == 50 {
				signal()
			}
			if _, err := s.Txn(ctx, nil, []store.Op{store.Put(fmt.Sprintf("/l/%d", i%5), fmt.Appendf(nil, "%d", i))}); err != nil {
				t.Error(err)
				return
			}
		}
	})
	<-started
	kvs, rev, err := s.List(ctx, "/l/")
	if err != nil {
		t.Fatal(err)
	}
	w, err := s.Watch(ctx, "/l/", rev)
	if err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	view := map[string]store.KV{}
	for _, kv := range kvs {
		view[kv.Key] = kv
	}
	final, finalRev, err := s.List(ctx, "/l/")
	if err != nil {
		t.Fatal(err)
	}
	for rev < finalRev {
		ev := collect(t, w, 1)[0]
		if ev.KV.ModRevision <= rev {
			t.Fatalf("event at revision %d after %d: out of order or repeated", ev.KV.ModRevision, rev)
		}
		rev = ev.KV.ModRevision
		view[ev.KV.Key] = ev.KV
	}
	for _, kv := range final {
		if got := view[kv.Key]; got.ModRevision != kv.ModRevision || !bytes.Equal(got.Value, kv.Value) {
			t.Fatalf("List+Watch view of %s = %+v, store has %+v", kv.Key, got, kv)
		}
	}
}

func testWatchCompacted(t *testing.T, s store.Store) {
	ctx := ctxT(t)
	// Enough revisions to pass any history bound a test store is opened
	// with (the suite expects a history of at most 1000 revisions).
	const n = 1100
	for i := range n {
		mustPut(t, s, "/c", fmt.Sprint(i))
	}
	if _, err := s.Watch(ctx, "/c", 1); !errors.Is(err, store.ErrCompacted) {
		t.Fatalf("Watch from revision 1 after %d revisions: err = %v, want ErrCompacted", n, err)
	}
	// The newest revisions are still there.
	w, err := s.Watch(ctx, "/c", n-1)
	if err != nil {
		t.Fatal(err)
	}
	wantEvent(t, collect(t, w, 1)[0], store.EventPut, "/c", fmt.Sprint(n-1), n)
}

func testWatchSlowReader(t *testing.T, s store.Store) {
	ctx := ctxT(t)
	w, err := s.Watch(ctx, "/s/", 0)
	if err != nil {
		t.Fatal(err)
	}
	// Nobody reads while 300 changes are made: none may be lost.
	const n = 300
	for i := range n {
		mustPut(t, s, fmt.Sprintf("/s/%03d", i), "v")
	}
	evs := collect(t, w, n)
	for i, ev := range evs {
		if ev.KV.Key != fmt.Sprintf("/s/%03d", i) {
			t.Fatalf("event %d is %s", i, ev.KV.Key)
		}
	}
}

func testWatchCancel(t *testing.T, s store.Store) {
	ctx, cancel := context.WithCancel(ctxT(t))
	w, err := s.Watch(ctx, "/", 0)
	if err != nil {
		t.Fatal(err)
	}
	mustPut(t, s, "/a", "1")
	collect(t, w, 1)
	cancel()
	mustPut(t, s, "/a", "2") // the watch may or may not see it; it must end
	for range w.Events() {
	}
	if !errors.Is(w.Err(), context.Canceled) {
		t.Fatalf("Err after cancel = %v, want context.Canceled", w.Err())
	}
	// A watch started with a done ctx fails at once or ends at once.
	if w2, err := s.Watch(ctx, "/", 0); err == nil {
		for range w2.Events() {
		}
		if !errors.Is(w2.Err(), context.Canceled) {
			t.Fatalf("watch on a canceled ctx: Err = %v", w2.Err())
		}
	} else if !errors.Is(err, context.Canceled) {
		t.Fatalf("Watch with a canceled ctx: err = %v", err)
	}
}

func testWatchClose(t *testing.T, s store.Store) {
	ctx := ctxT(t)
	w, err := s.Watch(ctx, "/", 0)
	if err != nil {
		t.Fatal(err)
	}
	mustPut(t, s, "/a", "1")
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	for range w.Events() {
	}
	if !errors.Is(w.Err(), store.ErrClosed) {
		t.Fatalf("Err after Close = %v, want ErrClosed", w.Err())
	}
	if _, err := s.Watch(ctx, "/", 0); !errors.Is(err, store.ErrClosed) {
		t.Fatalf("Watch after Close: err = %v, want ErrClosed", err)
	}
}

func testClosed(t *testing.T, s store.Store) {
	ctx := ctxT(t)
	mustPut(t, s, "/a", "1")
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if _, err := s.Get(ctx, "/a"); !errors.Is(err, store.ErrClosed) {
		t.Fatalf("Get after Close: %v", err)
	}
	if _, _, err := s.List(ctx, ""); !errors.Is(err, store.ErrClosed) {
		t.Fatalf("List after Close: %v", err)
	}
	if _, err := s.Txn(ctx, nil, []store.Op{store.Put("/b", nil)}); !errors.Is(err, store.ErrClosed) {
		t.Fatalf("Txn after Close: %v", err)
	}
	if err := s.Close(); !errors.Is(err, store.ErrClosed) {
		t.Fatalf("second Close: %v, want ErrClosed", err)
	}
}

func sameKVs(a, b []store.KV) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].Key != b[i].Key || !bytes.Equal(a[i].Value, b[i].Value) || a[i].CreateRevision != b[i].CreateRevision || a[i].ModRevision != b[i].ModRevision {
			return false
		}
	}
	return true
}
