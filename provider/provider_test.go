package provider_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/provider"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// recorder is an Observer that keeps what it is told.
type recorder struct {
	mu          sync.Mutex
	calls       []string
	errs        []error
	transitions []string
}

func (r *recorder) Call(prov, op string, d time.Duration, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls = append(r.calls, prov+"/"+op)
	r.errs = append(r.errs, err)
}

func (r *recorder) BreakerChanged(prov, from, to string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.transitions = append(r.transitions, prov+":"+from+"->"+to)
}

func (r *recorder) snapshot() (calls []string, transitions []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.calls...), append([]string(nil), r.transitions...)
}

type nopObserver struct{}

func (nopObserver) Call(string, string, time.Duration, error) {}
func (nopObserver) BreakerChanged(string, string, string)     {}

// discard is a logger that drops everything.
var discard = slog.New(slog.DiscardHandler)

func newProvider(t *testing.T, d driver.Driver, cfg provider.Config) *provider.Provider {
	t.Helper()
	if cfg.Name == "" {
		cfg.Name = "test"
	}
	if cfg.Logger == nil {
		cfg.Logger = discard
	}
	p, err := provider.New(d, cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return p
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestNewValidatesConfig(t *testing.T) {
	cases := []struct {
		name  string
		d     driver.Driver
		cfg   provider.Config
		paths []string
	}{
		{"no name", newFake(), provider.Config{}, []string{"name"}},
		{"no driver", nil, provider.Config{Name: "x"}, []string{"driver"}},
		{"negative rates", newFake(), provider.Config{Name: "x", ReadRate: -1, WriteBurst: -2}, []string{"read_rate", "write_burst"}},
		{"negative durations", newFake(), provider.Config{Name: "x", CallTimeout: -1, BreakerOpenFor: -1, StateTTL: -1, WatchInterval: -1},
			[]string{"call_timeout", "breaker_open_for", "state_ttl", "watch_interval"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := provider.New(c.d, c.cfg)
			if !errors.Is(err, driver.ErrInvalid) {
				t.Fatalf("err = %v, want ErrInvalid", err)
			}
			var fes driver.FieldErrors
			if !errors.As(err, &fes) {
				t.Fatalf("err = %v, want FieldErrors", err)
			}
			var got []string
			for _, fe := range fes {
				got = append(got, fe.Path)
			}
			if strings.Join(got, ",") != strings.Join(c.paths, ",") {
				t.Fatalf("paths = %v, want %v", got, c.paths)
			}
		})
	}
	p, err := provider.New(newFake(), provider.Config{Name: "ok"})
	if err != nil {
		t.Fatalf("New with defaults: %v", err)
	}
	if p.Name() != "ok" || p.Health().Breaker != "closed" {
		t.Fatalf("name %q health %+v", p.Name(), p.Health())
	}
}

func TestCapabilities(t *testing.T) {
	if got := newProvider(t, newFake(), provider.Config{}).Capabilities(); len(got) != 0 {
		t.Fatalf("bare driver capabilities = %v", got)
	}
	got := newProvider(t, lifecycle{newFake()}, provider.Config{}).Capabilities()
	if strings.Join(got, ",") != "logs,start,stop" {
		t.Fatalf("lifecycle capabilities = %v", got)
	}
}

func TestBreakerOpensAndFailsFast(t *testing.T) {
	ctx := testCtx(t)
	f := newFake()
	rec := &recorder{}
	p := newProvider(t, f, provider.Config{Name: "flaky", BreakerFailures: 3, BreakerOpenFor: time.Hour, Observer: rec})
	boom := errors.New("connection reset")
	f.setFault("get", boom)
	for i := range 3 {
		if _, err := p.Get(ctx, "i-1"); !errors.Is(err, boom) {
			t.Fatalf("call %d: err = %v, want the driver's error", i, err)
		}
	}
	h := p.Health()
	if h.Breaker != "open" || h.ConsecutiveFailures != 3 || h.LastError != boom.Error() || h.LastErrorAt.IsZero() {
		t.Fatalf("health after 3 failures = %+v", h)
	}
	// Open: every kind of call fails at once without reaching the driver.
	before := len(f.callLog())
	_, err := p.Get(ctx, "i-1")
	if !errors.Is(err, driver.ErrRetryable) {
		t.Fatalf("open breaker: err = %v, want ErrRetryable", err)
	}
	msg := err.Error()
	for _, want := range []string{`"flaky"`, "open after 3 consecutive failures", "connection reset", "lets a call through again at"} {
		if !strings.Contains(msg, want) {
			t.Errorf("open-breaker error %q does not say %q", msg, want)
		}
	}
	if _, err := p.List(ctx, nil); !errors.Is(err, driver.ErrRetryable) {
		t.Fatalf("List with open breaker: %v", err)
	}
	if _, err := p.Create(ctx, "n1", &driver.Spec{Image: "alpine:3"}); !errors.Is(err, driver.ErrRetryable) {
		t.Fatalf("Create with open breaker: %v", err)
	}
	if n := len(f.callLog()); n != before {
		t.Fatalf("driver was called %d times while the breaker was open", n-before)
	}
	_, transitions := rec.snapshot()
	if strings.Join(transitions, " ") != "flaky:closed->open" {
		t.Fatalf("transitions = %v", transitions)
	}
}

func TestAnswersDoNotTripBreaker(t *testing.T) {
	answers := []error{
		driver.ErrNotFound, driver.ErrInvalid, driver.ErrAlreadyExists, driver.ErrUnsupported,
		driver.ErrNotSuspended, driver.ErrQuotaExceeded, driver.ErrInsufficientCapacity, driver.ErrPermanent,
	}
	for _, kind := range answers {
		t.Run(kind.Error(), func(t *testing.T) {
			ctx := testCtx(t)
			f := newFake()
			p := newProvider(t, f, provider.Config{BreakerFailures: 2, BreakerOpenFor: time.Hour})
			f.setFault("get", driver.Errorf(kind, "answer"))
			for range 10 {
				if _, err := p.Get(ctx, "x"); !errors.Is(err, kind) {
					t.Fatalf("err = %v, want %v", err, kind)
				}
			}
			if h := p.Health(); h.Breaker != "closed" || h.ConsecutiveFailures != 0 {
				t.Fatalf("health after answers = %+v", h)
			}
		})
	}
	for _, kind := range []error{driver.ErrRetryable, driver.ErrTimeout, driver.ErrDeleteFailed} {
		t.Run("failure "+kind.Error(), func(t *testing.T) {
			ctx := testCtx(t)
			f := newFake()
			p := newProvider(t, f, provider.Config{BreakerFailures: 2, BreakerOpenFor: time.Hour})
			f.setFault("get", driver.Errorf(kind, "failure"))
			for range 2 {
				p.Get(ctx, "x")
			}
			if h := p.Health(); h.Breaker != "open" {
				t.Fatalf("health after 2 %v = %+v", kind, h)
			}
		})
	}
}

func TestAnswerResetsConsecutiveFailures(t *testing.T) {
	ctx := testCtx(t)
	f := newFake()
	p := newProvider(t, f, provider.Config{BreakerFailures: 3, BreakerOpenFor: time.Hour})
	boom := errors.New("boom")
	for range 3 {
		f.setFault("get", boom)
		p.Get(ctx, "x")
		p.Get(ctx, "x")
		f.setFault("get", nil)
		if _, err := p.Get(ctx, "x"); !errors.Is(err, driver.ErrNotFound) {
			t.Fatalf("err = %v, want ErrNotFound", err)
		}
	}
	if h := p.Health(); h.Breaker != "closed" || h.ConsecutiveFailures != 0 {
		t.Fatalf("health = %+v, want closed with 0 failures", h)
	}
}

// waitBreaker waits until the breaker reports want.
func waitBreaker(t *testing.T, ctx context.Context, p *provider.Provider, want string) {
	t.Helper()
	for p.Health().Breaker != want {
		select {
		case <-ctx.Done():
			t.Fatalf("breaker never became %s: %+v", want, p.Health())
		case <-time.After(5 * time.Millisecond):
		}
	}
}

func TestBreakerHalfOpenRecovery(t *testing.T) {
	ctx := testCtx(t)
	f := newFake()
	rec := &recorder{}
	p := newProvider(t, f, provider.Config{Name: "p", BreakerFailures: 2, BreakerOpenFor: 20 * time.Millisecond, Observer: rec})
	f.put(driver.Instance{ID: "i-1", State: driver.StateRunning})
	boom := errors.New("boom")
	f.setFault("get", boom)
	p.Get(ctx, "i-1")
	p.Get(ctx, "i-1")
	waitBreaker(t, ctx, p, "half-open")

	// A failing trial call opens the breaker again at once.
	if _, err := p.Get(ctx, "i-1"); !errors.Is(err, boom) {
		t.Fatalf("trial call: err = %v, want the driver's error", err)
	}
	if h := p.Health(); h.Breaker != "open" {
		t.Fatalf("after a failed trial: %+v", h)
	}
	waitBreaker(t, ctx, p, "half-open")

	// A successful trial call closes it.
	f.setFault("get", nil)
	if in, err := p.Get(ctx, "i-1"); err != nil || in.ID != "i-1" {
		t.Fatalf("trial call: %v %v", in, err)
	}
	if h := p.Health(); h.Breaker != "closed" || h.ConsecutiveFailures != 0 {
		t.Fatalf("after a good trial: %+v", h)
	}
	_, transitions := rec.snapshot()
	want := "p:closed->open p:open->half-open p:half-open->open p:open->half-open p:half-open->closed"
	if got := strings.Join(transitions, " "); got != want {
		t.Fatalf("transitions:\n got %s\nwant %s", got, want)
	}
}

func TestHalfOpenAllowsOneTrial(t *testing.T) {
	ctx := testCtx(t)
	f := newFake()
	f.put(driver.Instance{ID: "i-1", State: driver.StateRunning})
	p := newProvider(t, f, provider.Config{BreakerFailures: 1, BreakerOpenFor: time.Millisecond})
	f.setFault("get", errors.New("boom"))
	p.Get(ctx, "i-1")
	waitBreaker(t, ctx, p, "half-open")
	f.setFault("get", nil)

	// The trial call hangs in the driver...
	f.setHang("get", true)
	f.setNotify(make(chan string, 1))
	tctx, cancel := context.WithCancel(ctx)
	trial := make(chan error, 1)
	go func() { _, err := p.Get(tctx, "i-1"); trial <- err }()
	select {
	case op := <-f.notify:
		if op != "get" {
			t.Fatalf("driver saw %s", op)
		}
	case <-ctx.Done():
		t.Fatal("the trial call never reached the driver")
	}
	f.setNotify(nil)
	// ...so other calls are refused at once.
	n := f.count("get")
	_, err := p.Get(ctx, "i-1")
	if !errors.Is(err, driver.ErrRetryable) || !strings.Contains(err.Error(), "half-open") {
		t.Fatalf("second call during the trial: %v", err)
	}
	if f.count("get") != n {
		t.Fatal("a second call reached the driver during the trial")
	}
	// The caller giving up on the trial frees the slot without a verdict.
	cancel()
	if err := <-trial; !errors.Is(err, context.Canceled) {
		t.Fatalf("trial: %v", err)
	}
	if h := p.Health(); h.Breaker != "half-open" {
		t.Fatalf("after an abandoned trial: %+v", h)
	}
	f.setHang("get", false)
	if _, err := p.Get(ctx, "i-1"); err != nil {
		t.Fatal(err)
	}
	if h := p.Health(); h.Breaker != "closed" {
		t.Fatalf("after a good trial: %+v", h)
	}
}

func TestOperationErrorsFeedBreaker(t *testing.T) {
	ctx := testCtx(t)
	f := newFake()
	rec := &recorder{}
	p := newProvider(t, f, provider.Config{BreakerFailures: 2, BreakerOpenFor: time.Hour, Observer: rec})
	f.setFault("create.advance", driver.Errorf(driver.ErrRetryable, "hypervisor busy"))
	// Both creates are accepted first: a successful call in between would
	// reset the count of consecutive failures.
	var ops []driver.Operation
	for range 2 {
		op, err := p.Create(ctx, "n1", &driver.Spec{Image: "alpine:3"})
		if err != nil {
			t.Fatal(err)
		}
		ops = append(ops, op)
	}
	for i, op := range ops {
		if _, err := driver.Drive(ctx, op); !errors.Is(err, driver.ErrRetryable) {
			t.Fatalf("create %d: err = %v", i, err)
		}
		// A finished operation repeats its result without calling the driver.
		n := f.count("create.advance")
		if _, err := op.Advance(ctx); !errors.Is(err, driver.ErrRetryable) || f.count("create.advance") != n {
			t.Fatalf("repeat Advance: err %v, driver calls %d -> %d", err, n, f.count("create.advance"))
		}
	}
	if h := p.Health(); h.Breaker != "open" {
		t.Fatalf("health = %+v, want open", h)
	}
	calls, _ := rec.snapshot()
	if strings.Count(strings.Join(calls, " "), "test/create.advance") != 2 {
		t.Fatalf("observer calls = %v, want two create.advance", calls)
	}
}

func TestOpenBreakerDefersAdvance(t *testing.T) {
	ctx := testCtx(t)
	f := newFake()
	p := newProvider(t, f, provider.Config{BreakerFailures: 1, BreakerOpenFor: time.Hour})
	op, err := p.Create(ctx, "n1", &driver.Spec{Image: "alpine:3"})
	if err != nil {
		t.Fatal(err)
	}
	pr, err := op.Advance(ctx)
	if err != nil || pr.Instance == nil || pr.Done {
		t.Fatalf("first Advance = %+v, %v", pr, err)
	}
	f.setFault("get", errors.New("boom"))
	p.Get(ctx, "x") // opens the breaker
	n := f.count("create.advance")
	pr2, err := op.Advance(ctx)
	if err != nil || pr2.Done || pr2.Wait <= 0 || pr2.Instance == nil || pr2.Instance.ID != pr.Instance.ID {
		t.Fatalf("Advance with open breaker = %+v, %v; want a Wait and the known instance", pr2, err)
	}
	if f.count("create.advance") != n {
		t.Fatal("Advance reached the driver while the breaker was open")
	}
}

// Create and Delete never wait for the write budget: over it, they return
// a *provider.Busy at once, without reaching the driver, saying when a
// change is to spare again.
func TestCreateAndDeleteDoNotWaitForTheBudget(t *testing.T) {
	ctx := testCtx(t)
	f := newFake()
	f.put(driver.Instance{ID: "i-1", State: driver.StateRunning})
	// One change per 1000 s with a burst of 1.
	p := newProvider(t, lifecycle{f}, provider.Config{WriteRate: 0.001, WriteBurst: 1})
	if _, err := p.Create(ctx, "n1", &driver.Spec{Image: "alpine:3"}); err != nil {
		t.Fatal(err)
	}
	for _, call := range []struct {
		op string
		fn func() error
	}{
		{"create", func() error { _, err := p.Create(ctx, "n1", &driver.Spec{Image: "alpine:3"}); return err }},
		{"delete", func() error { _, err := p.Delete(ctx, "i-1"); return err }},
	} {
		err := call.fn()
		busy, ok := errors.AsType[*provider.Busy](err)
		if !ok || !errors.Is(err, driver.ErrRetryable) {
			t.Fatalf("%s over the budget: %v, want a *provider.Busy matching ErrRetryable", call.op, err)
		}
		if busy.Op != call.op || busy.Wait < 900*time.Second || !strings.Contains(err.Error(), "write budget is spent") {
			t.Errorf("%s: %+v (%v), want the op and a wait of about 1000s", call.op, busy, err)
		}
	}
	if n := f.count("create"); n != 1 {
		t.Errorf("the driver saw %d creates, want 1", n)
	}
	if n := f.count("delete"); n != 0 {
		t.Errorf("the driver saw %d deletes, want 0", n)
	}
}

func TestBudgetsAreSeparate(t *testing.T) {
	ctx := testCtx(t)
	f := newFake()
	f.put(driver.Instance{ID: "i-1", State: driver.StateRunning})
	// One change per 1000 s with a burst of 1; reads unlimited.
	p := newProvider(t, lifecycle{f}, provider.Config{WriteRate: 0.001, WriteBurst: 1})
	if err := p.Start(ctx, "i-1"); err != nil {
		t.Fatal(err)
	}
	// A wait that cannot end before the caller's deadline is refused at once.
	dctx, dcancel := context.WithTimeout(ctx, time.Second)
	defer dcancel()
	if err := p.Start(dctx, "i-1"); !errors.Is(err, driver.ErrRetryable) {
		t.Fatalf("second write with a deadline: err = %v, want ErrRetryable", err)
	}
	// Without a deadline the write waits for its token.
	wctx, cancel := context.WithCancel(context.Background())
	blocked := make(chan error, 1)
	go func() { blocked <- p.Start(wctx, "i-1") }()
	// Reads go through while the second write waits for its token.
	for i := range 20 {
		if _, err := p.Get(ctx, "i-1"); err != nil {
			t.Fatalf("read %d: %v", i, err)
		}
	}
	select {
	case err := <-blocked:
		t.Fatalf("second write returned before its token came: %v", err)
	default:
	}
	cancel()
	err := <-blocked
	if !errors.Is(err, driver.ErrRetryable) {
		t.Fatalf("cancelled write: err = %v, want ErrRetryable", err)
	}
	if f.count("start") != 1 || f.count("get") != 20 {
		t.Fatalf("driver calls = %v", f.callLog())
	}
	if h := p.Health(); h.ConsecutiveFailures != 0 {
		t.Fatalf("waiting for a budget counted as a failure: %+v", h)
	}

	// And the other way round: reads spent, changes still pass.
	f2 := newFake()
	f2.put(driver.Instance{ID: "i-1", State: driver.StateRunning})
	p2 := newProvider(t, lifecycle{f2}, provider.Config{ReadRate: 0.001, ReadBurst: 2})
	for range 2 {
		if _, err := p2.Get(ctx, "i-1"); err != nil {
			t.Fatal(err)
		}
	}
	// rate.Limiter refuses at once a wait that cannot end before the deadline.
	if _, err := p2.Get(dctx, "i-1"); !errors.Is(err, driver.ErrRetryable) {
		t.Fatalf("third read: err = %v, want ErrRetryable", err)
	}
	for range 5 {
		if err := p2.Stop(ctx, "i-1", time.Second); err != nil {
			t.Fatal(err)
		}
	}
	if f2.count("get") != 2 || f2.count("stop(1s)") != 5 {
		t.Fatalf("driver calls = %v", f2.callLog())
	}
}

func TestAdvanceNeverBlocksOverBudget(t *testing.T) {
	ctx := testCtx(t)
	f := newFake()
	p := newProvider(t, f, provider.Config{ReadRate: 0.001, ReadBurst: 1})
	op, err := p.Create(ctx, "n1", &driver.Spec{Image: "alpine:3"})
	if err != nil {
		t.Fatal(err)
	}
	pr, err := op.Advance(ctx)
	if err != nil || pr.Instance == nil {
		t.Fatalf("first Advance = %+v, %v", pr, err)
	}
	for range 3 {
		pr, err := op.Advance(ctx)
		if err != nil || pr.Done || pr.Wait <= 0 {
			t.Fatalf("Advance over budget = %+v, %v; want a Wait", pr, err)
		}
		if pr.Wait < 100*time.Second {
			t.Fatalf("Wait = %s, want about the time to the next token (1000s)", pr.Wait)
		}
	}
	if n := f.count("create.advance"); n != 1 {
		t.Fatalf("driver Advance called %d times, want 1", n)
	}
}

// queuedFake's creates wait their turn in the driver for ever.
type queuedFake struct{ *fake }

func (queuedFake) Create(context.Context, string, *driver.Spec) (driver.Operation, error) {
	return queuedOp{}, nil
}

type queuedOp struct{}

func (queuedOp) Advance(context.Context) (driver.Progress, error) {
	return driver.Progress{Queued: true, Wait: time.Second}, nil
}

// An Advance held back by the read budget reports the operation as queued
// as the driver last said it was: the caller's launch timeout goes on
// waiting.
func TestAdvanceOverBudgetKeepsQueued(t *testing.T) {
	ctx := testCtx(t)
	p := newProvider(t, queuedFake{newFake()}, provider.Config{ReadRate: 0.001, ReadBurst: 1})
	op, err := p.Create(ctx, "n1", &driver.Spec{Image: "alpine:3"})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		pr, err := op.Advance(ctx)
		if err != nil || !pr.Queued {
			t.Fatalf("Advance %d (the second over the budget) = %+v, %v; want Queued", i, pr, err)
		}
	}
}

// noDeadline returns a context without a deadline, so that the fake can
// tell whether the provider added one.
func noDeadline(t *testing.T) context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	return ctx
}

