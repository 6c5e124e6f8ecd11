package history

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/berth-dev/berth/store"
)

func put(key, value string) Change {
	return Change{Key: key, Value: value, Create: 1}
}

// revs returns the revisions of evs.
func revs(evs []store.Event) []int64 {
	var out []int64
	for _, ev := range evs {
		out = append(out, ev.KV.ModRevision)
	}
	return out
}

func TestRevisionBound(t *testing.T) {
	l := New(5, 3, 1<<20)
	if c, cur := l.Revisions(); c != 5 || cur != 5 {
		t.Fatalf("new log: Revisions = %d, %d; want 5, 5", c, cur)
	}
	for rev := int64(6); rev <= 20; rev++ {
		l.Append(rev, []Change{put("/a", "x"), put("/b", "y")})
		compact, cur := l.Revisions()
		if want := max(5, rev-3); compact != want || cur != rev {
			t.Fatalf("after %d: Revisions = %d, %d; want %d, %d", rev, compact, cur, want, rev)
		}
		evs, through, err := l.Changes("/", compact, 100)
		if err != nil || through != rev || len(evs) != int(2*(rev-compact)) {
			t.Fatalf("after %d: Changes from %d = %d events through %d, %v", rev, compact, len(evs), through, err)
		}
		if _, _, err := l.Changes("/", compact-1, 100); !errors.Is(err, store.ErrCompacted) {
			t.Fatalf("after %d: Changes from %d: %v, want ErrCompacted", rev, compact-1, err)
		}
		if l.n > 2*3 {
			t.Fatalf("after %d: %d changes held, want at most 6", rev, l.n)
		}
		if len(l.ring) > 4*3 {
			t.Fatalf("after %d: the dropped prefix is not released: %d slots for %d changes", rev, len(l.ring), l.n)
		}
	}
}

// TestByteBound appends revisions of large values: the log keeps what fits
// the byte bound, and always the latest revision, however large.
func TestByteBound(t *testing.T) {
	value := strings.Repeat("v", 1000)
	per := int64(len("/k") + len(value) + eventOverhead)
	l := New(0, 1000, 10*per)
	for rev := int64(1); rev <= 50; rev++ {
		l.Append(rev, []Change{put("/k", value)})
		if l.Bytes() > 10*per {
			t.Fatalf("after %d: %d bytes held, bound %d", rev, l.Bytes(), 10*per)
		}
	}
	compact, _ := l.Revisions()
	if compact != 40 {
		t.Fatalf("compact = %d, want 40 (ten revisions of one change fit)", compact)
	}
	// One revision larger than the bound is kept whole, alone.
	var big []Change
	for i := range 30 {
		big = append(big, put(fmt.Sprintf("/big/%d", i), value))
	}
	l.Append(51, big)
	compact, cur := l.Revisions()
	if compact != 50 || cur != 51 {
		t.Fatalf("after a revision over the bound: Revisions = %d, %d; want 50, 51", compact, cur)
	}
	evs, _, err := l.Changes("/big/", 50, 10)
	if err != nil || len(evs) != 30 {
		t.Fatalf("Changes of the large revision = %d events, %v; want 30", len(evs), err)
	}
	// The next revision pushes it out.
	l.Append(52, []Change{put("/k", "small")})
	if compact, _ := l.Revisions(); compact != 51 {
		t.Fatalf("compact after the next revision = %d, want 51", compact)
	}
	if len(l.ring) > minRing {
		t.Fatalf("the ring keeps %d slots for %d changes", len(l.ring), l.n)
	}
}

func TestChangesWindowPrefixAndCopies(t *testing.T) {
	l := New(0, 100, 1<<20)
	for rev := int64(1); rev <= 10; rev++ {
		l.Append(rev, []Change{put(fmt.Sprintf("/a/%d", rev), "a"), put(fmt.Sprintf("/b/%d", rev), "b"),
			{Key: fmt.Sprintf("/a/%d", rev-1)}})
	}
	evs, through, err := l.Changes("/a/", 3, 4)
	if err != nil || through != 7 {
		t.Fatalf("Changes(/a/, 3, 4) through %d, %v; want 7", through, err)
	}
	if got := fmt.Sprint(revs(evs)); got != "[4 4 5 5 6 6 7 7]" {
		t.Fatalf("revisions = %s", got)
	}
	for _, ev := range evs {
		if !strings.HasPrefix(ev.KV.Key, "/a/") {
			t.Fatalf("event %s outside the prefix", ev.KV.Key)
		}
	}
	// The caller owns what it gets.
	evs[0].KV.Value[0] = 'X'
	again, _, _ := l.Changes("/a/", 3, 1)
	if string(again[0].KV.Value) != "a" {
		t.Fatalf("a caller's change reached the log: %q", again[0].KV.Value)
	}
	// Past the latest revision: nothing, through stays.
	if evs, through, err := l.Changes("/", 12, 5); err != nil || len(evs) != 0 || through != 12 {
		t.Fatalf("Changes after the latest = %d events through %d, %v", len(evs), through, err)
	}
}

func TestAppendOutOfOrderPanics(t *testing.T) {
	l := New(4, 10, 1<<20)
	defer func() {
		if recover() == nil {
			t.Fatal("Append of an old revision did not panic")
		}
	}()
	l.Append(4, []Change{put("/a", "x")})
}
