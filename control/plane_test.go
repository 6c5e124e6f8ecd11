package control_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"go.uber.org/goleak"

	"github.com/berth-dev/berth/control"
	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/driver/drivertest"
	"github.com/berth-dev/berth/drivers/sim"
	"github.com/berth-dev/berth/provider"
	"github.com/berth-dev/berth/reconciler"
	"github.com/berth-dev/berth/scheduler"
	"github.com/berth-dev/berth/store"
	"github.com/berth-dev/berth/store/memory"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var quiet = func() *slog.Logger {
	if os.Getenv("BERTH_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}()

// newSim opens a sim back-end of nodes nodes of 4 cpus / 8 GiB, wrapped in
// a provider named "sim", closed at the end of the test.
func newSim(t *testing.T, nodes int, tune func(*sim.Options)) (*sim.Sim, *provider.Provider) {
	t.Helper()
	return newSimWith(t, nodes, tune, provider.Config{})
}

// newSimWith is newSim with the provider configured as pc (its name,
// logger and state cache set as newSim's).
func newSimWith(t *testing.T, nodes int, tune func(*sim.Options), pc provider.Config) (*sim.Sim, *provider.Provider) {
	t.Helper()
	s := newSimDriver(t, nodes, tune)
	return s, providerOf(t, s, pc)
}

// newSimDriver is the sim of newSimWith, without its provider.
func newSimDriver(t *testing.T, nodes int, tune func(*sim.Options)) *sim.Sim {
	t.Helper()
	opts := *sim.DefaultOptions()
	opts.Nodes = nodes
	opts.Shape = sim.Shape{Resources: driver.Resources{CPU: driver.CPUs(4), Memory: 8 * driver.GiB}}
	if tune != nil {
		tune(&opts)
	}
	s, err := sim.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// providerOf is the provider "sim" of d with pc, closed when the test ends.
func providerOf(t *testing.T, d driver.Driver, pc provider.Config) *provider.Provider {
	t.Helper()
	pc.Name, pc.Logger, pc.StateTTL = "sim", quiet, time.Millisecond
	p, err := provider.New(d, pc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close(context.Background()) })
	return p
}

// testCluster is the cluster id of every plane config makes: config
// writes it into the store as if the cluster had been made with it, so
// that the tests can tag resources as the plane's (or not) up front.
const testCluster = "test-cluster-id"

func config(st store.Store, provs ...*provider.Provider) control.Config {
	rec := []byte(`{"id": "` + testCluster + `", "name": "test"}`)
	if _, err := st.Txn(context.Background(), []store.Cmp{{Key: control.KeyCluster}}, []store.Op{store.Put(control.KeyCluster, rec)}); err != nil {
		panic(err)
	}
	return control.Config{
		Store: st, Providers: provs, Cluster: "test", Logger: quiet,
		SyncInterval: 20 * time.Millisecond, RetryBackoff: 10 * time.Millisecond,
		LaunchTimeout: 5 * time.Second, Workers: 3,
	}
}

// start creates a Plane and runs it until the returned stop is called (or
// the test ends); stop waits for Run to return and checks its error.
func start(t *testing.T, cfg control.Config) (*control.Plane, func()) {
	t.Helper()
	p, err := control.New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Errorf("Run returned %v, want context.Canceled", err)
		}
	}
	t.Cleanup(stop)
	return p, stop
}

// waitFor polls cond until it holds; the generous limit only guards
// against a hung test and is never what the test measures.
//
// The plane's tests run in a synctest bubble (testing/synctest): time is
// the bubble's fake clock, which moves only when every goroutine of the
// test waits, so the polls, the plane's timers (sync, retries, backoff,
// retention) and Config.Now cost no real time and never race with a slow
// machine. Only the tests that drive real processes (local_test.go) run
// on the real clock.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func phaseOf(t *testing.T, p *control.Plane, id string) reconciler.Phase {
	t.Helper()
	in, err := p.Instance(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	return in.Phase
}

func waitPhase(t *testing.T, p *control.Plane, id string, want reconciler.Phase) control.Instance {
	t.Helper()
	var last control.Instance
	deadline := time.Now().Add(20 * time.Second)
	for {
		in, err := p.Instance(context.Background(), id)
		if err != nil {
			t.Fatal(err)
		}
		last = in
		if in.Phase == want {
			return in
		}
		if in.Phase.Terminal() {
			t.Fatalf("instance %s is %s (%s), want %s", id, in.Phase, in.Message, want)
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for instance %s to be %s: it is %s (%s)", id, want, last.Phase, last.Message)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func tagged(t *testing.T, prov *provider.Provider, tags map[string]string) []*driver.Instance {
	t.Helper()
	got, err := prov.List(context.Background(), tags)
	if err != nil {
		t.Fatal(err)
	}
	return got
}

func req(id string, count int) scheduler.Request {
	return scheduler.Request{ID: id, Count: count, Spec: driver.Spec{Image: "busybox", Resources: driver.Resources{CPU: driver.CPUs(0.5), Memory: 256 * driver.MiB}}}
}

func TestLaunchAnswerAndDelete(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		_, prov := newSim(t, 3, nil)
		p, _ := start(t, config(memory.New(memory.Options{}), prov))
		ctx := context.Background()

		ans, err := p.Submit(ctx, req("web", 2), "alice")
		if err != nil {
			t.Fatal(err)
		}
		if len(ans.Instances) != 2 {
			t.Fatalf("answer has %d instances, want 2", len(ans.Instances))
		}
		for _, pl := range ans.Instances {
			if pl.Node == nil || pl.Node.Provider != "sim" || pl.Node.CPUs != driver.CPUs(4) || pl.Node.Memory != 8*driver.GiB {
				t.Fatalf("answer node = %+v, want a sim node with 4 cpus and 8Gi", pl.Node)
			}
			if !pl.Instance.Phase.HoldsNode() || pl.Instance.Owner != "alice" {
				t.Fatalf("answered instance = %+v", pl.Instance)
			}
		}
		for _, pl := range ans.Instances {
			in := waitPhase(t, p, pl.Instance.ID, reconciler.Running)
			if in.BackendID == "" || in.Observed == nil {
				t.Fatalf("running instance without back-end record: %+v", in)
			}
			got := tagged(t, prov, map[string]string{driver.TagInstance: in.ID})
			if len(got) != 1 || got[0].Tags[driver.TagCluster] != testCluster || got[0].Tags[driver.TagProvider] != "sim" {
				t.Fatalf("back-end holds %d copies of %s with tags %v", len(got), in.ID, got)
			}
		}
		// By name, and a second request with the same name is refused.
		named := req("db", 1)
		named.Name = "db"
		if _, err := p.Submit(ctx, named, ""); err != nil {
			t.Fatal(err)
		}
		if in, err := p.Instance(ctx, "db"); err != nil || in.ID != "db" {
			t.Fatalf("Instance(db) = %v, %v", in.ID, err)
		}
		named.ID = "db2"
		var fe *driver.FieldError
		if _, err := p.Submit(ctx, named, ""); !errors.Is(err, driver.ErrAlreadyExists) || !errors.As(err, &fe) || fe.Path != "name" {
			t.Fatalf("second db: err = %v, want ErrAlreadyExists naming the field name", err)
		}

		if err := p.Delete(ctx, "web-0"); err != nil {
			t.Fatal(err)
		}
		waitPhase(t, p, "web-0", reconciler.Deleted)
		if got := tagged(t, prov, map[string]string{driver.TagInstance: "web-0"}); len(got) != 0 {
			t.Fatalf("deleted instance still in the back-end: %v", got)
		}
		list, err := p.Instances(ctx, control.Filter{Owner: "alice"})
		if err != nil {
			t.Fatal(err)
		}
		if len(list) != 1 || list[0].ID != "web-1" {
			t.Fatalf("alice's live instances = %v, want web-1 only", ids(list))
		}
		if _, err := p.Instance(ctx, "nope"); !errors.Is(err, driver.ErrNotFound) {
			t.Fatalf("unknown instance: %v", err)
		}
	})
}

