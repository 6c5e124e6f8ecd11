// Package memory is an in-memory store.Store for tests and simulations. It
// keeps revisions, compares and watches exactly like the durable stores, and
// remembers a bounded history of changes for watches that start in the past.
package memory

import (
	"context"
	"encoding/binary"
	"sort"
	"strings"
	"sync"

	"github.com/berth-dev/berth/store"
	"github.com/berth-dev/berth/store/internal/history"
	"github.com/berth-dev/berth/store/internal/watch"
)

// DefaultHistory is the number of revisions a store remembers when
// Options.History is 0.
const DefaultHistory = history.DefaultRevisions

// Options configures a Store.
type Options struct {
	// History is how many of the latest revisions watches can start from;
	// older ones are forgotten and Watch returns store.ErrCompacted for
	// them. 0 means DefaultHistory.
	History int
	// HistoryBytes bounds the keys and values of the changes remembered
	// (the latest revision is always kept). 0 means 64 MiB.
	HistoryBytes int64
}

// Store is an in-memory store.Store. The zero value is not usable; call New.
type Store struct {
	hub *watch.Hub
	log *history.Log

	mu     sync.RWMutex
	closed bool
	rev    int64
	kvs    map[string]entry
}

// entry is a key's revisions and value in one string: the create and the
// mod revision as uvarints, then the value; the key is the map's. A map slot
// is then a key and a string header, and the history shares the value's
// bytes.
type entry string

// newEntry returns the entry of value at revisions create and modRev.
func newEntry(create, modRev int64, value []byte) entry {
	var buf [2 * binary.MaxVarintLen64]byte
	revs := binary.AppendUvarint(buf[:0], uint64(create))
	revs = binary.AppendUvarint(revs, uint64(modRev))
	var b strings.Builder
	b.Grow(len(revs) + len(value))
	b.Write(revs)
	b.Write(value)
	return entry(b.String())
}

// parts returns e's revisions and value; the value shares e's bytes.
func (e entry) parts() (create, modRev int64, value string) {
	c, n := binary.Uvarint([]byte(e))
	m, k := binary.Uvarint([]byte(e[n:]))
	return int64(c), int64(m), string(e[n+k:])
}

// kv returns e as the store.KV of key, with a copy of the value.
func (e entry) kv(key string) store.KV {
	create, modRev, value := e.parts()
	return store.KV{Key: key, Value: []byte(value), CreateRevision: create, ModRevision: modRev}
}

// New returns an empty store at revision 0.
func New(opts Options) *Store {
	if opts.History <= 0 {
		opts.History = DefaultHistory
	}
	if opts.HistoryBytes <= 0 {
		opts.HistoryBytes = history.DefaultBytes
	}
	return &Store{hub: watch.NewHub(), log: history.New(0, opts.History, opts.HistoryBytes), kvs: make(map[string]entry)}
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
	e, ok := s.kvs[key]
	if !ok {
		return store.KV{}, store.ErrNotFound
	}
	return e.kv(key), nil
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
	for k, e := range s.kvs {
		if strings.HasPrefix(k, prefix) {
			out = append(out, e.kv(k))
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
		var mod int64
		if e, ok := s.kvs[c.Key]; ok {
			_, mod, _ = e.parts()
		}
		if mod != c.ModRevision {
			return store.TxnResult{Succeeded: false, Revision: s.rev}, false, nil
		}
	}
	rev := s.rev + 1
	var evs []history.Change
	for _, op := range ops {
		switch op.Kind {
		case store.OpPut:
			create := rev
			if old, ok := s.kvs[op.Key]; ok {
				create, _, _ = old.parts()
			}
			e := newEntry(create, rev, op.Value)
			s.kvs[op.Key] = e
			_, _, value := e.parts()
			evs = append(evs, history.Change{Key: op.Key, Value: value, Create: create})
		case store.OpDelete:
			if _, ok := s.kvs[op.Key]; !ok {
				continue
			}
			delete(s.kvs, op.Key)
			evs = append(evs, history.Change{Key: op.Key})
		}
	}
	if len(evs) == 0 {
		return store.TxnResult{Succeeded: true, Revision: s.rev}, false, nil
	}
	s.rev = rev
	s.log.Append(rev, evs)
	return store.TxnResult{Succeeded: true, Revision: rev}, true, nil
}

// Watch implements store.Store.
func (s *Store) Watch(ctx context.Context, prefix string, fromRev int64) (store.Watcher, error) {
	return s.hub.Start(ctx, history.Source{Log: s.log, Closed: s.isClosed}, prefix, fromRev)
}

// Close implements store.Store. It ends every watch.
func (s *Store) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return store.ErrClosed
	}
	s.closed = true
	s.kvs = nil
	s.mu.Unlock()
	s.hub.Close()
	return nil
}

// isClosed reports whether Close was called.
func (s *Store) isClosed() bool {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.closed
}
