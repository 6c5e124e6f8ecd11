// Package drivertest is the conformance suite that every Berth driver's tests
// run, in the manner of testing/fstest.TestFS:
//
//	func TestConformance(t *testing.T) {
//		drivertest.Run(t, drivertest.Harness{
//			Open: func(t *testing.T) driver.Driver { ... },
//			Spec: func() *driver.Spec { ... },
//		})
//	}
//
// Run checks the required contract (create, drive to done, get, find, list by
// tags, delete, delete twice, parallel creates, bad specs, missing images)
// and every optional capability the driver declares through
// driver.Capabilities. It closes the driver at the end and checks with goleak
// that Close released every goroutine the driver started.
//
// Run must not run in parallel with other tests of the same binary that
// start goroutines, since the leak check looks at the whole process.
package drivertest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/berth-dev/berth/driver"
)

// Harness tells the suite how to exercise one driver.
type Harness struct {
	// Open returns a freshly opened driver. The suite closes it (and checks
	// with goleak that Close released every goroutine — so Open must not
	// leave goroutines of its own).
	Open func(t *testing.T) driver.Driver
	// Spec returns a spec for a long-running instance that, when it starts,
	// writes the line "hello stdout" to stdout and "hello stderr" to stderr,
	// then runs until stopped (and exits 0 on SIGTERM). The suite sets Name
	// and Tags itself.
	Spec func() *driver.Spec
	// Echo returns a spec for an instance that, made with Stdin, writes
	// the line "ready" to stdout, then copies its input to stdout until
	// the input ends, then exits 0 (a shell's `echo ready; cat`). The suite
	// sets Stdin, Name and Tags itself. The attach case runs only with it.
	Echo func() *driver.Spec
	// MissingImage returns a spec naming an image that does not exist, or nil
	// when the driver has no images (then the suite checks a bad-spec case
	// only).
	MissingImage func() *driver.Spec
	// Exec returns the command line that runs, inside an instance made
	// from Spec, the program of package probe with steps as its arguments
	// (the image's or the host's copy of it). Required when the driver is a
	// driver.Execer.
	Exec func(steps ...string) []string
	// PreloadImage is an image the suite may preload on every node when the
	// driver is a driver.Preloader; it must not be present before (the
	// harness arranges that).
	PreloadImage string
	// Parallel is how many instances the parallel-create test makes (default
	// 16).
	Parallel int
	// Timeout bounds each operation the suite drives and each wait for an
	// instance to reach a state (default one minute). It is a liveness bound,
	// never a performance assertion.
	Timeout time.Duration
	// Concurrent is how many cases run at once (default 1: one after the
	// other). Every case makes instances of its own, so a driver whose
	// instances are slow to start (guests booting) may let a few cases
	// run together, its nodes then holding up to Concurrent of them beside
	// the Parallel case's; Timeout must allow for the cases beside each.
	Concurrent int
}

