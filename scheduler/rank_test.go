package scheduler

import (
	"fmt"
	"testing"

	"github.com/berth-dev/berth/driver"
)

// rankCluster has three equal nodes 20%, 50% and 80% full.
func rankCluster(t *testing.T, opts ...ClusterOption) *Cluster {
	t.Helper()
	c := newTestCluster(t, "p", mkNodes("n", 3, 10, 10, nil), opts...)
	for i, used := range []float64{2, 5, 8} {
		err := c.Reserve(Allocation{ID: fmt.Sprintf("fill%d", i), Provider: "p", Node: fmt.Sprintf("n%d", i),
			Resources: driver.Resources{CPU: driver.CPUs(used), Memory: driver.Bytes(used * float64(driver.GiB))}, Labels: map[string]string{"app": fmt.Sprint(i)}})
		if err != nil {
			t.Fatal(err)
		}
	}
	return c
}

func TestScorers(t *testing.T) {
	tests := []struct {
		name       string
		strategy   Strategy
		typ        driver.WorkloadType
		affinities []string
		want       string
	}{
		{"binpack takes the fullest node that fits", StrategyBinpack, "", nil, "n2"},
		{"spread takes the emptiest", StrategySpread, "", nil, "n0"},
		{"waterfill raises the lowest", StrategyWaterfill, "", nil, "n0"},
		{"average keeps nodes near the mean", StrategyAverage, "", nil, "n1"},
		{"service defaults to spread", "", driver.TypeService, nil, "n0"},
		{"batch defaults to binpack", "", driver.TypeBatch, nil, "n2"},
		{"soft affinity outweighs the strategy", StrategySpread, "", []string{"app==~1"}, "n1"},
		{"soft anti-affinity outweighs the strategy", StrategyBinpack, "", []string{"app!=~2"}, "n1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := rankCluster(t)
			r := req("r", 1, 1024)
			r.Strategy, r.Type, r.Affinities = tt.strategy, tt.typ, tt.affinities
			p, err := c.Place(r)
			if err != nil {
				t.Fatal(err)
			}
			if got := nodesOf(p); len(got) != 1 || got[0] != tt.want {
				t.Fatalf("placed on %v, want %s", got, tt.want)
			}
		})
	}
}

func TestRandomStrategyIsSeededAndSpreads(t *testing.T) {
	pick := func(seed uint64) string {
		c := rankCluster(t, WithOptions(Options{Seed: seed}))
		r := req("r", 1, 1024)
		r.Strategy = StrategyRandom
		p, err := c.Place(r)
		if err != nil || len(p.Placements) != 1 {
			t.Fatal(p, err)
		}
		return p.Placements[0].Node
	}
	seen := map[string]bool{}
	for seed := range uint64(40) {
		a, b := pick(seed), pick(seed)
		if a != b {
			t.Fatalf("seed %d gave %s then %s", seed, a, b)
		}
		seen[a] = true
	}
	if len(seen) != 3 {
		t.Fatalf("40 seeds used nodes %v, want all three", seen)
	}
}

func TestWeights(t *testing.T) {
	// With a tiny affinity weight the strategy wins again.
	c := rankCluster(t, WithOptions(Options{Weights: Weights{Affinity: 0.001}}))
	r := req("r", 1, 1024)
	r.Strategy, r.Affinities = StrategySpread, []string{"app==~1"}
	p, err := c.Place(r)
	if err != nil {
		t.Fatal(err)
	}
	if got := nodesOf(p); got[0] != "n0" {
		t.Fatalf("placed on %v, want n0", got)
	}
}

func TestServiceReplicasApartBatchPacks(t *testing.T) {
	c := newTestCluster(t, "p", mkNodes("n", 4, 8, 32, nil))
	svc := req("svc", 0.5, 256)
	svc.Count = 4
	p, err := c.Place(svc)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, n := range nodesOf(p) {
		seen[n] = true
	}
	if len(seen) != 4 {
		t.Fatalf("service replicas on %v, want 4 distinct nodes", nodesOf(p))
	}
	batch := req("batch", 0.5, 256)
	batch.Count, batch.Type = 4, driver.TypeBatch
	p, err = c.Place(batch)
	if err != nil {
		t.Fatal(err)
	}
	seen = map[string]bool{}
	for _, n := range nodesOf(p) {
		seen[n] = true
	}
	if len(seen) != 1 {
		t.Fatalf("batch instances on %v, want one node", nodesOf(p))
	}
}
