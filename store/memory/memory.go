// Package memory is an in-memory store.Store for tests and simulations. It
// keeps revisions, compares and watches exactly like the durable stores, and
// remembers a bounded history of changes for watches that start in the past.
package memory

import (
	"context"
	"slices"
	"sort"
	"strings"
	"sync"

	"github.com/berth-dev/berth/store"
	"github.com/berth-dev/berth/store/internal/watch"
)

// DefaultHistory is the number of revisions a store remembers when
// Options.History is 0.
const DefaultHistory = 10000

// Options configures a Store.
type Options struct {
	// History is how many of the latest revisions watches can start from;
	// older ones are forgotten and Watch returns store.ErrCompacted for
	// them. 0 means DefaultHistory. The store forgets old changes in
	// batches, so it holds the changes of up to twice as many revisions.
	History int
}

// Store is an in-memory store.Store. The zero value is not usable; call New.
type Store struct {
	history int
	hub     *watch.Hub

	mu      sync.RWMutex
	closed  bool
	rev     int64
	compact int64
	kvs     map[string]store.KV
	log     []change // oldest first; holds every change after compact
}

type change struct {
	rev int64
	ev  store.Event
}

// New returns an empty store at revision 0.
func New(opts Options) *Store {
	if opts.History <= 0 {
		opts.History = DefaultHistory
	}
	return &Store{history: opts.History, hub: watch.NewHub(), kvs: make(map[string]store.KV)}
}

var _ store.Store = (*Store)(nil)

// Get implements store.Store.
func (s *Store) Get(ctx context.Context, key string) (store.KV, error) {
	if err := store.ValidateKey("key", key); err != nil {
		return store.KV{}, err
	}
	if err := ctx.Err(); err != nil {
		return store.KV{}, err
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return store.KV{}, store.ErrClosed
	}
	kv, ok := s.kvs[key]
	if !ok {
		return store.KV{}, store.ErrNotFound
	}
	return copyKV(kv), nil
}

// List implements store.Store.
func (s *Store) List(ctx context.Context, prefix string) ([]store.KV, int64, error) {
	if err := ctx.Err(); err != nil {
		return nil, 0, err
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return nil, 0, store.ErrClosed
	}
	var out []store.KV
	for k, kv := range s.kvs {
		if strings.HasPrefix(k, prefix) {
			out = append(out, copyKV(kv))
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out, s.rev, nil
}

// Txn implements store.Store.
func (s *Store) Txn(ctx context.Context, cmps []store.Cmp, ops []store.Op) (store.TxnResult, error) {
	if err := store.ValidateTxn(cmps, ops); err != nil {
		return store.TxnResult{}, err
	}
	if err := ctx.Err(); err != nil {
		return store.TxnResult{}, err
	}
	s.mu.Lock()
	res, changed, err := s.apply(cmps, ops)
	s.mu.Unlock()
	if changed {
		s.hub.Notify()
	}
	return res, err
}

func (s *Store) apply(cmps []store.Cmp, ops []store.Op) (store.TxnResult, bool, error) {
	if s.closed {
		return store.TxnResult{}, false, store.ErrClosed
	}
	for _, c := range cmps {
		if s.kvs[c.Key].ModRevision != c.ModRevision {
			return store.TxnResult{Succeeded: false, Revision: s.rev}, false, nil
		}
	}
	rev := s.rev + 1
	changed := false
	for _, op := range ops {
		switch op.Kind {
		case store.OpPut:
			kv := store.KV{Key: op.Key, Value: slices.Clone(op.Value), CreateRevision: rev, ModRevision: rev}
			if old, ok := s.kvs[op.Key]; ok {
				kv.CreateRevision = old.CreateRevision
			}
			if kv.Value == nil {
				kv.Value = []byte{}
			}
			s.kvs[op.Key] = kv
			s.log = append(s.log, change{rev, store.Event{Type: store.EventPut, KV: kv}})
			changed = true
		case store.OpDelete:
			if _, ok := s.kvs[op.Key]; !ok {
				continue
			}
			delete(s.kvs, op.Key)
			s.log = append(s.log, change{rev, store.Event{Type: store.EventDelete, KV: store.KV{Key: op.Key, ModRevision: rev}}})
			changed = true
		}
	}
	if !changed {
		return store.TxnResult{Succeeded: true, Revision: s.rev}, false, nil
	}
	s.rev = rev
	if c := s.rev - int64(s.history); c > s.compact {
		s.compact = c
		s.trim()
	}
	return store.TxnResult{Succeeded: true, Revision: rev}, true, nil
}

// trim forgets the changes at or before the compact revision, but only once
// they span a whole history's worth of revisions, so the copy of the kept
// changes is paid once per s.history commits rather than on every commit.
// Changes never reads at or before the compact revision, so the changes
// kept past it until the next trim are never seen.
func (s *Store) trim() {
	if len(s.log) == 0 || s.log[0].rev > s.compact-int64(s.history) {
		return
	}
	i := sort.Search(len(s.log), func(i int) bool { return s.log[i].rev > s.compact })
	s.log = slices.Delete(s.log, 0, i)
}

// Watch implements store.Store.
func (s *Store) Watch(ctx context.Context, prefix string, fromRev int64) (store.Watcher, error) {
	return s.hub.Start(ctx, source{s}, prefix, fromRev)
}

// Close implements store.Store. It ends every watch.
func (s *Store) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return store.ErrClosed
	}
	s.closed = true
	s.kvs, s.log = nil, nil
	s.mu.Unlock()
	s.hub.Close()
	return nil
}

// source reads the store's history for watches.
type source struct{ s *Store }

func (src source) Revisions() (int64, int64, error) {
	s := src.s
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return 0, 0, store.ErrClosed
	}
	return s.compact, s.rev, nil
}

func (src source) Changes(prefix string, after int64, limit int) ([]store.Event, int64, error) {
	s := src.s
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return nil, after, store.ErrClosed
	}
	if after < s.compact {
		return nil, after, store.ErrCompacted
	}
	through := min(s.rev, after+int64(limit))
	if through <= after {
		return nil, after, nil
	}
	i := sort.Search(len(s.log), func(i int) bool { return s.log[i].rev > after })
	var out []store.Event
	for ; i < len(s.log) && s.log[i].rev <= through; i++ {
		if ev := s.log[i].ev; strings.HasPrefix(ev.KV.Key, prefix) {
			ev.KV = copyKV(ev.KV)
			out = append(out, ev)
		}
	}
	return out, through, nil
}

func copyKV(kv store.KV) store.KV {
	if kv.Value != nil {
		kv.Value = slices.Clone(kv.Value)
	}
	return kv
}
