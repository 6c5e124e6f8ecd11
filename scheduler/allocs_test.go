package scheduler

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/berth-dev/berth/driver"
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

// The allocations of one Reserve call that have the same request, owner,
// pool, group, image, labels, priority and resources share what they
// share; any difference gets an info of its own.
func TestReserveSharesInfo(t *testing.T) {
	c := newTestCluster(t, "p", mkNodes("n", 2, 4, 16, nil))
	res := driver.Resources{CPU: 100, Memory: 64 * driver.MiB}
	as := []Allocation{
		{ID: "r-0", Provider: "p", Node: "n0", Request: "r", Image: "app", Labels: map[string]string{"k": "v"}, Resources: res},
		{ID: "r-1", Provider: "p", Node: "n1", Request: "r", Image: "app", Labels: map[string]string{"k": "v"}, Resources: res},
		{ID: "r-2", Provider: "p", Node: "n1", Request: "r", Image: "app", Labels: map[string]string{"k": "w"}, Resources: res},
		{ID: "r-3", Provider: "p", Node: "n1", Request: "r", Image: "app", Labels: map[string]string{"k": "v"}, Resources: res, Ports: []int{8080}},
	}
	if err := c.Reserve(as...); err != nil {
		t.Fatal(err)
	}
	info := func(id string) *reqInfo { return c.allocs.get(id).info }
	if info("r-0") != info("r-1") {
		t.Errorf("r-0 and r-1 have infos of their own")
	}
	if info("r-2") == info("r-0") || info("r-2").labels["k"] != "w" {
		t.Errorf("r-2, of other labels, shares r-0's info: labels %v", info("r-2").labels)
	}
	if i := info("r-3"); i == info("r-0") || !slices.Equal(i.ports, []int{8080}) || i.labels["k"] != "v" {
		t.Errorf("r-3, with a host port, has info %+v", i)
	}
	as[0].Labels["k"] = "changed"
	if info("r-0").labels["k"] != "v" {
		t.Errorf("the cluster keeps the caller's labels map")
	}
}
