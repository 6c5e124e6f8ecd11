package scheduler

import (
	"errors"
	"testing"

	"github.com/berth-dev/berth/driver"
)

// free returns what node name of c has free.
func free(t *testing.T, c *Cluster, name string) driver.Resources {
	t.Helper()
	for _, n := range c.Nodes() {
		if n.Name == name {
			return n.Free
		}
	}
	t.Fatalf("no node %s", name)
	return driver.Resources{}
}

func TestHold(t *testing.T) {
	c := newTestCluster(t, "p", mkNodes("n", 2, 4, 8, nil))
	// A placement's own reservation is what the stored record asks: Hold
	// keeps it, and what its back-end was told of it.
	p, err := c.Place(req("a", 1, 1024))
	if err != nil || len(p.Placements) != 1 {
		t.Fatal(p, err)
	}
	node := p.Placements[0].Node
	if err := c.SetPresence("a", Changing); err != nil {
		t.Fatal(err)
	}
	a := Allocation{ID: "a", Provider: "p", Node: node, Resources: driver.Resources{CPU: driver.CPUs(1), Memory: 1024 * driver.MiB}, Request: "a"}
	if err := c.Hold(a); err != nil {
		t.Fatal(err)
	}
	if got := free(t, c, node).CPU; got != driver.CPUs(3) {
		t.Fatalf("free cpu after holding a placement's own reservation: %v, want 3", got)
	}
	// A resize: the reservation is replaced, once, elastic as it was.
	c.allocs.get("a").elastic = true
	a.Resources.CPU = driver.CPUs(2)
	if err := c.Hold(a); err != nil {
		t.Fatal(err)
	}
	if got := free(t, c, node).CPU; got != driver.CPUs(2) {
		t.Fatalf("free cpu after a resize to 2: %v, want 2", got)
	}
	if al := c.allocs.get("a"); al.pres != Changing || !al.elastic {
		t.Fatal("a resize on the same node forgot what the back-end was told or that it is elastic")
	}
	// A move to the other node gives the first back.
	other := "n0"
	if node == "n0" {
		other = "n1"
	}
	a.Node = other
	if err := c.Hold(a); err != nil {
		t.Fatal(err)
	}
	if f, g := free(t, c, node).CPU, free(t, c, other).CPU; f != driver.CPUs(4) || g != driver.CPUs(2) {
		t.Fatalf("after a move: %v free on %s, %v on %s; want 4 and 2", f, node, g, other)
	}
	// An instance that held nothing reserves; an invalid allocation in the
	// same call holds nothing of it.
	b := Allocation{ID: "b", Provider: "p", Node: node, Resources: driver.Resources{CPU: driver.CPUs(1)}}
	bad := Allocation{Provider: "p", Node: node}
	if err := c.Hold(b, bad); err == nil {
		t.Fatal("an allocation without id was held")
	}
	if c.allocs.get("b") != nil {
		t.Fatal("a failed Hold reserved part of its call")
	}
	if err := c.Hold(b); err != nil {
		t.Fatal(err)
	}
	if got := free(t, c, node).CPU; got != driver.CPUs(3) {
		t.Fatalf("free cpu after holding b: %v, want 3", got)
	}
	if err := c.Release("b"); err != nil {
		t.Fatal(err)
	}
	if err := c.Release("b"); !errors.Is(err, driver.ErrNotFound) {
		t.Fatalf("second release: %v", err)
	}
}
