// Package store is Berth's state store: a key/value space with revisions,
// transactions that compare versions, and watches. Every change to Berth's
// state goes through Txn, so concurrent writers never overwrite each other
// (optimistic concurrency). The model is etcd's, so that an etcd
// implementation can sit behind the same interface.
//
// # Keys and revisions
//
// Keys are flat byte strings; Berth groups them by "/"-separated prefixes
// ("/instances/<id>", "/nodes/<id>"), and List and Watch select by prefix, as
// etcd's WithPrefix does. The store has one revision counter, starting at 0
// for an empty store. Every transaction that changes at least one key
// increases it, and all of its changes carry the new revision; a failed or
// read-only transaction, or one whose only ops delete missing keys,
// changes nothing and leaves the revision as it is. This is etcd's header
// revision, and KV.CreateRevision and KV.ModRevision are etcd's
// create_revision and mod_revision. A store may commit concurrent
// transactions that touch disjoint keys as one (the etcd store does): they
// then share its revision, each seeing exactly the comparisons it would
// have seen alone. One caller's transactions, one after the other, always
// carry increasing revisions.
//
// # Mapping to etcd
//
// An etcd implementation is a thin adapter over clientv3:
//   - Get and List are Get (WithPrefix, WithSort by key for List) and return
//     the response header's revision.
//   - Txn is Txn(ctx).If(Compare(ModRevision(key), "=", rev)...).Then(OpPut,
//     OpDelete...).Commit(); Succeeded and Header.Revision are TxnResult
//     (concurrent calls merged into one etcd transaction, store/etcd's
//     batch.go).
//   - Watch(ctx, prefix, fromRev) is Watch(ctx, prefix, WithPrefix(),
//     WithRev(fromRev+1)); a response whose CompactRevision is set ends the
//     watch with ErrCompacted.
//
// # Leases
//
// Leases are not implemented yet. In the etcd design a lease is an ID
// granted with a TTL; a Put may attach it, the holder keeps it alive, and
// when it expires (or is revoked) every key attached to it is deleted in one
// revision, which watchers see as delete events. Berth will use leases for
// node liveness; an embedded implementation would keep lease IDs and expiry
// times in the same file and delete expired keys through Txn.
package store

import (
	"context"
	"errors"
	"fmt"

	"github.com/berth-dev/berth/driver"
)

// ErrNotFound is returned by Get when the key does not exist. It wraps
// driver.ErrNotFound, so errors.Is(err, driver.ErrNotFound) holds too.
var ErrNotFound = fmt.Errorf("store: key %w", driver.ErrNotFound)

// ErrClosed is returned by every call made after Close.
var ErrClosed = errors.New("store: closed")

// ErrCompacted is returned by Watch when fromRev is older than the oldest
// change the store still remembers; the caller must List again and watch
// from the listing's revision.
var ErrCompacted = errors.New("store: revision compacted")

// Limits every implementation enforces; Txn rejects larger keys and values
// with an error wrapping driver.ErrInvalid that names the op.
const (
	// MaxKeySize is the longest key, in bytes.
	MaxKeySize = 4096
	// MaxValueSize is the largest value, in bytes (etcd's default request
	// limit is 1.5 MiB).
	MaxValueSize = 1 << 20
)

// KV is one key with its value and versions.
type KV struct {
	Key   string
	Value []byte
	// CreateRevision is the store revision at which the key was created
	// (last created, if it was deleted and put again).
	CreateRevision int64
	// ModRevision is the store revision of the key's last change.
	ModRevision int64
}

// Cmp is a condition of a transaction: the key's ModRevision must equal
// ModRevision. ModRevision 0 means the key must not exist.
type Cmp struct {
	Key         string
	ModRevision int64
}

// OpKind says what an Op does.
type OpKind int

// Op kinds.
const (
	OpPut OpKind = iota + 1
	OpDelete
)

// Op is one change in a transaction.
type Op struct {
	Kind  OpKind
	Key   string
	Value []byte // for OpPut
}

// Put returns an Op that sets key to value.
func Put(key string, value []byte) Op { return Op{Kind: OpPut, Key: key, Value: value} }

// Delete returns an Op that removes key (removing a missing key is no error).
func Delete(key string) Op { return Op{Kind: OpDelete, Key: key} }

// TxnResult reports a transaction's outcome.
type TxnResult struct {
	// Succeeded is false when a comparison failed; then nothing changed.
	Succeeded bool
	// Revision is the store's revision after the transaction: the revision
	// of its changes when it changed something, else the current revision.
	Revision int64
}

// EventType says how a key changed.
type EventType int

// Event types.
const (
	EventPut EventType = iota + 1
	EventDelete
)

