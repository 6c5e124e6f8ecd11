package sim_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/driver/drivertest"
	"github.com/berth-dev/berth/drivers/sim"
)

var epoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// newSim builds a sim on a manual clock; edit changes the defaults first.
func newSim(t *testing.T, edit func(*sim.Options)) (*sim.Sim, *sim.ManualClock) {
	t.Helper()
	clock := sim.NewManualClock(epoch)
	opts := sim.DefaultOptions()
	opts.Clock = clock
	if edit != nil {
		edit(opts)
	}
	s, err := sim.New(*opts)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { _ = s.Close(context.Background()) })
	return s, clock
}

func spec(name string) *driver.Spec {
	return &driver.Spec{
		Name:      name,
		Image:     "app:1",
		Resources: driver.Resources{CPU: driver.CPUs(0.5), Memory: 512 * driver.MiB},
		Tags:      map[string]string{driver.TagManaged: "true", "case": name},
	}
}

// create calls Create and one Advance; it returns the progress and the error
// from either.
func create(t *testing.T, s *sim.Sim, node string, sp *driver.Spec) (driver.Operation, driver.Progress, error) {
	t.Helper()
	op, err := s.Create(context.Background(), node, sp)
	if err != nil {
		return nil, driver.Progress{}, err
	}
	p, err := op.Advance(context.Background())
	return op, p, err
}

func mustRun(t *testing.T, s *sim.Sim, node string, sp *driver.Spec) *driver.Instance {
	t.Helper()
	_, p, err := create(t, s, node, sp)
	if err != nil {
		t.Fatalf("create %s on %s: %v", sp.Name, node, err)
	}
	if !p.Done {
		t.Fatalf("create %s on %s: not done on the first Advance with zero latency", sp.Name, node)
	}
	return p.Instance
}

func mustDelete(t *testing.T, s *sim.Sim, id string) {
	t.Helper()
	op, err := s.Delete(context.Background(), id)
	if err == nil {
		_, err = driver.Drive(context.Background(), op)
	}
	if err != nil {
		t.Fatalf("delete %s: %v", id, err)
	}
}

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestRegistered(t *testing.T) {
	def, err := driver.Lookup("sim")
	if err != nil {
		t.Fatal(err)
	}
	d, err := def.Open(context.Background(), nil, driver.Env{})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close(context.Background())
	st, err := d.State(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Nodes) != sim.DefaultNodes {
		t.Errorf("default cluster: %d nodes, want %d", len(st.Nodes), sim.DefaultNodes)
	}
	if n := st.Nodes[0]; n.Name != "node-01" || n.Capacity.CPU != driver.CPUs(4) || n.Status != driver.NodeOnline {
		t.Errorf("default node: %+v", n)
	}
	names := map[string]bool{}
	for _, o := range def.Options() {
		names[o.Name] = true
		if o.Help == "" {
			t.Errorf("option %s has no help", o.Name)
		}
	}
	for _, want := range []string{"nodes", "shape", "pools", "create_latency", "delete_latency", "latency_jitter", "seed",
		"fail_retryable", "fail_permanent", "fail_quota", "hang_rate", "offline_rate", "flap", "strict_images", "overcommit", "call_log"} {
		if !names[want] {
			t.Errorf("option %s is not declared", want)
		}
	}
}

func TestOptionErrors(t *testing.T) {
	def, err := driver.Lookup("sim")
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		raw  map[string]any
		key  string
	}{
		{"unknown key", map[string]any{"nodez": 3}, "nodez"},
		{"wrong type", map[string]any{"nodes": true}, "nodes"},
		{"wrong flag text", map[string]any{"nodes": "ten"}, "nodes"},
		{"too many nodes", map[string]any{"nodes": sim.MaxNodes + 1}, "nodes"},
		{"negative nodes", map[string]any{"nodes": -1}, "nodes"},
		{"nodes and pools", map[string]any{"nodes": 5, "pools": `[{"count": 2, "cpus": 1, "memory": 1024}]`}, "nodes"},
		{"pool count", map[string]any{"pools": `[{"count": 0, "cpus": 1, "memory": 1024}]`}, "pools[0].count"},
		{"pool cpus", map[string]any{"pools": `[{"count": 1, "cpus": 1, "memory": 1024}, {"count": 1, "cpus": -2, "memory": 1024}]`}, "pools[1].cpus"},
		{"pool unknown field", map[string]any{"pools": `[{"count": 1, "cpu": 1}]`}, "pools"},
		{"pools too big", map[string]any{"pools": `[{"count": 60000, "cpus": 1, "memory": 1}, {"count": 60000, "cpus": 1, "memory": 1}]`}, "pools"},
		{"duplicate prefix", map[string]any{"pools": `[{"count": 1, "name_prefix": "a", "cpus": 1, "memory": 1}, {"count": 1, "name_prefix": "a", "cpus": 1, "memory": 1}]`}, "pools[1].name_prefix"},
		{"bad prefix", map[string]any{"pools": `[{"count": 1, "name_prefix": "-a", "cpus": 1, "memory": 1}]`}, "pools[0].name_prefix"},
		{"negative pool memory", map[string]any{"pools": `[{"count": 1, "cpus": 1, "memory": -1}]`}, "pools[0].memory"},
		{"shape without cpus", map[string]any{"shape": `{"memory": "1Gi"}`}, "shape.cpus"},
		{"rate above one", map[string]any{"fail_quota": 1.5}, "fail_quota"},
		{"rates add up", map[string]any{"fail_retryable": 0.6, "fail_permanent": 0.6}, "fail_retryable"},
		{"negative latency", map[string]any{"create_latency": "-1s"}, "create_latency"},
		{"latency not a duration", map[string]any{"delete_latency": 5}, "delete_latency"},
		{"negative call log", map[string]any{"call_log": -1}, "call_log"},
		{"overcommit below one", map[string]any{"overcommit": 0.5}, "overcommit"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := def.Decode(c.raw)
			if !errors.Is(err, driver.ErrInvalid) {
				t.Fatalf("Decode(%v): %v, want ErrInvalid", c.raw, err)
			}
			if !drivertest.HasField(err, c.key) {
				t.Errorf("Decode(%v): %v does not name %q", c.raw, err, c.key)
			}
			if !strings.Contains(err.Error(), `driver "sim"`) {
				t.Errorf("Decode(%v): %v does not name the driver", c.raw, err)
			}
		})
	}
}

