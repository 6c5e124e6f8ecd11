package integration_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/client"

	"github.com/berth-dev/berth/control"
	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/drivers/docker/dockertest"
	"github.com/berth-dev/berth/reconciler"
	"github.com/berth-dev/berth/scheduler"
)

// helloSpec is a small service that runs until it is stopped and is placed
// again when its node is lost (restart policy always).
func helloSpec() driver.Spec {
	return driver.Spec{
		Image:         helloImage,
		Resources:     driver.Resources{CPU: 50, Memory: 16 * driver.MiB},
		RestartPolicy: driver.RestartPolicy{Name: "always"},
	}
}

// named returns r with a name unique to e's cluster, and so to this run:
// the docker driver names each container after its instance, and other
// test runs may share the machine's engine.
func (e *env) named(r scheduler.Request) scheduler.Request {
	r.Name = e.cluster + "-" + r.ID
	return r
}

// nodeRecord returns the status Berth recorded in its store for node.
func (e *env) nodeRecord(t *testing.T, node string) control.NodeState {
	t.Helper()
	kvs, _, err := e.store.List(context.Background(), control.PrefixNodes+provName+"/"+node)
	if err != nil {
		t.Fatal(err)
	}
	var st control.NodeState
	for _, kv := range kvs {
		if kv.Key == control.PrefixNodes+provName+"/"+node {
			if err := json.Unmarshal(kv.Value, &st); err != nil {
				t.Fatalf("node record %s: %v", kv.Key, err)
			}
		}
	}
	return st
}

// matchStore checks that the raw listings of both engines show exactly
// the containers the store's instances name, each labelled with its
// instance, on the engine of the instance's node.
func (e *env) matchStore(t *testing.T) {
	t.Helper()
	want := map[string]map[string]string{mainNode: {}, secondNode: {}}
	for _, in := range e.instances(t) {
		if in.Phase == reconciler.Failed && in.BackendID == "" {
			continue // failed with nothing left on the back-end
		}
		if in.BackendID == "" || want[in.Node] == nil {
			t.Errorf("instance %s is %s on node %q with back-end id %q; want it on an engine", in.ID, in.Phase, in.Node, in.BackendID)
			continue
		}
		want[in.Node][containerID(in.BackendID)] = in.ID
	}
	for name, c := range engines() {
		if got := e.raw(t, c); !maps.Equal(got, want[name]) {
			t.Errorf("%s: the engine holds %v, the store says %v", name, got, want[name])
		}
	}
}

// settled waits until each of the plane's n instances runs or has failed
// and returns them.
func (e *env) settled(t *testing.T, n int) []control.Instance {
	t.Helper()
	var ins []control.Instance
	e.waitFor(t, fmt.Sprintf("%d instances running or failed", n), func() bool {
		ins = e.instances(t)
		return len(ins) == n && !slices.ContainsFunc(ins, func(in control.Instance) bool {
			return in.Phase != reconciler.Running && in.Phase != reconciler.Failed
		})
	})
	return ins
}