// Run runs the whole suite as subtests of t.
func Run(t *testing.T, h Harness) {
	t.Helper()
	if h.Open == nil || h.Spec == nil {
		t.Fatal("drivertest: Harness.Open and Harness.Spec are required")
	}
	if h.Parallel <= 0 {
		h.Parallel = 16
	}
	if h.Timeout <= 0 {
		h.Timeout = time.Minute
	}
	if h.Concurrent <= 0 {
		h.Concurrent = 1
	}
	ignore := goleak.IgnoreCurrent()
	d := h.Open(t)
	if d == nil {
		t.Fatal("drivertest: Harness.Open returned a nil driver")
	}
	closed := false
	closeDriver := func() error {
		if closed {
			return nil
		}
		closed = true
		ctx, cancel := context.WithTimeout(context.Background(), h.Timeout)
		defer cancel()
		return d.Close(ctx)
	}
	t.Cleanup(func() { _ = closeDriver() })

	s := &suite{h: h, d: d, run: newRunID()}
	caps := map[string]bool{}
	for _, c := range driver.Capabilities(d) {
		caps[c] = true
	}
	t.Logf("drivertest: run %s, capabilities %v", s.run, driver.Capabilities(d))

	type testCase struct {
		name string
		fn   func(*testing.T)
	}
	cases := []testCase{
		{"Lifecycle", s.testLifecycle},
		{"DeleteTwice", s.testDeleteTwice},
		{"Parallel", s.testParallel},
		{"InvalidSpec", s.testInvalidSpec},
		{"MissingImage", s.testMissingImage},
		{"UnknownID", func(t *testing.T) { s.testUnknownID(t, caps) }},
	}
	t.Run("State", s.testState)
	// Lifecycle compares the node's reservations before and after its
	// create when the spec asks for resources: no other case may create
	// or delete meanwhile, so it then runs alone, first.
	if !h.Spec().Resources.IsZero() {
		t.Run(cases[0].name, cases[0].fn)
		cases = cases[1:]
	}
	capTests := []testCase{
		{driver.CapImages, s.testImages},
		{driver.CapLogs, s.testLogs},
		{driver.CapStop, s.testStop},
		{driver.CapStart, s.testStart},
		{driver.CapRestart, s.testRestart},
		{driver.CapKill, s.testKill},
		{driver.CapResize, s.testResize},
		{driver.CapPreload, s.testPreload},
		{driver.CapSuspend, s.testSuspend},
		{driver.CapEvents, s.testEvents},
		{driver.CapUsage, s.testUsage},
		{driver.CapConsole, s.testConsole},
		{driver.CapAttach, s.testAttach},
		{driver.CapArchive, s.testArchive},
		{driver.CapTop, s.testTop},
	}
	for _, c := range capTests {
		if caps[c.name] {
			cases = append(cases, testCase{"Cap/" + c.name, c.fn})
		}
	}
	cases = append(cases, testCase{"Cap/" + driver.CapExec, func(t *testing.T) {
		if !caps[driver.CapExec] {
			t.Skip("the driver is no driver.Execer: it cannot run a command in an instance (its fallback, ErrUnsupported, is package provider's)")
		}
		s.testExec(t)
	}})
	// Up to Concurrent cases at once, started in this order.
	sem := make(chan struct{}, h.Concurrent)
	var wg sync.WaitGroup
	for _, c := range cases {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			t.Run(c.name, c.fn)
		})
	}
	wg.Wait()

	if err := closeDriver(); err != nil {
		t.Errorf("Close: %v", err)
	}
	goleak.VerifyNone(t, ignore)
}

// tagRun is the tag key that marks every instance of one suite run, so that
// List sees only this run's instances even on a shared back-end.
const tagRun = "berth.drivertest.run"

type suite struct {
	h   Harness
	d   driver.Driver
	run string
}

func newRunID() string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func (s *suite) ctx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), s.h.Timeout)
	t.Cleanup(cancel)
	return ctx
}

// tags returns the suite's tags plus extra.
func (s *suite) tags(extra map[string]string) map[string]string {
	tags := map[string]string{
		driver.TagManaged:  "true",
		driver.TagCluster:  "drivertest",
		driver.TagProvider: "drivertest",
		tagRun:             s.run,
	}
	maps.Copy(tags, extra)
	return tags
}

// name returns an instance name unique to this run.
func (s *suite) name(suffix string) string { return "dt-" + s.run + "-" + suffix }

// spec returns the harness spec with the suite's name and tags.
func (s *suite) spec(name string, extra map[string]string) *driver.Spec {
	sp := s.h.Spec()
	sp.Name = name
	sp.Tags = s.tags(extra)
	return sp
}

// onlineNodes returns the names of the online nodes.
func (s *suite) onlineNodes(t *testing.T) []string {
	t.Helper()
	st, err := s.d.State(s.ctx(t))
	if err != nil {
		t.Fatalf("State: %v", err)
	}
	var names []string
	for _, n := range st.Nodes {
		if n.Status == driver.NodeOnline {
			names = append(names, n.Name)
		}
	}
	if len(names) == 0 {
		t.Fatal("State: no online node")
	}
	return names
}