func TestOptionsFromFlags(t *testing.T) {
	def, _ := driver.Lookup("sim")
	v, err := def.Decode(map[string]any{
		"pools":          `[{"count": 3, "name_prefix": "gpu-", "cpus": 8, "memory": "64Gi", "gpus": 2, "zones": ["a", "b"], "racks": ["r1"], "labels": {"tier": "gpu"}, "images": ["cuda"]}]`,
		"create_latency": "1.5s",
		"seed":           "42",
		"strict_images":  "true",
		"fail_quota":     "0.25",
		"call_log":       "5",
	})
	if err != nil {
		t.Fatal(err)
	}
	o := v.(*sim.Options)
	if o.CreateLatency != 1500*time.Millisecond || o.Seed != 42 || !o.StrictImages || o.FailQuota != 0.25 || o.CallLog != 5 {
		t.Errorf("decoded %+v", o)
	}
	s, err := sim.New(*o)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(context.Background())
	st, _ := s.State(context.Background())
	if len(st.Nodes) != 3 {
		t.Fatalf("%d nodes, want 3", len(st.Nodes))
	}
	n := st.Nodes[1]
	if n.Name != "gpu-2" || n.Attributes["zone"] != "b" || n.Attributes["rack"] != "r1" || n.Labels["tier"] != "gpu" ||
		n.Capacity.GPUs != 2 || n.Capacity.Memory != 64*driver.GiB || len(n.Images) != 1 || n.Images[0] != "cuda:latest" {
		t.Errorf("node 2: %+v", n)
	}
}

// outcome runs n creates with the same specs on s and returns a line per
// create: the error class or the instance id, and the wait hint.
func outcomes(t *testing.T, s *sim.Sim, n int) []string {
	t.Helper()
	st, _ := s.State(context.Background())
	var out []string
	for i := range n {
		node := st.Nodes[i%len(st.Nodes)].Name
		_, p, err := create(t, s, node, spec(fmt.Sprintf("i%d", i)))
		switch {
		case err != nil:
			out = append(out, fmt.Sprint(driver.ClassOf(err)))
		case p.Done:
			out = append(out, "done "+p.Instance.ID)
		default:
			out = append(out, fmt.Sprintf("wait %s %s", p.Wait, p.Instance.ID))
		}
	}
	return out
}

func TestDeterministicUnderSeed(t *testing.T) {
	faulty := func(seed uint64) func(*sim.Options) {
		return func(o *sim.Options) {
			o.Seed = seed
			o.Nodes = 20
			o.FailRetryable, o.FailPermanent, o.FailQuota, o.HangRate = 0.1, 0.05, 0.05, 0.05
			o.CreateLatency, o.LatencyJitter = time.Second, time.Second
			o.OfflineRate = 0.2
		}
	}
	a, _ := newSim(t, faulty(7))
	b, _ := newSim(t, faulty(7))
	c, _ := newSim(t, faulty(8))
	// Ids carry each sim's random epoch, so that a restarted sim never
	// repeats one; everything else is the same under the same seed.
	oa, ob, oc := outcomes(t, a, 500), outcomes(t, b, 500), outcomes(t, c, 500)
	epochs := regexp.MustCompile(`sim-[0-9a-z]+-`)
	for _, o := range [][]string{oa, ob, oc} {
		for i := range o {
			o[i] = epochs.ReplaceAllString(o[i], "sim-")
		}
	}
	if strings.Join(oa, "\n") != strings.Join(ob, "\n") {
		t.Error("two sims with seed 7 gave different outcomes")
	}
	if strings.Join(oa, "\n") == strings.Join(oc, "\n") {
		t.Error("seeds 7 and 8 gave the same 500 outcomes")
	}
	ca, cb := a.Calls(), b.Calls()
	if len(ca) != 500 || len(cb) != 500 {
		t.Fatalf("Calls: %d and %d records, want 500", len(ca), len(cb))
	}
	for i := range ca {
		if ca[i].Op != cb[i].Op || ca[i].Node != cb[i].Node || epochs.ReplaceAllString(ca[i].Instance, "") != epochs.ReplaceAllString(cb[i].Instance, "") ||
			driver.ClassOf(ca[i].Err) != driver.ClassOf(cb[i].Err) || !ca[i].Time.Equal(cb[i].Time) {
			t.Fatalf("call %d differs: %+v vs %+v", i, ca[i], cb[i])
		}
	}
}

func TestFailureRates(t *testing.T) {
	s, _ := newSim(t, func(o *sim.Options) {
		o.Seed = 3
		o.Nodes = 10
		o.Shape.CPU = driver.CPUs(100000)
		o.Shape.Memory = 100000 * driver.GiB
		o.FailRetryable, o.FailPermanent, o.FailQuota, o.HangRate = 0.10, 0.05, 0.02, 0.03
	})
	const n = 20000
	counts := map[string]int{}
	for _, o := range outcomes(t, s, n) {
		counts[strings.Fields(o)[0]]++
	}
	// Each count must lie within five standard deviations of its rate.
	for _, c := range []struct {
		key  string
		rate float64
	}{
		{first(driver.ErrRetryable), 0.10}, {first(driver.ErrPermanent), 0.05},
		{first(driver.ErrQuotaExceeded), 0.02}, {"wait", 0.03}, {"done", 0.80},
	} {
		mean := c.rate * n
		sd := sqrt(n * c.rate * (1 - c.rate))
		if got := float64(counts[c.key]); got < mean-5*sd || got > mean+5*sd {
			t.Errorf("%s: %v of %d creates, want %.0f ± %.0f", c.key, got, n, mean, 5*sd)
		}
	}
	t.Logf("outcomes of %d creates: %v", n, counts)
}