// TestPlacementHonoursEngineLabels: the second engine carries the engine
// label disk=ssd (dockerd --label), the main one does not. Constraints on
// it place each request on the right engine, the containers really are
// there, and a constraint no engine meets leaves the instance pending with
// a reason and creates nothing.
func TestPlacementHonoursEngineLabels(t *testing.T) {
	e := setup(t, nil)
	ctx := context.Background()
	e.afterSyncs(t, 1) // the scheduler has read both engines

	nodes, err := e.plane.Nodes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var seen []string
	for _, n := range nodes {
		seen = append(seen, n.Name)
		if n.Status != driver.NodeOnline {
			t.Fatalf("node %s is %s (%s), want online", n.Name, n.Status, n.Reason)
		}
		if got, want := n.Labels["disk"] == "ssd", n.Name == secondNode; got != want {
			t.Fatalf("node %s labels %v: the engine label disk=ssd belongs to %s only", n.Name, n.Labels, secondNode)
		}
	}
	slices.Sort(seen)
	if !slices.Equal(seen, []string{mainNode, secondNode}) {
		t.Fatalf("nodes %v, want %s and %s", seen, mainNode, secondNode)
	}

	nvme := e.named(scheduler.Request{ID: "nvme", Spec: helloSpec(), Constraints: []string{"disk==nvme"}})
	plan, err := e.plane.Plan(ctx, nvme)
	if err != nil {
		t.Fatal(err)
	}
	if plan.Unplaced != 1 || len(plan.Placements) != 0 || len(plan.Reasons) == 0 {
		t.Errorf("Plan of disk==nvme: %+v; want it unplaced, with reasons", plan)
	}
	t.Logf("why disk==nvme cannot be placed: %v", plan.Reasons)

	reqs := map[string]scheduler.Request{
		secondNode: e.named(scheduler.Request{ID: "ssd", Count: 4, Spec: helloSpec(), Constraints: []string{"disk==ssd"}}),
		mainNode:   e.named(scheduler.Request{ID: "other", Count: 4, Spec: helloSpec(), Constraints: []string{"disk!=ssd"}}),
	}
	for node, r := range reqs {
		ans, err := e.plane.Submit(ctx, r, "it")
		if err != nil {
			t.Fatalf("submit %s: %v", r.ID, err)
		}
		for _, p := range ans.Instances {
			if p.Node == nil || p.Node.Name != node {
				t.Errorf("%s placed on %+v, want %s", p.Instance.ID, p.Node, node)
			}
		}
	}
	// No engine has disk=nvme: the request is refused at submit, naming
	// the constraint and the nodes it rules out.
	_, err = e.plane.Submit(ctx, nvme, "it")
	var fe *driver.FieldError
	if !errors.Is(err, driver.ErrUnsupported) || !errors.As(err, &fe) || fe.Path != "constraints[0]" || !strings.Contains(fe.Reason, "2 nodes: constraint disk==nvme") {
		t.Fatalf("submit nvme: %v; want refused naming constraints[0] and both nodes", err)
	}

	e.waitFor(t, "the constrained instances running", func() bool {
		n := 0
		for _, in := range e.instances(t) {
			if in.Phase == reconciler.Failed {
				t.Fatalf("instance %s failed: %s", in.ID, in.Message)
			}
			if in.Phase == reconciler.Running {
				n++
			}
		}
		return n == 8
	})
	for _, in := range e.instances(t) {
		switch {
		case in.ID == "nvme":
			t.Errorf("nvme was kept: %s", in.Phase)
		case strings.HasPrefix(in.ID, "ssd-") && in.Node != secondNode,
			strings.HasPrefix(in.ID, "other-") && in.Node != mainNode:
			t.Errorf("%s runs on %s", in.ID, in.Node)
		}
	}
	// The store and the engines agree, container by container; the pending
	// instance has none (matchStore would flag it for its missing id).
	for name, c := range engines() {
		for id, inst := range e.raw(t, c) {
			in, err := e.plane.Instance(ctx, inst)
			if err != nil || in.Node != name || containerID(in.BackendID) != id {
				t.Errorf("%s: container %s labelled %q is not what the store says (%+v, %v)", name, id, inst, in, err)
			}
		}
	}
	if got := len(e.raw(t, second.Client)); got != 4 {
		t.Errorf("%s holds %d containers, want the 4 ssd instances", secondNode, got)
	}
	if got := len(e.raw(t, mainCli)); got != 4 {
		t.Errorf("%s holds %d containers, want the 4 other instances", mainNode, got)
	}
	e.deleteAll(t)
}

