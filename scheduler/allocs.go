package scheduler

import (
	"hash/maphash"
	"iter"
)

// allocTable is the set of a cluster's allocations by instance id: an
// open-addressing table of pointers to them, at most three quarters full,
// with a byte of each id's hash beside it so that a probe reads an
// allocation only when that byte matches. It costs 12 to 24 bytes per
// allocation, where a map[string]*alloc costs about 45 (a cluster holds a
// million). The zero value is empty.
type allocTable struct {
	seed    maphash.Seed
	entries []*alloc // len is a power of two, or zero
	tags    []uint8  // per entry: 0 when empty, else tagOf its id's hash
	n       int
}

func tagOf(h uint64) uint8 { return uint8(h>>57) | 0x80 }

func (t *allocTable) hash(id string) uint64 { return maphash.String(t.seed, id) }

// len returns how many allocations the table holds.
func (t *allocTable) len() int { return t.n }

// get returns the allocation of instance id, or nil.
func (t *allocTable) get(id string) *alloc {
	if t.n == 0 {
		return nil
	}
	h := t.hash(id)
	tag, mask := tagOf(h), uint64(len(t.entries)-1)
	for i := h & mask; t.tags[i] != 0; i = (i + 1) & mask {
		if t.tags[i] == tag && t.entries[i].id == id {
			return t.entries[i]
		}
	}
	return nil
}

// add adds a, whose id must not be in the table.
func (t *allocTable) add(a *alloc) {
	if 4*(t.n+1) > 3*len(t.entries) {
		t.grow()
	}
	t.insert(a, t.hash(a.id))
	t.n++
}

func (t *allocTable) insert(a *alloc, h uint64) {
	mask := uint64(len(t.entries) - 1)
	i := h & mask
	for t.tags[i] != 0 {
		i = (i + 1) & mask
	}
	t.entries[i], t.tags[i] = a, tagOf(h)
}

func (t *allocTable) grow() {
	old := t.entries
	if old == nil {
		t.seed = maphash.MakeSeed()
	}
	n := max(2*len(old), 64)
	t.entries, t.tags = make([]*alloc, n), make([]uint8, n)
	for _, a := range old {
		if a != nil {
			t.insert(a, t.hash(a.id))
		}
	}
}

// del removes a, shifting the entries after it back so that probing needs
// no tombstones; an allocation not in the table is left alone.
func (t *allocTable) del(a *alloc) {
	if t.n == 0 {
		return
	}
	mask := uint64(len(t.entries) - 1)
	i := t.hash(a.id) & mask
	for t.entries[i] != a {
		if t.tags[i] == 0 {
			return
		}
		i = (i + 1) & mask
	}
	t.n--
	for {
		t.entries[i], t.tags[i] = nil, 0
		j := i
		for {
			j = (j + 1) & mask
			e := t.entries[j]
			if e == nil {
				return
			}
			// e may move to i if its home is not within (i, j].
			home := t.hash(e.id) & mask
			if (j > i && (home <= i || home > j)) || (j < i && home <= i && home > j) {
				t.entries[i], t.tags[i] = e, t.tags[j]
				i = j
				break
			}
		}
	}
}

// all yields every allocation, in no particular order. The table must not
// change during the loop.
func (t *allocTable) all() iter.Seq[*alloc] {
	return func(yield func(*alloc) bool) {
		for _, a := range t.entries {
			if a != nil && !yield(a) {
				return
			}
		}
	}
}