// first returns the first word of err's text, as outcomes reports it.
func first(err error) string { return strings.Fields(fmt.Sprint(err))[0] }

func sqrt(x float64) float64 {
	r := x
	for range 50 {
		r = (r + x/r) / 2
	}
	return r
}

func TestHangEndsWithContext(t *testing.T) {
	s, clock := newSim(t, func(o *sim.Options) { o.HangRate = 1 })
	ctx, cancel := context.WithCancel(context.Background())
	op, err := s.Create(ctx, "node-01", spec("hung"))
	if err != nil {
		t.Fatal(err)
	}
	clock.Advance(time.Hour)
	p, err := op.Advance(context.Background())
	if err != nil || p.Done {
		t.Fatalf("hung create after an hour: done %v, %v; want still in progress", p.Done, err)
	}
	cancel()
	if !waitFor(func() bool { _, err := op.Advance(context.Background()); return err != nil }) {
		t.Fatal("the create did not end after its context was cancelled")
	}
	if _, err := op.Advance(context.Background()); !errors.Is(err, driver.ErrTimeout) {
		t.Fatalf("abandoned create: %v, want ErrTimeout", err)
	}
	list, _ := s.List(context.Background(), map[string]string{"case": "hung"})
	if len(list) != 1 || list[0].State != driver.StateFailed {
		t.Fatalf("after an abandoned create List shows %+v, want one failed instance to clean up", list)
	}
	mustDelete(t, s, list[0].ID)
}

// waitFor polls cond for up to ten seconds; the sim has no goroutines, but
// a cancelled context runs its AfterFunc on a goroutine of its own.
func waitFor(cond func() bool) bool {
	for range 1000 {
		if cond() {
			return true
		}
		time.Sleep(10 * time.Millisecond)
	}
	return false
}

