// Package etcd is a store.Store on etcd (v3): Berth's state kept by a
// replicated, highly available engine, for a cluster of Berth servers.
//
// The mapping is the one store.Store describes: keys live under a prefix
// (one per Berth cluster), Get and List are etcd ranges, Txn is an etcd
// transaction comparing mod revisions, Watch is an etcd watch. A store
// revision is etcd's revision minus one, so that an empty etcd is at
// revision 0 as every store starts; revisions grow by one per changing
// etcd transaction as long as nothing else writes to the etcd cluster
// (other writers, a leader election among them, make them jump, which the
// store's contract allows: they stay monotonic). Concurrent calls of Txn
// are merged into fewer etcd transactions (batch.go).
//
// The store compacts etcd's history itself, keeping the latest
// Options.History revisions for watches that start in the past.
package etcd

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/store"
)

// Defaults of Options.
const (
	DefaultHistory = 10000
	// DefaultMaxTxnOps is the most comparisons and ops one transaction may
	// carry: the limit the embedded member is started with. An external
	// etcd must be started with --max-txn-ops at least this high.
	DefaultMaxTxnOps = 1 << 16
	// DefaultMaxRequestBytes is the largest transaction, in bytes: the
	// embedded member's --max-request-bytes.
	DefaultMaxRequestBytes = 64 << 20
	// listPage is how many keys one range request of List reads.
	listPage = 5000
	// callTimeout bounds a write once it is sent: it runs to the end
	// whatever the caller's context does (store.Store's contract), but not
	// for ever when the cluster has no leader.
	callTimeout = 30 * time.Second
)

// Options configures a Store.
type Options struct {
	// Prefix is put in front of every key: one Berth cluster's key space
	// within the etcd cluster. It may be empty.
	Prefix string
	// History is how many of the latest revisions watches can start from
	// (0: DefaultHistory); the store compacts older ones.
	History int64
	// MaxTxnOps and MaxRequestBytes are the etcd cluster's limits (0: the
	// defaults above); a larger transaction is refused with an error
	// wrapping driver.ErrInvalid that names the limit.
	MaxTxnOps       int
	MaxRequestBytes int
	// Observe, when set, is told how long each call to etcd took.
	Observe func(op string, d time.Duration, err error)
}

// Store is a store.Store on an etcd client. The client stays the caller's:
// Close ends the store's calls and watches, not the client.
type Store struct {
	c    *clientv3.Client
	opts Options

	// mu guards closed and compacted; calls hold calls while they run.
	mu        sync.Mutex
	closed    bool
	compacted int64 // the store revision history was last compacted to
	calls     sync.WaitGroup
	// stop ends every watch when the store closes.
	stop     context.Context
	stopNow  context.CancelFunc
	watchers sync.WaitGroup
	// batch merges concurrent transactions (batch.go); drains are its
	// goroutines sending them.
	batch  batcher
	drains sync.WaitGroup
}

var _ store.Store = (*Store)(nil)

// New returns a Store on c.
func New(c *clientv3.Client, opts Options) *Store {
	if opts.History <= 0 {
		opts.History = DefaultHistory
	}
	if opts.MaxTxnOps <= 0 {
		opts.MaxTxnOps = DefaultMaxTxnOps
	}
	if opts.MaxRequestBytes <= 0 {
		opts.MaxRequestBytes = DefaultMaxRequestBytes
	}
	s := &Store{c: c, opts: opts}
	s.stop, s.stopNow = context.WithCancel(context.Background())
	return s
}

// enter registers a call, or says the store is closed.
func (s *Store) enter() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return store.ErrClosed
	}
	s.calls.Add(1)
	return nil
}

func (s *Store) observe(op string, start time.Time, err error) {
	if s.opts.Observe != nil {
		s.opts.Observe(op, time.Since(start), err)
	}
}

// etcdRev is the etcd revision of store revision r.
func etcdRev(r int64) int64 { return r + 1 }

// storeRev is the store revision of etcd revision r (0 for 0).
func storeRev(r int64) int64 {
	if r <= 0 {
		return 0
	}
	return r - 1
}

// wrap turns an etcd error into the store's vocabulary.
func wrap(op string, err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return err
	case errors.Is(err, rpctypes.ErrCompacted):
		return fmt.Errorf("store/etcd: %s: %w", op, store.ErrCompacted)
	case errors.Is(err, rpctypes.ErrTooManyOps), errors.Is(err, rpctypes.ErrRequestTooLarge):
		return fmt.Errorf("store/etcd: %s: %w: %w", op, driver.ErrInvalid, err)
	}
	// A cluster without a leader, a member cut off, a connection lost:
	// worth trying again.
	return fmt.Errorf("store/etcd: %s: %w: %w", op, driver.ErrRetryable, err)
}

func (s *Store) kv(kv *mvccpb.KeyValue) store.KV {
	return store.KV{
		Key: strings.TrimPrefix(string(kv.Key), s.opts.Prefix), Value: append([]byte{}, kv.Value...),
		CreateRevision: storeRev(kv.CreateRevision), ModRevision: storeRev(kv.ModRevision),
	}
}