func ids(list []control.Instance) []string {
	var out []string
	for _, in := range list {
		out = append(out, in.ID)
	}
	return out
}

func TestBadInput(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		_, prov := newSim(t, 1, nil)
		p, err := control.New(context.Background(), config(memory.New(memory.Options{}), prov))
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		for _, tc := range []struct {
			name  string
			req   scheduler.Request
			field string
		}{
			{"negative cpus", scheduler.Request{Spec: driver.Spec{Image: "x", Resources: driver.Resources{CPU: -1}}}, "cpus"},
			{"no image", scheduler.Request{}, "image"},
			{"unknown provider", scheduler.Request{Spec: driver.Spec{Image: "x"}, Provider: "mars"}, "provider"},
			{"bad id", scheduler.Request{ID: "a/b", Spec: driver.Spec{Image: "x"}}, "id"},
			{"names too long", scheduler.Request{Count: 10, Spec: driver.Spec{Name: strings.Repeat("n", 56), Image: "x"}}, "name"},
			{"bad constraint", scheduler.Request{Spec: driver.Spec{Image: "x"}, Constraints: []string{"=="}}, "constraints[0]"},
		} {
			_, err := p.Submit(ctx, tc.req, "")
			var fe *driver.FieldError
			if !errors.Is(err, driver.ErrInvalid) || !errors.As(err, &fe) || fe.Path != tc.field {
				t.Errorf("%s: err = %v, want ErrInvalid naming %s", tc.name, err, tc.field)
			}
		}
		if _, err := control.New(ctx, control.Config{}); !errors.Is(err, driver.ErrInvalid) {
			t.Errorf("empty config: %v", err)
		}
		list, _ := p.Instances(ctx, control.Filter{All: true})
		if len(list) != 0 {
			t.Fatalf("bad requests left instances: %v", ids(list))
		}
	})
}

func TestPermanentFailureFailsWithTheBackEndsMessage(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		_, prov := newSim(t, 2, func(o *sim.Options) { o.FailPermanent = 1 })
		p, _ := start(t, config(memory.New(memory.Options{}), prov))
		if _, err := p.Submit(context.Background(), req("bad", 1), ""); err != nil {
			t.Fatal(err)
		}
		in := waitPhase(t, p, "bad", reconciler.Failed)
		if in.Attempts != 0 || !strings.Contains(in.Message, "sim") {
			t.Fatalf("failed instance: attempts %d, message %q; want 0 attempts and the sim's message", in.Attempts, in.Message)
		}
	})
}

func TestRetryableFailureIsRequeuedUntilOutOfAttempts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, prov := newSim(t, 2, func(o *sim.Options) { o.FailRetryable = 1 })
		cfg := config(memory.New(memory.Options{}), prov)
		cfg.MaxAttempts = 3
		p, _ := start(t, cfg)
		if _, err := p.Submit(context.Background(), req("flaky", 1), ""); err != nil {
			t.Fatal(err)
		}
		in := waitPhase(t, p, "flaky", reconciler.Failed)
		if in.Attempts != 3 || !strings.Contains(in.Message, "failed after 3 attempts") {
			t.Fatalf("attempts %d, message %q", in.Attempts, in.Message)
		}
		// The first refusal of each node is not counted: it sends the instance
		// to the other node. Once both are excluded the instance goes back to
		// them, and each refusal counts.
		var nodes []string
		for _, c := range s.Calls() {
			if c.Op == "create" {
				nodes = append(nodes, c.Node)
			}
		}
		if len(nodes) != 2+3 || nodes[0] == nodes[1] {
			t.Fatalf("creates on %v, want one on each node, then one per attempt (3)", nodes)
		}
	})
}

func TestQuotaRefusalIsRequeuedNotFailed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, prov := newSim(t, 2, func(o *sim.Options) { o.FailQuota = 1 })
		cfg := config(memory.New(memory.Options{}), prov)
		cfg.MaxAttempts = 1
		p, _ := start(t, cfg)
		if _, err := p.Submit(context.Background(), req("q", 1), ""); err != nil {
			t.Fatal(err)
		}
		// Many refusals, more than MaxAttempts, and it is still waiting.
		waitFor(t, "several quota refusals", func() bool {
			n := 0
			for _, c := range s.Calls() {
				if c.Op == "create" && errors.Is(c.Err, driver.ErrQuotaExceeded) {
					n++
				}
			}
			return n >= 3
		})
		waitFor(t, "q back in the queue, waiting for quota", func() bool {
			in, err := p.Instance(context.Background(), "q")
			if err != nil {
				t.Fatal(err)
			}
			if in.Phase == reconciler.Failed || in.Attempts != 0 {
				t.Fatalf("after quota refusals: phase %s, attempts %d, message %q", in.Phase, in.Attempts, in.Message)
			}
			return in.Phase == reconciler.Pending && strings.Contains(in.Message, "quota")
		})
	})
}

func TestLaunchTimeoutDeletesWhatMayExistAndRetries(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, prov := newSim(t, 2, func(o *sim.Options) { o.HangRate = 1 })
		cfg := config(memory.New(memory.Options{}), prov)
		cfg.LaunchTimeout = 100 * time.Millisecond
		cfg.MaxAttempts = 2
		p, _ := start(t, cfg)
		if _, err := p.Submit(context.Background(), req("slow", 1), ""); err != nil {
			t.Fatal(err)
		}
		in := waitPhase(t, p, "slow", reconciler.Failed)
		if in.Attempts != 2 || !strings.Contains(in.Message, "launch did not finish") {
			t.Fatalf("attempts %d, message %q", in.Attempts, in.Message)
		}
		if creates := countCalls(s, "create"); creates != 2 {
			t.Fatalf("%d creates, want 2", creates)
		}
		waitFor(t, "no copy left in the back-end", func() bool {
			return len(tagged(t, prov, map[string]string{driver.TagInstance: "slow"})) == 0
		})
	})
}

// A create that waits for the worker (here behind the provider's write
// budget) longer than the launch timeout times out only once the back-end
// has been asked for that long: the wakes held back while it waited are
// made when the worker takes it.
func TestLaunchTimeoutOfCreatesThatWaited(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		// Ten creates a second, one at a time: the last of twelve waits
		// over a second for its turn.
		s, prov := newSimWith(t, 2, func(o *sim.Options) { o.HangRate = 1 }, provider.Config{WriteRate: 10, WriteBurst: 1})
		cfg := config(memory.New(memory.Options{}), prov)
		cfg.LaunchTimeout, cfg.MaxAttempts, cfg.Workers = 200*time.Millisecond, 1, 1
		p, _ := start(t, cfg)
		const n = 12
		if _, err := p.Submit(context.Background(), req("queued", n), ""); err != nil {
			t.Fatal(err)
		}
		for i := range n {
			in := waitPhase(t, p, fmt.Sprintf("queued-%d", i), reconciler.Failed)
			if !strings.Contains(in.Message, "launch did not finish") {
				t.Errorf("queued-%d failed with %q, want a launch timeout", i, in.Message)
			}
		}
		if creates := countCalls(s, "create"); creates != n {
			t.Errorf("%d creates, want %d: each instance asked for once", creates, n)
		}
	})
}

