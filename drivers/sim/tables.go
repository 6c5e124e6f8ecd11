package sim

import (
	"encoding/binary"
	"hash/maphash"
)

// nameTable maps instance names to slots. It is an open-addressing hash
// table of 32-bit hashes and slots, with no pointers for the garbage
// collector to scan; the names themselves are read from the instances.
type nameTable struct {
	seed    maphash.Seed
	entries []nameEntry // len is a power of two, or zero
	n       int
}

type nameEntry struct {
	hash uint32
	slot uint32 // slot+1; 0 marks an empty entry
}

// get returns the slot named name; is reports whether a slot has a name.
func (t *nameTable) get(name string, is func(slot uint32, name string) bool) (uint32, bool) {
	if t.n == 0 {
		return 0, false
	}
	h := t.hash(name)
	mask := uint32(len(t.entries) - 1)
	for i := h & mask; ; i = (i + 1) & mask {
		e := t.entries[i]
		if e.slot == 0 {
			return 0, false
		}
		if e.hash == h && is(e.slot-1, name) {
			return e.slot - 1, true
		}
	}
}

// put adds name for slot; the name must not be present.
func (t *nameTable) put(name string, slot uint32) {
	if 2*(t.n+1) > len(t.entries) {
		t.grow()
	}
	t.insert(nameEntry{hash: t.hash(name), slot: slot + 1})
	t.n++
}

func (t *nameTable) insert(e nameEntry) {
	mask := uint32(len(t.entries) - 1)
	i := e.hash & mask
	for t.entries[i].slot != 0 {
		i = (i + 1) & mask
	}
	t.entries[i] = e
}

func (t *nameTable) grow() {
	old := t.entries
	if t.entries == nil {
		t.seed = maphash.MakeSeed()
	}
	t.entries = make([]nameEntry, max(2*len(old), 64))
	for _, e := range old {
		if e.slot != 0 {
			t.insert(e)
		}
	}
}

// remove deletes the entry of name at slot, shifting the entries after it
// back so that probing needs no tombstones.
func (t *nameTable) remove(name string, slot uint32) {
	if t.n == 0 {
		return
	}
	h := t.hash(name)
	mask := uint32(len(t.entries) - 1)
	i := h & mask
	for {
		e := t.entries[i]
		if e.slot == 0 {
			return
		}
		if e.slot == slot+1 {
			break
		}
		i = (i + 1) & mask
	}
	t.n--
	for {
		t.entries[i] = nameEntry{}
		j := i
		for {
			j = (j + 1) & mask
			e := t.entries[j]
			if e.slot == 0 {
				return
			}
			home := e.hash & mask
			// e may move to i if its home is not within (i, j].
			if (j > i && (home <= i || home > j)) || (j < i && home <= i && home > j) {
				t.entries[i] = e
				i = j
				break
			}
		}
	}
}

func (t *nameTable) hash(name string) uint32 {
	return uint32(maphash.String(t.seed, name))
}

// Tags and labels are kept as length-prefixed keys and values: an
// instance's name and tags in its chunk's arena, labels (which few instances
// have) in one string.

// encodePairs encodes m; nil or empty gives "".
func encodePairs(m map[string]string) string {
	if len(m) == 0 {
		return ""
	}
	var stack [256]byte
	return string(appendPairs(stack[:0], m))
}

// next splits the length-prefixed string or bytes at the start of p from
// the rest.
func next[T ~string | ~[]byte](p T) (s, rest T) {
	var n, shift uint
	i := 0
	for ; i < len(p); i++ {
		c := p[i]
		n |= uint(c&0x7f) << shift
		shift += 7
		if c < 0x80 {
			i++
			break
		}
	}
	return p[i : i+int(n)], p[i+int(n):]
}

// pairMap decodes p into a fresh map; "" gives nil.
func pairMap(p string) map[string]string {
	if p == "" {
		return nil
	}
	return addPairs(make(map[string]string, 4), p)
}

// addPairs decodes p into m and returns m.
func addPairs(m map[string]string, p string) map[string]string {
	for len(p) > 0 {
		var k, v string
		k, p = next(p)
		v, p = next(p)
		m[k] = v
	}
	return m
}

// chunk holds 1<<chunkBits instance slots and an arena with their names
// and encoded tags. Neither holds pointers but for the rare extra, so the
// garbage collector has next to nothing to scan however many instances run.
type chunk struct {
	slots [1 << chunkBits]inst
	arena []byte
	dead  int // bytes of arena that no live instance uses
}

// store appends name and the encoded tags own to the arena and returns
// where they start.
func (c *chunk) store(name string, own []byte) (off uint32) {
	if need := len(name) + len(own); cap(c.arena)-len(c.arena) < need {
		c.reserve(need)
	}
	start := len(c.arena)
	c.arena = append(c.arena, name...)
	c.arena = append(c.arena, own...)
	return uint32(start)
}

// maxArenaGuess caps the first allocation of a chunk's arena.
const maxArenaGuess = 4 << 20

// reserve makes room for need more bytes, dropping the bytes of deleted
// instances when they are more than half of the arena.
func (c *chunk) reserve(need int) {
	live := len(c.arena) - c.dead
	if c.arena == nil {
		// Guess that the chunk's instances are alike: room for all of them,
		// within reason.
		c.arena = make([]byte, 0, min(max(need<<chunkBits, 4096), maxArenaGuess))
		return
	}
	if c.dead <= live {
		grown := make([]byte, len(c.arena), max(2*cap(c.arena), len(c.arena)+need, 4096))
		copy(grown, c.arena)
		c.arena = grown
		return
	}
	fresh := make([]byte, 0, max(2*(live+need), 4096))
	for i := range c.slots {
		in := &c.slots[i]
		if in.state == stFree {
			continue
		}
		end := in.off + uint32(in.nameLen) + in.tagsLen
		off := uint32(len(fresh))
		fresh = append(fresh, c.arena[in.off:end]...)
		in.off = off
	}
	c.arena, c.dead = fresh, 0
}

// name returns the bytes of the instance's name.
func (c *chunk) name(in *inst) []byte { return c.arena[in.off : in.off+uint32(in.nameLen)] }

// tags returns the instance's encoded tags.
func (c *chunk) tags(in *inst) []byte {
	start := in.off + uint32(in.nameLen)
	return c.arena[start : start+in.tagsLen]
}

// appendPairs appends the encoding of m to b.
func appendPairs(b []byte, m map[string]string) []byte {
	for k, v := range m {
		b = appendPair(b, k, v)
	}
	return b
}

// appendPair appends the encoding of the pair k, v to b.
func appendPair(b []byte, k, v string) []byte {
	b = binary.AppendUvarint(b, uint64(len(k)))
	b = append(b, k...)
	b = binary.AppendUvarint(b, uint64(len(v)))
	return append(b, v...)
}

// lookupBytes returns the value of key in the encoded pairs p.
func lookupBytes(p []byte, key string) ([]byte, bool) {
	for len(p) > 0 {
		var k, v []byte
		k, p = next(p)
		v, p = next(p)
		if string(k) == key {
			return v, true
		}
	}
	return nil, false
}
