// Package bolt is Berth's default store.Store: one bbolt file, durable
// before acknowledging. Every committed Txn is fsynced before Txn returns.
// Revisions survive a restart: the file holds the current revision and each
// key's create and mod revisions. The history that watches starting in the
// past read from is kept in memory, bounded by Options.History and
// Options.HistoryBytes, and starts empty when the file is opened: a watch
// from a revision before the open ends with store.ErrCompacted, and its
// reader lists again, as after any compaction. A commit writes only the
// keys it changes. Concurrent Txns are committed together in one bbolt
// transaction (group commit), each still applied in order with its own
// revision.
package bolt

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	bbolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"

	"github.com/berth-dev/berth/store"
	"github.com/berth-dev/berth/store/internal/history"
	"github.com/berth-dev/berth/store/internal/watch"
)

// ErrLocked is returned by Open when another process (or another Store in
// this process) has the file open.
var ErrLocked = errors.New("store file is locked by another process")

// Defaults for Options' zero values.
const (
	DefaultLockTimeout = time.Second
	DefaultHistory     = history.DefaultRevisions
	// maxGroup is the most Txns committed in one bbolt transaction.
	maxGroup = 512
	// initialMmap is the address space mapped for the file when it is
	// opened (not disk space).
	initialMmap = 1 << 30
	// allocSize is how much the file grows by when it is full (space
	// that is not written yet takes no disk blocks).
	allocSize = 128 << 20
)

// Options configures Open. The zero value gives the defaults.
type Options struct {
	// LockTimeout is how long Open waits for the file lock held by another
	// process before failing with ErrLocked. 0 means DefaultLockTimeout.
	LockTimeout time.Duration
	// History is how many of the latest revisions watches can start from;
	// older ones are dropped and Watch returns store.ErrCompacted for them.
	// 0 means DefaultHistory.
	History int
	// HistoryBytes bounds the keys and values of the changes kept for
	// watches (the latest revision is always kept). 0 means 64 MiB.
	HistoryBytes int64
	// NoGroupCommit commits every Txn in its own bbolt transaction; it is
	// for measuring what group commit gains.
	NoGroupCommit bool
}

// Store is a store.Store kept in one bbolt file.
type Store struct {
	db      *bbolt.DB
	noGroup bool
	hub     *watch.Hub
	log     *history.Log

	// commitMu orders commits, so the history receives revisions in order
	// when Txns are not grouped.
	commitMu sync.Mutex

	// closeMu is held shared by every call and exclusively by Close, so
	// Close waits for calls in progress.
	closeMu sync.RWMutex
	closed  bool

	groupMu sync.Mutex
	queue   []*call
	busy    bool
}

var _ store.Store = (*Store)(nil)

// Open opens or creates the store file at path. It fails with an error
// wrapping ErrLocked when another process holds the file for longer than
// opts.LockTimeout, and with a clear error when the file is not a Berth
// store.
func Open(path string, opts Options) (*Store, error) {
	if opts.LockTimeout <= 0 {
		opts.LockTimeout = DefaultLockTimeout
	}
	if opts.History <= 0 {
		opts.History = DefaultHistory
	}
	if opts.HistoryBytes <= 0 {
		opts.HistoryBytes = history.DefaultBytes
	}
	db, err := bbolt.Open(path, 0o600, &bbolt.Options{
		Timeout:      opts.LockTimeout,
		FreelistType: bbolt.FreelistMapType,
		// The free list is rebuilt from the pages when the file is opened
		// rather than written with every commit, so a commit writes and
		// syncs only the pages it changed and the meta page.
		NoFreelistSync: true,
		// Reserving address space up front saves remapping the file as it
		// grows; a remap waits for every reader and stalls commits.
		InitialMmapSize: initialMmap,
	})
	if errors.Is(err, berrors.ErrTimeout) {
		return nil, fmt.Errorf("store/bolt: open %s: %w (waited %s)", path, ErrLocked, opts.LockTimeout)
	}
	if err != nil {
		return nil, fmt.Errorf("store/bolt: open %s: %w", path, err)
	}
	// The file grows in large steps: each growth is a truncate and a full
	// fsync that stalls commits for tens of milliseconds.
	db.AllocSize = allocSize
	var rev int64
	err = db.Update(func(tx *bbolt.Tx) error {
		for _, name := range [][]byte{bucketMeta, bucketKV} {
			if _, err := tx.CreateBucketIfNotExists(name); err != nil {
				return err
			}
		}
		meta := tx.Bucket(bucketMeta)
		v, err := getU64(meta.Get(metaFormat))
		switch {
		case err != nil:
			return err
		case v == 1:
			// Format 1 kept the change log in the file.
			if err := tx.DeleteBucket(bucketLog); err != nil && !errors.Is(err, berrors.ErrBucketNotFound) {
				return err
			}
			if err := meta.Delete(metaCompact); err != nil {
				return err
			}
			if err := meta.Put(metaFormat, u64(formatVersion)); err != nil {
				return err
			}
		case v == 0:
			if err := meta.Put(metaFormat, u64(formatVersion)); err != nil {
				return err
			}
		case v != formatVersion:
			return fmt.Errorf("store/bolt: file format %d, this build reads %d", v, formatVersion)
		}
		rev, err = getU64(meta.Get(metaRev))
		return err
	})
	if err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("store/bolt: open %s: %w", path, err)
	}
	return &Store{db: db, noGroup: opts.NoGroupCommit, hub: watch.NewHub(), log: history.New(rev, opts.History, opts.HistoryBytes)}, nil
}