// queuedDriver is the sim behind a bound on the calls in flight that
// every create waits behind for queue: its operation reports Queued, and
// reaches the sim, only once that has passed.
type queuedDriver struct {
	*sim.Sim
	queue time.Duration
}

func (d queuedDriver) Create(ctx context.Context, node string, spec *driver.Spec) (driver.Operation, error) {
	return &queuedOp{d: d, ctx: ctx, node: node, spec: spec, until: time.Now().Add(d.queue)}, nil
}

type queuedOp struct {
	d     queuedDriver
	ctx   context.Context
	node  string
	spec  *driver.Spec
	until time.Time
	op    driver.Operation
}

func (o *queuedOp) Advance(ctx context.Context) (driver.Progress, error) {
	if o.op == nil {
		if wait := time.Until(o.until); wait > 0 {
			return driver.Progress{Queued: true, Wait: wait}, nil
		}
		op, err := o.d.Sim.Create(o.ctx, o.node, o.spec)
		if err != nil {
			return driver.Progress{}, err
		}
		o.op = op
	}
	return o.op.Advance(ctx)
}

// A create that waits its turn in the driver (Progress.Queued) longer than
// the launch timeout runs: the timeout counts from when the back-end is
// asked.
func TestLaunchTimeoutWaitsForQueuedCreates(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newSimDriver(t, 2, func(o *sim.Options) { o.CreateLatency = 50 * time.Millisecond })
		prov := providerOf(t, queuedDriver{Sim: s, queue: 2 * time.Second}, provider.Config{})
		cfg := config(memory.New(memory.Options{}), prov)
		cfg.LaunchTimeout, cfg.MaxAttempts = 200*time.Millisecond, 1
		p, _ := start(t, cfg)
		const n = 3
		if _, err := p.Submit(context.Background(), req("waits", n), ""); err != nil {
			t.Fatal(err)
		}
		for i := range n {
			in := waitPhase(t, p, fmt.Sprintf("waits-%d", i), reconciler.Running)
			if in.Attempts != 0 {
				t.Errorf("waits-%d: %d failed attempts (%s), want none", i, in.Attempts, in.Message)
			}
		}
		if creates := countCalls(s, "create"); creates != n {
			t.Errorf("%d creates, want %d", creates, n)
		}
	})
}

// A create held back by the provider's write budget does not hold the
// worker: with one worker and one change in ten seconds, the create sent
// first is driven to its end meanwhile (its launch timeout is 5s), and the
// one held back is sent when the budget allows, its launch timeout
// counting from then. Deletes wait their turns the same way.
func TestBudgetHoldsNoWorker(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, prov := newSimWith(t, 2, func(o *sim.Options) { o.CreateLatency = 100 * time.Millisecond }, provider.Config{WriteRate: 0.1, WriteBurst: 1})
		cfg := config(memory.New(memory.Options{}), prov)
		cfg.Workers = 1 // LaunchTimeout 5s
		p, _ := start(t, cfg)
		if _, err := p.Submit(context.Background(), req("paced", 2), ""); err != nil {
			t.Fatal(err)
		}
		for i := range 2 {
			in := waitPhase(t, p, fmt.Sprintf("paced-%d", i), reconciler.Running)
			if in.Attempts != 0 {
				t.Errorf("paced-%d: %d failed attempts (%s), want none", i, in.Attempts, in.Message)
			}
		}
		if creates := countCalls(s, "create"); creates != 2 {
			t.Errorf("%d creates, want 2", creates)
		}
		// The deletes wait their turns the same way.
		for i := range 2 {
			if err := p.Delete(context.Background(), fmt.Sprintf("paced-%d", i)); err != nil {
				t.Fatal(err)
			}
		}
		for i := range 2 {
			waitPhase(t, p, fmt.Sprintf("paced-%d", i), reconciler.Deleted)
		}
		if left := tagged(t, prov, map[string]string{driver.TagCluster: testCluster}); len(left) != 0 {
			t.Errorf("%d copies left in the back-end", len(left))
		}
	})
}

func TestCrashResumeAdoptsWithoutDuplicates(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		_, prov := newSim(t, 4, func(o *sim.Options) { o.CreateLatency = 30 * time.Millisecond; o.LatencyJitter = 40 * time.Millisecond })
		st := memory.New(memory.Options{})
		p1, stop1 := start(t, config(st, prov))
		const n = 40
		r := req("batch", n)
		r.CPU = driver.CPUs(0.25)
		ans, err := p1.Submit(context.Background(), r, "")
		if err != nil {
			t.Fatal(err)
		}
		for _, pl := range ans.Instances {
			if pl.Node == nil {
				t.Fatalf("%s not placed: %s", pl.Instance.ID, pl.Instance.Message)
			}
		}
		// Crash in the middle of the launches: some created, some in flight,
		// some not started.
		waitFor(t, "some launches under way", func() bool {
			return len(tagged(t, prov, map[string]string{driver.TagCluster: testCluster})) >= 5
		})
		stop1()

		p2, _ := start(t, config(st, prov))
		for i := range n {
			waitPhase(t, p2, fmt.Sprintf("batch-%d", i), reconciler.Running)
		}
		all := tagged(t, prov, map[string]string{driver.TagCluster: testCluster})
		seen := map[string]string{}
		for _, r := range all {
			id := r.Tags[driver.TagInstance]
			if prev, dup := seen[id]; dup {
				// A duplicate may exist only until the sync deletes it.
				t.Logf("duplicate of %s: %s and %s", id, prev, r.ID)
			}
			seen[id] = r.ID
		}
		waitFor(t, "exactly one copy of each instance", func() bool {
			return len(tagged(t, prov, map[string]string{driver.TagCluster: testCluster})) == n
		})
		for i := range n {
			in, _ := p2.Instance(context.Background(), fmt.Sprintf("batch-%d", i))
			got := tagged(t, prov, map[string]string{driver.TagInstance: in.ID})
			if len(got) != 1 || got[0].ID != in.BackendID {
				t.Fatalf("%s: back-end copies %v, record says %s", in.ID, got, in.BackendID)
			}
		}
	})
}

func TestLeaksAreDeletedAfterTwoSightingsUntaggedNeverTouched(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, prov := newSim(t, 2, nil)
		ctx := context.Background()
		make1 := func(name string, tags map[string]string) string {
			op, err := s.Create(ctx, "node-1", &driver.Spec{Name: name, Image: "busybox", Tags: tags})
			if err != nil {
				t.Fatal(err)
			}
			in, err := driver.Drive(ctx, op)
			if err != nil {
				t.Fatal(err)
			}
			return in.ID
		}
		leak := make1("leak", map[string]string{driver.TagManaged: "true", driver.TagCluster: testCluster, driver.TagProvider: "sim", driver.TagInstance: "ghost"})
		other := make1("other-cluster", map[string]string{driver.TagManaged: "true", driver.TagCluster: "elsewhere", driver.TagInstance: "x"})
		mine := make1("not-berth", map[string]string{"team": "ops"})

		p, _ := start(t, config(memory.New(memory.Options{}), prov))
		_ = p
		waitFor(t, "the leak to be deleted", func() bool {
			_, err := s.Get(ctx, leak)
			return errors.Is(err, driver.ErrNotFound)
		})
		deletes := 0
		for _, c := range s.Calls() {
			if c.Op == "delete" {
				deletes++
				if c.Instance != leak {
					t.Errorf("deleted %s, which is not the leak", c.Instance)
				}
			}
		}
		if deletes != 1 {
			t.Fatalf("%d deletes, want 1", deletes)
		}
		for _, id := range []string{other, mine} {
			if _, err := s.Get(ctx, id); err != nil {
				t.Fatalf("%s was touched: %v", id, err)
			}
		}
	})
}