// TestLeakedContainersAndStrangers creates containers straight through the
// Engine API. Those labelled as this cluster's (berth.managed, berth.cluster,
// berth.provider, berth.instance of an instance Berth does not know), one
// on each engine, are deleted by the plane; an unlabelled one, one of
// another cluster and one lacking berth.managed are never touched, and
// neither is Berth's own instance.
func TestLeakedContainersAndStrangers(t *testing.T) {
	e := setup(t, nil)
	ctx := context.Background()
	run := dockertest.RandomID()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		for name, c := range engines() {
			if _, err := dockertest.RemoveByLabel(ctx, c, "it.run", run); err != nil {
				t.Errorf("cleanup on %s: %v", name, err)
			}
		}
	})

	if _, err := e.plane.Submit(ctx, e.named(scheduler.Request{ID: "mine", Spec: helloSpec()}), "it"); err != nil {
		t.Fatal(err)
	}
	mine := e.allIn(t, reconciler.Running, 1)[0]

	berthLabels := func(cluster, instance string) map[string]string {
		return map[string]string{
			driver.TagManaged: "true", driver.TagCluster: cluster,
			driver.TagProvider: provName, driver.TagInstance: instance,
		}
	}
	type raw struct {
		name   string
		cli    *client.Client
		labels map[string]string
		leak   bool // Berth must delete it
		id     string
	}
	id := e.plane.ClusterID()
	half := berthLabels(id, "ghost-half-"+run)
	delete(half, driver.TagManaged)
	raws := []*raw{
		{name: "leak-main", cli: mainCli, labels: berthLabels(id, "ghost-"+run), leak: true},
		{name: "leak-second", cli: second.Client, labels: berthLabels(id, "ghost2-"+run), leak: true},
		// Same name, another cluster: a second server named as this one.
		{name: "same-name", cli: mainCli, labels: map[string]string{driver.TagManaged: "true", driver.TagCluster: "other-" + run,
			driver.TagClusterName: e.cluster, driver.TagProvider: provName, driver.TagInstance: "ghost3-" + run}},
		{name: "plain", cli: mainCli, labels: map[string]string{}},
		{name: "other-cluster", cli: mainCli, labels: berthLabels("other-"+run, "ghost-"+run)},
		{name: "other-cluster-second", cli: second.Client, labels: berthLabels("other-"+run, "ghost2-"+run)},
		{name: "not-managed", cli: mainCli, labels: half},
	}
	for _, r := range raws {
		r.labels["it.run"] = run
		res, err := r.cli.ContainerCreate(ctx, client.ContainerCreateOptions{
			Name:   "it-" + run + "-" + r.name,
			Config: &container.Config{Image: helloImage, Labels: r.labels},
		})
		if err != nil {
			t.Fatalf("create %s: %v", r.name, err)
		}
		r.id = res.ID
		if _, err := r.cli.ContainerStart(ctx, r.id, client.ContainerStartOptions{}); err != nil {
			t.Fatalf("start %s: %v", r.name, err)
		}
	}
	present := func(r *raw) (bool, string) {
		list, err := r.cli.ContainerList(ctx, client.ContainerListOptions{All: true, Filters: make(client.Filters).Add("id", r.id)})
		if err != nil {
			t.Fatal(err)
		}
		if len(list.Items) == 0 {
			return false, ""
		}
		return true, string(list.Items[0].State)
	}

	waitFor(t, "the leaked containers deleted", func() bool {
		for _, r := range raws {
			if ok, _ := present(r); r.leak && ok {
				return false
			}
		}
		return true
	})
	// Give the plane time to misbehave: several more listings.
	e.afterSyncs(t, 5)
	for _, r := range raws {
		if r.leak {
			continue
		}
		if ok, state := present(r); !ok || state != "running" {
			t.Errorf("%s (not this cluster's) was touched: present %v, state %q", r.name, ok, state)
		}
	}
	if n := e.metrics.leaksFound(provName); n != 2 {
		t.Errorf("the plane reports %d leaks deleted, want 2", n)
	}
	in, err := e.plane.Instance(ctx, "mine")
	if err != nil || in.Phase != reconciler.Running || in.BackendID != mine.BackendID {
		t.Errorf("Berth's own instance after the leak cleanup: %+v %v; want it running, unchanged", in, err)
	}
	for name, c := range engines() {
		if _, err := dockertest.RemoveByLabel(ctx, c, "it.run", run); err != nil {
			t.Fatalf("remove the strangers on %s: %v", name, err)
		}
	}
	e.matchStore(t)
	e.deleteAll(t)
}

