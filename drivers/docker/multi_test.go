package docker

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/moby/moby/client"

	"github.com/berth-dev/berth/driver"
)

func needSecond(t *testing.T) {
	t.Helper()
	if second == nil {
		t.Skipf("no second engine: %s", secondWhy)
	}
}

func nodeNamed(t *testing.T, st *driver.PlatformState, name string) driver.Node {
	t.Helper()
	for _, n := range st.Nodes {
		if n.Name == name {
			return n
		}
	}
	t.Fatalf("State has no node %s: %+v", name, st.Nodes)
	return driver.Node{}
}

// TestTwoEngines: one provider, two real engines, each a node; containers
// placed on both; an image copied from one to the other without a
// registry; a draining engine refuses new containers.
func TestTwoEngines(t *testing.T) {
	needSecond(t)
	leakCheck(t)
	o := testOptions(DefaultHost, second.Address())
	o.Engines[1].Labels = map[string]string{"zone": "b"}
	o.Engines[1].Capacity = driver.Resources{CPU: 1500}
	d := openTest(t, o)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	run := randomID()
	tags := map[string]string{"berth.test.run": run}

	st, err := d.State(ctx)
	if err != nil {
		t.Fatal(err)
	}
	e1, e2 := nodeNamed(t, st, "e1"), nodeNamed(t, st, "e2")
	if e1.Status != driver.NodeOnline || e2.Status != driver.NodeOnline {
		t.Fatalf("State: e1 %s (%s), e2 %s (%s); want both online", e1.Status, e1.Reason, e2.Status, e2.Reason)
	}
	if e2.Labels["zone"] != "b" || e2.Capacity.CPU != 1500 || e2.Capacity.Memory <= 0 {
		t.Errorf("e2: labels %v capacity %+v; want the configured zone and cpus, the engine's memory", e2.Labels, e2.Capacity)
	}
	if e2.Attributes["storage_driver"] != "vfs" || e1.Attributes["os"] == "" || e1.Attributes["kernel"] == "" || e1.Attributes["arch"] == "" {
		t.Errorf("attributes: e1 %v, e2 %v", e1.Attributes, e2.Attributes)
	}
	if !slices.Contains(e2.Images, helloImage) {
		t.Errorf("e2 images %v lack %s", e2.Images, helloImage)
	}

	// Placement on both engines.
	spec := func() *driver.Spec {
		s := helloSpec()
		s.Tags = tags
		return s
	}
	i1 := create(t, d, "e1", spec())
	i2 := create(t, d, "e2", spec())
	if !strings.HasPrefix(i1.ID, "e1/") || !strings.HasPrefix(i2.ID, "e2/") || i2.Node != "e2" {
		t.Errorf("instances %s on %s and %s on %s", i1.ID, i1.Node, i2.ID, i2.Node)
	}
	list, err := d.List(ctx, tags)
	if err != nil {
		t.Fatal(err)
	}
	var nodes []string
	for _, in := range list {
		nodes = append(nodes, in.Node)
	}
	slices.Sort(nodes)
	if !slices.Equal(nodes, []string{"e1", "e2"}) {
		t.Errorf("List: instances on %v, want one on each engine", nodes)
	}
	st, err = d.State(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"e1", "e2"} {
		n := nodeNamed(t, st, name)
		if n.Instances < 1 || n.Reserved.CPU < 100 || n.Reserved.Memory < 32*driver.MiB {
			t.Errorf("%s: %d instances, reserved %+v; want at least the test's container", name, n.Instances, n.Reserved)
		}
	}
	if found, err := d.Find(ctx, i2.Name); err != nil || found.ID != i2.ID {
		t.Errorf("Find %s: %+v %v, want %s", i2.Name, found, err, i2.ID)
	}

	// Copy an image engine to engine: save on e1, load on e2.
	img := "berth-test/copy:" + run
	if _, err := mainCli.ImageTag(ctx, client.ImageTagOptions{Source: helloImage, Target: img}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, c := range []*client.Client{mainCli, second.Client} {
			_, _ = c.ImageRemove(context.Background(), img, client.ImageRemoveOptions{})
		}
	})
	var mu sync.Mutex
	var reports []driver.PreloadProgress
	err = d.Preload(ctx, img, []string{"e2"}, func(p driver.PreloadProgress) {
		mu.Lock()
		reports = append(reports, p)
		mu.Unlock()
	})
	if err != nil {
		t.Fatalf("Preload: %v", err)
	}
	imgs, err := d.Images(ctx, "e2")
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(imgs, func(i driver.Image) bool { return i.Name == img }) {
		t.Errorf("after Preload, e2 images %v lack %s", imgs, img)
	}
	var copied int64
	for _, p := range reports {
		if p.Node != "e2" || p.Image != img || p.Err != "" {
			t.Errorf("progress %+v", p)
		}
		if strings.HasPrefix(p.Status, "cop") {
			copied = max(copied, p.Current)
		}
	}
	if copied == 0 || reports[len(reports)-1].Status != "done" {
		t.Errorf("progress %+v: want bytes copied from e1 and a final done", reports)
	}
	// The copied image runs on e2.
	onE2 := spec()
	onE2.Image = img
	create(t, d, "e2", onE2)
	// Preloading what is present anywhere already is a no-op; what is on no
	// engine is a permanent failure.
	if err := d.Preload(ctx, img, nil, nil); err != nil {
		t.Errorf("Preload of a present image: %v", err)
	}
	if err := d.Preload(ctx, "berth-test/nowhere:"+run, nil, nil); !errors.Is(err, driver.ErrPermanent) {
		t.Errorf("Preload of an image no engine has: %v, want ErrPermanent", err)
	}

	// A draining engine takes nothing new.
	o2 := testOptions(DefaultHost, second.Address())
	o2.Engines[1].Drain = true
	dd := openTest(t, o2)
	st, err = dd.State(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if n := nodeNamed(t, st, "e2"); n.Status != driver.NodeDraining {
		t.Errorf("drained e2: status %s", n.Status)
	}
	if _, err := dd.Create(ctx, "e2", spec()); !errors.Is(err, driver.ErrInsufficientCapacity) {
		t.Errorf("Create on a draining engine: %v, want ErrInsufficientCapacity", err)
	}
}

