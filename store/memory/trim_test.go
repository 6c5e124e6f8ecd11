package memory

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/berth-dev/berth/store"
)

// TestHistoryBoundAcrossTrims commits past several trims and checks, after
// every commit, that the history kept is bounded, that a watch from the
// compact revision sees exactly the changes since then, and that one
// revision older is compacted.
func TestHistoryBoundAcrossTrims(t *testing.T) {
	const history = 7
	s := New(Options{History: history})
	defer s.Close()
	ctx := context.Background()
	for i := 1; i <= 5*history; i++ {
		// Two ops per Txn, so revisions and log entries differ.
		ops := []store.Op{store.Put(fmt.Sprintf("/a/%d", i), []byte("x")), store.Put("/b", []byte(fmt.Sprint(i)))}
		res, err := s.Txn(ctx, nil, ops)
		if err != nil || !res.Succeeded {
			t.Fatalf("Txn %d: %+v %v", i, res, err)
		}
		compact := max(res.Revision-history, 0)
		if got, _ := s.log.Revisions(); got != compact {
			t.Fatalf("after rev %d the compact revision is %d, want %d", res.Revision, got, compact)
		}
		if compact > 1 { // fromRev 0 means "now"
			if _, err := s.Watch(ctx, "/", compact-1); !errors.Is(err, store.ErrCompacted) {
				t.Fatalf("rev %d: Watch from %d: %v, want ErrCompacted", res.Revision, compact-1, err)
			}
		}
		from := max(compact, 1)
		checkWatch(t, s, from, res.Revision)
	}
}

// checkWatch watches "/" from rev from and wants both changes of every
// revision in (from, through], in order.
func checkWatch(t *testing.T, s *Store, from, through int64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	w, err := s.Watch(ctx, "/", from)
	if err != nil {
		t.Fatalf("Watch from %d (current %d): %v", from, through, err)
	}
	defer func() {
		cancel()
		for range w.Events() {
		}
	}()
	for rev := from + 1; rev <= through; rev++ {
		for _, key := range []string{fmt.Sprintf("/a/%d", rev), "/b"} {
			select {
			case ev, ok := <-w.Events():
				if !ok {
					t.Fatalf("watch from %d ended at rev %d: %v", from, rev, w.Err())
				}
				if ev.KV.ModRevision != rev || ev.KV.Key != key {
					t.Fatalf("watch from %d: got %s@%d, want %s@%d", from, ev.KV.Key, ev.KV.ModRevision, key, rev)
				}
			case <-ctx.Done():
				t.Fatalf("watch from %d: no event for rev %d", from, rev)
			}
		}
	}
}