// TestEngineStopsDuringLaunches: a wave of services runs spread over both
// engines; a second wave is being launched when the second engine is
// stopped. Berth marks the node offline, places everything that ran or was
// bound there again on the main engine, loses nothing; when the engine
// returns, the old copies there are deleted and no duplicate survives: the
// raw listings of both engines match the store.
func TestEngineStopsDuringLaunches(t *testing.T) {
	e := setup(t, nil)
	ctx := context.Background()
	e.afterSyncs(t, 1)

	const wave = 8
	if _, err := e.plane.Submit(ctx, e.named(scheduler.Request{ID: "a", Count: wave, Spec: helloSpec(), Strategy: scheduler.StrategySpread}), "it"); err != nil {
		t.Fatal(err)
	}
	per := map[string]int{}
	for _, in := range e.allIn(t, reconciler.Running, wave) {
		per[in.Node]++
	}
	if per[mainNode] == 0 || per[secondNode] == 0 {
		t.Fatalf("the first wave runs %v; want it on both engines", per)
	}
	e.matchStore(t)
	oldCopies := e.raw(t, second.Client)

	if _, err := e.plane.Submit(ctx, e.named(scheduler.Request{ID: "b", Count: wave, Spec: helloSpec(), Strategy: scheduler.StrategySpread}), "it"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a launch of the second wave on the second engine", func() bool {
		return slices.ContainsFunc(e.instances(t), func(in control.Instance) bool {
			return strings.HasPrefix(in.ID, "b-") && in.Node == secondNode && in.Phase == reconciler.Creating
		})
	})
	second.Stop()
	var bound []string
	for _, in := range e.instances(t) {
		if in.Node == secondNode {
			bound = append(bound, in.ID+":"+string(in.Phase))
		}
	}
	t.Logf("the second engine stopped; on it or bound for it then: %v; old copies there: %d", bound, len(oldCopies))

	waitFor(t, "the second engine recorded offline", func() bool {
		return e.nodeRecord(t, secondNode).Status == driver.NodeOffline
	})
	if st := e.nodeRecord(t, secondNode); st.Reason == "" {
		t.Errorf("node record %+v: want the reason it is offline", st)
	}
	// The node record turns offline before the plane has moved what ran
	// there: wait until every instance runs on the main engine or failed.
	var moved []control.Instance
	e.waitFor(t, "every instance running on the main engine or failed", func() bool {
		moved = e.instances(t)
		return len(moved) == 2*wave && !slices.ContainsFunc(moved, func(in control.Instance) bool {
			return in.Phase != reconciler.Failed && (in.Phase != reconciler.Running || in.Node != mainNode)
		})
	})
	running := map[string]string{} // instance → back-end id
	for _, in := range moved {
		switch {
		case in.Phase == reconciler.Failed:
			// Nothing accepted may be lost.
			t.Errorf("instance %s was lost: failed on %s: %s", in.ID, in.Node, in.Message)
		case in.Node != mainNode:
			t.Errorf("%s runs on %s while it is offline", in.ID, in.Node)
		default:
			running[in.ID] = in.BackendID
		}
	}
	t.Logf("while the second engine is away: provider health %+v; failed create attempts %d", e.prov.Health(), len(e.metrics.failedLaunches()))
	for _, f := range e.metrics.failedLaunches() {
		t.Logf("failed create attempt: %s", f)
	}

	// The engine returns with the old copies, which its restart policy
	// starts again.
	if err := second.Start(ctx); err != nil {
		t.Fatalf("restart the second engine: %v", err)
	}
	back := e.raw(t, second.Client)
	t.Logf("the second engine is back holding %d containers of the cluster", len(back))
	for id, inst := range oldCopies {
		if _, ok := back[id]; !ok {
			// Deleted already by Berth, or lost by the engine: neither
			// leaves a duplicate, but the engine keeps containers.
			t.Logf("old copy %s of %s is not listed on the second engine's return", id, inst)
		}
	}
	waitFor(t, "the second engine recorded online", func() bool {
		return e.nodeRecord(t, secondNode).Status == driver.NodeOnline
	})
	e.waitFor(t, "the old copies on the second engine deleted", func() bool {
		return len(e.raw(t, second.Client)) == 0
	})
	e.waitFor(t, "no stale copy left to delete", func() bool {
		return !slices.ContainsFunc(e.instances(t), func(in control.Instance) bool { return len(in.Stale) > 0 })
	})
	// Several more listings: what ran while the engine was away runs on,
	// unmoved; nothing is created again or lost.
	e.afterSyncs(t, 5)
	after := map[string]string{}
	for _, in := range e.settled(t, 2*wave) {
		if in.Phase == reconciler.Running {
			after[in.ID] = in.BackendID
		}
	}
	if !maps.Equal(after, running) {
		t.Errorf("after the engine returned the running instances are %v, before %v", after, running)
	}
	e.matchStore(t)
	e.deleteAll(t)
}