// listCounter counts a provider's List calls.
type listCounter struct{ n atomic.Int64 }

func (c *listCounter) Call(_, op string, _ time.Duration, _ error) {
	if op == "list" {
		c.n.Add(1)
	}
}
func (c *listCounter) BreakerChanged(string, string, string) {}

func TestLeakNeedsTwoSightings(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		opts := *sim.DefaultOptions()
		opts.Nodes = 1
		s, err := sim.New(opts)
		if err != nil {
			t.Fatal(err)
		}
		lists := &listCounter{}
		prov, err := provider.New(s, provider.Config{Name: "sim", Logger: quiet, Observer: lists})
		if err != nil {
			t.Fatal(err)
		}
		defer prov.Close(context.Background())
		ctx := context.Background()
		op, err := s.Create(ctx, "node-1", &driver.Spec{Image: "busybox", Tags: map[string]string{driver.TagManaged: "true", driver.TagCluster: testCluster, driver.TagInstance: "ghost"}})
		if err != nil {
			t.Fatal(err)
		}
		leak, err := driver.Drive(ctx, op)
		if err != nil {
			t.Fatal(err)
		}
		cfg := config(memory.New(memory.Options{}), prov)
		cfg.SyncInterval = 50 * time.Millisecond
		_, stop := start(t, cfg)
		waitFor(t, "the first listing", func() bool { return lists.n.Load() >= 1 })
		// Between the first and the second listing the leak must survive.
		if _, err := s.Get(ctx, leak.ID); err != nil && lists.n.Load() < 2 {
			t.Fatalf("a leak seen once was deleted: %v", err)
		}
		waitFor(t, "the leak deleted after the second sighting", func() bool {
			_, err := s.Get(ctx, leak.ID)
			return errors.Is(err, driver.ErrNotFound)
		})
		if n := lists.n.Load(); n < 2 {
			t.Fatalf("deleted after %d listings", n)
		}
		stop()
	})
}

func TestNodeOfflineReschedulesAndNoDuplicateSurvives(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, prov := newSim(t, 2, nil)
		p, _ := start(t, config(memory.New(memory.Options{}), prov))
		ctx := context.Background()
		r := req("svc", 1)
		r.RestartPolicy = driver.RestartPolicy{Name: "always"}
		plain := req("once", 1)
		ans, err := p.Submit(ctx, r, "")
		if err != nil {
			t.Fatal(err)
		}
		first := waitPhase(t, p, "svc", reconciler.Running)
		node := ans.Instances[0].Node.Name
		plain.Constraints = []string{"node==" + node}
		if _, err := p.Submit(ctx, plain, ""); err != nil {
			t.Fatal(err)
		}
		waitPhase(t, p, "once", reconciler.Running)

		if err := s.SetNodeStatus(node, driver.NodeOffline, "pulled the plug"); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "svc to run on the other node", func() bool {
			in, _ := p.Instance(ctx, "svc")
			return in.Phase == reconciler.Running && in.Node != node
		})
		moved, _ := p.Instance(ctx, "svc")
		if moved.BackendID == first.BackendID || len(moved.Stale) != 1 {
			t.Fatalf("moved instance: %+v", moved)
		}
		if in, _ := p.Instance(ctx, "once"); in.Node != node || in.Phase == reconciler.Pending {
			t.Fatalf("instance without restart policy was moved: %+v", in)
		}
		// While the node is away both copies exist; when it returns the old
		// one is deleted.
		if err := s.SetNodeStatus(node, driver.NodeOnline, ""); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "one copy of svc", func() bool {
			return len(tagged(t, prov, map[string]string{driver.TagInstance: "svc"})) == 1
		})
		got := tagged(t, prov, map[string]string{driver.TagInstance: "svc"})
		if got[0].ID != moved.BackendID {
			t.Fatalf("the surviving copy is %s, want the new one %s", got[0].ID, moved.BackendID)
		}
		waitFor(t, "the stale record cleared", func() bool {
			in, _ := p.Instance(ctx, "svc")
			return len(in.Stale) == 0
		})
	})
}

func TestUnplaceableStaysPendingWithReasonAndIsPlacedWhenCapacityFrees(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		_, prov := newSim(t, 1, nil)
		p, _ := start(t, config(memory.New(memory.Options{}), prov))
		ctx := context.Background()
		big := req("big", 1)
		big.CPU = driver.CPUs(3)
		if _, err := p.Submit(ctx, big, ""); err != nil {
			t.Fatal(err)
		}
		waitPhase(t, p, "big", reconciler.Running)
		second := req("second", 1)
		second.CPU = driver.CPUs(3)
		ans, err := p.Submit(ctx, second, "")
		if err != nil {
			t.Fatal(err)
		}
		if in := ans.Instances[0]; in.Node != nil || in.Instance.Phase != reconciler.Pending || !strings.Contains(in.Instance.Message, "cpu") {
			t.Fatalf("second: %+v (node %v), want pending with a cpu reason", in.Instance, in.Node)
		}
		if err := p.Delete(ctx, "big"); err != nil {
			t.Fatal(err)
		}
		waitPhase(t, p, "second", reconciler.Running)
	})
}

func TestQuotas(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		_, prov := newSim(t, 4, nil)
		cfg := config(memory.New(memory.Options{}), prov)
		cfg.Quotas = []control.Quota{{Owner: "bob", Instances: 2, CPU: driver.CPUs(2)}}
		p, _ := start(t, cfg)
		ctx := context.Background()
		huge := req("huge", 1)
		huge.CPU = driver.CPUs(3)
		if _, err := p.Submit(ctx, huge, "bob"); !errors.Is(err, driver.ErrQuotaExceeded) {
			t.Fatalf("a request that can never fit: %v, want ErrQuotaExceeded", err)
		}
		ans, err := p.Submit(ctx, req("b", 3), "bob")
		if err != nil {
			t.Fatal(err)
		}
		placed := 0
		for _, pl := range ans.Instances {
			if pl.Node != nil {
				placed++
			} else if !strings.Contains(pl.Instance.Message, "quota owner bob") {
				t.Fatalf("pending message %q", pl.Instance.Message)
			}
		}
		if placed != 2 {
			t.Fatalf("%d placed, want 2 (the quota)", placed)
		}
		use, _ := p.Quotas(ctx)
		if len(use) != 1 || use[0].UsedInstances != 2 || use[0].UsedCPU != driver.CPUs(1) {
			t.Fatalf("quota use %+v", use)
		}
		// Others are not limited by bob's quota.
		if ans, err := p.Submit(ctx, req("carol", 1), "carol"); err != nil || ans.Instances[0].Node == nil {
			t.Fatalf("carol: %v %+v", err, ans)
		}
		// Freeing one of bob's lets the third in.
		if err := p.Delete(ctx, "b-0"); err != nil {
			t.Fatal(err)
		}
		waitPhase(t, p, "b-2", reconciler.Running)
	})
}

