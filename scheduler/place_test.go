package scheduler

import (
	"errors"
	"slices"
	"testing"

	"github.com/berth-dev/berth/driver"
)

func TestSoftConstraintRelaxed(t *testing.T) {
	nodes := mkNodes("n", 2, 4, 8, nil)
	nodes[0].Labels = map[string]string{"disk": "ssd"}
	c := newTestCluster(t, "p", nodes)
	r := req("a", 3, 512)
	r.Constraints = []string{"disk==~ssd"}
	p, err := c.Place(r)
	if err != nil {
		t.Fatal(err)
	}
	if got := nodesOf(p); !slices.Equal(got, []string{"n0"}) || len(p.Relaxed) != 0 {
		t.Fatalf("honoured soft constraint: nodes %v relaxed %v", got, p.Relaxed)
	}
	// n0 is now too full: the soft constraint is relaxed, not failed.
	r = req("b", 3, 512)
	r.Constraints = []string{"disk==~ssd"}
	p, err = c.Place(r)
	if err != nil {
		t.Fatal(err)
	}
	if got := nodesOf(p); !slices.Equal(got, []string{"n1"}) || !slices.Equal(p.Relaxed, []string{"disk==~ssd"}) {
		t.Fatalf("relaxed soft constraint: nodes %v relaxed %v", got, p.Relaxed)
	}
	// A hard constraint is never relaxed.
	r = req("c", 3, 512)
	r.Constraints = []string{"disk==ssd"}
	p, err = c.Place(r)
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Placements) != 0 || p.Unplaced[0].Reasons.String() != "1 node: constraint disk==ssd; 1: not enough cpu (reservations)" {
		t.Fatalf("hard constraint: %+v %s", nodesOf(p), p.Unplaced[0].Reasons)
	}
}

func TestRelaxedPrefersMoreSoftMatches(t *testing.T) {
	nodes := mkNodes("n", 3, 4, 8, nil)
	nodes[1].Labels = map[string]string{"zone": "a"}
	nodes[2].Labels = map[string]string{"zone": "a", "disk": "ssd"}
	c := newTestCluster(t, "p", nodes)
	// No node has gpu=yes, so the soft rules are relaxed; n2 meets two of three.
	r := req("a", 1, 512)
	r.Constraints = []string{"zone==~a", "disk==~ssd", "gpu==~yes"}
	p, err := c.Place(r)
	if err != nil {
		t.Fatal(err)
	}
	if got := nodesOf(p); !slices.Equal(got, []string{"n2"}) {
		t.Fatalf("placed on %v, want n2", got)
	}
}

func TestHostPorts(t *testing.T) {
	c := newTestCluster(t, "p", mkNodes("n", 1, 8, 8, nil), WithPortRange(30000, 30001))
	r := req("web", 0.1, 64)
	r.Count, r.Type = 3, driver.TypeBatch
	r.Ports = []driver.Port{{ContainerPort: 8080, Publish: true}}
	p, err := c.Place(r)
	if err != nil {
		t.Fatal(err)
	}
	var ports []int
	for _, pl := range p.Placements {
		ports = append(ports, pl.Ports...)
	}
	slices.Sort(ports)
	if !slices.Equal(ports, []int{30000, 30001}) {
		t.Fatalf("ports = %v, want 30000 and 30001", ports)
	}
	if len(p.Unplaced) != 1 || p.Unplaced[0].Reasons.String() != "1 node: no free host port in 30000-30001" {
		t.Fatalf("unplaced = %+v", p.Unplaced)
	}
	// Releasing one frees its port for the next.
	if err := c.Release(p.Placements[0].Instance); err != nil {
		t.Fatal(err)
	}
	q := req("again", 0.1, 64)
	q.Ports = r.Ports
	p2, err := c.Place(q)
	if err != nil || len(p2.Placements) != 1 || !slices.Equal(p2.Placements[0].Ports, p.Placements[0].Ports) {
		t.Fatalf("after release: %+v %v", p2, err)
	}
	// A fixed port is used up on its node.
	f := req("fixed", 0.1, 64)
	f.Count = 2
	f.Ports = []driver.Port{{ContainerPort: 80, HostPort: 8080}}
	p3, err := c.Place(f)
	if err != nil {
		t.Fatal(err)
	}
	if len(p3.Placements) != 1 || p3.Unplaced[0].Reasons.String() != "1 node: host port 8080 in use" {
		t.Fatalf("fixed port twice: %+v", p3)
	}
}

