package scheduler

import (
	"slices"
	"strings"
	"testing"

	"github.com/berth-dev/berth/driver"
)

// filterCluster has one node for each thing a filter looks at.
func filterCluster(t *testing.T) *Cluster {
	t.Helper()
	res := func(cpus float64, gib int64) driver.Resources {
		return driver.Resources{CPU: driver.CPUs(cpus), Memory: driver.Bytes(gib) * driver.GiB}
	}
	c := NewCluster()
	c.SetCapabilities("p1", []string{driver.CapResize})
	p1 := []driver.Node{
		{Name: "a", Status: driver.NodeOnline, Capacity: res(4, 8), Labels: map[string]string{"disk": "ssd", "zone": "eu-1"},
			Attributes: map[string]string{"os": "linux"}, Images: []string{"redis"}, Ports: []int{80}},
		{Name: "b", Status: driver.NodeOnline, Capacity: res(4, 8), Labels: map[string]string{"disk": "hdd", "zone": "eu-2"},
			Attributes: map[string]string{"os": "linux"}, MaxInstances: 1, Instances: 1},
		{Name: "c", Status: driver.NodeDraining, Capacity: res(4, 8)},
		{Name: "d", Status: driver.NodeOffline, Capacity: res(4, 8)},
		{Name: "web-1", Status: driver.NodeOnline, Capacity: res(16, 64), Labels: map[string]string{"zone": "us-1"}},
	}
	e := res(2, 4)
	e.GPUs = 1
	e.Other = map[string]int64{"fpga": 2}
	p2 := []driver.Node{{Name: "e", Status: driver.NodeOnline, Capacity: e, Labels: map[string]string{"disk": "ssd"}, Attributes: map[string]string{"os": "windows"}}}
	if err := c.UpdateNodes("p1", p1); err != nil {
		t.Fatal(err)
	}
	if err := c.UpdateNodes("p2", p2); err != nil {
		t.Fatal(err)
	}
	return c
}