func TestPoolsKeepMinReadyAndNodeSetsReuseThem(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		_, prov := newSim(t, 2, nil)
		cfg := config(memory.New(memory.Options{}), prov)
		cfg.Pools = []control.Pool{{Name: "ci", Provider: "sim", MaxInstances: 3, Labels: []control.Label{
			{Name: "small", Spec: driver.Spec{Image: "busybox", Resources: driver.Resources{CPU: driver.CPUs(0.5)}}, MinReady: 2},
		}}}
		p, _ := start(t, cfg)
		ctx := context.Background()
		ready := func() []control.Instance {
			list, _ := p.Instances(ctx, control.Filter{Pool: "ci", Phases: []reconciler.Phase{reconciler.Running}})
			return slices.DeleteFunc(list, func(in control.Instance) bool { return in.Owner != "" })
		}
		waitFor(t, "two ready instances", func() bool { return len(ready()) == 2 })
		warm := ready()

		g := scheduler.Group{ID: "job1", Kind: scheduler.KindNodeSet, Provider: "sim", Services: []scheduler.Service{
			{Request: scheduler.Request{Spec: driver.Spec{Name: "small", Image: "busybox"}}},
		}}
		ans, err := p.SubmitGroup(ctx, g, "zuul")
		if err != nil {
			t.Fatal(err)
		}
		if len(ans.Instances) != 1 || !slices.ContainsFunc(warm, func(in control.Instance) bool { return in.ID == ans.Instances[0].Instance.ID }) {
			t.Fatalf("node set got %+v, want one of the warm instances %v", ans.Instances, ids(warm))
		}
		if got := ans.Instances[0].Instance; got.Owner != "zuul" || got.Group != "job1" {
			t.Fatalf("reused instance owner %q group %q", got.Owner, got.Group)
		}
		// The pool tops up to two ready, within its cap of three.
		waitFor(t, "the pool topped up", func() bool { return len(ready()) == 2 })
		all, _ := p.Instances(ctx, control.Filter{Pool: "ci"})
		if len(all) != 3 {
			t.Fatalf("pool holds %d instances, want its cap of 3", len(all))
		}
	})
}

func TestHoldExpires(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		_, prov := newSim(t, 1, nil)
		p, _ := start(t, config(memory.New(memory.Options{}), prov))
		ctx := context.Background()
		if _, err := p.Submit(ctx, req("h", 1), ""); err != nil {
			t.Fatal(err)
		}
		waitPhase(t, p, "h", reconciler.Running)
		if err := p.Hold(ctx, "h", time.Now().Add(50*time.Millisecond)); err != nil {
			t.Fatal(err)
		}
		if ph := phaseOf(t, p, "h"); ph != reconciler.Held && ph != reconciler.Deleting && ph != reconciler.Deleted {
			t.Fatalf("held instance is %s", ph)
		}
		waitPhase(t, p, "h", reconciler.Deleted)
	})
}

func TestStopStartResizeLogsAndEvents(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		_, prov := newSim(t, 1, nil)
		st := memory.New(memory.Options{})
		p, _ := start(t, config(st, prov))
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		events := make(chan control.Event, 1000)
		evDone := make(chan error, 1)
		go func() { evDone <- p.Events(ctx, 0, func(e control.Event) { events <- e }) }()
		// Let the watch start before the first change.
		time.Sleep(20 * time.Millisecond)

		if _, err := p.Submit(ctx, req("app", 1), ""); err != nil {
			t.Fatal(err)
		}
		waitPhase(t, p, "app", reconciler.Running)
		if err := p.Stop(ctx, "app", time.Second); err != nil {
			t.Fatal(err)
		}
		if ph := phaseOf(t, p, "app"); ph != reconciler.Stopped {
			t.Fatalf("after Stop: %s", ph)
		}
		if err := p.Start(ctx, "app"); err != nil {
			t.Fatal(err)
		}
		if ph := phaseOf(t, p, "app"); ph != reconciler.Running {
			t.Fatalf("after Start: %s", ph)
		}
		if err := p.Resize(ctx, "app", driver.Resources{CPU: driver.CPUs(1)}); err != nil {
			t.Fatal(err)
		}
		in, _ := p.Instance(ctx, "app")
		if in.Spec.CPU != driver.CPUs(1) {
			t.Fatalf("resized cpus = %s", in.Spec.CPU)
		}
		if err := p.Resize(ctx, "app", driver.Resources{CPU: driver.CPUs(64)}); !errors.Is(err, driver.ErrInsufficientCapacity) {
			t.Fatalf("oversized resize: %v", err)
		}
		var out strings.Builder
		if err := p.Logs(ctx, "app", driver.LogOptions{Stdout: true, Stderr: true}, &out, io.Discard); err != nil {
			t.Fatal(err)
		}
		if out.Len() == 0 {
			t.Fatal("no log output")
		}
		seen := map[reconciler.Phase]bool{}
		waitFor(t, "events of every phase", func() bool {
			for {
				select {
				case e := <-events:
					if e.Kind == control.EventInstance && e.Instance.ID == "app" {
						seen[e.Instance.Phase] = true
					}
				default:
					return seen[reconciler.Creating] && seen[reconciler.Running] && seen[reconciler.Stopping] && seen[reconciler.Stopped]
				}
			}
		})
		cancel()
		if err := <-evDone; !errors.Is(err, context.Canceled) {
			t.Fatalf("Events returned %v", err)
		}
		nodes, err := p.Nodes(context.Background())
		if err != nil || len(nodes) != 1 || nodes[0].BerthCount != 1 || nodes[0].Berth.CPU != driver.CPUs(1) {
			t.Fatalf("nodes = %+v, %v", nodes, err)
		}
		provs, err := p.Providers(context.Background())
		if err != nil || len(provs) != 1 || provs[0].Name != "sim" || provs[0].Driver != "sim" || provs[0].Health.Breaker != "closed" {
			t.Fatalf("providers = %+v, %v", provs, err)
		}
	})
}

func TestPlanIsADryRun(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		_, prov := newSim(t, 2, nil)
		p, err := control.New(context.Background(), config(memory.New(memory.Options{}), prov))
		if err != nil {
			t.Fatal(err)
		}
		r := req("dry", 3)
		r.Constraints = []string{"node==node-1"}
		ans, err := p.Plan(context.Background(), r)
		if err != nil {
			t.Fatal(err)
		}
		if len(ans.Placements) != 3 || ans.Placements[0].Node.Name != "node-1" {
			t.Fatalf("plan = %+v", ans)
		}
		r.Constraints = []string{"node==mars"}
		ans, err = p.Plan(context.Background(), r)
		if err != nil || ans.Unplaced != 3 || len(ans.Reasons) == 0 || !strings.Contains(ans.Reasons[0], "node==mars") {
			t.Fatalf("plan = %+v, %v", ans, err)
		}
		list, _ := p.Instances(context.Background(), control.Filter{All: true})
		if len(list) != 0 {
			t.Fatalf("a dry run stored instances: %v", ids(list))
		}
	})
}

func TestInstanceLostBehindBerthsBack(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, prov := newSim(t, 2, nil)
		p, _ := start(t, config(memory.New(memory.Options{}), prov))
		ctx := context.Background()
		keep := req("keep", 1)
		keep.RestartPolicy = driver.RestartPolicy{Name: "always"}
		for _, r := range []scheduler.Request{keep, req("gone", 1)} {
			if _, err := p.Submit(ctx, r, ""); err != nil {
				t.Fatal(err)
			}
		}
		first := waitPhase(t, p, "keep", reconciler.Running)
		gone := waitPhase(t, p, "gone", reconciler.Running)
		for _, id := range []string{first.BackendID, gone.BackendID} {
			op, err := s.Delete(ctx, id)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := driver.Drive(ctx, op); err != nil {
				t.Fatal(err)
			}
		}
		in := waitPhase(t, p, "gone", reconciler.Failed)
		if !strings.Contains(in.Message, "lost") {
			t.Fatalf("message %q", in.Message)
		}
		waitFor(t, "keep to run again", func() bool {
			in, _ := p.Instance(ctx, "keep")
			return in.Phase == reconciler.Running && in.BackendID != first.BackendID
		})
	})
}

