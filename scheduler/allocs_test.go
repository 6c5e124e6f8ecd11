package scheduler

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// The alloc table agrees with a map through random adds and deletes, past
// several growths.
func TestAllocTable(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	var tab allocTable
	ref := map[string]*alloc{}
	var live []*alloc
	for k := range 20000 {
		if len(live) > 0 && rng.IntN(3) == 0 {
			j := rng.IntN(len(live))
			a := live[j]
			live[j] = live[len(live)-1]
			live = live[:len(live)-1]
			tab.del(a)
			delete(ref, a.id)
			tab.del(a) // gone already: nothing happens
		} else {
			a := &alloc{id: fmt.Sprint("g.s-", k)}
			tab.add(a)
			ref[a.id] = a
			live = append(live, a)
		}
		if tab.len() != len(ref) {
			t.Fatalf("step %d: len %d, want %d", k, tab.len(), len(ref))
		}
		if k%1000 == 0 {
			for id, a := range ref {
				if got := tab.get(id); got != a {
					t.Fatalf("step %d: get %s = %v, want %v", k, id, got, a)
				}
			}
			n := 0
			for a := range tab.all() {
				if ref[a.id] != a {
					t.Fatalf("step %d: all yields %s, not in the table", k, a.id)
				}
				n++
			}
			if n != len(ref) {
				t.Fatalf("step %d: all yields %d, want %d", k, n, len(ref))
			}
		}
		if tab.get(fmt.Sprint("absent-", k)) != nil {
			t.Fatalf("step %d: an absent id is found", k)
		}
	}
}