// TestEngineGoesAway stops the second engine while containers are being
// launched on both: the first engine keeps working, the second goes
// offline, creates on it fail retryable, it comes back online when it
// returns, and once everything is deleted nothing is left on either.
func TestEngineGoesAway(t *testing.T) {
	needSecond(t)
	leakCheck(t)
	d := openTest(t, testOptions(DefaultHost, second.Address()))
	run := randomID()
	tags := map[string]string{"berth.test.run": run}
	t.Cleanup(func() {
		removeByLabel(t, mainCli, "berth.test.run", run)
		if second.Running() {
			removeByLabel(t, second.Client, "berth.test.run", run)
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	wctx, stopWatch := context.WithCancel(ctx)
	var evs syncEvents
	watchDone := make(chan error, 1)
	go func() { watchDone <- d.Watch(wctx, evs.add) }()

	launch := func(node string) (*driver.Instance, error) {
		s := helloSpec()
		s.Tags = tags
		op, err := d.Create(ctx, node, s)
		if err != nil {
			return nil, err
		}
		return driver.Drive(ctx, op)
	}
	const perEngine = 12
	type result struct {
		node string
		inst *driver.Instance
		err  error
	}
	results := make(chan result, 2*perEngine)
	stopped := make(chan struct{})
	var wg sync.WaitGroup
	for _, node := range []string{"e1", "e2"} {
		wg.Go(func() {
			for i := range perEngine {
				if node == "e2" && i == perEngine/3 {
					<-stopped // the rest of e2's launches happen while it is away
				}
				inst, err := launch(node)
				results <- result{node, inst, err}
			}
		})
	}
	// Stop the second engine once a few launches have gone through.
	time.Sleep(300 * time.Millisecond)
	second.Stop()
	close(stopped)
	wg.Wait()
	close(results)

	var onE1, e2ok, e2retry int
	for r := range results {
		switch {
		case r.node == "e1" && r.err != nil:
			t.Errorf("create on e1 while e2 was away: %v", r.err)
		case r.node == "e1":
			onE1++
		case r.err == nil:
			e2ok++
		case errors.Is(r.err, driver.ErrRetryable):
			e2retry++
		case errors.Is(r.err, driver.ErrTimeout):
			// Cut off mid-call while the engine shut down and the cleanup
			// could not run: the outcome is unknown, and List must find
			// whatever was made.
			t.Logf("create on e2 during shutdown: %v", r.err)
		default:
			// Above all not ErrPermanent: an engine going away is no
			// verdict on the spec.
			t.Errorf("create on e2 while it was away: %v, want ErrRetryable or ErrTimeout", r.err)
		}
	}
	if onE1 != perEngine {
		t.Errorf("%d of %d creates on e1 succeeded", onE1, perEngine)
	}
	if e2retry == 0 {
		t.Errorf("no create on the stopped e2 failed retryable (%d succeeded)", e2ok)
	}
	st, err := d.State(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if n := nodeNamed(t, st, "e2"); n.Status != driver.NodeOffline || n.Reason == "" {
		t.Errorf("stopped e2: status %s reason %q, want offline with a reason", n.Status, n.Reason)
	}
	if n := nodeNamed(t, st, "e1"); n.Status != driver.NodeOnline {
		t.Errorf("e1: status %s while e2 is away", n.Status)
	}
	// List sees e1 whole and says that e2 was not listed.
	partialList, err := d.List(ctx, tags)
	var partial *driver.PartialListError
	if !errors.Is(err, driver.ErrRetryable) || !errors.As(err, &partial) {
		t.Errorf("List while e2 is away: %v, want a PartialListError (ErrRetryable)", err)
	} else if !slices.Equal(partial.Nodes, []string{"e2"}) {
		t.Errorf("List while e2 is away: missed nodes %v, want [e2]", partial.Nodes)
	}
	if n := countOn(partialList, "e1"); n != onE1 || len(partialList) != n {
		t.Errorf("List while e2 is away: %d instances, %d on e1; want the %d on e1 only", len(partialList), n, onE1)
	}

	// Once e2 went offline it stayed offline while it shut down: no
	// flapping back online before it was started again.
	var wentOff bool
	for _, e := range evs.list() {
		if e.Type != driver.EventNode || e.Node != "e2" {
			continue
		}
		wentOff = wentOff || strings.HasPrefix(e.Message, string(driver.NodeOffline))
		if wentOff && strings.HasPrefix(e.Message, string(driver.NodeOnline)) {
			t.Errorf("e2 came back online while it was stopped: %s", e.Message)
		}
	}

	// The engine returns; its health loop finds it.
	if err := second.Start(ctx); err != nil {
		t.Fatalf("restart the second engine: %v", err)
	}
	wait(t, func() bool {
		st, err := d.State(ctx)
		return err == nil && nodeNamed(t, st, "e2").Status == driver.NodeOnline
	})
	if _, err := launch("e2"); err != nil {
		t.Errorf("create on e2 after it returned: %v", err)
	}
	wait(t, func() bool {
		var off, on bool
		for _, e := range evs.list() {
			if e.Type == driver.EventNode && e.Node == "e2" {
				off = off || strings.HasPrefix(e.Message, string(driver.NodeOffline))
				on = on || (off && strings.HasPrefix(e.Message, string(driver.NodeOnline)))
			}
		}
		return on
	})
	stopWatch()
	if err := <-watchDone; !errors.Is(err, context.Canceled) {
		t.Errorf("Watch: %v", err)
	}

	// Leak cleanup: everything Create made, on both engines, is listed and
	// deleted; nothing remains.
	list, err := d.List(ctx, tags)
	if err != nil {
		t.Fatal(err)
	}
	if len(list) < onE1+e2ok+1 {
		t.Errorf("List: %d instances, want at least the %d creates that succeeded", len(list), onE1+e2ok+1)
	}
	for _, in := range list {
		op, err := d.Delete(ctx, in.ID)
		if err == nil {
			_, err = driver.Drive(ctx, op)
		}
		if err != nil {
			t.Errorf("delete %s: %v", in.ID, err)
		}
	}
	for name, c := range map[string]*client.Client{"e1": mainCli, "e2": second.Client} {
		left, err := c.ContainerList(ctx, client.ContainerListOptions{All: true, Filters: make(client.Filters).Add("label", "berth.test.run="+run)})
		if err != nil {
			t.Fatal(err)
		}
		if len(left.Items) != 0 {
			t.Errorf("%s: %d containers left after deleting everything listed", name, len(left.Items))
		}
	}
}

func countOn(list []*driver.Instance, node string) int {
	n := 0
	for _, in := range list {
		if in.Node == node {
			n++
		}
	}
	return n
}