// TestTwoClustersOneNameOneEngine: two servers with the same cluster name
// on the same engines each run 20 containers; after five sync rounds of
// each (leak cleanup included) both sets are intact. Then one server stops
// for good: the other leaves its containers alone.
func TestTwoClustersOneNameOneEngine(t *testing.T) {
	leakCheck(t)
	name := "it-" + dockertest.RandomID()
	a := setupNamed(t, name, nil)
	b := setupNamed(t, name, nil)
	if a.plane.ClusterID() == b.plane.ClusterID() {
		t.Fatalf("two stores share the cluster id %s", a.plane.ClusterID())
	}
	ctx := context.Background()
	for _, e := range []*env{a, b} {
		r := scheduler.Request{ID: "web-" + e.plane.ClusterID()[:8], Count: 20, Spec: helloSpec()}
		r.Spec.Resources = driver.Resources{CPU: 10, Memory: 8 * driver.MiB}
		if _, err := e.plane.Submit(ctx, e.named(r), "it"); err != nil {
			t.Fatal(err)
		}
	}
	running := map[*env][]control.Instance{a: a.allIn(t, reconciler.Running, 20), b: b.allIn(t, reconciler.Running, 20)}
	rounds := func(e *env, n int64) {
		from := e.lists.n.Load()
		e.waitFor(t, fmt.Sprintf("%d more sync rounds", n), func() bool { return e.lists.n.Load() >= from+n })
	}
	rounds(a, 5)
	rounds(b, 5)
	intact := func(e *env, want []control.Instance) {
		t.Helper()
		got := map[string]string{}
		for name, c := range engines() {
			for id, inst := range e.raw(t, c) {
				got[name+"/"+id] = inst // as the driver's back-end ids read
			}
		}
		for _, in := range want {
			if got[in.BackendID] != in.ID {
				t.Errorf("cluster %s: %s's container %s is gone", e.plane.ClusterID()[:8], in.ID, in.BackendID)
			}
		}
		if len(got) != len(want) {
			t.Errorf("cluster %s: %d containers on the engines, want %d", e.plane.ClusterID()[:8], len(got), len(want))
		}
	}
	intact(a, running[a])
	intact(b, running[b])
	for _, e := range []*env{a, b} {
		e.metrics.mu.Lock()
		if n := e.metrics.leaks[provName]; n > 0 {
			t.Errorf("cluster %s deleted %d containers as leaks", e.plane.ClusterID()[:8], n)
		}
		e.metrics.mu.Unlock()
	}

	// b stops for good; a goes on syncing and leaves b's containers alone.
	b.stopPlane(t)
	rounds(a, 5)
	intact(b, running[b])
	intact(a, running[a])
	a.deleteAll(t)
	b.deleteRaw(t)
}

// TestImageOnOneEngineOnly: an image only the main engine has, asked for
// with a preference for the second engine (a soft constraint): the
// container never fails. It runs on the main engine, after the second
// refused it for lack of the image, and the reason is kept.
func TestImageOnOneEngineOnly(t *testing.T) {
	e := setup(t, nil)
	ctx := context.Background()
	e.afterSyncs(t, 1)
	only := "berth-test/it-only-main:" + dockertest.RandomID()
	if err := dockertest.BuildHello(ctx, mainCli, only); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dockertest.RemoveImages(context.Background(), mainCli, only) })
	spec := helloSpec()
	spec.Image = only
	r := e.named(scheduler.Request{ID: "only", Spec: spec, Constraints: []string{"disk==~ssd"}})
	if _, err := e.plane.Submit(ctx, r, ""); err != nil {
		t.Fatal(err)
	}
	var in control.Instance
	e.waitFor(t, "the container to run", func() bool {
		got, err := e.plane.Instance(ctx, r.Name)
		in = got
		return err == nil && (got.Phase == reconciler.Running || got.Phase.Terminal())
	})
	if in.Phase != reconciler.Running {
		t.Fatalf("%s is %s: %s", in.ID, in.Phase, in.Message)
	}
	if in.Node != mainNode {
		t.Fatalf("%s runs on %s, which lacks the image", in.ID, in.Node)
	}
	t.Logf("runs on %s; refused by %v", in.Node, in.Refused)
	e.deleteAll(t)
}