// feasibleNodes runs the filter chain over every node for r.
func feasibleNodes(t *testing.T, c *Cluster, r *Request) []string {
	t.Helper()
	cr, err := compile(r, "")
	if err != nil {
		t.Fatal(err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for i := range int32(len(c.nodes)) {
		if cr.staticReason(c.st.t, i, true) == "" && c.planner.dynReason(cr, i, nil) == "" {
			out = append(out, c.st.t.names[i])
		}
	}
	return out
}

func TestFilters(t *testing.T) {
	base := func() *Request { return req("r", 1, 512) }
	with := func(f func(r *Request)) *Request { r := base(); f(r); return r }
	tests := []struct {
		name string
		r    *Request
		want []string
	}{
		{"online with room", base(), []string{"a", "web-1", "e"}},
		{"cpu", with(func(r *Request) { r.CPU = driver.CPUs(3) }), []string{"a", "web-1"}},
		{"fractional cpu", with(func(r *Request) { r.CPU = driver.CPUs(2.001) }), []string{"a", "web-1"}},
		{"memory", with(func(r *Request) { r.Memory = 10 * driver.GiB }), []string{"web-1"}},
		{"gpus", with(func(r *Request) { r.GPUs = 1 }), []string{"e"}},
		{"named resource", with(func(r *Request) { r.Other = map[string]int64{"fpga": 2} }), []string{"e"}},
		{"named resource too much", with(func(r *Request) { r.Other = map[string]int64{"fpga": 3} }), nil},
		{"label ==", with(func(r *Request) { r.Constraints = []string{"disk==ssd"} }), []string{"a", "e"}},
		{"label != (missing label counts as different)", with(func(r *Request) { r.Constraints = []string{"disk!=ssd"} }), []string{"web-1"}},
		{"attribute regex", with(func(r *Request) { r.Constraints = []string{"os==/lin.*/"} }), []string{"a"}},
		{"node glob", with(func(r *Request) { r.Constraints = []string{"node==web*"} }), []string{"web-1"}},
		{"node !=", with(func(r *Request) { r.Constraints = []string{"node!=a"} }), []string{"web-1", "e"}},
		{"two constraints", with(func(r *Request) { r.Constraints = []string{"disk==ssd", "os!=windows"} }), []string{"a"}},
		{"provider field", with(func(r *Request) { r.Provider = "p2" }), []string{"e"}},
		{"provider constraint", with(func(r *Request) { r.Constraints = []string{"provider==p1"} }), []string{"a", "web-1"}},
		{"capability", with(func(r *Request) { r.Capabilities = []string{driver.CapResize} }), []string{"a", "web-1"}},
		{"fixed host port", with(func(r *Request) { r.Ports = []driver.Port{{ContainerPort: 80, HostPort: 80}} }), []string{"web-1", "e"}},
		{"image affinity", with(func(r *Request) { r.Affinities = []string{"image==redis"} }), []string{"a"}},
		{"image anti-affinity", with(func(r *Request) { r.Affinities = []string{"image!=redis"} }), []string{"web-1", "e"}},
		{"soft constraint counted as hard first", with(func(r *Request) { r.Constraints = []string{"zone==~eu-1"} }), []string{"a"}},
	}
	c := filterCluster(t)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := feasibleNodes(t, c, tt.r)
			if !slices.Equal(got, tt.want) {
				t.Fatalf("feasible = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestReasonsSummary(t *testing.T) {
	c := filterCluster(t)
	r := req("r", 1, 10*1024)
	r.Constraints = []string{"disk==ssd"}
	p, err := c.Place(r)
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Placements) != 0 || len(p.Unplaced) != 1 || !slices.Equal(p.Unplaced[0].Indexes, []int{0}) {
		t.Fatalf("plan = %+v", p)
	}
	got := p.Unplaced[0].Reasons
	if got.Nodes != 6 {
		t.Errorf("nodes = %d, want 6", got.Nodes)
	}
	// b and web-1 fail the constraint, a and e are too small, c drains, d is
	// offline; said provider by provider (e is p2's).
	want := "provider p1: 2 nodes: constraint disk==ssd; 1: node draining; 1: node offline; 1: not enough memory (reservations); provider p2: 1 node: not enough memory (reservations)"
	if s := got.String(); s != want {
		t.Errorf("summary = %q, want %q", s, want)
	}
}

func TestReasonsString(t *testing.T) {
	tests := []struct {
		r    Reasons
		want string
	}{
		{Reasons{}, "no nodes"},
		{tally{{"p", "not enough memory"}: 4812, {"p", "constraint disk==ssd"}: 188}.reasons(), "4,812 nodes: not enough memory; 188: constraint disk==ssd"},
		{tally{{"p", "node offline"}: 1}.reasons(), "1 node: node offline"},
		{tally{{"p", "b"}: 2, {"p", "a"}: 2, {"p", "c"}: 1000000}.reasons(), "1,000,000 nodes: c; 2: a; 2: b"},
		// Several providers: each says its own.
		{tally{{"local", "provider lacks capability kind:container"}: 1, {"docker", "not enough cpu"}: 3, {"docker", "constraint zone==b"}: 1}.reasons(),
			"provider docker: 3 nodes: not enough cpu; 1: constraint zone==b; provider local: 1 node: provider lacks capability kind:container"},
	}
	for _, tt := range tests {
		if got := tt.r.String(); got != tt.want {
			t.Errorf("String() = %q, want %q", got, tt.want)
		}
	}
}

// An avoided node is avoided on its own provider only, and the rejection
// counts say why.
func TestAvoid(t *testing.T) {
	c := newTestCluster(t, "a", mkNodes("n", 2, 4, 8, nil))
	if err := c.UpdateNodes("b", mkNodes("n", 1, 4, 8, nil)); err != nil {
		t.Fatal(err)
	}
	r := req("r", 1, 512)
	r.Avoid = []Avoid{{Provider: "a", Node: "n0", Reason: "a launch failed there"}, {Provider: "a", Node: "n1", Reason: "refused it"}}
	plan, err := c.Snapshot(Options{}).Plan(r)
	if err != nil {
		t.Fatal(err)
	}
	if len(plan.Placements) != 1 || plan.Placements[0].Provider != "b" || plan.Placements[0].Node != "n0" {
		t.Fatalf("placements %+v, want b/n0 (the avoided n0 is a's)", plan.Placements)
	}
	r.Provider = "a"
	plan, err = c.Snapshot(Options{}).Plan(r)
	if err != nil {
		t.Fatal(err)
	}
	if len(plan.Placements) != 0 || len(plan.Unplaced) != 1 {
		t.Fatalf("placed %+v on an avoided node", plan.Placements)
	}
	got := plan.Unplaced[0].Reasons.String()
	for _, want := range []string{"avoided: a launch failed there", "avoided: refused it"} {
		if !strings.Contains(got, want) {
			t.Errorf("reasons %q do not say %q", got, want)
		}
	}
}