// create creates an instance named name on node from sp and drives it to
// done, and checks that the driver left sp as it was. A cleanup that
// deletes the instance is registered before Create is called, so nothing is
// left behind even when the test fails.
func (s *suite) create(t *testing.T, node string, sp *driver.Spec) *driver.Instance {
	t.Helper()
	var id string
	t.Cleanup(func() { s.remove(t, id, sp.Name) })
	given, err := json.Marshal(sp)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if after, err := json.Marshal(sp); err != nil || !bytes.Equal(after, given) {
			t.Errorf("Create changed the spec it was given:\nbefore %s\nafter  %s", given, after)
		}
	}()
	ctx := s.ctx(t)
	op, err := s.d.Create(ctx, node, sp)
	if err != nil {
		t.Fatalf("Create %s on %s: %v", sp.Name, node, err)
	}
	if op == nil {
		t.Fatalf("Create %s: nil Operation and nil error", sp.Name)
	}
	inst, err := driver.Drive(ctx, op)
	if inst != nil {
		id = inst.ID
	}
	if err != nil {
		t.Fatalf("Create %s on %s: operation: %v", sp.Name, node, err)
	}
	if inst == nil || inst.ID == "" {
		t.Fatalf("Create %s: done without an instance id (%+v)", sp.Name, inst)
	}
	return inst
}

// remove deletes the instance with id id (or, when id is empty, the one
// named name) and accepts ErrNotFound.
func (s *suite) remove(t *testing.T, id, name string) {
	ctx, cancel := context.WithTimeout(context.Background(), s.h.Timeout)
	defer cancel()
	if id == "" {
		inst, err := s.d.Find(ctx, name)
		if errors.Is(err, driver.ErrNotFound) {
			return
		}
		if err != nil {
			t.Errorf("cleanup: Find %s: %v", name, err)
			return
		}
		id = inst.ID
	}
	op, err := s.d.Delete(ctx, id)
	if err == nil {
		_, err = driver.Drive(ctx, op)
	}
	if err != nil && !errors.Is(err, driver.ErrNotFound) {
		t.Errorf("cleanup: Delete %s (%s): %v", id, name, err)
	}
}

// destroy deletes inst and requires the delete to succeed.
func (s *suite) destroy(t *testing.T, id string) {
	t.Helper()
	ctx := s.ctx(t)
	op, err := s.d.Delete(ctx, id)
	if err != nil {
		t.Fatalf("Delete %s: %v", id, err)
	}
	if _, err := driver.Drive(ctx, op); err != nil {
		t.Fatalf("Delete %s: operation: %v", id, err)
	}
}