// Get implements store.Store.
func (s *Store) Get(ctx context.Context, key string) (store.KV, error) {
	if err := store.ValidateKey("key", key); err != nil {
		return store.KV{}, err
	}
	if err := s.enter(); err != nil {
		return store.KV{}, err
	}
	defer s.calls.Done()
	start := time.Now()
	resp, err := s.c.Get(ctx, s.opts.Prefix+key)
	s.observe("get", start, err)
	if err != nil {
		return store.KV{}, wrap("get", err)
	}
	if len(resp.Kvs) == 0 {
		return store.KV{}, store.ErrNotFound
	}
	return s.kv(resp.Kvs[0]), nil
}

// List implements store.Store. It reads in pages, all at the revision of
// the first, so the listing is one consistent picture however long it is.
func (s *Store) List(ctx context.Context, prefix string) ([]store.KV, int64, error) {
	if err := s.enter(); err != nil {
		return nil, 0, err
	}
	defer s.calls.Done()
	full := s.opts.Prefix + prefix
	end := clientv3.GetPrefixRangeEnd(full)
	from := full
	if from == "" {
		from = "\x00"
	}
	var out []store.KV
	var rev int64
	for {
		opts := []clientv3.OpOption{clientv3.WithRange(end), clientv3.WithSort(clientv3.SortByKey, clientv3.SortAscend), clientv3.WithLimit(listPage)}
		if rev != 0 {
			opts = append(opts, clientv3.WithRev(rev))
		}
		start := time.Now()
		resp, err := s.c.Get(ctx, from, opts...)
		s.observe("list", start, err)
		if err != nil {
			return nil, 0, wrap("list", err)
		}
		if rev == 0 {
			rev = resp.Header.Revision
		}
		for _, kv := range resp.Kvs {
			out = append(out, s.kv(kv))
		}
		if !resp.More || len(resp.Kvs) == 0 {
			break
		}
		from = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
	}
	return out, storeRev(rev), nil
}

// Txn implements store.Store. Once sent, a transaction runs to its end
// even if ctx ends (within callTimeout), so that its outcome is known.
func (s *Store) Txn(ctx context.Context, cmps []store.Cmp, ops []store.Op) (store.TxnResult, error) {
	if err := store.ValidateTxn(cmps, ops); err != nil {
		return store.TxnResult{}, err
	}
	if n := len(cmps) + len(ops); n > s.opts.MaxTxnOps {
		return store.TxnResult{}, fmt.Errorf("store/etcd: %w", &driver.FieldError{Path: "ops", Reason: fmt.Sprintf("%d comparisons and ops in one transaction: the etcd cluster takes at most %d (its --max-txn-ops)", n, s.opts.MaxTxnOps)})
	}
	size := 0
	for _, op := range ops {
		size += len(op.Key) + len(s.opts.Prefix) + len(op.Value) + 16
	}
	for _, c := range cmps {
		size += len(c.Key) + len(s.opts.Prefix) + 16
	}
	if size > s.opts.MaxRequestBytes {
		return store.TxnResult{}, fmt.Errorf("store/etcd: %w", &driver.FieldError{Path: "ops", Reason: fmt.Sprintf("a transaction of about %d bytes: the etcd cluster takes at most %d (its --max-request-bytes)", size, s.opts.MaxRequestBytes)})
	}
	if err := ctx.Err(); err != nil {
		return store.TxnResult{}, err
	}
	if err := s.enter(); err != nil {
		return store.TxnResult{}, err
	}
	defer s.calls.Done()
	c := &call{cmps: make([]clientv3.Cmp, len(cmps)), cmpKeys: make([]string, len(cmps)),
		ops: make([]clientv3.Op, len(ops)), opKeys: make([]string, len(ops)), size: size}
	for i, cmp := range cmps {
		key := s.opts.Prefix + cmp.Key
		if cmp.ModRevision == 0 {
			c.cmps[i] = clientv3.Compare(clientv3.CreateRevision(key), "=", 0)
		} else {
			c.cmps[i] = clientv3.Compare(clientv3.ModRevision(key), "=", etcdRev(cmp.ModRevision))
		}
		c.cmpKeys[i] = key
	}
	for i, op := range ops {
		key := s.opts.Prefix + op.Key
		if op.Kind == store.OpPut {
			c.ops[i] = clientv3.OpPut(key, string(op.Value))
		} else {
			c.ops[i] = clientv3.OpDelete(key)
		}
		c.opKeys[i] = key
	}
	start := time.Now()
	o := s.send(ctx, c)
	resp, err := o.resp, o.err
	s.observe("txn", start, err)
	if err != nil {
		return store.TxnResult{}, wrap("txn", err)
	}
	rev := storeRev(resp.Header.Revision)
	if resp.Succeeded && len(ops) > 0 {
		s.maybeCompact(rev)
	}
	return store.TxnResult{Succeeded: resp.Succeeded, Revision: rev}, nil
}