// Path returns the store file's path.
func (s *Store) Path() string { return s.db.Path() }

// view runs fn in a read transaction unless the store is closed.
func (s *Store) view(fn func(tx *bbolt.Tx) error) error {
	s.closeMu.RLock()
	defer s.closeMu.RUnlock()
	if s.closed {
		return store.ErrClosed
	}
	return s.db.View(fn)
}

// Get implements store.Store.
func (s *Store) Get(ctx context.Context, key string) (store.KV, error) {
	if err := store.ValidateKey("key", key); err != nil {
		return store.KV{}, err
	}
	if err := ctx.Err(); err != nil {
		return store.KV{}, err
	}
	var kv store.KV
	err := s.view(func(tx *bbolt.Tx) error {
		b := tx.Bucket(bucketKV).Get([]byte(key))
		if b == nil {
			return store.ErrNotFound
		}
		var err error
		kv, err = decodeKV(key, b)
		return err
	})
	return kv, err
}

// List implements store.Store. It reads the range twice in one read
// transaction, first to size it, so a listing of n keys costs a few
// allocations rather than 2n; it checks ctx every 4096 keys.
func (s *Store) List(ctx context.Context, prefix string) ([]store.KV, int64, error) {
	if err := ctx.Err(); err != nil {
		return nil, 0, err
	}
	var out []store.KV
	var rev int64
	err := s.view(func(tx *bbolt.Tx) error {
		var err error
		if rev, err = getU64(tx.Bucket(bucketMeta).Get(metaRev)); err != nil {
			return err
		}
		p := []byte(prefix)
		c := tx.Bucket(bucketKV).Cursor()
		n, keyBytes, valueBytes := 0, 0, 0
		for k, v := c.Seek(p); k != nil && bytes.HasPrefix(k, p); k, v = c.Next() {
			if n%4096 == 4095 {
				if err := ctx.Err(); err != nil {
					return err
				}
			}
			if len(v) < kvHeader {
				return fmt.Errorf("store/bolt: corrupt entry for key %q: %d bytes", k, len(v))
			}
			n++
			keyBytes += len(k)
			valueBytes += len(v) - kvHeader
		}
		if n == 0 {
			return nil
		}
		var keys strings.Builder
		keys.Grow(keyBytes)
		values := make([]byte, 0, valueBytes)
		ends := make([]int, 0, n)
		out = make([]store.KV, 0, n)
		for k, v := c.Seek(p); k != nil && bytes.HasPrefix(k, p) && len(out) < n; k, v = c.Next() {
			keys.Write(k)
			ends = append(ends, keys.Len())
			off := len(values)
			values = append(values, v[kvHeader:]...)
			out = append(out, store.KV{
				Value:          values[off:len(values):len(values)],
				CreateRevision: createRevision(v),
				ModRevision:    modRevision(v),
			})
		}
		all, start := keys.String(), 0
		for i, end := range ends {
			out[i].Key = all[start:end]
			start = end
		}
		return nil
	})
	if err != nil {
		return nil, 0, err
	}
	return out, rev, nil
}

// call is one Txn waiting to be committed.
type call struct {
	cmps []store.Cmp
	ops  []store.Op
	// wake receives true when this call is to lead the next group commit,
	// false when another leader has committed it.
	wake chan bool

	res    store.TxnResult
	events []history.Change // the changes, when it changed something
	err    error
}

// Txn implements store.Store. Concurrent Txns are committed in groups: the
// first caller commits its own Txn and every Txn that arrived while the
// previous group was being written, in arrival order, in one bbolt
// transaction and one fsync.
func (s *Store) Txn(ctx context.Context, cmps []store.Cmp, ops []store.Op) (store.TxnResult, error) {
	if err := store.ValidateTxn(cmps, ops); err != nil {
		return store.TxnResult{}, err
	}
	if err := ctx.Err(); err != nil {
		return store.TxnResult{}, err
	}
	s.closeMu.RLock()
	defer s.closeMu.RUnlock()
	if s.closed {
		return store.TxnResult{}, store.ErrClosed
	}
	c := &call{cmps: cmps, ops: ops}
	if s.noGroup {
		s.commit([]*call{c})
	} else {
		s.group(c)
	}
	if c.err != nil {
		return store.TxnResult{}, fmt.Errorf("store/bolt: txn: %w", c.err)
	}
	return c.res, nil
}