// waitState polls Get until cond holds for the instance's state, and fails
// the test when the suite's timeout passes first.
func (s *suite) waitState(t *testing.T, id string, what string, cond func(driver.State) bool) *driver.Instance {
	t.Helper()
	ctx := s.ctx(t)
	var last *driver.Instance
	var lastErr error
	for {
		last, lastErr = s.d.Get(ctx, id)
		if lastErr == nil && cond(last.State) {
			return last
		}
		select {
		case <-ctx.Done():
			if lastErr != nil {
				t.Fatalf("instance %s never became %s: last Get: %v", id, what, lastErr)
			}
			t.Fatalf("instance %s never became %s: last state %q (%s)", id, what, last.State, last.Message)
			return nil
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func is(states ...driver.State) func(driver.State) bool {
	return func(st driver.State) bool {
		for _, s := range states {
			if st == s {
				return true
			}
		}
		return false
	}
}

// startOne creates one running instance for a capability test. When the
// driver reads logs, it also waits for the spec's first line, so that the
// program is known to be up (and handling SIGTERM) before the test acts on it.
func (s *suite) startOne(t *testing.T, suffix string) *driver.Instance {
	t.Helper()
	nodes := s.onlineNodes(t)
	inst := s.create(t, nodes[0], s.spec(s.name(suffix), nil))
	inst = s.waitState(t, inst.ID, "running", is(driver.StateRunning))
	if lr, ok := driver.As[driver.LogReader](s.d, driver.CapLogs); ok {
		ctx := s.ctx(t)
		var out *SyncBuffer
		up := poll(ctx, func() bool {
			out = new(SyncBuffer)
			err := lr.Logs(ctx, inst.ID, driver.LogOptions{Stdout: true}, out, io.Discard)
			return err == nil && strings.Contains(out.String(), helloStdout)
		})
		if !up {
			t.Fatalf("instance %s never wrote %q to stdout (got %q)", inst.ID, helloStdout, out.String())
		}
	}
	return inst
}

func (s *suite) testState(t *testing.T) {
	st, err := s.d.State(s.ctx(t))
	if err != nil {
		t.Fatalf("State: %v", err)
	}
	if len(st.Nodes) == 0 {
		t.Fatal("State: no nodes")
	}
	if st.Aggregated && len(st.Nodes) != 1 {
		t.Errorf("State: Aggregated with %d nodes, want 1", len(st.Nodes))
	}
	seen := map[string]bool{}
	online := 0
	for i, n := range st.Nodes {
		if n.Name == "" {
			t.Errorf("State: node %d has no name", i)
		}
		if seen[n.Name] {
			t.Errorf("State: node name %q appears twice", n.Name)
		}
		seen[n.Name] = true
		switch n.Status {
		case driver.NodeOnline:
			online++
			if n.Capacity.CPU <= 0 && n.Capacity.Memory <= 0 {
				t.Errorf("State: online node %s has no capacity: %+v", n.Name, n.Capacity)
			}
		case driver.NodeOffline, driver.NodeDraining:
		default:
			t.Errorf("State: node %s has status %q", n.Name, n.Status)
		}
		if err := driver.ValidateCapacity("reserved.", n.Reserved); err != nil {
			t.Errorf("State: node %s: %v", n.Name, err)
		}
		if n.Instances < 0 {
			t.Errorf("State: node %s reports %d instances", n.Name, n.Instances)
		}
	}
	if online == 0 {
		t.Error("State: no online node")
	}
}

func nodeOf(t *testing.T, st *driver.PlatformState, name string) driver.Node {
	t.Helper()
	for _, n := range st.Nodes {
		if n.Name == name {
			return n
		}
	}
	t.Fatalf("State: node %s is missing", name)
	return driver.Node{}
}

func (s *suite) testLifecycle(t *testing.T) {
	ctx := s.ctx(t)
	node := s.onlineNodes(t)[0]
	before, err := s.d.State(ctx)
	if err != nil {
		t.Fatalf("State: %v", err)
	}
	name := s.name("life")
	sp := s.spec(name, map[string]string{"drivertest.case": "life"})
	inst := s.create(t, node, sp)
	if inst.Node != node {
		t.Errorf("created instance: Node %q, want %q", inst.Node, node)
	}
	if inst.Name != name {
		t.Errorf("created instance: Name %q, want %q", inst.Name, name)
	}
	if inst.State != driver.StateRunning {
		t.Errorf("created instance: State %q, want %q once the create is done", inst.State, driver.StateRunning)
	}
	id := inst.ID

	got, err := s.d.Get(ctx, id)
	if err != nil {
		t.Fatalf("Get %s: %v", id, err)
	}
	if got.ID != id || got.Name != name || got.Node != node {
		t.Errorf("Get %s: got id %q name %q node %q", id, got.ID, got.Name, got.Node)
	}
	if got.State != driver.StateRunning {
		t.Errorf("Get %s: State %q, want running", id, got.State)
	}
	for k, v := range sp.Tags {
		if got.Tags[k] != v {
			t.Errorf("Get %s: tag %s = %q, want %q", id, k, got.Tags[k], v)
		}
	}
	found, err := s.d.Find(ctx, name)
	if err != nil {
		t.Fatalf("Find %s: %v", name, err)
	}
	if found.ID != id {
		t.Errorf("Find %s: id %q, want %q", name, found.ID, id)
	}

	list, err := s.d.List(ctx, map[string]string{tagRun: s.run, "drivertest.case": "life"})
	if err != nil {
		t.Fatalf("List: %v", err)
	}
	if len(list) != 1 || list[0].ID != id {
		t.Errorf("List by the instance's tags: got %v, want exactly [%s]", ids(list), id)
	}
	if w, ok := s.d.(driver.Walker); ok {
		var walked []*driver.Instance
		if err := w.Walk(ctx, map[string]string{tagRun: s.run, "drivertest.case": "life"}, func(in *driver.Instance) error {
			walked = append(walked, in)
			return nil
		}); err != nil {
			t.Fatalf("Walk: %v", err)
		}
		if len(walked) != 1 || walked[0].ID != id || walked[0].Tags["drivertest.case"] != "life" {
			t.Errorf("Walk by the instance's tags: got %v, want exactly [%s] with its tags", ids(walked), id)
		}
		stop := errors.New("stop")
		if err := w.Walk(ctx, map[string]string{tagRun: s.run}, func(*driver.Instance) error { return stop }); !errors.Is(err, stop) {
			t.Errorf("Walk whose fn fails: %v, want fn's error", err)
		}
	}
	if sk, ok := s.d.(driver.Skimmer); ok && len(list) == 1 {
		// Every glance as List shows the instance; fn gets the whole
		// instance of those skim asks for, and only of those.
		var glanced []driver.Glance
		var whole []*driver.Instance
		tags := map[string]string{tagRun: s.run, "drivertest.case": "life"}
		if err := sk.Skim(ctx, tags, func(g *driver.Glance) bool {
			glanced = append(glanced, *g)
			return true
		}, func(in *driver.Instance) error {
			whole = append(whole, in)
			return nil
		}); err != nil {
			t.Fatalf("Skim: %v", err)
		}
		if len(glanced) != 1 || glanced[0].ID != id || glanced[0].Instance != list[0].Tags[driver.TagInstance] || glanced[0].State != list[0].State ||
			(glanced[0].ExitCode == nil) != (list[0].ExitCode == nil) {
			t.Errorf("Skim by the instance's tags: glances %+v, want exactly one of %s as List shows it (%s)", glanced, id, list[0].State)
		}
		if len(whole) != 1 || whole[0].ID != id || whole[0].Tags["drivertest.case"] != "life" {
			t.Errorf("Skim asking for every instance: got %v, want exactly [%s] with its tags", ids(whole), id)
		}
		whole = nil
		if err := sk.Skim(ctx, tags, func(*driver.Glance) bool { return false }, func(in *driver.Instance) error {
			whole = append(whole, in)
			return nil
		}); err != nil || len(whole) != 0 {
			t.Errorf("Skim asking for no instance: gave %v, %v", ids(whole), err)
		}
		stop := errors.New("stop")
		if err := sk.Skim(ctx, map[string]string{tagRun: s.run}, func(*driver.Glance) bool { return true },
			func(*driver.Instance) error { return stop }); !errors.Is(err, stop) {
			t.Errorf("Skim whose fn fails: %v, want fn's error", err)
		}
	}
	list, err = s.d.List(ctx, map[string]string{tagRun: s.run, "drivertest.case": "other"})
	if err != nil {
		t.Fatalf("List: %v", err)
	}
	if len(list) != 0 {
		t.Errorf("List with a tag value no instance has: got %v, want none", ids(list))
	}

	if !sp.Resources.IsZero() {
		after, err := s.d.State(ctx)
		if err != nil {
			t.Fatalf("State: %v", err)
		}
		b, a := nodeOf(t, before, node), nodeOf(t, after, node)
		if !a.Reserved.IsZero() || !b.Reserved.IsZero() {
			if want := b.Reserved.Add(sp.Resources); !want.Fits(a.Reserved) {
				t.Errorf("State: node %s reserved %+v after the create, want at least %+v", node, a.Reserved, want)
			}
		}
	}

	s.destroy(t, id)
	if _, err := s.d.Get(ctx, id); !errors.Is(err, driver.ErrNotFound) {
		t.Errorf("Get after delete: %v, want ErrNotFound", err)
	}
	if _, err := s.d.Find(ctx, name); !errors.Is(err, driver.ErrNotFound) {
		t.Errorf("Find after delete: %v, want ErrNotFound", err)
	}
	list, err = s.d.List(ctx, map[string]string{tagRun: s.run, "drivertest.case": "life"})
	if err != nil {
		t.Fatalf("List: %v", err)
	}
	if len(list) != 0 {
		t.Errorf("List after delete: %v, want none", ids(list))
	}
}

func ids(list []*driver.Instance) []string {
	out := make([]string, len(list))
	for i, in := range list {
		out[i] = in.ID
	}
	return out
}

func (s *suite) testDeleteTwice(t *testing.T) {
	ctx := s.ctx(t)
	inst := s.create(t, s.onlineNodes(t)[0], s.spec(s.name("twice"), nil))
	s.destroy(t, inst.ID)
	op, err := s.d.Delete(ctx, inst.ID)
	if err == nil {
		_, err = driver.Drive(ctx, op)
	}
	if !errors.Is(err, driver.ErrNotFound) {
		t.Errorf("second Delete of %s: %v, want ErrNotFound", inst.ID, err)
	}
}

func (s *suite) testParallel(t *testing.T) {
	n := s.h.Parallel
	nodes := s.onlineNodes(t)
	type result struct {
		inst *driver.Instance
		err  error
	}
	results := make(chan result, n)
	specs := make([]*driver.Spec, n)
	for i := range n {
		specs[i] = s.spec(s.name(fmt.Sprintf("par%d", i)), map[string]string{"drivertest.case": "parallel"})
		t.Cleanup(func() { s.remove(t, "", specs[i].Name) })
	}
	ctx := s.ctx(t)
	for i := range n {
		go func() {
			op, err := s.d.Create(ctx, nodes[i%len(nodes)], specs[i])
			if err != nil {
				results <- result{err: err}
				return
			}
			inst, err := driver.Drive(ctx, op)
			results <- result{inst, err}
		}()
	}
	created := map[string]bool{}
	for range n {
		r := <-results
		if r.err != nil {
			t.Errorf("parallel Create: %v", r.err)
			continue
		}
		if created[r.inst.ID] {
			t.Errorf("parallel Create: id %s returned twice", r.inst.ID)
		}
		created[r.inst.ID] = true
	}
	if t.Failed() {
		return
	}
	tags := map[string]string{tagRun: s.run, "drivertest.case": "parallel"}
	list, err := s.d.List(ctx, tags)
	if err != nil {
		t.Fatalf("List: %v", err)
	}
	if len(list) != n {
		t.Errorf("List: %d instances, want %d", len(list), n)
	}
	for _, in := range list {
		if !created[in.ID] {
			t.Errorf("List: unexpected instance %s", in.ID)
		}
	}

	errs := make(chan error, n)
	for id := range created {
		go func() {
			op, err := s.d.Delete(ctx, id)
			if err == nil {
				_, err = driver.Drive(ctx, op)
			}
			if err != nil {
				err = fmt.Errorf("Delete %s: %w", id, err)
			}
			errs <- err
		}()
	}
	for range created {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
	list, err = s.d.List(ctx, tags)
	if err != nil {
		t.Fatalf("List: %v", err)
	}
	if len(list) != 0 {
		t.Errorf("List after parallel deletes: %v, want none", ids(list))
	}
}

// expectNothing checks that no instance of this run carries the case tag
// and that name is unknown.
func (s *suite) expectNothing(t *testing.T, ctx context.Context, caseTag, name string) {
	t.Helper()
	list, err := s.d.List(ctx, map[string]string{tagRun: s.run, "drivertest.case": caseTag})
	if err != nil {
		t.Fatalf("List: %v", err)
	}
	if len(list) != 0 {
		t.Errorf("List: %v left behind by a failed create", ids(list))
	}
	if inst, err := s.d.Find(ctx, name); !errors.Is(err, driver.ErrNotFound) {
		t.Errorf("Find %s after a failed create: %v %v, want ErrNotFound", name, inst, err)
	}
}

func (s *suite) testInvalidSpec(t *testing.T) {
	node := s.onlineNodes(t)[0]
	cases := []struct {
		name   string
		field  string
		mutate func(*driver.Spec)
	}{
		{"negative-cpus", "cpus", func(sp *driver.Spec) { sp.CPU = -1 }},
		{"six-config-files", "config_files", func(sp *driver.Spec) {
			sp.ConfigFiles = nil
			for i := range driver.MaxConfigFiles + 1 {
				sp.ConfigFiles = append(sp.ConfigFiles, driver.ConfigFile{Path: fmt.Sprintf("/etc/f%d", i), Content: "x"})
			}
		}},
		{"bad-kind", "kind", func(sp *driver.Spec) { sp.Kind = "submarine" }},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ctx := s.ctx(t)
			name := s.name("bad-" + c.name)
			sp := s.spec(name, map[string]string{"drivertest.case": "invalid"})
			c.mutate(sp)
			t.Cleanup(func() { s.remove(t, "", name) })
			op, err := s.d.Create(ctx, node, sp)
			if !errors.Is(err, driver.ErrInvalid) {
				if op != nil {
					_, derr := driver.Drive(ctx, op)
					t.Fatalf("Create with a bad %s: Create returned %v (operation: %v), want ErrInvalid from Create", c.field, err, derr)
				}
				t.Fatalf("Create with a bad %s: %v, want ErrInvalid", c.field, err)
			}
			var fe *driver.FieldError
			if !errors.As(err, &fe) {
				t.Errorf("Create with a bad %s: %v does not carry a *driver.FieldError", c.field, err)
			} else if !HasField(err, c.field) {
				t.Errorf("Create with a bad %s: %v does not name the field %q", c.field, err, c.field)
			}
			s.expectNothing(t, ctx, "invalid", name)
		})
	}
}

// HasField reports whether err holds a *driver.FieldError for path.
func HasField(err error, path string) bool {
	var fes driver.FieldErrors
	if errors.As(err, &fes) {
		for _, fe := range fes {
			if fe.Path == path {
				return true
			}
		}
	}
	var fe *driver.FieldError
	return errors.As(err, &fe) && fe.Path == path
}

func (s *suite) testMissingImage(t *testing.T) {
	if s.h.MissingImage == nil {
		t.Skip("the driver has no images (Harness.MissingImage is nil)")
	}
	ctx := s.ctx(t)
	node := s.onlineNodes(t)[0]
	sp := s.h.MissingImage()
	name := s.name("noimage")
	sp.Name = name
	sp.Tags = s.tags(map[string]string{"drivertest.case": "noimage"})
	t.Cleanup(func() { s.remove(t, "", name) })
	op, err := s.d.Create(ctx, node, sp)
	if err == nil {
		_, err = driver.Drive(ctx, op)
	}
	if !errors.Is(err, driver.ErrPermanent) {
		t.Fatalf("Create with missing image %q: %v, want ErrPermanent", sp.Image, err)
	}
	s.expectNothing(t, ctx, "noimage", name)
}

// testUnknownID checks that every call taking an instance id answers
// ErrNotFound for the id of a deleted instance.
func (s *suite) testUnknownID(t *testing.T, caps map[string]bool) {
	ctx := s.ctx(t)
	inst := s.create(t, s.onlineNodes(t)[0], s.spec(s.name("gone"), nil))
	s.destroy(t, inst.ID)
	id := inst.ID
	calls := map[string]func() error{
		"Get": func() error { _, err := s.d.Get(ctx, id); return err },
	}
	if caps[driver.CapStart] {
		calls["Start"] = func() error { return s.d.(driver.Starter).Start(ctx, id) }
	}
	if caps[driver.CapStop] {
		calls["Stop"] = func() error { return s.d.(driver.Stopper).Stop(ctx, id, time.Second) }
	}
	if caps[driver.CapRestart] {
		calls["Restart"] = func() error { return s.d.(driver.Restarter).Restart(ctx, id, time.Second) }
	}
	if caps[driver.CapKill] {
		calls["Kill"] = func() error { return s.d.(driver.Killer).Kill(ctx, id, "KILL") }
	}
	if caps[driver.CapResize] {
		calls["Resize"] = func() error {
			return s.d.(driver.Resizer).Resize(ctx, id, driver.Resources{CPU: 100, Memory: 64 * driver.MiB})
		}
	}
	if caps[driver.CapSuspend] {
		calls["Suspend"] = func() error { return s.d.(driver.Suspender).Suspend(ctx, id) }
		calls["Resume"] = func() error { return s.d.(driver.Suspender).Resume(ctx, id) }
	}
	if caps[driver.CapUsage] {
		calls["Usage"] = func() error { _, err := s.d.(driver.UsageReporter).Usage(ctx, id); return err }
	}
	if caps[driver.CapConsole] {
		calls["Console"] = func() error { _, err := s.d.(driver.ConsoleReader).Console(ctx, id); return err }
	}
	if caps[driver.CapExec] {
		calls["Exec"] = func() error {
			_, err := s.d.(driver.Execer).Exec(ctx, id, driver.ExecOptions{Cmd: []string{"true"}}, nil, io.Discard, io.Discard)
			return err
		}
	}
	if caps[driver.CapArchive] {
		calls["StatPath"] = func() error { _, err := s.d.(driver.Archiver).StatPath(ctx, id, "/"); return err }
	}
	if caps[driver.CapTop] {
		calls["Top"] = func() error { _, err := s.d.(driver.Topper).Top(ctx, id, ""); return err }
	}
	if caps[driver.CapLogs] {
		calls["Logs"] = func() error {
			var o, e SyncBuffer
			return s.d.(driver.LogReader).Logs(ctx, id, driver.LogOptions{Stdout: true, Stderr: true}, &o, &e)
		}
	}
	for name, call := range calls {
		if err := call(); !errors.Is(err, driver.ErrNotFound) {
			t.Errorf("%s on deleted instance %s: %v, want ErrNotFound", name, id, err)
		}
	}
}
