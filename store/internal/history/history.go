// Package history keeps a store's latest changes in memory, for watches
// that start in the past. It is bounded twice: by revisions and by bytes,
// so that a few revisions holding thousands of large values cannot hold
// gigabytes. What falls out of it is compacted: a watch from before it ends
// with store.ErrCompacted, and its reader lists again.
package history

import (
	"sort"
	"strings"
	"sync"

	"github.com/berth-dev/berth/store"
)

// Defaults for stores' history options.
const (
	// DefaultRevisions is how many revisions a history holds by default.
	DefaultRevisions = 10000
	// DefaultBytes is how many bytes of keys and values a history holds by
	// default.
	DefaultBytes = 64 << 20
)

// eventOverhead is what one held change costs besides its key and value.
const eventOverhead = 96

// Change is one change a Log holds: a put of Value to Key, whose key was
// created at revision Create, or a delete of Key when Create is 0 (a key that
// exists was created at revision 1 or later). Strings let a store share the
// bytes it keeps for the key's current value with its history.
type Change struct {
	Key, Value string
	Create     int64
}

// held is a Change at revision rev.
type held struct {
	Change
	rev int64
}

// Log is a bounded history of changes. It is safe for concurrent use.
type Log struct {
	maxRevs  int64
	maxBytes int64

	mu      sync.RWMutex
	compact int64 // every change after compact is held
	rev     int64 // the latest revision appended (or the start)
	// The held changes, oldest first, are ring[head], ring[head+1], ...,
	// n of them, wrapping around the end of ring.
	ring  []held
	head  int
	n     int
	bytes int64
}

// minRing is the smallest ring a Log allocates.
const minRing = 8

// New returns an empty history at revision rev, which is also its compact
// revision: watches may start at rev or later. It holds the changes of at
// most maxRevs revisions and, beyond the latest revision, at most maxBytes
// of keys and values.
func New(rev int64, maxRevs int, maxBytes int64) *Log {
	return &Log{maxRevs: int64(max(maxRevs, 1)), maxBytes: max(maxBytes, 1), compact: rev, rev: rev}
}

// Append records the changes of revision rev, in order; rev must be later
// than every revision appended before.
func (l *Log) Append(rev int64, chs []Change) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if rev <= l.rev {
		panic("history: revisions appended out of order")
	}
	l.rev = rev
	for _, ch := range chs {
		if l.n == len(l.ring) {
			l.resize(max(2*l.n, minRing))
		}
		*l.at(l.n) = held{ch, rev}
		l.n++
		l.bytes += size(ch)
	}
	l.trim()
}

// trim drops the oldest revisions while more than maxRevs are held or the
// changes take more than maxBytes, always keeping the latest revision.
func (l *Log) trim() {
	if c := l.rev - l.maxRevs; c > l.compact {
		l.dropThrough(c)
	}
	for l.bytes > l.maxBytes && l.n > 0 && l.at(0).rev < l.rev {
		l.dropThrough(l.at(0).rev)
	}
	// Release most of the ring once it is mostly empty.
	if len(l.ring) > minRing && l.n <= len(l.ring)/4 {
		l.resize(max(2*l.n, minRing))
	}
}

// dropThrough forgets every change at or before rev.
func (l *Log) dropThrough(rev int64) {
	for l.n > 0 && l.at(0).rev <= rev {
		h := l.at(0)
		l.bytes -= size(h.Change)
		*h = held{}
		l.head = (l.head + 1) % len(l.ring)
		l.n--
	}
	l.compact = max(l.compact, rev)
}

// at returns the ith held change, oldest first; i is at most len(l.ring)-1.
func (l *Log) at(i int) *held {
	return &l.ring[(l.head+i)%len(l.ring)]
}

// resize moves the held changes to a ring of c slots, at least l.n.
func (l *Log) resize(c int) {
	ring := make([]held, c)
	for i := range l.n {
		ring[i] = *l.at(i)
	}
	l.ring, l.head = ring, 0
}

func size(ch Change) int64 {
	return int64(len(ch.Key) + len(ch.Value) + eventOverhead)
}

// Revisions returns the compact revision (the log holds every change after
// it) and the latest revision appended.
func (l *Log) Revisions() (compact, current int64) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.compact, l.rev
}

// Bytes returns the size the held changes are counted at.
func (l *Log) Bytes() int64 {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.bytes
}

// Changes returns copies of the changes to keys with prefix at revisions in
// (after, through], oldest first, where through is at most after+limit and
// at most the latest revision, and never less than after. It returns
// store.ErrCompacted when after is older than the compact revision.
func (l *Log) Changes(prefix string, after int64, limit int) ([]store.Event, int64, error) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	if after < l.compact {
		return nil, after, store.ErrCompacted
	}
	through := min(l.rev, after+int64(limit))
	if through <= after {
		return nil, after, nil
	}
	i := sort.Search(l.n, func(i int) bool { return l.at(i).rev > after })
	var out []store.Event
	for ; i < l.n && l.at(i).rev <= through; i++ {
		if h := l.at(i); strings.HasPrefix(h.Key, prefix) {
			out = append(out, h.event())
		}
	}
	return out, through, nil
}

// event returns h as a store.Event, with a copy of the value.
func (h held) event() store.Event {
	if h.Create == 0 {
		return store.Event{Type: store.EventDelete, KV: store.KV{Key: h.Key, ModRevision: h.rev}}
	}
	kv := store.KV{Key: h.Key, Value: []byte(h.Value), CreateRevision: h.Create, ModRevision: h.rev}
	return store.Event{Type: store.EventPut, KV: kv}
}

// Source serves a store's watches (it is a watch.Source) from Log, and
// answers store.ErrClosed once Closed reports that the store is closed.
type Source struct {
	Log    *Log
	Closed func() bool
}

// Revisions returns the Log's compact and latest revisions.
func (s Source) Revisions() (compact, current int64, err error) {
	if s.Closed() {
		return 0, 0, store.ErrClosed
	}
	compact, current = s.Log.Revisions()
	return compact, current, nil
}

// Changes returns the Log's changes, as Log.Changes.
func (s Source) Changes(prefix string, after int64, limit int) ([]store.Event, int64, error) {
	if s.Closed() {
		return nil, after, store.ErrClosed
	}
	return s.Log.Changes(prefix, after, limit)
}