func TestSubmitBeforeRunIsLaunchedByRun(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		_, prov := newSim(t, 1, nil)
		cfg := config(memory.New(memory.Options{}), prov)
		p, err := control.New(context.Background(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		ans, err := p.Submit(context.Background(), req("early", 1), "")
		if err != nil {
			t.Fatal(err)
		}
		if ph := ans.Instances[0].Instance.Phase; ph != reconciler.Scheduled {
			t.Fatalf("without a running reconciler the instance is %s, want scheduled", ph)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- p.Run(ctx) }()
		waitPhase(t, p, "early", reconciler.Running)
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Fatal(err)
		}
	})
}

func TestGroupEssentialsArePlacedAllOrNone(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		_, prov := newSim(t, 2, nil)
		rec := &recorder{launched: map[string]int{}, failed: map[string]int{}}
		cfg := config(memory.New(memory.Options{}), prov)
		cfg.Metrics = rec
		p, _ := start(t, cfg)
		ctx := context.Background()
		big := req("big", 2)
		big.CPU = driver.CPUs(3)
		big.MaxPerNode = 1
		if _, err := p.Submit(ctx, big, ""); err != nil {
			t.Fatal(err)
		}
		waitPhase(t, p, "big-0", reconciler.Running)
		waitPhase(t, p, "big-1", reconciler.Running)

		svc := func(name string) scheduler.Service {
			return scheduler.Service{Request: scheduler.Request{Spec: driver.Spec{Name: name, Image: "busybox", Resources: driver.Resources{CPU: driver.CPUs(3)}}}}
		}
		g := scheduler.Group{ID: "app", Services: []scheduler.Service{svc("web"), svc("db")}}
		ans, err := p.SubmitGroup(ctx, g, "")
		if err != nil {
			t.Fatal(err)
		}
		if len(ans.Instances) != 2 {
			t.Fatalf("group answer %+v", ans.Instances)
		}
		for _, pl := range ans.Instances {
			if pl.Node != nil || pl.Instance.Phase != reconciler.Pending {
				t.Fatalf("%s placed although its group cannot fit whole: %+v", pl.Instance.ID, pl.Instance)
			}
		}
		passes := func() int {
			n := 0
			rec.get(func() { n = rec.scheduled })
			return n
		}
		// Room for one of the two: the group still waits.
		if err := p.Delete(ctx, "big-0"); err != nil {
			t.Fatal(err)
		}
		waitPhase(t, p, "big-0", reconciler.Deleted)
		before := passes()
		waitFor(t, "three placement passes", func() bool { return passes() >= before+3 })
		for _, pl := range ans.Instances {
			if ph := phaseOf(t, p, pl.Instance.ID); ph != reconciler.Pending {
				t.Fatalf("%s is %s: placed without the rest of its group", pl.Instance.ID, ph)
			}
		}
		// Room for both: the group is placed whole.
		if err := p.Delete(ctx, "big-1"); err != nil {
			t.Fatal(err)
		}
		for _, pl := range ans.Instances {
			waitPhase(t, p, pl.Instance.ID, reconciler.Running)
		}
	})
}

// TestChangesByAnotherWriterAreFollowed writes a deletion request into the
// store behind the plane's back, as another server sharing the store would:
// the plane sees it through its store watch and deletes the instance.
func TestChangesByAnotherWriterAreFollowed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		_, prov := newSim(t, 1, nil)
		st := memory.New(memory.Options{})
		p, _ := start(t, config(st, prov))
		ctx := context.Background()
		if _, err := p.Submit(ctx, req("shared", 1), ""); err != nil {
			t.Fatal(err)
		}
		waitPhase(t, p, "shared", reconciler.Running)
		in, err := p.Record("shared")
		if err != nil {
			t.Fatal(err)
		}
		next, _ := reconciler.Step(in, reconciler.Event{Kind: reconciler.DeleteRequested}, time.Now())
		b, err := json.Marshal(next)
		if err != nil {
			t.Fatal(err)
		}
		res, err := st.Txn(ctx, []store.Cmp{{Key: control.PrefixInstances + "shared", ModRevision: in.Revision}}, []store.Op{store.Put(control.PrefixInstances+"shared", b)})
		if err != nil || !res.Succeeded {
			t.Fatalf("external write: %v %v", res, err)
		}
		waitPhase(t, p, "shared", reconciler.Deleted)
		if got := tagged(t, prov, map[string]string{driver.TagInstance: "shared"}); len(got) != 0 {
			t.Fatalf("still in the back-end: %v", got)
		}
	})
}

func TestWaitingGroupSurvivesARestart(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		_, prov := newSim(t, 2, nil)
		st := memory.New(memory.Options{})
		rec := &recorder{launched: map[string]int{}, failed: map[string]int{}}
		cfg := config(st, prov)
		cfg.Metrics = rec
		p1, stop1 := start(t, cfg)
		ctx := context.Background()
		big := req("big", 2)
		big.CPU = driver.CPUs(3)
		big.MaxPerNode = 1
		if _, err := p1.Submit(ctx, big, ""); err != nil {
			t.Fatal(err)
		}
		waitPhase(t, p1, "big-0", reconciler.Running)
		waitPhase(t, p1, "big-1", reconciler.Running)
		svc := func(name string) scheduler.Service {
			return scheduler.Service{Request: scheduler.Request{Spec: driver.Spec{Name: name, Image: "busybox", Resources: driver.Resources{CPU: driver.CPUs(3)}}}}
		}
		if _, err := p1.SubmitGroup(ctx, scheduler.Group{ID: "app", Services: []scheduler.Service{svc("web"), svc("db")}}, ""); err != nil {
			t.Fatal(err)
		}
		stop1()

		p2, _ := start(t, cfg)
		passes := func() int {
			n := 0
			rec.get(func() { n = rec.scheduled })
			return n
		}
		if err := p2.Delete(ctx, "big-0"); err != nil {
			t.Fatal(err)
		}
		waitPhase(t, p2, "big-0", reconciler.Deleted)
		before := passes()
		waitFor(t, "three placement passes", func() bool { return passes() >= before+3 })
		for _, id := range []string{"app.web", "app.db"} {
			if ph := phaseOf(t, p2, id); ph != reconciler.Pending {
				t.Fatalf("%s is %s: placed without the rest of its group after a restart", id, ph)
			}
		}
		if err := p2.Delete(ctx, "big-1"); err != nil {
			t.Fatal(err)
		}
		waitPhase(t, p2, "app.web", reconciler.Running)
		waitPhase(t, p2, "app.db", reconciler.Running)
	})
}

