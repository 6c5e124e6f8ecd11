package scheduler

import (
	"slices"
	"testing"
	"time"

	"github.com/berth-dev/berth/driver"
)

func svc(name string, cpus float64, count int, essential *int) Service {
	return Service{Request: Request{Spec: driver.Spec{Name: name, Image: "x", Type: driver.TypeBatch,
		Resources: driver.Resources{CPU: driver.CPUs(cpus), Memory: 64 * driver.MiB}}, Count: count}, Essential: essential}
}

func ip(n int) *int { return &n }

func freeCPU(c *Cluster) driver.MilliCPU {
	var f driver.MilliCPU
	for _, n := range c.Nodes() {
		f += n.Free.CPU
	}
	return f
}

func TestGangAllOrNone(t *testing.T) {
	c := newTestCluster(t, "p", mkNodes("n", 2, 4, 8, nil))
	// 2 x 3 cpus take both nodes; the 2 cpu service then fits nowhere.
	g := &Group{ID: "g", Services: []Service{svc("a", 3, 2, nil), svc("b", 2, 1, nil)}}
	p, err := c.PlaceGroup(g)
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Placements) != 0 {
		t.Fatalf("gang placed in part: %v", nodesOf(p))
	}
	if len(p.Unplaced) != 2 || p.Unplaced[1].Reasons.String() != "2 nodes: not enough cpu (reservations)" {
		t.Fatalf("unplaced %+v", p.Unplaced)
	}
	if f := freeCPU(c); f != driver.CPUs(8) {
		t.Fatalf("free cpu after a failed gang = %s, want 8", f)
	}
	// Essential instances all placed, elastic ones best effort.
	g = &Group{ID: "h", Services: []Service{svc("a", 2, 2, nil), svc("b", 1, 6, ip(2))}}
	p, err = c.PlaceGroup(g)
	if err != nil {
		t.Fatal(err)
	}
	elastic := 0
	for _, pl := range p.Placements {
		if pl.Elastic {
			elastic++
		}
	}
	if len(p.Placements) != 6 || elastic != 2 || len(p.Unplaced) != 1 || !p.Unplaced[0].Elastic || len(p.Unplaced[0].Indexes) != 2 {
		t.Fatalf("placements %d (elastic %d), unplaced %+v", len(p.Placements), elastic, p.Unplaced)
	}
	if p.Placements[0].Instance != "h.a-0" || p.Placements[2].Instance != "h.b-0" {
		t.Fatalf("instance ids %s %s", p.Placements[0].Instance, p.Placements[2].Instance)
	}
}

func TestStartupOrder(t *testing.T) {
	c := newTestCluster(t, "p", mkNodes("n", 2, 8, 8, nil))
	a, b := svc("late", 1, 1, nil), svc("early", 1, 1, nil)
	a.StartupOrder, b.StartupOrder = 2, 1
	p, err := c.PlaceGroup(&Group{ID: "g", Services: []Service{a, b}})
	if err != nil {
		t.Fatal(err)
	}
	if p.Placements[0].Instance != "g.early" || p.Placements[1].Instance != "g.late" {
		t.Fatalf("order: %s, %s", p.Placements[0].Instance, p.Placements[1].Instance)
	}
}

func TestNodeSetOneProvider(t *testing.T) {
	c := NewCluster()
	if err := c.UpdateNodes("p1", mkNodes("s", 1, 2, 8, nil)); err != nil {
		t.Fatal(err)
	}
	if err := c.UpdateNodes("p2", mkNodes("b", 2, 8, 8, nil)); err != nil {
		t.Fatal(err)
	}
	g := &Group{ID: "set", Kind: KindNodeSet, Services: []Service{svc("small", 1, 1, nil), svc("big", 4, 2, nil)}}
	p, err := c.PlaceGroup(g)
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Placements) != 3 {
		t.Fatalf("placed %d: %+v", len(p.Placements), p.Unplaced)
	}
	for _, pl := range p.Placements {
		if pl.Provider != "p2" {
			t.Fatalf("%s on provider %s, want every label on p2", pl.Instance, pl.Provider)
		}
	}
}

func TestElasticEvictedForEssential(t *testing.T) {
	c := newTestCluster(t, "p", mkNodes("n", 2, 4, 8, nil))
	low := &Group{ID: "low", Services: []Service{svc("w", 1, 8, ip(1))}}
	p, err := c.PlaceGroup(low)
	if err != nil || len(p.Placements) != 8 {
		t.Fatalf("low: %+v %v", p, err)
	}
	// A group of lower priority evicts nothing.
	lower := &Group{ID: "lower", Priority: -1, Services: []Service{svc("x", 2, 1, nil)}}
	p, err = c.PlaceGroup(lower)
	if err != nil || len(p.Placements) != 0 || len(p.Evicted) != 0 {
		t.Fatalf("lower: %+v %v", p, err)
	}
	high := &Group{ID: "high", Priority: 5, Services: []Service{svc("x", 3, 1, nil)}}
	p, err = c.PlaceGroup(high)
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Placements) != 1 || len(p.Evicted) != 3 {
		t.Fatalf("high: placed %d, evicted %v", len(p.Placements), p.Evicted)
	}
	if slices.Contains(p.Evicted, "low.w-0") {
		t.Fatalf("the essential instance low.w-0 was evicted")
	}
	for _, id := range p.Evicted {
		if err := c.Release(id); err == nil {
			t.Fatalf("evicted %s still held", id)
		}
	}
	if st := c.Stats(); st.Instances != 8-3+1 {
		t.Fatalf("instances = %d, want 6", st.Instances)
	}
	if bad := c.Overbooked(); len(bad) > 0 {
		t.Fatalf("overbooked %v", bad)
	}
}