func TestCallTimeout(t *testing.T) {
	ctx := noDeadline(t)
	f := newFake()
	p := newProvider(t, f, provider.Config{CallTimeout: 10 * time.Millisecond, BreakerFailures: 2, BreakerOpenFor: time.Hour})
	f.setHang("get", true)
	_, err := p.Get(ctx, "i-1")
	if !errors.Is(err, driver.ErrTimeout) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want ErrTimeout wrapping DeadlineExceeded", err)
	}
	if h := p.Health(); h.ConsecutiveFailures != 1 {
		t.Fatalf("a timeout must count as a failure: %+v", h)
	}
	// The caller giving up is not the back-end's fault.
	cctx, cancel := context.WithCancel(ctx)
	go cancel()
	p.Get(cctx, "i-1")
	if h := p.Health(); h.ConsecutiveFailures != 1 || h.Breaker != "closed" {
		t.Fatalf("caller cancellation counted: %+v", h)
	}
	// Operation.Advance is timed too.
	f.setHang("get", false)
	f.setHang("create.advance", true)
	op, err := p.Create(ctx, "n1", &driver.Spec{Image: "alpine:3"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := op.Advance(ctx); !errors.Is(err, driver.ErrTimeout) {
		t.Fatalf("Advance: err = %v, want ErrTimeout", err)
	}
	if !f.hadDeadline("create.advance") || f.hadDeadline("create") {
		t.Fatal("CallTimeout must bound Advance and not Create (whose ctx bounds the operation)")
	}
}

func TestLogsFollowIsNotTimed(t *testing.T) {
	ctx := noDeadline(t)
	f := newFake()
	f.put(driver.Instance{ID: "i-1", State: driver.StateRunning})
	p := newProvider(t, lifecycle{f}, provider.Config{CallTimeout: time.Minute})
	var out, errb bytes.Buffer
	if err := p.Logs(ctx, "i-1", driver.LogOptions{Stdout: true, Stderr: true, Tail: 2}, &out, &errb); err != nil {
		t.Fatal(err)
	}
	if out.String() != "out 149\nout 150\n" || errb.String() != "err\n" {
		t.Fatalf("logs = %q / %q", out.String(), errb.String())
	}
	if !f.hadDeadline("logs") {
		t.Fatal("Logs without Follow must be timed")
	}
	fctx, cancel := context.WithCancel(ctx)
	cw := cancelWriter{cancel}
	if err := p.Logs(fctx, "i-1", driver.LogOptions{Stdout: true, Follow: true}, cw, cw); !errors.Is(err, context.Canceled) {
		t.Fatalf("follow: err = %v", err)
	}
	if f.hadDeadline("logs") {
		t.Fatal("Logs with Follow must not be timed")
	}
	if h := p.Health(); h.ConsecutiveFailures != 0 {
		t.Fatalf("ending a follow counted as a failure: %+v", h)
	}
}

// TestAttachIsLongAndResizeChecked: Attach is a stream, not bounded by
// CallTimeout, as a Logs follow; ResizeTTY refuses an empty size itself.
func TestAttachIsLongAndResizeChecked(t *testing.T) {
	ctx := noDeadline(t)
	f := newFake()
	f.put(driver.Instance{ID: "i-1", State: driver.StateRunning})
	p := newProvider(t, full{lifecycle{f}}, provider.Config{CallTimeout: time.Minute})
	var out, errb bytes.Buffer
	if err := p.Attach(ctx, "i-1", driver.AttachOptions{Replay: true}, strings.NewReader("hello\n"), &out, &errb); err != nil {
		t.Fatal(err)
	}
	if out.String() != "hello\n" {
		t.Fatalf("attach output %q", out.String())
	}
	if f.hadDeadline("attach") {
		t.Fatal("Attach must not be timed")
	}
	fctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := p.Attach(fctx, "i-1", driver.AttachOptions{}, nil, &out, &errb); !errors.Is(err, context.Canceled) {
		t.Fatalf("attach ended by its caller: %v", err)
	}
	if h := p.Health(); h.ConsecutiveFailures != 0 {
		t.Fatalf("ending an attach counted as a failure: %+v", h)
	}
	if err := p.ResizeTTY(ctx, "i-1", driver.TTYSize{Rows: 40, Cols: 120}); err != nil {
		t.Fatal(err)
	}
	if !f.hadDeadline("resize-tty(40x120)") {
		t.Fatal("ResizeTTY must be timed")
	}
	n := len(f.callLog())
	var fe *driver.FieldError
	if err := p.ResizeTTY(ctx, "i-1", driver.TTYSize{Cols: 80}); !errors.As(err, &fe) || fe.Path != "size" || !errors.Is(err, driver.ErrInvalid) {
		t.Fatalf("resize to no rows: %v", err)
	}
	if len(f.callLog()) != n {
		t.Fatalf("an invalid size reached the driver: %v", f.callLog())
	}
}

// TestExecIsLongAndChecked: Exec is a stream, not bounded by
// CallTimeout; malformed options never reach the driver.
func TestExecIsLongAndChecked(t *testing.T) {
	ctx := noDeadline(t)
	f := newFake()
	f.put(driver.Instance{ID: "i-1", State: driver.StateRunning})
	p := newProvider(t, full{lifecycle{f}}, provider.Config{CallTimeout: time.Minute})
	var out bytes.Buffer
	code, err := p.Exec(ctx, "i-1", driver.ExecOptions{Cmd: []string{"cat", "-"}}, strings.NewReader("hi\n"), &out, io.Discard)
	if err != nil || code != 2 || out.String() != "hi\n" {
		t.Fatalf("Exec = %d, %v, output %q; want 2, nil, hi", code, err, out.String())
	}
	if f.hadDeadline("exec") {
		t.Fatal("Exec must not be timed")
	}
	n := len(f.callLog())
	var fe *driver.FieldError
	if _, err := p.Exec(ctx, "i-1", driver.ExecOptions{}, nil, &out, io.Discard); !errors.As(err, &fe) || fe.Path != "cmd" {
		t.Fatalf("Exec of no command: %v", err)
	}
	if len(f.callLog()) != n {
		t.Fatalf("an invalid exec reached the driver: %v", f.callLog())
	}
}

func TestStateIsSharedAndCached(t *testing.T) {
	ctx := testCtx(t)
	f := newFake()
	p := newProvider(t, f, provider.Config{StateTTL: time.Hour})
	var wg sync.WaitGroup
	for range 50 {
		wg.Go(func() {
			st, err := p.State(ctx)
			if err != nil || len(st.Nodes) != 2 {
				t.Errorf("State = %v, %v", st, err)
			}
		})
	}
	wg.Wait()
	if n := f.count("state"); n != 1 {
		t.Fatalf("driver State called %d times for 50 callers, want 1", n)
	}
	// A finished create invalidates the reading.
	op, err := p.Create(ctx, "n1", &driver.Spec{Image: "alpine:3"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := driver.Drive(ctx, op); err != nil {
		t.Fatal(err)
	}
	if _, err := p.State(ctx); err != nil {
		t.Fatal(err)
	}
	if n := f.count("state"); n != 2 {
		t.Fatalf("driver State called %d times after a create, want 2", n)
	}
}

func TestCreateDeleteLifecycle(t *testing.T) {
	ctx := testCtx(t)
	f := newFake()
	p := newProvider(t, f, provider.Config{})
	if _, err := p.Create(ctx, "n1", &driver.Spec{}); !errors.Is(err, driver.ErrInvalid) {
		t.Fatalf("bad spec: err = %v", err)
	}
	op, err := p.Create(ctx, "n1", &driver.Spec{Name: "web", Image: "alpine:3"})
	if err != nil {
		t.Fatal(err)
	}
	in, err := driver.Drive(ctx, op)
	if err != nil || in.State != driver.StateRunning || in.Node != "n1" {
		t.Fatalf("create = %+v, %v", in, err)
	}
	if got, err := p.Find(ctx, "web"); err != nil || got.ID != in.ID {
		t.Fatalf("Find = %+v, %v", got, err)
	}
	if l, err := p.List(ctx, nil); err != nil || len(l) != 1 {
		t.Fatalf("List = %v, %v", l, err)
	}
	for i, want := range []error{nil, driver.ErrNotFound} {
		op, err := p.Delete(ctx, in.ID)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := driver.Drive(ctx, op); !errors.Is(err, want) {
			t.Fatalf("delete %d: err = %v, want %v", i, err, want)
		}
	}
	if _, err := p.Get(ctx, in.ID); !errors.Is(err, driver.ErrNotFound) {
		t.Fatalf("Get after delete: %v", err)
	}
	if err := p.Close(ctx); err != nil || f.count("close") != 1 {
		t.Fatalf("Close: %v", err)
	}
}

func TestFallbacks(t *testing.T) {
	ctx := testCtx(t)

	t.Run("restart is stop then start", func(t *testing.T) {
		f := newFake()
		f.put(driver.Instance{ID: "i-1", State: driver.StateRunning})
		p := newProvider(t, lifecycle{f}, provider.Config{})
		if err := p.Restart(ctx, "i-1", 3*time.Second); err != nil {
			t.Fatal(err)
		}
		if got := strings.Join(f.callLog(), " "); got != "stop(3s) start" {
			t.Fatalf("driver calls = %s", got)
		}
		if in, _ := p.Get(ctx, "i-1"); in.State != driver.StateRunning {
			t.Fatalf("state after restart = %s", in.State)
		}
		if err := p.Restart(ctx, "gone", 0); !errors.Is(err, driver.ErrNotFound) {
			t.Fatalf("restart of a missing instance: %v", err)
		}
		if err := newProvider(t, newFake(), provider.Config{}).Restart(ctx, "i-1", 0); !errors.Is(err, driver.ErrUnsupported) {
			t.Fatalf("restart without stop/start: %v", err)
		}
	})

	t.Run("kill KILL is stop with no grace", func(t *testing.T) {
		for _, sig := range []string{"KILL", "SIGKILL", "9", "kill", "sigkill"} {
			f := newFake()
			f.put(driver.Instance{ID: "i-1", State: driver.StateRunning})
			p := newProvider(t, lifecycle{f}, provider.Config{})
			if err := p.Kill(ctx, "i-1", sig); err != nil {
				t.Fatalf("%s: %v", sig, err)
			}
			if got := strings.Join(f.callLog(), " "); got != "stop(0s)" {
				t.Fatalf("%s: driver calls = %s", sig, got)
			}
		}
		f := newFake()
		p := newProvider(t, lifecycle{f}, provider.Config{})
		if err := p.Kill(ctx, "i-1", "TERM"); !errors.Is(err, driver.ErrUnsupported) {
			t.Fatalf("TERM: %v", err)
		}
		var fe *driver.FieldError
		if err := p.Kill(ctx, "i-1", ""); !errors.As(err, &fe) || fe.Path != "signal" {
			t.Fatalf("empty signal: %v", err)
		}
		if err := p.Kill(ctx, "i-1", "BOGUS"); !errors.As(err, &fe) || fe.Path != "signal" {
			t.Fatalf("bad signal: %v", err)
		}
		if len(f.callLog()) != 0 {
			t.Fatalf("driver calls = %v", f.callLog())
		}
		if err := newProvider(t, newFake(), provider.Config{}).Kill(ctx, "i-1", "KILL"); !errors.Is(err, driver.ErrUnsupported) {
			t.Fatalf("KILL without stop: %v", err)
		}
	})

	t.Run("images from state", func(t *testing.T) {
		p := newProvider(t, newFake(), provider.Config{})
		imgs, err := p.Images(ctx, "n1")
		if err != nil || len(imgs) != 2 || imgs[0].Name != "alpine:3" || imgs[1].Name != "busybox:1" {
			t.Fatalf("Images = %v, %v", imgs, err)
		}
		if _, err := p.Images(ctx, "n9"); !errors.Is(err, driver.ErrNotFound) {
			t.Fatalf("unknown node: %v", err)
		}
	})

	t.Run("preload when already present", func(t *testing.T) {
		f := newFake()
		p := newProvider(t, f, provider.Config{})
		var got []string
		progress := func(pp driver.PreloadProgress) { got = append(got, pp.Node+":"+pp.Status) }
		if err := p.Preload(ctx, "alpine:3", nil, progress); err != nil {
			t.Fatal(err)
		}
		if strings.Join(got, " ") != "n1:present n2:present" {
			t.Fatalf("progress = %v", got)
		}
		if err := p.Preload(ctx, "busybox:1", []string{"n1"}, nil); err != nil {
			t.Fatal(err)
		}
		err := p.Preload(ctx, "busybox:1", nil, nil)
		if !errors.Is(err, driver.ErrUnsupported) || !strings.Contains(err.Error(), "n2") {
			t.Fatalf("missing on n2: %v", err)
		}
		if err := p.Preload(ctx, "alpine:3", []string{"n9"}, nil); !errors.Is(err, driver.ErrNotFound) {
			t.Fatalf("unknown node: %v", err)
		}
		var fe *driver.FieldError
		if err := p.Preload(ctx, "", nil, nil); !errors.As(err, &fe) || fe.Path != "image" {
			t.Fatalf("empty image: %v", err)
		}
	})

	t.Run("console from logs", func(t *testing.T) {
		f := newFake()
		f.put(driver.Instance{ID: "i-1", State: driver.StateRunning})
		p := newProvider(t, lifecycle{f}, provider.Config{})
		out, err := p.Console(ctx, "i-1")
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
		// The last 100 lines of stdout and the last of stderr.
		if len(lines) != 101 || lines[0] != "out 51" || lines[99] != "out 150" || lines[100] != "err" {
			t.Fatalf("console: %d lines, first %q last %q", len(lines), lines[0], lines[len(lines)-1])
		}
		if _, err := p.Console(ctx, "gone"); !errors.Is(err, driver.ErrNotFound) {
			t.Fatalf("console of a missing instance: %v", err)
		}
		if _, err := newProvider(t, newFake(), provider.Config{}).Console(ctx, "i-1"); !errors.Is(err, driver.ErrUnsupported) {
			t.Fatalf("console without logs: %v", err)
		}
	})

	t.Run("unsupported", func(t *testing.T) {
		f := newFake()
		p := newProvider(t, f, provider.Config{})
		var o bytes.Buffer
		for name, err := range map[string]error{
			"start":      p.Start(ctx, "i-1"),
			"stop":       p.Stop(ctx, "i-1", 0),
			"suspend":    p.Suspend(ctx, "i-1"),
			"resume":     p.Resume(ctx, "i-1"),
			"resize":     p.Resize(ctx, "i-1", driver.Resources{CPU: 500}),
			"logs":       p.Logs(ctx, "i-1", driver.LogOptions{Stdout: true}, &o, &o),
			"attach":     p.Attach(ctx, "i-1", driver.AttachOptions{}, strings.NewReader("x"), &o, &o),
			"resize-tty": p.ResizeTTY(ctx, "i-1", driver.TTYSize{Rows: 24, Cols: 80}),
			"usage":      func() error { _, err := p.Usage(ctx, "i-1"); return err }(),
			"exec": func() error {
				_, err := p.Exec(ctx, "i-1", driver.ExecOptions{Cmd: []string{"ls"}}, nil, &o, &o)
				return err
			}(),
		} {
			if !errors.Is(err, driver.ErrUnsupported) {
				t.Errorf("%s: err = %v, want ErrUnsupported", name, err)
			}
		}
		if len(f.callLog()) != 0 {
			t.Fatalf("driver calls = %v", f.callLog())
		}
		if h := p.Health(); h.ConsecutiveFailures != 0 {
			t.Fatalf("unsupported counted as failure: %+v", h)
		}
	})
}

// TestNativeCapabilitiesWin checks that a driver's own implementation is
// used instead of the fallback.
func TestNativeCapabilitiesWin(t *testing.T) {
	ctx := testCtx(t)
	f := newFake()
	f.put(driver.Instance{ID: "i-1", State: driver.StateRunning})
	p := newProvider(t, full{lifecycle{f}}, provider.Config{})
	if err := p.Restart(ctx, "i-1", time.Second); err != nil {
		t.Fatal(err)
	}
	if err := p.Kill(ctx, "i-1", "TERM"); err != nil {
		t.Fatal(err)
	}
	if s, err := p.Console(ctx, "i-1"); err != nil || s != "serial console" {
		t.Fatalf("Console = %q, %v", s, err)
	}
	if imgs, err := p.Images(ctx, "n1"); err != nil || imgs[0].Name != "native:1" {
		t.Fatalf("Images = %v, %v", imgs, err)
	}
	if err := p.Preload(ctx, "other:1", nil, nil); err != nil {
		t.Fatal(err)
	}
	if err := p.Resize(ctx, "i-1", driver.Resources{CPU: 500}); err != nil {
		t.Fatal(err)
	}
	var fe *driver.FieldError
	if err := p.Resize(ctx, "i-1", driver.Resources{Memory: -1}); !errors.As(err, &fe) || fe.Path != "memory" {
		t.Fatalf("negative memory: %v", err)
	}
	if err := p.Suspend(ctx, "i-1"); err != nil {
		t.Fatal(err)
	}
	if err := p.Resume(ctx, "i-1"); err != nil {
		t.Fatal(err)
	}
	if u, err := p.Usage(ctx, "i-1"); err != nil || u.CPU != 250 {
		t.Fatalf("Usage = %v, %v", u, err)
	}
	wctx, cancel := context.WithCancel(ctx)
	var events []driver.Event
	err := p.Watch(wctx, func(e driver.Event) { events = append(events, e); cancel() })
	if !errors.Is(err, context.Canceled) || len(events) != 1 || events[0].Instance != "native" {
		t.Fatalf("Watch = %v, events %v", err, events)
	}
	want := "restart kill TERM console images preload resize suspend resume usage watch"
	if got := strings.Join(f.callLog(), " "); got != want {
		t.Fatalf("driver calls:\n got %s\nwant %s", got, want)
	}
	if f.count("state") != 0 {
		t.Fatal("a fallback read State")
	}
}

func TestWatchByPolling(t *testing.T) {
	ctx := testCtx(t)
	f := newFake()
	f.setNotify(make(chan string)) // unbuffered: only calls made while the test waits are seen
	f.put(driver.Instance{ID: "a", Node: "n1", State: driver.StateRunning})
	f.put(driver.Instance{ID: "b", Node: "n1", State: driver.StateRunning})
	p := newProvider(t, f, provider.Config{WatchInterval: time.Millisecond})

	wctx, cancel := context.WithCancel(ctx)
	events := make(chan driver.Event, 100)
	done := make(chan error, 1)
	go func() { done <- p.Watch(wctx, func(e driver.Event) { events <- e }) }()

	waitList := func() {
		t.Helper()
		for {
			select {
			case op := <-f.notify:
				if op == "list" {
					return
				}
			case <-ctx.Done():
				t.Fatal("no List call")
			}
		}
	}
	next := func() driver.Event {
		t.Helper()
		select {
		case e := <-events:
			return e
		case <-ctx.Done():
			t.Fatal("no event")
			return driver.Event{}
		}
	}
	// A List call that starts after another one did means the first
	// listing, the baseline, has been taken.
	waitList()
	waitList()
	f.apply(func(insts map[string]*driver.Instance) {
		insts["c"] = &driver.Instance{ID: "c", Node: "n2", State: driver.StateRunning, Tags: map[string]string{"k": "v"}}
		insts["a"].State = driver.StateExited
		delete(insts, "b")
	})
	var got []string
	for range 3 {
		e := next()
		got = append(got, fmt.Sprintf("%s:%s:%s", e.Type, e.Instance, e.Node))
		if e.Type == driver.EventStart && e.Tags["k"] != "v" {
			t.Errorf("start event lost the tags: %+v", e)
		}
	}
	if strings.Join(got, " ") != "die:a:n1 start:c:n2 delete:b:n1" {
		t.Fatalf("events = %v", got)
	}
	f.setState("c", driver.StateSuspended)
	if e := next(); e.Type != driver.EventSuspend || e.Instance != "c" {
		t.Fatalf("event = %+v, want pause of c", e)
	}
	f.setState("c", driver.StateRunning)
	if e := next(); e.Type != driver.EventResume || e.Instance != "c" {
		t.Fatalf("event = %+v, want unpause of c", e)
	}
	// A failing listing is skipped, not reported, and polling goes on.
	f.setFault("list", errors.New("flaky"))
	waitList()
	waitList()
	f.setFault("list", nil)
	f.remove("c")
	if e := next(); e.Type != driver.EventDelete || e.Instance != "c" {
		t.Fatalf("event = %+v, want delete of c", e)
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("Watch returned %v", err)
	}
	select {
	case e := <-events:
		t.Fatalf("unexpected event %+v", e)
	default:
	}
}

func TestWatchPollingStopsOnAnswer(t *testing.T) {
	ctx := testCtx(t)
	f := newFake()
	f.setFault("list", driver.Errorf(driver.ErrUnsupported, "no listing"))
	p := newProvider(t, f, provider.Config{WatchInterval: time.Millisecond})
	if err := p.Watch(ctx, func(driver.Event) {}); !errors.Is(err, driver.ErrUnsupported) {
		t.Fatalf("Watch = %v, want ErrUnsupported", err)
	}
}

// TestLogging checks the attributes and levels of the provider's logs.
func TestLogging(t *testing.T) {
	ctx := testCtx(t)
	var buf bytes.Buffer
	var mu sync.Mutex
	h := slog.NewJSONHandler(&lockedWriter{mu: &mu, w: &buf}, &slog.HandlerOptions{Level: slog.LevelDebug})
	f := newFake()
	f.put(driver.Instance{ID: "x-1", State: driver.StateRunning})
	p := newProvider(t, f, provider.Config{Name: "logged", Logger: slog.New(h)})
	if _, err := p.Get(ctx, "x-1"); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Get(ctx, "x-2"); !errors.Is(err, driver.ErrNotFound) {
		t.Fatal(err)
	}
	op, err := p.Create(ctx, "n1", &driver.Spec{Name: "web", Image: "alpine:3"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := driver.Drive(ctx, op); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	var recs []map[string]any
	sc := bufio.NewScanner(&buf)
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatal(err)
		}
		recs = append(recs, m)
	}
	find := func(op string, level string) map[string]any {
		for _, r := range recs {
			if r["op"] == op && r["level"] == level {
				return r
			}
		}
		t.Fatalf("no %s record for op %s in %v", level, op, recs)
		return nil
	}
	ok := find("get", "DEBUG")
	bad := find("get", "WARN")
	if ok["provider"] != "logged" || ok["instance"] != "x-1" || bad["instance"] != "x-2" || bad["error"] == nil {
		t.Fatalf("get records: %v / %v", ok, bad)
	}
	cr := find("create", "DEBUG")
	if cr["node"] != "n1" || cr["name"] != "web" {
		t.Fatalf("create record: %v", cr)
	}
	done := find("create.advance", "DEBUG")
	if done["instance"] != "i-1" || done["node"] != "n1" {
		t.Fatalf("create.advance record: %v", done)
	}
	n := 0
	for _, r := range recs {
		if r["op"] == "create.advance" {
			n++
		}
	}
	if n != 1 {
		t.Fatalf("%d create.advance records, want only the finish", n)
	}
}

// cancelWriter ends a Logs follow once output arrives.
type cancelWriter struct{ cancel context.CancelFunc }

func (c cancelWriter) Write(p []byte) (int, error) {
	c.cancel()
	return len(p), nil
}

type lockedWriter struct {
	mu *sync.Mutex
	w  *bytes.Buffer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// BenchmarkGet measures what the provider adds to a driver call: budget,
// breaker, timeout context, metrics hook and a disabled debug log.
func BenchmarkGet(b *testing.B) {
	f := newFake()
	f.put(driver.Instance{ID: "i-1", State: driver.StateRunning})
	ctx := context.Background()
	b.Run("driver", func(b *testing.B) {
		for b.Loop() {
			if _, err := f.Get(ctx, "i-1"); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("provider", func(b *testing.B) {
		p, err := provider.New(f, provider.Config{Name: "bench", Logger: discard, ReadRate: 1e9, ReadBurst: 1e6, Observer: nopObserver{}})
		if err != nil {
			b.Fatal(err)
		}
		for b.Loop() {
			if _, err := p.Get(ctx, "i-1"); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkStateParallel measures many callers sharing the cached State.
func BenchmarkStateParallel(b *testing.B) {
	p, err := provider.New(newFake(), provider.Config{Name: "bench", Logger: discard})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := p.State(ctx); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// A partial listing is an answer: it never opens the breaker however often
// it comes, while the same kind without the partial type does.
func TestPartialListDoesNotTripBreaker(t *testing.T) {
	ctx := testCtx(t)
	f := newFake()
	p := newProvider(t, f, provider.Config{Name: "two-engines", BreakerFailures: 2, BreakerOpenFor: time.Hour})
	f.setFault("list", &driver.PartialListError{Nodes: []string{"n2"}, Err: errors.New("engine n2 is offline")})
	for range 10 {
		_, err := p.List(ctx, nil)
		var partial *driver.PartialListError
		if !errors.As(err, &partial) || !partial.Missing("n2") {
			t.Fatalf("List err = %v, want the partial listing", err)
		}
	}
	if h := p.Health(); h.Breaker != "closed" {
		t.Fatalf("health after partial listings = %+v", h)
	}
	f.setFault("list", driver.Errorf(driver.ErrRetryable, "engine n1 is offline"))
	for range 2 {
		_, _ = p.List(ctx, nil)
	}
	if h := p.Health(); h.Breaker != "open" {
		t.Fatalf("health after retryable listings = %+v, want open", h)
	}
}

// TestFollowEndedByCallerIsQuiet: a follower that goes away (Ctrl-C) is
// logged at debug level, not as a failure.
func TestFollowEndedByCallerIsQuiet(t *testing.T) {
	ctx := noDeadline(t)
	var buf bytes.Buffer
	var mu sync.Mutex
	h := slog.NewJSONHandler(&lockedWriter{mu: &mu, w: &buf}, &slog.HandlerOptions{Level: slog.LevelInfo})
	f := newFake()
	f.put(driver.Instance{ID: "i-1", State: driver.StateRunning})
	p := newProvider(t, lifecycle{f}, provider.Config{Logger: slog.New(h)})
	fctx, cancel := context.WithCancel(ctx)
	cw := cancelWriter{cancel}
	if err := p.Logs(fctx, "i-1", driver.LogOptions{Stdout: true, Follow: true}, cw, cw); !errors.Is(err, context.Canceled) {
		t.Fatalf("follow: err = %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if strings.Contains(buf.String(), "logs failed") {
		t.Errorf("a follower that went away was logged as a failure: %s", buf.String())
	}
}