// TestSpecSharedButNeverAliased checks the instances of a request, which
// share one spec in the plane: a resize changes one instance only, what a
// caller does with an instance it was given changes nothing, and after a
// restart the instances share their spec again.
func TestSpecSharedButNeverAliased(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		_, prov := newSim(t, 3, nil)
		st := memory.New(memory.Options{})
		p, stop := start(t, config(st, prov))
		ctx := context.Background()
		ans, err := p.Submit(ctx, req("trio", 3), "")
		if err != nil {
			t.Fatal(err)
		}
		ans.Instances[1].Instance.Spec.Image = "changed-by-the-caller"
		for _, id := range []string{"trio-0", "trio-1", "trio-2"} {
			waitPhase(t, p, id, reconciler.Running)
		}
		if err := p.Resize(ctx, "trio-0", driver.Resources{CPU: driver.CPUs(1)}); err != nil {
			t.Fatal(err)
		}
		got, err := p.Instance(ctx, "trio-2")
		if err != nil {
			t.Fatal(err)
		}
		got.Spec.Memory = 1 // a caller's change
		check := func(p *control.Plane) {
			t.Helper()
			for id, cpu := range map[string]driver.MilliCPU{"trio-0": driver.CPUs(1), "trio-1": driver.CPUs(0.5), "trio-2": driver.CPUs(0.5)} {
				in, err := p.Instance(ctx, id)
				if err != nil {
					t.Fatal(err)
				}
				if in.Spec.CPU != cpu || in.Spec.Memory != 256*driver.MiB || in.Spec.Image != "busybox" {
					t.Fatalf("%s: cpus %s, memory %s, image %q; want %s, 256Mi, busybox", id, in.Spec.CPU, in.Spec.Memory, in.Spec.Image, cpu)
				}
			}
		}
		check(p)
		stop()
		p2, _ := start(t, config(st, prov))
		check(p2)
	})
}

func TestPlaceRoundWaitsForARoundOfRun(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		_, prov := newSim(t, 1, nil)
		p, err := control.New(context.Background(), config(memory.New(memory.Options{}), prov))
		if err != nil {
			t.Fatal(err)
		}
		// Without Run there is no placer: PlaceRound waits for its context.
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		if err := p.PlaceRound(ctx); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("PlaceRound without Run: %v, want the context's deadline", err)
		}
		big := req("big", 1)
		big.CPU = driver.CPUs(3)
		if _, err := p.Submit(context.Background(), big, ""); err != nil {
			t.Fatal(err)
		}
		second := req("second", 1)
		second.CPU = driver.CPUs(3)
		if _, err := p.Submit(context.Background(), second, ""); err != nil {
			t.Fatal(err)
		}
		runCtx, stop := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- p.Run(runCtx) }()
		defer func() { stop(); <-done }()
		waitPhase(t, p, "big", reconciler.Running)
		// A round that starts after PlaceRound is called has decided the
		// waiting instance when it returns: it still does not fit, and says why.
		if err := p.PlaceRound(context.Background()); err != nil {
			t.Fatal(err)
		}
		if in, err := p.Instance(context.Background(), "second"); err != nil || in.Phase != reconciler.Pending {
			t.Fatalf("second: %+v, %v; want pending", in, err)
		}
	})
}

// TestQueuePolicyOrdersWaitingGroups fills the one node, queues a group of
// 3 cpus, then one of 2, and frees the node: fifo places the first come
// (3 cpus; the other no longer fits), size the smallest (2 cpus; the
// other no longer fits).
func TestQueuePolicyOrdersWaitingGroups(t *testing.T) {
	for _, tc := range []struct {
		policy        scheduler.Policy
		placed, waits string
	}{
		{scheduler.PolicyFIFO, "three.three", "two.two"},
		{scheduler.PolicySize, "two.two", "three.three"},
	} {
		t.Run(string(tc.policy), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				_, prov := newSim(t, 1, nil)
				cfg := config(memory.New(memory.Options{}), prov)
				cfg.QueuePolicy = tc.policy
				p, _ := start(t, cfg)
				ctx := context.Background()
				full := req("full", 1)
				full.CPU = driver.CPUs(4)
				if _, err := p.Submit(ctx, full, ""); err != nil {
					t.Fatal(err)
				}
				waitPhase(t, p, "full", reconciler.Running)
				group := func(id string, cpus float64) scheduler.Group {
					return scheduler.Group{ID: id, Services: []scheduler.Service{{Request: scheduler.Request{Spec: driver.Spec{
						Name: id, Image: "busybox", Type: driver.TypeBatch, Resources: driver.Resources{CPU: driver.CPUs(cpus)}}}}}}
				}
				for _, g := range []scheduler.Group{group("three", 3), group("two", 2)} {
					if _, err := p.SubmitGroup(ctx, g, ""); err != nil {
						t.Fatal(err)
					}
					// One after the other: fifo tells them apart by arrival.
					time.Sleep(time.Second)
				}
				if err := p.Delete(ctx, "full"); err != nil {
					t.Fatal(err)
				}
				waitPhase(t, p, tc.placed, reconciler.Running)
				if ph := phaseOf(t, p, tc.waits); ph != reconciler.Pending {
					t.Fatalf("%s is %s, want pending: the queue's order is not %s", tc.waits, ph, tc.policy)
				}
			})
		})
	}
}

// TestPoolQueuePolicy fills the one node and queues two groups of 3 and
// 2 cpus, then frees the node, under a server whose queue is fifo and a
// pool "ci" whose own queue is size. Node sets of the pool wait in its
// queue: the smaller is placed though it came second. Groups of no pool
// wait in the server's: the first come is placed.
func TestPoolQueuePolicy(t *testing.T) {
	spec := func(cpus float64) driver.Spec {
		return driver.Spec{Image: "busybox", Type: driver.TypeBatch, Resources: driver.Resources{CPU: driver.CPUs(cpus)}}
	}
	nodeSet := func(id string, _ float64) scheduler.Group {
		return scheduler.Group{ID: id, Kind: scheduler.KindNodeSet, Pool: "ci", Services: []scheduler.Service{{Request: scheduler.Request{Spec: driver.Spec{Name: id}}}}}
	}
	plain := func(id string, cpus float64) scheduler.Group {
		sp := spec(cpus)
		sp.Name = id
		return scheduler.Group{ID: id, Services: []scheduler.Service{{Request: scheduler.Request{Spec: sp}}}}
	}
	for _, tc := range []struct {
		name          string
		group         func(id string, cpus float64) scheduler.Group
		placed, waits string
	}{
		{"pool size", nodeSet, "two.two", "three.three"},
		{"server fifo", plain, "three.three", "two.two"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				_, prov := newSim(t, 1, nil)
				cfg := config(memory.New(memory.Options{}), prov)
				cfg.QueuePolicy = scheduler.PolicyFIFO
				cfg.Pools = []control.Pool{{Name: "ci", Provider: "sim", QueuePolicy: scheduler.PolicySize, Labels: []control.Label{
					{Name: "three", Spec: spec(3)}, {Name: "two", Spec: spec(2)},
				}}}
				p, _ := start(t, cfg)
				ctx := context.Background()
				full := req("full", 1)
				full.CPU = driver.CPUs(4)
				if _, err := p.Submit(ctx, full, ""); err != nil {
					t.Fatal(err)
				}
				waitPhase(t, p, "full", reconciler.Running)
				for _, g := range []scheduler.Group{tc.group("three", 3), tc.group("two", 2)} {
					if _, err := p.SubmitGroup(ctx, g, "zuul"); err != nil {
						t.Fatal(err)
					}
					time.Sleep(time.Second)
				}
				if err := p.Delete(ctx, "full"); err != nil {
					t.Fatal(err)
				}
				waitPhase(t, p, tc.placed, reconciler.Running)
				if ph := phaseOf(t, p, tc.waits); ph != reconciler.Pending {
					t.Fatalf("%s is %s, want pending", tc.waits, ph)
				}
			})
		})
	}
}