func TestInstanceCap(t *testing.T) {
	nodes := mkNodes("n", 1, 8, 8, nil)
	nodes[0].MaxInstances = 2
	c := newTestCluster(t, "p", nodes)
	r := req("a", 0.1, 64)
	r.Count = 3
	p, err := c.Place(r)
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Placements) != 2 || p.Unplaced[0].Reasons.String() != "1 node: instance cap reached" {
		t.Fatalf("plan %+v", p)
	}
}

func TestInstanceAffinity(t *testing.T) {
	c := newTestCluster(t, "p", mkNodes("n", 3, 8, 8, nil))
	db := req("db", 1, 512)
	db.Name, db.Group, db.Labels = "db", "shop", map[string]string{"app": "db"}
	p, err := c.Place(db)
	if err != nil || len(p.Placements) != 1 {
		t.Fatal(p, err)
	}
	dbNode := p.Placements[0].Node
	for _, tt := range []struct {
		aff  string
		same bool
	}{
		{"instance==db", true}, {"container==d?", true}, {"label.app==db", true}, {"app==db", true},
		{"group==shop", true}, {"image==app", true},
		{"instance!=db", false}, {"group!=shop", false}, {"app!=/d.*/", false},
	} {
		r := req("", 0.1, 64)
		r.Affinities = []string{tt.aff}
		pl, err := c.Snapshot(Options{}).Plan(r)
		if err != nil || len(pl.Placements) != 1 {
			t.Fatalf("%s: %+v %v", tt.aff, pl, err)
		}
		if got := pl.Placements[0].Node == dbNode; got != tt.same {
			t.Errorf("%s: placed on %s, db is on %s", tt.aff, pl.Placements[0].Node, dbNode)
		}
	}
	r := req("x", 0.1, 64)
	r.Affinities = []string{"instance==nothing"}
	pl, _ := c.Place(r)
	if len(pl.Placements) != 0 || pl.Unplaced[0].Reasons.String() != "3 nodes: affinity instance==nothing" {
		t.Fatalf("unmatched affinity: %+v", pl)
	}
}

func TestMaxPerNode(t *testing.T) {
	c := newTestCluster(t, "p", mkNodes("n", 2, 8, 8, nil))
	r := req("a", 0.1, 64)
	r.Count, r.Type, r.MaxPerNode = 5, driver.TypeBatch, 2
	p, err := c.Place(r)
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Placements) != 4 || p.Unplaced[0].Reasons.String() != "2 nodes: max_per_node reached" {
		t.Fatalf("plan %v %+v", nodesOf(p), p.Unplaced)
	}
}

func TestDuplicateAndRelease(t *testing.T) {
	c := newTestCluster(t, "p", mkNodes("n", 1, 8, 8, nil))
	if _, err := c.Place(req("a", 1, 64)); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Place(req("a", 1, 64)); !errors.Is(err, driver.ErrAlreadyExists) {
		t.Fatalf("second place of a: %v, want ErrAlreadyExists", err)
	}
	if err := c.Release("a"); err != nil {
		t.Fatal(err)
	}
	if err := c.Release("a"); !errors.Is(err, driver.ErrNotFound) {
		t.Fatalf("second release: %v, want ErrNotFound", err)
	}
	if _, err := c.Place(&Request{}); !errors.Is(err, driver.ErrInvalid) {
		t.Fatalf("invalid request: %v, want ErrInvalid", err)
	}
	if n := c.Nodes()[0]; n.Free.CPU != driver.CPUs(8) || n.Instances != 0 {
		t.Fatalf("after release: %+v", n)
	}
}

