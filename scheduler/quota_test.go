package scheduler

import (
	"strings"
	"testing"

	"github.com/berth-dev/berth/driver"
)

func TestQuotas(t *testing.T) {
	c := newTestCluster(t, "a", mkNodes("a", 4, 8, 16, nil))
	if err := c.UpdateNodes("b", mkNodes("b", 4, 8, 16, nil)); err != nil {
		t.Fatal(err)
	}
	if err := c.SetQuotas([]Quota{{Owner: "bob", Instances: 3}, {Provider: "a", CPU: driver.CPUs(2)}}); err != nil {
		t.Fatal(err)
	}
	// Bob's existing instance counts.
	if err := c.Reserve(Allocation{ID: "old", Provider: "b", Node: "b0", Owner: "bob", Resources: driver.Resources{CPU: driver.CPUs(1)}}); err != nil {
		t.Fatal(err)
	}
	r := req("r", 1, 256)
	r.Owner, r.Count = "bob", 5
	plan, err := c.Place(r)
	if err != nil {
		t.Fatal(err)
	}
	if len(plan.Placements) != 2 {
		t.Fatalf("placed %d of bob's instances, want 2 (quota 3, 1 held)", len(plan.Placements))
	}
	if got := plan.Unplaced[0].Reasons.String(); !strings.Contains(got, "quota owner bob: 3 of 3 instances in use") {
		t.Errorf("reasons %q do not name bob's quota", got)
	}
	// Provider a allows 2 cpus: alice's 4 one-cpu instances, binpacked,
	// put at most 2 on a.
	r = req("s", 1, 256)
	r.Owner, r.Count = "alice", 4
	plan, err = c.Place(r)
	if err != nil {
		t.Fatal(err)
	}
	onA := 0
	for _, pl := range plan.Placements {
		if pl.Provider == "a" {
			onA++
		}
	}
	if len(plan.Placements) != 4 || onA > 2 {
		t.Fatalf("placed %d, %d on a; want 4 with at most 2 on a", len(plan.Placements), onA)
	}
	use := c.QuotaUse()
	if use[0].UsedInstances != 3 || use[1].UsedCPU > driver.CPUs(2) {
		t.Errorf("quota use %+v", use)
	}
	// Releasing gives the room back.
	if err := c.Release("old"); err != nil {
		t.Fatal(err)
	}
	if u := c.QuotaUse()[0]; u.UsedInstances != 2 {
		t.Errorf("after release bob uses %d, want 2", u.UsedInstances)
	}
}

// Two schedulers planning on snapshots cannot together go over a quota:
// the cluster's commit checks it again.
func TestQuotaCommit(t *testing.T) {
	c := newTestCluster(t, "a", mkNodes("n", 4, 8, 16, nil))
	if err := c.SetQuotas([]Quota{{Owner: "bob", Instances: 1}}); err != nil {
		t.Fatal(err)
	}
	s1, s2 := c.Snapshot(Options{}), c.Snapshot(Options{})
	r1, r2 := req("x", 1, 256), req("y", 1, 256)
	r1.Owner, r2.Owner = "bob", "bob"
	p1, err := s1.Plan(r1)
	if err != nil {
		t.Fatal(err)
	}
	p2, err := s2.Plan(r2)
	if err != nil {
		t.Fatal(err)
	}
	if len(p1.Placements) != 1 || len(p2.Placements) != 1 {
		t.Fatalf("each snapshot should place its one instance: %d, %d", len(p1.Placements), len(p2.Placements))
	}
	if acc, _ := s1.Commit(p1); len(acc) != 1 {
		t.Fatalf("first commit accepted %d", len(acc))
	}
	if acc, rej := s2.Commit(p2); len(acc) != 0 || len(rej) != 1 {
		t.Fatalf("second commit accepted %d, rejected %d; want the quota to reject it", len(acc), len(rej))
	}
}

func TestQuotaValidate(t *testing.T) {
	c := NewCluster()
	err := c.SetQuotas([]Quota{{Instances: 1}, {Owner: "x", Pool: "y"}, {Owner: "z", CPU: -1}})
	for _, want := range []string{"quotas[0]", "quotas[1]", "quotas[2].cpus"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v does not name %s", err, want)
		}
	}
}