// TestNodeSetByPoolLabels asks for three instances of a pool's label by
// name alone: the ready one is handed out, the other two are launched with
// the label's spec on the pool's provider. Unknown pools and labels are
// refused naming the field.
func TestNodeSetByPoolLabels(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		_, prov := newSim(t, 2, nil)
		cfg := config(memory.New(memory.Options{}), prov)
		cfg.Pools = []control.Pool{{Name: "ci", Provider: "sim", Labels: []control.Label{
			{Name: "sleeper", Spec: driver.Spec{Image: "sleeper:1", Resources: driver.Resources{CPU: driver.CPUs(0.25), Memory: 64 * driver.MiB}}, MinReady: 1},
		}}}
		p, _ := start(t, cfg)
		ctx := context.Background()
		ready := func() []control.Instance {
			list, _ := p.Instances(ctx, control.Filter{Pool: "ci", Phases: []reconciler.Phase{reconciler.Running}})
			return slices.DeleteFunc(list, func(in control.Instance) bool { return in.Owner != "" })
		}
		waitFor(t, "a ready instance", func() bool { return len(ready()) == 1 })
		warm := ready()[0].ID

		for _, bad := range []struct {
			g    scheduler.Group
			path string
		}{
			{scheduler.Group{ID: "x", Kind: scheduler.KindNodeSet, Pool: "nope", Services: []scheduler.Service{{Request: scheduler.Request{Spec: driver.Spec{Name: "sleeper"}}}}}, "pool"},
			{scheduler.Group{ID: "x", Kind: scheduler.KindNodeSet, Pool: "ci", Services: []scheduler.Service{{Request: scheduler.Request{Spec: driver.Spec{Name: "waker"}}}}}, "services[0].name"},
			{scheduler.Group{ID: "x", Pool: "ci", Services: []scheduler.Service{{Request: scheduler.Request{Spec: driver.Spec{Name: "sleeper", Image: "x"}}}}}, "pool"},
		} {
			if _, err := p.SubmitGroup(ctx, bad.g, "zuul"); !drivertest.HasField(err, bad.path) {
				t.Errorf("pool %q, service %q: %v, want an error naming %s", bad.g.Pool, bad.g.Services[0].Name, err, bad.path)
			}
		}

		g := scheduler.Group{ID: "job", Kind: scheduler.KindNodeSet, Pool: "ci", Services: []scheduler.Service{
			{Request: scheduler.Request{Spec: driver.Spec{Name: "sleeper"}, Count: 3}},
		}}
		ans, err := p.SubmitGroup(ctx, g, "zuul")
		if err != nil {
			t.Fatal(err)
		}
		if len(ans.Instances) != 3 || ans.Instances[0].Instance.ID != warm {
			t.Fatalf("node set got %v, want the warm %s first and two more", placedIDs(ans.Instances), warm)
		}
		for _, pl := range ans.Instances {
			in := waitPhase(t, p, pl.Instance.ID, reconciler.Running)
			if in.Spec == nil || in.Spec.Image != "sleeper:1" || in.Spec.CPU != driver.CPUs(0.25) || in.Provider != "sim" || in.Owner != "zuul" || in.Group != "job" {
				t.Fatalf("%s: spec %+v on %s, owner %q, group %q", in.ID, in.Spec, in.Provider, in.Owner, in.Group)
			}
		}
	})
}

func placedIDs(ps []control.Placed) []string {
	var out []string
	for _, p := range ps {
		out = append(out, p.Instance.ID)
	}
	return out
}

// unreadable is a sim back-end whose Get says not found for the copies in
// hidden while List shows them: how an engine shows a create still in
// flight, or one it undid when its caller went away. Its creates go on
// when their caller goes away, as a crashed server's do in an engine.
type unreadable struct {
	*sim.Sim
	mu     sync.Mutex
	hidden map[string]bool
}

func (u *unreadable) Create(ctx context.Context, node string, spec *driver.Spec) (driver.Operation, error) {
	return u.Sim.Create(context.WithoutCancel(ctx), node, spec)
}

func (u *unreadable) Get(ctx context.Context, id string) (*driver.Instance, error) {
	u.mu.Lock()
	hide := u.hidden[id]
	u.mu.Unlock()
	if hide {
		return nil, fmt.Errorf("%w: %s is listed but cannot be read", driver.ErrNotFound, id)
	}
	return u.Sim.Get(ctx, id)
}

func (u *unreadable) hide(ids []*driver.Instance, hidden bool) {
	u.mu.Lock()
	defer u.mu.Unlock()
	for _, in := range ids {
		u.hidden[in.ID] = hidden
	}
}

// heldClock reads one time while held and the (bubble's) time after.
type heldClock struct {
	mu   sync.Mutex
	held bool
	at   time.Time
}

func (c *heldClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.held {
		return c.at
	}
	return time.Now()
}

func (c *heldClock) release() {
	c.mu.Lock()
	c.held = false
	c.mu.Unlock()
}

// TestResumedLaunchOfUnreadableCopy: a server that resumes the launches of
// one that died meets copies still being built that the back-end lists but
// cannot show yet, or ever. It waits for them; one that becomes readable is
// adopted, one that never does is deleted and its instance launched again.
// No launch fails, and no node is refused, for a copy the back-end hid.
func TestResumedLaunchOfUnreadableCopy(t *testing.T) {
	for _, tc := range []struct {
		name   string
		adopts bool // the copies become readable
	}{
		{name: "readable-later", adopts: true},
		{name: "never-readable", adopts: false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				clock := &heldClock{held: true, at: time.Now()}
				s, _ := newSim(t, 2, func(o *sim.Options) { o.CreateLatency = time.Second; o.Clock = clock })
				u := &unreadable{Sim: s, hidden: map[string]bool{}}
				prov, err := provider.New(u, provider.Config{Name: "sim", Logger: quiet, StateTTL: time.Millisecond})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = prov.Close(context.Background()) })
				st := memory.New(memory.Options{})
				p1, stop1 := start(t, config(st, prov))
				const n = 4
				if _, err := p1.Submit(context.Background(), req("held", n), ""); err != nil {
					t.Fatal(err)
				}
				mine := map[string]string{driver.TagCluster: testCluster}
				waitFor(t, "every copy under way", func() bool { return len(tagged(t, prov, mine)) == n })
				stop1()
				first := tagged(t, prov, mine)
				u.hide(first, true)
				// The copies are built 2 s into the next server's term; only
				// those of the first case can be read from then on.
				time.AfterFunc(2*time.Second, func() {
					clock.release()
					if tc.adopts {
						u.hide(first, false)
					}
				})

				cfg := config(st, prov)
				cfg.LaunchTimeout = time.Minute // the wait for the copies, not a launch timeout, decides
				p2, _ := start(t, cfg)
				for i := range n {
					in := waitPhase(t, p2, fmt.Sprintf("held-%d", i), reconciler.Running)
					if len(in.Refused) != 0 {
						t.Errorf("%s: nodes refused for a copy that could not be read: %v", in.ID, in.Refused)
					}
					adopted := false
					for _, c := range first {
						adopted = adopted || c.ID == in.BackendID
					}
					if adopted != tc.adopts {
						t.Errorf("%s runs as %s: adopted the first copy %v, want %v", in.ID, in.BackendID, adopted, tc.adopts)
					}
				}
				waitFor(t, "exactly one copy of each instance", func() bool { return len(tagged(t, prov, mine)) == n })
			})
		})
	}
}

// countCalls returns how many calls of op the sim has logged.
func countCalls(s *sim.Sim, op string) int {
	n := 0
	for _, c := range s.Calls() {
		if c.Op == op {
			n++
		}
	}
	return n
}