// group queues c and either waits for a leader to commit it or leads.
func (s *Store) group(c *call) {
	c.wake = make(chan bool, 1)
	s.groupMu.Lock()
	s.queue = append(s.queue, c)
	if s.busy {
		s.groupMu.Unlock()
		if lead := <-c.wake; !lead {
			return
		}
		s.groupMu.Lock()
	}
	s.busy = true
	n := min(len(s.queue), maxGroup)
	batch := s.queue[:n:n]
	s.queue = s.queue[n:]
	s.groupMu.Unlock()

	s.commit(batch)
	for _, o := range batch {
		if o != c {
			o.wake <- false
		}
	}

	s.groupMu.Lock()
	if len(s.queue) > 0 {
		s.queue[0].wake <- true
	} else {
		s.busy = false
	}
	s.groupMu.Unlock()
}

// commit applies calls in order in one bbolt transaction and adds their
// changes to the history. When the transaction fails, it applies each call
// in its own, so one bad call fails alone.
func (s *Store) commit(calls []*call) {
	s.commitMu.Lock()
	changed := s.commitLocked(calls)
	s.commitMu.Unlock()
	if changed {
		s.hub.Notify()
	}
}

func (s *Store) commitLocked(calls []*call) (changed bool) {
	err := s.db.Update(func(tx *bbolt.Tx) error {
		for _, c := range calls {
			if err := s.apply(tx, c); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil && len(calls) > 1 {
		for _, c := range calls {
			if s.commitLocked([]*call{c}) {
				changed = true
			}
		}
		return changed
	}
	for _, c := range calls {
		if err != nil {
			c.res, c.events, c.err = store.TxnResult{}, nil, err
			continue
		}
		if c.events != nil {
			s.log.Append(c.res.Revision, c.events)
			c.events = nil
			changed = true
		}
	}
	return changed
}

// apply runs one Txn inside tx and records its outcome in c.
func (s *Store) apply(tx *bbolt.Tx, c *call) error {
	c.res, c.events, c.err = store.TxnResult{}, nil, nil
	meta, kvs := tx.Bucket(bucketMeta), tx.Bucket(bucketKV)
	rev, err := getU64(meta.Get(metaRev))
	if err != nil {
		return err
	}
	for _, cmp := range c.cmps {
		if modRevision(kvs.Get([]byte(cmp.Key))) != cmp.ModRevision {
			c.res = store.TxnResult{Succeeded: false, Revision: rev}
			return nil
		}
	}
	next := rev + 1
	var events []history.Change
	for _, op := range c.ops {
		key := []byte(op.Key)
		old := kvs.Get(key)
		switch op.Kind {
		case store.OpPut:
			create := next
			if old != nil {
				create = createRevision(old)
			}
			enc := encodeKV(create, next, op.Value)
			if err := kvs.Put(key, enc); err != nil {
				return err
			}
			events = append(events, history.Change{Key: op.Key, Value: string(op.Value), Create: create})
		case store.OpDelete:
			if old == nil {
				continue
			}
			if err := kvs.Delete(key); err != nil {
				return err
			}
			events = append(events, history.Change{Key: op.Key})
		}
	}
	if len(events) == 0 {
		c.res = store.TxnResult{Succeeded: true, Revision: rev}
		return nil
	}
	if err := meta.Put(metaRev, u64(next)); err != nil {
		return err
	}
	c.res, c.events = store.TxnResult{Succeeded: true, Revision: next}, events
	return nil
}

// Watch implements store.Store.
func (s *Store) Watch(ctx context.Context, prefix string, fromRev int64) (store.Watcher, error) {
	return s.hub.Start(ctx, history.Source{Log: s.log, Closed: s.isClosed}, prefix, fromRev)
}

// Close implements store.Store: it waits for calls in progress, ends every
// watch and closes the file.
func (s *Store) Close() error {
	s.closeMu.Lock()
	if s.closed {
		s.closeMu.Unlock()
		return store.ErrClosed
	}
	s.closed = true
	s.closeMu.Unlock()
	s.hub.Close()
	if err := s.db.Close(); err != nil {
		return fmt.Errorf("store/bolt: close: %w", err)
	}
	return nil
}

// isClosed reports whether Close was called.
func (s *Store) isClosed() bool {
	s.closeMu.RLock()
	defer s.closeMu.RUnlock()
	return s.closed
}
