package sim

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/berth-dev/berth/driver"
)

// TestNameTable checks the table against a Go map through random puts and
// removes, many of them colliding in a small table.
func TestNameTable(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	var tab nameTable
	names := map[uint32]string{} // slot -> name, the table's contents
	bySlot := func(slot uint32, name string) bool { return names[slot] == name }
	want := map[string]uint32{}
	for step := range 200_000 {
		name := fmt.Sprintf("n%d", r.IntN(3000))
		if slot, ok := want[name]; ok && r.IntN(2) == 0 {
			tab.remove(name, slot)
			delete(want, name)
			delete(names, slot)
		} else if !ok {
			slot := uint32(step)
			names[slot] = name
			tab.put(name, slot)
			want[name] = slot
		}
		if step%997 == 0 {
			for n, slot := range want {
				if got, ok := tab.get(n, bySlot); !ok || got != slot {
					t.Fatalf("step %d: get %s = %d %v, want %d", step, n, got, ok, slot)
				}
			}
			if _, ok := tab.get("absent", bySlot); ok {
				t.Fatalf("step %d: found a name never put", step)
			}
			if tab.n != len(want) {
				t.Fatalf("step %d: %d entries, want %d", step, tab.n, len(want))
			}
		}
	}
}

func TestPairsRoundTrip(t *testing.T) {
	for _, m := range []map[string]string{
		nil,
		{"a": ""},
		{"berth.managed": "true", "k\x00ey": "v\x00al", "long": strings.Repeat("x", 300), "": "empty key"},
	} {
		p := encodePairs(m)
		got := pairMap(p)
		if len(m) == 0 && got != nil {
			t.Errorf("%v: decoded %v, want nil", m, got)
		}
		if len(m) > 0 && !maps.Equal(got, m) {
			t.Errorf("%q: decoded %q", m, got)
		}
		for k, v := range m {
			if x, ok := lookupBytes([]byte(p), k); !ok || string(x) != v {
				t.Errorf("lookupBytes %q: %q %v, want %q", k, x, ok, v)
			}
		}
		if _, ok := lookupBytes([]byte(p), "missing"); ok {
			t.Errorf("lookupBytes found a missing key in %q", m)
		}
	}
}

// TestArenaCompaction churns instances with names and tags through a small
// cluster so that chunk arenas grow and compact many times, and checks that
// every live instance keeps its name and tags.
func TestArenaCompaction(t *testing.T) {
	opts := DefaultOptions()
	opts.Nodes = 2
	opts.Shape.CPU = 1 << 40
	opts.Shape.Memory = 1 << 60
	s, err := New(*opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	r := rand.New(rand.NewPCG(7, 8))
	live := map[string]string{} // id -> name
	stored := 0                 // bytes ever written to arenas
	for i := range 100000 {
		if len(live) > 100 && r.IntN(2) == 0 {
			for id := range live {
				op, err := s.Delete(ctx, id)
				if err == nil {
					_, err = op.Advance(ctx)
				}
				if err != nil {
					t.Fatal(err)
				}
				delete(live, id)
				break
			}
			continue
		}
		name := fmt.Sprintf("inst-%d-%s", i, strings.Repeat("x", r.IntN(40)))
		tags := map[string]string{driver.TagManaged: "true", "n": name, "pad": strings.Repeat("p", r.IntN(200))}
		stored += len(name)
		for k, v := range tags {
			stored += len(k) + len(v) + 2
		}
		op, err := s.Create(ctx, "node-1", &driver.Spec{Name: name, Image: "a", Tags: tags})
		if err != nil {
			t.Fatal(err)
		}
		p, err := op.Advance(ctx)
		if err != nil {
			t.Fatal(err)
		}
		live[p.Instance.ID] = name
	}
	list, err := s.List(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != len(live) {
		t.Fatalf("List: %d instances, want %d", len(list), len(live))
	}
	for _, in := range list {
		if want := live[in.ID]; in.Name != want || in.Tags["n"] != want {
			t.Fatalf("instance %s: name %q, tag n %q; want %q", in.ID, in.Name, in.Tags["n"], want)
		}
		if f, err := s.Find(ctx, in.Name); err != nil || f.ID != in.ID {
			t.Fatalf("Find %s: %v %v", in.Name, f, err)
		}
	}
	arena := 0
	for _, c := range s.chunks {
		arena += cap(c.arena)
	}
	if arena > stored/2 {
		t.Errorf("arenas hold %d bytes after %d were written for %d live instances: dead bytes are not dropped", arena, stored, len(live))
	}
}