// Event is one change seen by a watch.
type Event struct {
	Type EventType
	// KV is the key after the change; for a delete, Value is nil,
	// CreateRevision is 0 and ModRevision is the revision of the delete.
	KV KV
}

// Store is the state store. Implementations are safe for concurrent use.
// Values passed in and returned are copied: callers may reuse and modify
// their slices.
type Store interface {
	// Get returns the key, or ErrNotFound.
	Get(ctx context.Context, key string) (KV, error)

	// List returns every key with the prefix, sorted by key, and the store
	// revision the listing reflects. The empty prefix lists every key.
	List(ctx context.Context, prefix string) ([]KV, int64, error)

	// Txn applies ops atomically if every comparison holds, and reports
	// whether it did. When Txn returns nil error with Succeeded true the
	// change is durable. Malformed cmps or ops (an empty or oversized key,
	// an unknown kind, a key changed twice in one Txn) give an error
	// wrapping driver.ErrInvalid that names the field, and change nothing.
	// A Txn whose ctx ends before it starts writing returns ctx's error and
	// changes nothing; once writing has begun it runs to the end.
	Txn(ctx context.Context, cmps []Cmp, ops []Op) (TxnResult, error)

	// Watch sends every change to keys with prefix made after revision
	// fromRev (0 means from now), in revision order, until ctx ends; then it
	// closes the channel. A slow reader never loses events: the store buffers
	// or the watch ends with the channel closed and Err reporting why.
	// Changes of one revision are sent in the order of the Txn's ops. The
	// usual pattern is List, then Watch from the listing's revision. Watch
	// returns ErrCompacted when fromRev is older than the store's history;
	// a watch whose reader falls that far behind later ends with Err
	// ErrCompacted.
	Watch(ctx context.Context, prefix string, fromRev int64) (Watcher, error)

	// Close releases the store. Calls after Close return ErrClosed; running
	// watches end with Err ErrClosed. Close waits for calls in progress.
	Close() error
}

// Watcher is a running watch.
type Watcher interface {
	// Events delivers changes in revision order; it is closed when the watch
	// ends.
	Events() <-chan Event
	// Err says why the watch ended (ctx's error, ErrCompacted, ErrClosed).
	// It is nil while Events is open.
	Err() error
}

// ValidateTxn checks a transaction's comparisons and ops against the rules
// every implementation enforces. It returns nil or driver.FieldErrors naming
// each bad field, e.g. "ops[2].key".
func ValidateTxn(cmps []Cmp, ops []Op) error {
	var es driver.FieldErrors
	for i, c := range cmps {
		if err := validateKey(c.Key); err != "" {
			es = append(es, &driver.FieldError{Path: fmt.Sprintf("cmps[%d].key", i), Reason: err})
		}
		if c.ModRevision < 0 {
			es = append(es, &driver.FieldError{Path: fmt.Sprintf("cmps[%d].mod_revision", i), Reason: fmt.Sprintf("must not be negative, got %d", c.ModRevision)})
		}
	}
	seen := make(map[string]int, len(ops))
	for i, op := range ops {
		if err := validateKey(op.Key); err != "" {
			es = append(es, &driver.FieldError{Path: fmt.Sprintf("ops[%d].key", i), Reason: err})
		} else if j, dup := seen[op.Key]; dup {
			es = append(es, &driver.FieldError{Path: fmt.Sprintf("ops[%d].key", i), Reason: fmt.Sprintf("key %q is already changed by ops[%d]", op.Key, j)})
		} else {
			seen[op.Key] = i
		}
		switch op.Kind {
		case OpPut:
			if len(op.Value) > MaxValueSize {
				es = append(es, &driver.FieldError{Path: fmt.Sprintf("ops[%d].value", i), Reason: fmt.Sprintf("%d bytes is more than the limit of %d", len(op.Value), MaxValueSize)})
			}
		case OpDelete:
		default:
			es = append(es, &driver.FieldError{Path: fmt.Sprintf("ops[%d].kind", i), Reason: fmt.Sprintf("unknown op kind %d", op.Kind)})
		}
	}
	return es.Err()
}

// ValidateKey checks a key given to Get; field names the argument in the
// error.
func ValidateKey(field, key string) error {
	if err := validateKey(key); err != "" {
		return &driver.FieldError{Path: field, Reason: err}
	}
	return nil
}

// ValidateFromRev checks Watch's fromRev.
func ValidateFromRev(fromRev int64) error {
	if fromRev < 0 {
		return &driver.FieldError{Path: "fromRev", Reason: fmt.Sprintf("must not be negative, got %d", fromRev)}
	}
	return nil
}

func validateKey(key string) string {
	switch {
	case key == "":
		return "key is empty"
	case len(key) > MaxKeySize:
		return fmt.Sprintf("key of %d bytes is longer than the limit of %d", len(key), MaxKeySize)
	}
	return ""
}