func TestReserveAndReportedUse(t *testing.T) {
	nodes := mkNodes("n", 1, 4, 8, nil)
	nodes[0].Reserved = driver.Resources{CPU: driver.CPUs(1)} // something Berth does not own
	c := newTestCluster(t, "p", nodes)
	// An instance on a node not reported yet is kept on a placeholder.
	if err := c.Reserve(Allocation{ID: "old", Provider: "q", Node: "later", Resources: driver.Resources{CPU: driver.CPUs(1)}}); err != nil {
		t.Fatal(err)
	}
	if err := c.Reserve(Allocation{ID: "old", Provider: "q", Node: "later"}); !errors.Is(err, driver.ErrAlreadyExists) {
		t.Fatalf("reserve twice: %v", err)
	}
	if err := c.UpdateNodes("q", mkNodes("later", 1, 2, 8, nil)); err != nil {
		t.Fatal(err)
	}
	// "later" became "later0"; the placeholder "later" is removed, its
	// allocation kept until released.
	if err := c.Release("old"); err != nil {
		t.Fatal(err)
	}
	// The larger of reported (1 cpu) and Berth's allocations counts.
	r := req("a", 3, 64)
	r.Provider = "p"
	if p, _ := c.Place(r); len(p.Placements) != 1 {
		t.Fatalf("3 of 4 cpus with 1 reported: %+v", p)
	}
	// Berth holds 3, the back-end reports 1 (taken to be part of Berth's
	// 3), so 1 cpu is left.
	r = req("b", 1, 64)
	r.Provider = "p"
	if p, _ := c.Place(r); len(p.Placements) != 1 {
		t.Fatalf("1 cpu left: %+v", p)
	}
	r = req("c", 0.1, 64)
	r.Provider = "p"
	if p, _ := c.Place(r); len(p.Placements) != 0 {
		t.Fatalf("node is full: %+v", nodesOf(p))
	}
	// Before Berth allocated anything, the reported 1 cpu was what counted.
	c2 := newTestCluster(t, "p", nodes)
	if p, _ := c2.Place(req("d", 3.5, 64)); len(p.Placements) != 0 {
		t.Fatalf("3.5 of 4 cpus with 1 reported in use: %+v", nodesOf(p))
	}
}

func TestUpdateNodesValidation(t *testing.T) {
	c := NewCluster()
	err := c.UpdateNodes("p", []driver.Node{{Name: "a"}, {Name: "a", Capacity: driver.Resources{CPU: -1}}})
	if got := paths(err); !slices.Equal(got, []string{"nodes[1].name", "nodes[1].capacity.cpus"}) {
		t.Fatalf("paths = %v (%v)", got, err)
	}
	var fe *driver.FieldError
	if err := c.UpdateNodes("", nil); !errors.As(err, &fe) || fe.Path != "provider" {
		t.Fatalf("empty provider: %v", err)
	}
}

func TestOfflineAndDrainingUpdates(t *testing.T) {
	nodes := mkNodes("n", 2, 4, 8, nil)
	c := newTestCluster(t, "p", nodes)
	nodes[0].Status = driver.NodeDraining
	nodes[1].Status = driver.NodeOffline
	if err := c.UpdateNodes("p", nodes); err != nil {
		t.Fatal(err)
	}
	p, _ := c.Place(req("a", 1, 64))
	if len(p.Placements) != 0 || p.Unplaced[0].Reasons.String() != "1 node: node draining; 1: node offline" {
		t.Fatalf("%+v", p)
	}
	// A node missing from a reading is removed.
	if err := c.UpdateNodes("p", nodes[:1]); err != nil {
		t.Fatal(err)
	}
	if got := len(c.Nodes()); got != 1 {
		t.Fatalf("nodes = %d, want 1", got)
	}
}