// maybeCompact compacts etcd's history to the latest History revisions
// once it holds a twentieth more than that.
func (s *Store) maybeCompact(rev int64) {
	s.mu.Lock()
	to := rev - s.opts.History
	if to <= 0 || to-s.compacted < s.opts.History/20+1 {
		s.mu.Unlock()
		return
	}
	s.compacted = to
	s.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	start := time.Now()
	_, err := s.c.Compact(ctx, etcdRev(to))
	s.observe("compact", start, err)
	// Another server compacted as far already: nothing to do.
	_ = err
}

// Watch implements store.Store.
func (s *Store) Watch(ctx context.Context, prefix string, fromRev int64) (store.Watcher, error) {
	if err := store.ValidateFromRev(fromRev); err != nil {
		return nil, err
	}
	if err := s.enter(); err != nil {
		return nil, err
	}
	defer s.calls.Done()
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if fromRev > 0 {
		// The watch reports compaction only after it started; a read at
		// the first revision asked for says at once whether etcd still
		// has it.
		_, err := s.c.Get(ctx, s.opts.Prefix+prefix, clientv3.WithRev(etcdRev(fromRev)+1), clientv3.WithCountOnly())
		switch {
		case errors.Is(err, rpctypes.ErrCompacted):
			return nil, fmt.Errorf("store/etcd: watch %s from revision %d: %w", prefix, fromRev, store.ErrCompacted)
		case err != nil && !errors.Is(err, rpctypes.ErrFutureRev):
			return nil, wrap("watch", err)
		}
	}
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	stopAfter := context.AfterFunc(s.stop, cancel)
	opts := []clientv3.OpOption{clientv3.WithPrefix(), clientv3.WithCreatedNotify()}
	if fromRev > 0 {
		opts = append(opts, clientv3.WithRev(etcdRev(fromRev)+1))
	}
	full := s.opts.Prefix + prefix
	if full == "" {
		full = "\x00"
		opts[0] = clientv3.WithFromKey()
	}
	ch := s.c.Watch(wctx, full, opts...)
	// The first answer says whether the watch could start where asked.
	var first clientv3.WatchResponse
	select {
	case first = <-ch:
	case <-ctx.Done():
		stopAfter()
		cancel()
		return nil, ctx.Err()
	}
	if first.CompactRevision != 0 {
		stopAfter()
		cancel()
		return nil, fmt.Errorf("store/etcd: watch %s from revision %d: %w", prefix, fromRev, store.ErrCompacted)
	}
	if err := first.Err(); err != nil {
		stopAfter()
		cancel()
		if cerr := s.closedErr(); cerr != nil {
			return nil, cerr
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, wrap("watch", err)
	}
	w := &watcher{events: make(chan store.Event)}
	s.watchers.Add(1)
	go func() {
		defer s.watchers.Done()
		defer stopAfter()
		defer cancel()
		w.run(ctx, s, ch, first)
	}()
	return w, nil
}

// closedErr is store.ErrClosed once the store is closed.
func (s *Store) closedErr() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return store.ErrClosed
	}
	return nil
}

type watcher struct {
	events chan store.Event
	mu     sync.Mutex
	err    error
}

func (w *watcher) Events() <-chan store.Event { return w.events }

func (w *watcher) Err() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.err
}

// run forwards the watch's events until it ends, then says why.
func (w *watcher) run(ctx context.Context, s *Store, ch clientv3.WatchChan, first clientv3.WatchResponse) {
	end := func(err error) {
		w.mu.Lock()
		w.err = err
		w.mu.Unlock()
		close(w.events)
	}
	resp := first
	for {
		for _, ev := range resp.Events {
			out := store.Event{Type: store.EventPut, KV: s.kv(ev.Kv)}
			if ev.Type == clientv3.EventTypeDelete {
				out.Type = store.EventDelete
				out.KV.Value, out.KV.CreateRevision = nil, 0
			}
			select {
			case w.events <- out:
			case <-ctx.Done():
				end(ctx.Err())
				return
			case <-s.stop.Done():
				end(store.ErrClosed)
				return
			}
		}
		var ok bool
		resp, ok = <-ch
		switch {
		case s.closedErr() != nil:
			end(store.ErrClosed)
			return
		case ctx.Err() != nil:
			end(ctx.Err())
			return
		case !ok:
			end(fmt.Errorf("store/etcd: watch ended: %w", driver.ErrRetryable))
			return
		case resp.CompactRevision != 0:
			end(fmt.Errorf("store/etcd: watch fell behind the history kept: %w", store.ErrCompacted))
			return
		case resp.Err() != nil:
			end(wrap("watch", resp.Err()))
			return
		}
	}
}

// Close implements store.Store: it waits for the calls in progress and
// ends every watch with store.ErrClosed. The client stays open.
func (s *Store) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return store.ErrClosed
	}
	s.closed = true
	s.mu.Unlock()
	s.calls.Wait()
	s.drains.Wait()
	s.stopNow()
	s.watchers.Wait()
	return nil
}