func TestLatencyOnManualClock(t *testing.T) {
	s, clock := newSim(t, func(o *sim.Options) {
		o.CreateLatency = 5 * time.Second
		o.DeleteLatency = 2 * time.Second
	})
	ctx := context.Background()
	op, p, err := create(t, s, "node-01", spec("slow"))
	if err != nil || p.Done || p.Wait != 5*time.Second {
		t.Fatalf("first Advance: %+v %v; want not done, wait 5s", p, err)
	}
	id := p.Instance.ID
	if got, _ := s.Get(ctx, id); got.State != driver.StateCreating {
		t.Errorf("during the create: state %q", got.State)
	}
	clock.Advance(4 * time.Second)
	if p, _ = op.Advance(ctx); p.Done || p.Wait != time.Second {
		t.Errorf("after 4s: %+v, want wait 1s", p)
	}
	clock.Advance(time.Second)
	if got, _ := s.Get(ctx, id); got.State != driver.StateRunning {
		t.Errorf("after 5s, before Advance: state %q, want running", got.State)
	}
	if p, err = op.Advance(ctx); !p.Done || err != nil || p.Instance.State != driver.StateRunning {
		t.Fatalf("after 5s: %+v %v, want done and running", p, err)
	}
	dop, err := s.Delete(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if p, _ := dop.Advance(ctx); p.Done || p.Wait != 2*time.Second {
		t.Errorf("delete: %+v, want wait 2s", p)
	}
	if got, _ := s.Get(ctx, id); got.State != driver.StateDeleting {
		t.Errorf("during the delete: state %q", got.State)
	}
	clock.Advance(2 * time.Second)
	if p, err := dop.Advance(ctx); !p.Done || err != nil {
		t.Errorf("delete after 2s: %+v %v", p, err)
	}
	if _, err := s.Get(ctx, id); !errors.Is(err, driver.ErrNotFound) {
		t.Errorf("after the delete: %v, want ErrNotFound", err)
	}
}

func TestDeleteDuringCreate(t *testing.T) {
	s, _ := newSim(t, func(o *sim.Options) { o.CreateLatency = time.Minute })
	op, p, err := create(t, s, "node-01", spec("cut"))
	if err != nil {
		t.Fatal(err)
	}
	mustDelete(t, s, p.Instance.ID)
	if _, err := op.Advance(context.Background()); !errors.Is(err, driver.ErrNotFound) {
		t.Errorf("create whose instance was deleted: %v, want ErrNotFound", err)
	}
	st, _ := s.State(context.Background())
	if !st.Nodes[0].Reserved.IsZero() || st.Nodes[0].Instances != 0 {
		t.Errorf("node after the delete: reserved %+v, %d instances", st.Nodes[0].Reserved, st.Nodes[0].Instances)
	}
}

func TestNodeOfflineAndBack(t *testing.T) {
	s, _ := newSim(t, nil)
	ctx := context.Background()
	inst := mustRun(t, s, "node-02", spec("before"))
	if err := s.SetNodeStatus("node-02", driver.NodeOffline, "power cut"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := create(t, s, "node-02", spec("during")); !errors.Is(err, driver.ErrRetryable) {
		t.Errorf("create on an offline node: %v, want ErrRetryable", err)
	}
	got, err := s.Get(ctx, inst.ID)
	if err != nil || got.State != driver.StateUnknown || !strings.Contains(got.Message, "power cut") {
		t.Errorf("instance on an offline node: %+v %v, want state unknown with the reason", got, err)
	}
	if err := s.Stop(ctx, inst.ID, 0); !errors.Is(err, driver.ErrRetryable) {
		t.Errorf("stop on an offline node: %v, want ErrRetryable", err)
	}
	if op, err := s.Delete(ctx, inst.ID); err != nil {
		t.Fatal(err)
	} else if _, err := op.Advance(ctx); !errors.Is(err, driver.ErrDeleteFailed) {
		t.Errorf("delete on an offline node: %v, want ErrDeleteFailed", err)
	}
	st, _ := s.State(ctx)
	if st.Nodes[1].Status != driver.NodeOffline || st.Nodes[1].Reason != "power cut" {
		t.Errorf("State: node-02 %s %q", st.Nodes[1].Status, st.Nodes[1].Reason)
	}
	if err := s.SetNodeStatus("node-02", driver.NodeDraining, ""); err != nil {
		t.Fatal(err)
	}
	if _, _, err := create(t, s, "node-02", spec("draining")); !errors.Is(err, driver.ErrRetryable) {
		t.Errorf("create on a draining node: %v, want ErrRetryable", err)
	}
	if err := s.SetNodeStatus("node-02", "", ""); err != nil {
		t.Fatal(err)
	}
	if got, _ := s.Get(ctx, inst.ID); got.State != driver.StateRunning {
		t.Errorf("instance after its node came back: %q, want running", got.State)
	}
	mustRun(t, s, "node-02", spec("after"))
	if err := s.SetNodeStatus("node-99", driver.NodeOffline, ""); !errors.Is(err, driver.ErrNotFound) {
		t.Errorf("SetNodeStatus of an unknown node: %v", err)
	}
	if err := s.SetNodeStatus("node-01", "asleep", ""); !errors.Is(err, driver.ErrInvalid) {
		t.Errorf("SetNodeStatus with a bad status: %v", err)
	}
}

func TestNodeUnlistedMakesListPartial(t *testing.T) {
	s, _ := newSim(t, nil)
	ctx := context.Background()
	a := mustRun(t, s, "node-01", spec("a"))
	b := mustRun(t, s, "node-02", spec("b"))
	c := mustRun(t, s, "node-03", spec("c"))
	// listed returns the ids List shows and the nodes it names as missed.
	listed := func(tags map[string]string) ([]string, []string) {
		t.Helper()
		got, err := s.List(ctx, tags)
		var ids []string
		for _, in := range got {
			ids = append(ids, in.ID)
		}
		if err == nil {
			return ids, nil
		}
		var partial *driver.PartialListError
		if !errors.As(err, &partial) || !errors.Is(err, driver.ErrRetryable) {
			t.Fatalf("List: %v, want a PartialListError (ErrRetryable)", err)
		}
		return ids, partial.Nodes
	}
	// Set twice: one call with false undoes it.
	for _, n := range []string{"node-03", "node-02", "node-03"} {
		if err := s.SetNodeUnlisted(n, true); err != nil {
			t.Fatal(err)
		}
	}
	d := mustRun(t, s, "node-02", spec("d"))
	if ids, missed := listed(nil); !slices.Equal(ids, []string{a.ID}) || !slices.Equal(missed, []string{"node-02", "node-03"}) {
		t.Errorf("List with node-02 and node-03 unlisted: %v, missed %v; want [%s], missed [node-02 node-03]", ids, missed, a.ID)
	}
	if ids, missed := listed(map[string]string{"case": "c"}); len(ids) != 0 || !slices.Equal(missed, []string{"node-02", "node-03"}) {
		t.Errorf("List of case=c with its node unlisted: %v, missed %v", ids, missed)
	}
	// Only List is affected: the instances run, Get finds them, the nodes
	// are online.
	if got, err := s.Get(ctx, c.ID); err != nil || got.State != driver.StateRunning {
		t.Errorf("Get of an instance on an unlisted node: %+v, %v", got, err)
	}
	st, _ := s.State(ctx)
	if st.Nodes[1].Status != driver.NodeOnline || st.Nodes[2].Status != driver.NodeOnline {
		t.Errorf("State: node-02 %s, node-03 %s; want both online", st.Nodes[1].Status, st.Nodes[2].Status)
	}
	if err := s.SetNodeUnlisted("node-02", false); err != nil {
		t.Fatal(err)
	}
	if ids, missed := listed(nil); !slices.Equal(ids, []string{a.ID, b.ID, d.ID}) || !slices.Equal(missed, []string{"node-03"}) {
		t.Errorf("List with node-03 unlisted: %v, missed %v; want [%s %s %s], missed [node-03]", ids, missed, a.ID, b.ID, d.ID)
	}
	if err := s.SetNodeUnlisted("node-03", false); err != nil {
		t.Fatal(err)
	}
	if ids, missed := listed(nil); len(ids) != 4 || missed != nil {
		t.Errorf("List with every node listed: %v, missed %v; want 4 instances and a nil error", ids, missed)
	}
	if err := s.SetNodeUnlisted("node-99", true); !errors.Is(err, driver.ErrNotFound) {
		t.Errorf("SetNodeUnlisted of an unknown node: %v, want ErrNotFound", err)
	}
	var log []string
	for _, call := range s.Calls() {
		if call.Op == "set_node_unlisted" {
			log = append(log, call.Node+" "+call.Detail)
		}
	}
	if want := []string{"node-03 unlisted", "node-02 unlisted", "node-03 unlisted", "node-02 listed", "node-03 listed"}; !slices.Equal(log, want) {
		t.Errorf("calls: %q, want %q", log, want)
	}
}

func TestOfflineRateFlaps(t *testing.T) {
	s, clock := newSim(t, func(o *sim.Options) {
		o.Nodes = 1000
		o.OfflineRate = 0.3
		o.Flap = time.Minute
		o.Seed = 11
	})
	offline := func() map[string]bool {
		st, _ := s.State(context.Background())
		m := map[string]bool{}
		for _, n := range st.Nodes {
			if n.Status == driver.NodeOffline {
				m[n.Name] = true
			}
		}
		return m
	}
	first := offline()
	if len(first) < 200 || len(first) > 400 {
		t.Errorf("%d of 1000 nodes offline at rate 0.3", len(first))
	}
	clock.Advance(time.Minute)
	second := offline()
	back, gone := 0, 0
	for n := range first {
		if !second[n] {
			back++
		}
	}
	for n := range second {
		if !first[n] {
			gone++
		}
	}
	if back == 0 || gone == 0 {
		t.Errorf("after one flap period: %d nodes came back and %d went offline; want some of each", back, gone)
	}
}

func TestCapacity(t *testing.T) {
	s, _ := newSim(t, func(o *sim.Options) {
		o.Nodes = 2
		o.Shape = sim.Shape{Resources: driver.Resources{CPU: driver.CPUs(1), Memory: driver.GiB, Other: map[string]int64{"fpga": 1}}, MaxInstances: 3}
	})
	ctx := context.Background()
	sp := func(name string, cpu float64) *driver.Spec {
		x := spec(name)
		x.Image = ""
		x.Kind = driver.KindProcess
		x.Command = []string{"run"}
		x.CPU, x.Memory = driver.CPUs(cpu), 0
		return x
	}
	a := mustRun(t, s, "node-1", sp("a", 0.6))
	if _, _, err := create(t, s, "node-1", sp("b", 0.6)); !errors.Is(err, driver.ErrInsufficientCapacity) {
		t.Errorf("over cpu capacity: %v, want ErrInsufficientCapacity", err)
	}
	f := sp("f", 0.1)
	f.Other = map[string]int64{"fpga": 2}
	if _, _, err := create(t, s, "node-1", f); !errors.Is(err, driver.ErrInsufficientCapacity) {
		t.Errorf("over fpga capacity: %v, want ErrInsufficientCapacity", err)
	}
	mustRun(t, s, "node-1", sp("c", 0.1))
	mustRun(t, s, "node-1", sp("d", 0.1))
	if _, _, err := create(t, s, "node-1", sp("e", 0.1)); !errors.Is(err, driver.ErrInsufficientCapacity) {
		t.Errorf("over max_instances: %v, want ErrInsufficientCapacity", err)
	}
	if _, err := s.Create(ctx, "node-77", sp("x", 0.1)); !errors.Is(err, driver.ErrNotFound) {
		t.Errorf("create on an unknown node: %v, want ErrNotFound", err)
	}
	st, _ := s.State(ctx)
	if r := st.Nodes[0].Reserved; r.CPU != driver.CPUs(0.8) || st.Nodes[0].Instances != 3 {
		t.Errorf("reserved %s cpus on %d instances, want 0.8 on 3", r.CPU, st.Nodes[0].Instances)
	}
	if err := s.Resize(ctx, a.ID, driver.Resources{CPU: driver.CPUs(0.9)}); !errors.Is(err, driver.ErrInsufficientCapacity) {
		t.Errorf("resize beyond the node: %v, want ErrInsufficientCapacity", err)
	}
	if err := s.Resize(ctx, a.ID, driver.Resources{CPU: driver.CPUs(0.7)}); err != nil {
		t.Errorf("resize within the node: %v", err)
	}
	if err := s.Resize(ctx, a.ID, driver.Resources{Memory: -1}); !errors.Is(err, driver.ErrInvalid) {
		t.Errorf("resize to negative memory: %v, want ErrInvalid", err)
	}
	list, _ := s.List(ctx, nil)
	for _, in := range list {
		mustDelete(t, s, in.ID)
	}
	st, _ = s.State(ctx)
	if !st.Nodes[0].Reserved.Fits(driver.Resources{Other: map[string]int64{"fpga": 0}}) || st.Nodes[0].Instances != 0 {
		t.Errorf("after deleting everything: reserved %+v, %d instances", st.Nodes[0].Reserved, st.Nodes[0].Instances)
	}
}

func TestImages(t *testing.T) {
	s, _ := newSim(t, func(o *sim.Options) {
		o.Nodes = 3
		o.StrictImages = true
		o.Shape.Images = []string{"app:1"}
	})
	ctx := context.Background()
	sp := spec("x")
	sp.Image = "other"
	_, _, err := create(t, s, "node-2", sp)
	if !errors.Is(err, driver.ErrPermanent) || !strings.Contains(err.Error(), "other") || !strings.Contains(err.Error(), "node-2") {
		t.Errorf("missing image: %v, want ErrPermanent naming the image and node-2", err)
	}
	if err := s.SetNodeStatus("node-3", driver.NodeOffline, ""); err != nil {
		t.Fatal(err)
	}
	var reports []driver.PreloadProgress
	err = s.Preload(ctx, "other", nil, func(p driver.PreloadProgress) { reports = append(reports, p) })
	if !errors.Is(err, driver.ErrRetryable) || !strings.Contains(err.Error(), "node-3") {
		t.Errorf("preload with node-3 offline: %v, want ErrRetryable naming node-3", err)
	}
	var statuses []string
	for _, r := range reports {
		statuses = append(statuses, r.Node+":"+r.Status)
	}
	if got := strings.Join(statuses, " "); got != "node-1:pulling node-1:done node-2:pulling node-2:done node-3:failed" {
		t.Errorf("progress: %s", got)
	}
	imgs, _ := s.Images(ctx, "node-2")
	if len(imgs) != 2 || imgs[1].Name != "other:latest" || imgs[1].Size <= 0 {
		t.Errorf("node-2 images after preload: %+v", imgs)
	}
	mustRun(t, s, "node-2", sp)
	reports = nil
	if err := s.Preload(ctx, "other:latest", []string{"node-1"}, func(p driver.PreloadProgress) { reports = append(reports, p) }); err != nil {
		t.Fatal(err)
	}
	if len(reports) != 1 || reports[0].Status != "present" {
		t.Errorf("preload of a present image: %+v", reports)
	}
	if err := s.Preload(ctx, "x", []string{"node-1", "node-9"}, nil); !errors.Is(err, driver.ErrNotFound) {
		t.Errorf("preload on an unknown node: %v, want ErrNotFound", err)
	}
	if imgs, _ := s.Images(ctx, "node-1"); len(imgs) != 2 {
		t.Errorf("a failed preload changed node-1: %+v", imgs)
	}
}

func TestImageFetchedOnFirstUse(t *testing.T) {
	s, _ := newSim(t, nil)
	sp := spec("p")
	sp.Image = "fresh"
	mustRun(t, s, "node-01", sp)
	imgs, _ := s.Images(context.Background(), "node-01")
	if len(imgs) != 1 || imgs[0].Name != "fresh:latest" {
		t.Errorf("images after a create without strict_images: %+v", imgs)
	}
}

func TestPortsAndNames(t *testing.T) {
	s, _ := newSim(t, nil)
	ctx := context.Background()
	a := spec("a")
	a.Ports = []driver.Port{{ContainerPort: 80, HostPort: 8080}, {ContainerPort: 443, Publish: true}}
	inst := mustRun(t, s, "node-01", a)
	if len(inst.Ports) != 2 || inst.Ports[0].HostPort != 8080 || inst.Ports[1].HostPort != 30000 {
		t.Errorf("ports: %+v", inst.Ports)
	}
	b := spec("b")
	b.Ports = []driver.Port{{ContainerPort: 80, HostPort: 8080}}
	if _, _, err := create(t, s, "node-01", b); !errors.Is(err, driver.ErrInsufficientCapacity) {
		t.Errorf("host port taken: %v, want ErrInsufficientCapacity", err)
	}
	mustRun(t, s, "node-02", b)
	if _, _, err := create(t, s, "node-03", spec("a")); !errors.Is(err, driver.ErrAlreadyExists) {
		t.Errorf("name taken: %v, want ErrAlreadyExists", err)
	}
	st, _ := s.State(ctx)
	if fmt.Sprint(st.Nodes[0].Ports) != "[8080 30000]" {
		t.Errorf("node-01 ports: %v", st.Nodes[0].Ports)
	}
	anon := spec("")
	anon.Name = ""
	in := mustRun(t, s, "node-01", anon)
	if found, err := s.Find(ctx, in.ID); err != nil || found.ID != in.ID || found.Name != in.ID {
		t.Errorf("Find of an unnamed instance by its id: %+v %v", found, err)
	}
	bad := spec(in.ID)
	if _, err := s.Create(ctx, "node-01", bad); !errors.Is(err, driver.ErrInvalid) {
		t.Errorf("a name shaped like an id: %v, want ErrInvalid", err)
	}
	mustDelete(t, s, inst.ID)
	mustRun(t, s, "node-01", a)
}

func TestSignalsAndStates(t *testing.T) {
	s, _ := newSim(t, nil)
	ctx := context.Background()
	in := mustRun(t, s, "node-01", spec("sig"))
	exit := func() (driver.State, int) {
		got, err := s.Get(ctx, in.ID)
		if err != nil {
			t.Fatal(err)
		}
		if got.ExitCode == nil {
			return got.State, -1
		}
		return got.State, *got.ExitCode
	}
	if err := s.Kill(ctx, in.ID, "SIGUSR1"); err != nil {
		t.Fatal(err)
	}
	if st, _ := exit(); st != driver.StateRunning {
		t.Errorf("after USR1: %s, want running", st)
	}
	if err := s.Kill(ctx, in.ID, "TERM"); err != nil {
		t.Fatal(err)
	}
	if st, code := exit(); st != driver.StateExited || code != 0 {
		t.Errorf("after TERM: %s %d, want exited 0", st, code)
	}
	if err := s.Kill(ctx, in.ID, "KILL"); !errors.Is(err, driver.ErrPermanent) {
		t.Errorf("kill of an exited instance: %v, want ErrPermanent", err)
	}
	if err := s.Start(ctx, in.ID); err != nil {
		t.Fatal(err)
	}
	if err := s.Kill(ctx, in.ID, "9"); err != nil {
		t.Fatal(err)
	}
	if st, code := exit(); st != driver.StateExited || code != 137 {
		t.Errorf("after 9: %s %d, want exited 137", st, code)
	}
	if err := s.Kill(ctx, in.ID, "STOP"); !drivertest.HasField(err, "signal") {
		t.Errorf("a signal the sim does not act on: %v, want ErrInvalid naming signal", err)
	}
	if err := s.Kill(ctx, in.ID, "BOGUS"); !drivertest.HasField(err, "signal") {
		t.Errorf("unknown signal: %v, want ErrInvalid naming signal", err)
	}
	if err := s.Suspend(ctx, in.ID); !errors.Is(err, driver.ErrPermanent) {
		t.Errorf("suspend of an exited instance: %v, want ErrPermanent", err)
	}
	if err := s.Resume(ctx, in.ID); !errors.Is(err, driver.ErrNotSuspended) {
		t.Errorf("resume of an exited instance: %v, want ErrNotSuspended", err)
	}
	var out strings.Builder
	if err := s.Logs(ctx, in.ID, driver.LogOptions{Stdout: true}, &out, &out); err != nil {
		t.Fatal(err)
	}
	if out.String() != "started\nstarted\n" {
		t.Errorf("logs after two starts: %q", out.String())
	}
	u, err := s.Usage(ctx, in.ID)
	if err != nil || u.CPU != 0 {
		t.Errorf("usage of an exited instance: %+v %v, want zero", u, err)
	}
	calls := s.Calls()
	var ops []string
	for _, c := range calls {
		ops = append(ops, c.Op)
	}
	if got := strings.Join(ops, " "); got != "create kill kill kill start kill suspend resume" {
		t.Errorf("calls: %s", got)
	}
}

func TestCallLogRing(t *testing.T) {
	s, _ := newSim(t, func(o *sim.Options) { o.CallLog = 3 })
	for i := range 5 {
		mustRun(t, s, "node-01", spec(fmt.Sprintf("r%d", i)))
	}
	calls := s.Calls()
	if len(calls) != 3 || calls[0].Name != "r2" || calls[2].Name != "r4" || s.CallCount() != 5 {
		t.Errorf("ring of 3 after 5 calls: %+v (count %d)", calls, s.CallCount())
	}
}

func TestCloseEndsWatchAndFollow(t *testing.T) {
	s, _ := newSim(t, nil)
	in := mustRun(t, s, "node-01", spec("w"))
	watchDone := make(chan error, 1)
	logsDone := make(chan error, 1)
	go func() { watchDone <- s.Watch(context.Background(), func(driver.Event) {}) }()
	go func() {
		var out strings.Builder
		logsDone <- s.Logs(context.Background(), in.ID, driver.LogOptions{Stdout: true, Follow: true}, &out, &out)
	}()
	if err := s.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := <-watchDone; err == nil {
		t.Error("Watch returned nil after Close")
	}
	if err := <-logsDone; err != nil && !errors.Is(err, driver.ErrPermanent) {
		t.Errorf("followed Logs after Close: %v, want nil (or ErrPermanent if it began after Close)", err)
	}
	if _, err := s.Get(context.Background(), in.ID); !errors.Is(err, driver.ErrPermanent) {
		t.Errorf("Get after Close: %v, want ErrPermanent", err)
	}
}

func TestWatchSeesLatencyTransitions(t *testing.T) {
	s, clock := newSim(t, func(o *sim.Options) { o.CreateLatency = time.Second })
	ctx, cancel := context.WithCancel(context.Background())
	events := make(chan driver.Event, 16)
	done := make(chan error, 1)
	started := make(chan struct{})
	go func() {
		close(started)
		done <- s.Watch(ctx, func(e driver.Event) { events <- e })
	}()
	<-started
	// Watch subscribes as it starts; a node event proves it has.
	var first driver.Event
	for {
		_ = s.SetNodeStatus("node-01", "", "")
		select {
		case first = <-events:
		case <-time.After(10 * time.Millisecond):
			continue
		}
		break
	}
	if first.Type != driver.EventNode {
		t.Fatalf("first event %+v, want a node event", first)
	}
	_, p, err := create(t, s, "node-01", spec("ev"))
	if err != nil {
		t.Fatal(err)
	}
	clock.Advance(time.Second)
	if _, err := s.State(context.Background()); err != nil {
		t.Fatal(err)
	}
	for e := range events {
		if e.Type == driver.EventNode {
			continue
		}
		if e.Type != driver.EventStart || e.Instance != p.Instance.ID || e.State != driver.StateRunning || e.Tags["case"] != "ev" {
			t.Errorf("event %+v, want the start of %s", e, p.Instance.ID)
		}
		break
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("Watch: %v", err)
	}
}

func TestUsage(t *testing.T) {
	s, clock := newSim(t, nil)
	ctx := context.Background()
	in := mustRun(t, s, "node-01", spec("u"))
	var readings []driver.MilliCPU
	for range 5 {
		u, err := s.Usage(ctx, in.ID)
		if err != nil {
			t.Fatal(err)
		}
		if u.CPU <= 0 || u.CPU > in.Resources.CPU || u.Memory <= 0 || u.Memory > in.Resources.Memory || !u.Time.Equal(clock.Now()) {
			t.Errorf("usage %+v of an instance with %+v at %s", u, in.Resources, clock.Now())
		}
		readings = append(readings, u.CPU)
		clock.Advance(time.Minute)
	}
	if readings[0] == readings[1] && readings[1] == readings[2] && readings[2] == readings[3] {
		t.Errorf("usage never changes from minute to minute: %v", readings)
	}
	st, _ := s.State(ctx)
	n := st.Nodes[0]
	if n.InUse == nil || n.InUse.CPU <= 0 || n.InUse.CPU > n.Reserved.CPU || n.InUse.Memory > n.Reserved.Memory {
		t.Errorf("node in use %+v, reserved %+v", n.InUse, n.Reserved)
	}
	if err := s.Stop(ctx, in.ID, 0); err != nil {
		t.Fatal(err)
	}
	st, _ = s.State(ctx)
	if st.Nodes[0].InUse.CPU != 0 || st.Nodes[0].Reserved.CPU != in.Resources.CPU {
		t.Errorf("after stop: in use %+v, reserved %+v; want nothing in use and the reservation kept", st.Nodes[0].InUse, st.Nodes[0].Reserved)
	}
}

// TestIDsNeverRepeatAcrossSims: a sim started again (a restarted server's)
// never hands out an id the last one did, and does not know the last one's.
func TestIDsNeverRepeatAcrossSims(t *testing.T) {
	a, _ := newSim(t, nil)
	b, _ := newSim(t, nil)
	ia := mustRun(t, a, "node-02", &driver.Spec{Name: "x", Image: "i"})
	ib := mustRun(t, b, "node-02", &driver.Spec{Name: "x", Image: "i"})
	if ia.ID == ib.ID {
		t.Fatalf("two sims gave the same id %s to their first instance", ia.ID)
	}
	if _, err := b.Get(context.Background(), ia.ID); !errors.Is(err, driver.ErrNotFound) {
		t.Fatalf("the second sim finds the first one's id %s: %v", ia.ID, err)
	}
}

// The tags a plane writes on every instance (all but the instance's id)
// are kept once for all of them; each instance still reads back its own
// tags whole, and a listing filters on the shared ones and on its own.
func TestSharedTags(t *testing.T) {
	s, _ := newSim(t, nil)
	ctx := context.Background()
	tagged := func(name, cluster string) *driver.Spec {
		sp := spec(name)
		sp.Tags = map[string]string{driver.TagManaged: "true", driver.TagCluster: cluster, driver.TagProvider: "sim", driver.TagInstance: name}
		return sp
	}
	want := map[string]map[string]string{}
	for i, cluster := range []string{"c1", "c1", "c2", "c1"} {
		sp := tagged(fmt.Sprintf("i%d", i), cluster)
		in := mustRun(t, s, "node-01", sp)
		if !maps.Equal(in.Tags, sp.Tags) {
			t.Errorf("created %s with tags %v, want %v", sp.Name, in.Tags, sp.Tags)
		}
		want[in.ID] = sp.Tags
	}
	// Tags without an instance id are the instance's own.
	plain := mustRun(t, s, "node-01", spec("plain"))
	want[plain.ID] = spec("plain").Tags
	for id, tags := range want {
		got, err := s.Get(ctx, id)
		if err != nil || !maps.Equal(got.Tags, tags) {
			t.Errorf("Get %s: tags %v, %v; want %v", id, got.Tags, err, tags)
		}
	}
	for _, tt := range []struct {
		filter map[string]string
		n      int
	}{
		{map[string]string{driver.TagCluster: "c1"}, 3},
		{map[string]string{driver.TagCluster: "c2", driver.TagProvider: "sim"}, 1},
		{map[string]string{driver.TagCluster: "c1", driver.TagInstance: "i3"}, 1},
		{map[string]string{driver.TagInstance: "i2", driver.TagCluster: "c1"}, 0},
		{map[string]string{"case": "plain"}, 1},
		{nil, 5},
	} {
		got, err := s.List(ctx, tt.filter)
		if err != nil || len(got) != tt.n {
			t.Errorf("List %v: %d instances, %v; want %d", tt.filter, len(got), err, tt.n)
		}
		for _, in := range got {
			if !maps.Equal(in.Tags, want[in.ID]) {
				t.Errorf("List %v: %s has tags %v, want %v", tt.filter, in.ID, in.Tags, want[in.ID])
			}
		}
	}
}

// An instance tag that is not the instance's name (a later incarnation's
// name) reads back as written, beside one that is, in its tags, in a
// listing's filter, in a glance and in a placement.
func TestInstanceTagOtherThanName(t *testing.T) {
	s, _ := newSim(t, nil)
	ctx := context.Background()
	tags := func(id string) map[string]string {
		return map[string]string{driver.TagManaged: "true", driver.TagCluster: "c1", driver.TagInstance: id}
	}
	same := spec("i1")
	same.Tags = tags("i1")
	other := spec("i2.1")
	other.Tags = tags("i2")
	want := map[string]string{}
	for _, sp := range []*driver.Spec{same, other} {
		in := mustRun(t, s, "node-01", sp)
		if !maps.Equal(in.Tags, sp.Tags) || in.Name != sp.Name {
			t.Errorf("created %s with tags %v, want %v", in.Name, in.Tags, sp.Tags)
		}
		got, err := s.Get(ctx, in.ID)
		if err != nil || !maps.Equal(got.Tags, sp.Tags) {
			t.Errorf("Get %s: tags %v, %v; want %v", in.ID, got.Tags, err, sp.Tags)
		}
		want[in.ID] = sp.Tags[driver.TagInstance]
	}
	for id, n := range map[string]int{"i1": 1, "i2": 1, "i2.1": 0} {
		got, err := s.List(ctx, map[string]string{driver.TagInstance: id})
		if err != nil || len(got) != n {
			t.Errorf("List instance %s: %d instances, %v; want %d", id, len(got), err, n)
		}
	}
	err := s.Skim(ctx, nil, func(g *driver.Glance) bool {
		if g.Instance != want[g.ID] {
			t.Errorf("glance of %s: instance %q, want %q", g.ID, g.Instance, want[g.ID])
		}
		return false
	}, func(*driver.Instance) error { return nil })
	if err != nil {
		t.Fatal(err)
	}
	var tagged []string
	if err := s.Placements(ctx, func(p *sim.Placement) error {
		tagged = append(tagged, string(p.Instance))
		return nil
	}); err != nil || !slices.Equal(tagged, []string{"i1", "i2"}) {
		t.Errorf("Placements: instances %q, %v; want i1, i2", tagged, err)
	}
}

// Skim's glances and Placements agree with List, an instance on an offline
// node included, and Skim takes whole only the instances asked for.
func TestSkimAndPlacements(t *testing.T) {
	s, _ := newSim(t, nil)
	ctx := context.Background()
	a := spec("a")
	a.Tags[driver.TagInstance] = "berth-a"
	mustRun(t, s, "node-01", a)
	mustRun(t, s, "node-02", spec("b")) // no instance tag
	if err := s.SetNodeStatus("node-02", driver.NodeOffline, "power cut"); err != nil {
		t.Fatal(err)
	}
	list, err := s.List(ctx, nil)
	if err != nil || len(list) != 2 {
		t.Fatalf("List: %d instances, %v", len(list), err)
	}
	var glances []driver.Glance
	var whole []*driver.Instance
	err = s.Skim(ctx, nil, func(g *driver.Glance) bool {
		glances = append(glances, *g)
		return g.Instance == "berth-a"
	}, func(in *driver.Instance) error {
		whole = append(whole, in)
		return nil
	})
	if err != nil || len(glances) != len(list) {
		t.Fatalf("Skim: %d glances, %v; want %d", len(glances), err, len(list))
	}
	for i, in := range list {
		g := glances[i]
		if g.ID != in.ID || g.Instance != in.Tags[driver.TagInstance] || g.State != in.State || (g.ExitCode == nil) != (in.ExitCode == nil) {
			t.Errorf("glance %+v of %s (%s, tag %q)", g, in.ID, in.State, in.Tags[driver.TagInstance])
		}
	}
	if glances[1].State != driver.StateUnknown {
		t.Errorf("glance of the instance on the offline node: %s, want unknown", glances[1].State)
	}
	if len(whole) != 1 || whole[0].ID != list[0].ID || whole[0].Tags["case"] != "a" {
		t.Errorf("Skim took whole %v, want only %s with its tags", whole, list[0].ID)
	}

	var places []sim.Placement
	if err := s.Placements(ctx, func(p *sim.Placement) error {
		q := *p
		q.Instance = slices.Clone(p.Instance) // p's bytes are the walk's
		places = append(places, q)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if len(places) != len(list) {
		t.Fatalf("Placements: %d, want %d", len(places), len(list))
	}
	for i, in := range list {
		p := places[i]
		if p.Node != in.Node || p.Resources.CPU != in.Resources.CPU || p.Resources.Memory != in.Resources.Memory || string(p.Instance) != in.Tags[driver.TagInstance] {
			t.Errorf("placement %+v of %s on %s (%+v)", p, in.ID, in.Node, in.Resources)
		}
	}
	stop := errors.New("stop")
	if err := s.Placements(ctx, func(*sim.Placement) error { return stop }); !errors.Is(err, stop) {
		t.Errorf("Placements whose fn fails: %v", err)
	}
}