// TestImagePresenceScores: of nodes otherwise alike, the one holding the
// image is chosen, by name or by name:latest; nodes without it still take
// the instance when it is the only room.
func TestImagePresenceScores(t *testing.T) {
	for _, strategy := range []Strategy{StrategyBinpack, StrategySpread} {
		for _, held := range []string{"app", "app:latest"} {
			nodes := mkNodes("n", 3, 4, 8, nil)
			nodes[2].Images = []string{held}
			c := newTestCluster(t, "p", nodes)
			r := req("a", 1, 256)
			r.Strategy = strategy
			p, err := c.Place(r)
			if err != nil {
				t.Fatal(err)
			}
			if got := nodesOf(p); !slices.Equal(got, []string{"n2"}) {
				t.Errorf("%s, node holds %q: placed on %v, want n2", strategy, held, got)
			}
		}
	}
	nodes := mkNodes("n", 2, 4, 8, nil)
	nodes[1].Images = []string{"app"}
	c := newTestCluster(t, "p", nodes)
	if p, err := c.Place(req("big", 4, 256)); err != nil || !slices.Equal(nodesOf(p), []string{"n1"}) {
		t.Fatalf("first: %v %v", nodesOf(p), err)
	}
	if p, err := c.Place(req("next", 4, 256)); err != nil || !slices.Equal(nodesOf(p), []string{"n0"}) {
		t.Fatalf("with the image's node full: %v %v, want n0", nodesOf(p), err)
	}
}

// TestStaleReading: a reading of the nodes begun before an untracked
// instance was released may still count it. UpdateNodesRead keeps the
// node's last reading then, so the room is free for the next placement;
// UpdateNodes, which applies any reading, shows what it would have cost.
func TestStaleReading(t *testing.T) {
	c := newTestCluster(t, "p", mkNodes("n", 1, 4, 8, nil))
	if p, err := c.Place(req("a", 4, 64)); err != nil || len(p.Placements) != 1 {
		t.Fatalf("place a: %+v %v", p, err)
	}
	since := c.ReadBegin()
	// The back-end is read while a still runs there...
	reading := busyNodes(1, 4, 64)
	// ...and a is deleted and released before the reading is applied.
	if err := c.Release("a"); err != nil {
		t.Fatal(err)
	}
	if err := c.UpdateNodesRead("p", reading, since); err != nil {
		t.Fatal(err)
	}
	if p, err := c.Place(req("b", 4, 64)); err != nil || len(p.Placements) != 1 {
		t.Fatalf("place b after the stale reading: %+v %v", p, err)
	}
	if err := c.Release("b"); err != nil {
		t.Fatal(err)
	}
	// A reading begun after the last release is taken.
	if err := c.UpdateNodesRead("p", mkNodes("n", 1, 4, 8, nil), c.ReadBegin()); err != nil {
		t.Fatal(err)
	}
	// Applied, the stale reading holds the released room.
	if err := c.UpdateNodes("p", reading); err != nil {
		t.Fatal(err)
	}
	if p, err := c.Place(req("c", 4, 64)); err != nil || len(p.Placements) != 0 {
		t.Fatalf("place c on a node whose reading counts 4 cpus reserved: %+v %v", p, err)
	}
}

// busyNodes returns a reading of n nodes of 4 cpus and 8 GiB, each
// running one instance of cpus and mib.
func busyNodes(n int, cpus float64, mib int64) []driver.Node {
	nodes := mkNodes("n", n, 4, 8, nil)
	for i := range nodes {
		nodes[i].Reserved = driver.Resources{CPU: driver.CPUs(cpus), Memory: driver.Bytes(mib) * driver.MiB}
		nodes[i].Instances = 1
	}
	return nodes
}