func TestQueueBackfill(t *testing.T) {
	now := time.Unix(1000, 0)
	for _, strict := range []bool{false, true} {
		c := newTestCluster(t, "p", mkNodes("n", 1, 4, 8, nil))
		q := &Queue{Policy: PolicyFIFO, Strict: strict}
		for _, g := range []*Group{
			{ID: "big", Services: []Service{svc("x", 8, 1, nil)}},
			{ID: "s1", Services: []Service{svc("x", 1, 1, nil)}},
			{ID: "s2", Services: []Service{svc("x", 1, 1, nil)}},
		} {
			if err := q.Push(g, now); err != nil {
				t.Fatal(err)
			}
		}
		done, err := c.Schedule(q, now)
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, d := range done {
			ids = append(ids, d.Group.ID)
		}
		want := []string{"s1", "s2"}
		if strict {
			want = nil
		}
		if !slices.Equal(ids, want) {
			t.Fatalf("strict=%v: placed %v, want %v", strict, ids, want)
		}
		if q.Len() != 3-len(want) {
			t.Fatalf("strict=%v: %d left in the queue", strict, q.Len())
		}
	}
}

// TestScheduleQueues passes over a fifo and a size queue on a node with
// room for 4 cpus: the urgent group of the second queue goes first (its
// class is higher), then each queue in its own order, the first queue's
// class-0 groups before the second's.
func TestScheduleQueues(t *testing.T) {
	now := time.Unix(1000, 0)
	c := newTestCluster(t, "p", mkNodes("n", 1, 4, 8, nil))
	fifo, size := &Queue{Policy: PolicyFIFO}, &Queue{Policy: PolicySize}
	for _, x := range []struct {
		q    *Queue
		id   string
		cpus float64
		prio int
	}{
		{fifo, "f-big", 2, 0}, {fifo, "f-small", 1, 0},
		{size, "s-big", 3, 0}, {size, "s-small", 0.5, 0}, {size, "s-urgent", 0.5, 1},
	} {
		if err := x.q.Push(&Group{ID: x.id, Priority: x.prio, Services: []Service{svc("x", x.cpus, 1, nil)}}, now); err != nil {
			t.Fatal(err)
		}
	}
	done, err := c.ScheduleQueues([]*Queue{fifo, size}, now)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, d := range done {
		ids = append(ids, d.Group.ID)
	}
	// 0.5 + 2 + 1 + 0.5 = 4 cpus; s-big no longer fits.
	if want := []string{"s-urgent", "f-big", "f-small", "s-small"}; !slices.Equal(ids, want) {
		t.Fatalf("placed %v, want %v", ids, want)
	}
	if fifo.Len() != 0 || size.Len() != 1 {
		t.Fatalf("left: fifo %d, size %d; want 0 and 1", fifo.Len(), size.Len())
	}
}

func TestQueueOrder(t *testing.T) {
	t0 := time.Unix(0, 0)
	total := driver.Resources{CPU: driver.CPUs(100), Memory: 100 * driver.GiB}
	mk := func(id string, cpus float64, prio int) *Group {
		return &Group{ID: id, Priority: prio, Services: []Service{svc("x", cpus, 1, nil)}}
	}
	ids := func(items []*QueueItem) []string {
		var out []string
		for _, it := range items {
			out = append(out, it.Group.ID)
		}
		return out
	}
	tests := []struct {
		policy Policy
		at     time.Duration
		want   []string
	}{
		{PolicyFIFO, 0, []string{"urgent", "big", "mid", "small"}},
		{PolicySize, 0, []string{"urgent", "small", "mid", "big"}},
		// The big group arrived first; once it has waited 30 minutes its
		// dynamic size (0.4 / 31) is below the small one's (0.02).
		{PolicyDynSize, 0, []string{"urgent", "small", "mid", "big"}},
		{PolicyDynSize, 30 * time.Minute, []string{"urgent", "big", "small", "mid"}},
	}
	for _, tt := range tests {
		q := &Queue{Policy: tt.policy}
		now := t0.Add(tt.at)
		_ = q.Push(mk("big", 40, 0), t0)
		_ = q.Push(mk("mid", 10, 0), now)
		_ = q.Push(mk("small", 2, 0), now)
		_ = q.Push(mk("urgent", 50, 9), now)
		if got := ids(q.Order(now, total)); !slices.Equal(got, tt.want) {
			t.Errorf("%s at +%s: %v, want %v", tt.policy, tt.at, got, tt.want)
		}
	}
	if err := (&Queue{Policy: "lifo"}).Push(mk("a", 1, 0), t0); err == nil {
		t.Error("unknown policy accepted")
	}
}