// TestPresenceFreesReading: a reading taken while an instance ran counts
// it; once its back-end has let it go (Gone) and it is released, its room
// is free although no reading has been taken since, on the cluster and on
// a snapshot.
func TestPresenceFreesReading(t *testing.T) {
	c := newTestCluster(t, "p", mkNodes("n", 1, 4, 8, nil))
	if p, err := c.Place(req("a", 4, 64)); err != nil || len(p.Placements) != 1 {
		t.Fatalf("place a: %+v %v", p, err)
	}
	snap := c.Snapshot(Options{})
	for _, p := range []Presence{Changing, Present} {
		if err := c.SetPresence("a", p); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.UpdateNodesRead("p", busyNodes(1, 4, 64), c.ReadBegin()); err != nil {
		t.Fatal(err)
	}
	for _, p := range []Presence{Changing, Gone} {
		if err := c.SetPresence("a", p); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Release("a"); err != nil {
		t.Fatal(err)
	}
	if err := c.SetPresence("a", Gone); !errors.Is(err, driver.ErrNotFound) {
		t.Fatalf("SetPresence of a released instance: %v, want ErrNotFound", err)
	}
	snap.Refresh()
	if p, _, err := snap.Place(req("b", 4, 64)); err != nil || len(p.Placements) != 1 {
		t.Fatalf("place b on a snapshot after a left: %+v %v", p, err)
	}
	if err := c.Release("b"); err != nil {
		t.Fatal(err)
	}
	if p, err := c.Place(req("c", 4, 64)); err != nil || len(p.Placements) != 1 {
		t.Fatalf("place c after a left: %+v %v", p, err)
	}
	// A later reading that counts c (Untracked) holds its room after its
	// release, until a reading no longer counts it.
	if err := c.UpdateNodesRead("p", busyNodes(1, 4, 64), c.ReadBegin()); err != nil {
		t.Fatal(err)
	}
	if err := c.Release("c"); err != nil {
		t.Fatal(err)
	}
	if p, err := c.Place(req("d", 1, 64)); err != nil || len(p.Placements) != 0 {
		t.Fatalf("place d while the reading counts the untracked c: %+v %v", p, err)
	}
}

// TestPresenceUncertainReading: a reading begun while a create or a delete
// was under way on a node, or before an instance there changed presence,
// may or may not count that instance: the node keeps what its last
// reading counted, so that the room is freed when the instance goes.
func TestPresenceUncertainReading(t *testing.T) {
	for _, tt := range []struct {
		name string
		// during moves a while the reading is taken, after it was placed
		// (then Changing, Present: running) and before it is deleted
		// (then Changing, Gone).
		during []Presence
	}{
		{"creating", []Presence{Changing}},
		{"created as read", []Presence{Changing, Present}},
		{"deleting", []Presence{Changing, Present, Changing}},
		{"deleted as read", []Presence{Changing, Present, Changing, Gone}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c := newTestCluster(t, "p", mkNodes("n", 2, 4, 8, nil))
			if p, err := c.Place(req("a", 4, 64)); err != nil || len(p.Placements) != 1 {
				t.Fatalf("place a: %+v %v", p, err)
			}
			px, err := c.Place(req("x", 1, 64))
			if err != nil || len(px.Placements) != 1 {
				t.Fatalf("place x: %+v %v", px, err)
			}
			node := px.Placements[0].Node // the other node
			since := c.ReadBegin()
			for _, p := range tt.during {
				if err := c.SetPresence("a", p); err != nil {
					t.Fatal(err)
				}
			}
			// Read as a ran: the node of a counts it, the other counts x.
			reading := busyNodes(2, 4, 64)
			for i := range reading {
				if reading[i].Name == node {
					reading[i].Reserved.CPU = driver.CPUs(1)
				}
			}
			if err := c.UpdateNodesRead("p", reading, since); err != nil {
				t.Fatal(err)
			}
			for _, p := range []Presence{Changing, Present, Changing, Gone}[len(tt.during):] {
				if err := c.SetPresence("a", p); err != nil {
					t.Fatal(err)
				}
			}
			if err := c.Release("a"); err != nil {
				t.Fatal(err)
			}
			if p, err := c.Place(req("b", 4, 64)); err != nil || len(p.Placements) != 1 {
				t.Fatalf("place b after a left: %+v %v", p, err)
			}
			// The other node took its reading: x is untracked, and the
			// reading's 1 cpu stays after x is released.
			if err := c.Release("x"); err != nil {
				t.Fatal(err)
			}
			if p, err := c.Place(req("y", 4, 64)); err != nil || len(p.Placements) != 0 {
				t.Fatalf("place y where the reading counts 1 cpu: %+v %v", p, err)
			}
		})
	}
}
