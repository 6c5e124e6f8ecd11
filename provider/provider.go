// Package provider is what Berth's engine uses to talk to a compute back-end.
//
// A *Provider wraps one driver.Driver and gives every back-end, without the
// back-end writing it: separate rate limits for reads and for changes, a
// circuit breaker that fails fast while the back-end misbehaves, per-call
// timeouts, structured logging, metric hooks, one shared cached State, and the
// one fallback for every optional capability (fallback.go). Package driver is
// what back-ends implement; package provider is what callers use, as in
// database/sql and database/sql/driver.
package provider

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/berth-dev/berth/driver"
	"github.com/sony/gobreaker/v2"
	"golang.org/x/time/rate"
)

// Defaults applied by New to zero Config fields.
const (
	DefaultCallTimeout     = 30 * time.Second
	DefaultBreakerFailures = 5
	DefaultBreakerOpenFor  = 30 * time.Second
	DefaultStateTTL        = time.Second
	DefaultWatchInterval   = 2 * time.Second
)

// Config configures a Provider. Zero values take the defaults above; negative
// values are invalid.
type Config struct {
	// Name is the provider's name (required); it appears in every log line,
	// metric and provider-made error.
	Name string
	// ReadRate is how many reads per second reach the back-end: State, Get,
	// Find, List, Images, Logs, Attach, Usage, Console and
	// Operation.Advance. 0 means
	// unlimited.
	ReadRate float64
	// ReadBurst is how many reads may go at once above ReadRate; 0 means 1
	// when ReadRate is set.
	ReadBurst int
	// WriteRate is how many changes per second reach the back-end: Create,
	// Delete, Start, Stop, Restart, Kill, Suspend, Resume, Resize,
	// ResizeTTY, Preload. 0
	// means unlimited.
	WriteRate float64
	// WriteBurst is as ReadBurst, for changes.
	WriteBurst int
	// CallTimeout bounds each synchronous call and each Operation.Advance.
	// It is not applied to Create and Delete (whose ctx bounds the whole
	// operation), Logs with Follow, Attach, Watch or Preload. Default 30s.
	CallTimeout time.Duration
	// BreakerFailures is how many consecutive failures open the breaker.
	// Default 5.
	BreakerFailures uint32
	// BreakerOpenFor is how long the breaker stays open before it lets one
	// trial call through (half-open). Default 30s.
	BreakerOpenFor time.Duration
	// StateTTL is how long one State reading is shared by all callers.
	// Default 1s.
	StateTTL time.Duration
	// WatchInterval is how often the Watch fallback polls List. Default 2s.
	WatchInterval time.Duration
	// Logger receives the provider's logs; nil means slog.Default().
	Logger *slog.Logger
	// Observer receives metric hooks; nil means none.
	Observer Observer
}

// Observer receives a provider's metrics. Its methods are called from the
// goroutine making the call, never while the provider holds a lock, and must
// not block.
type Observer interface {
	// Call reports one call of op ("get", "create", "create.advance", ...):
	// d is how long the back-end took (0 when the provider refused the call
	// before it reached the back-end) and err its outcome. An Advance put
	// off for the budget or the breaker (Progress.Wait) is not a call.
	Call(provider, op string, d time.Duration, err error)
	// BreakerChanged reports a breaker transition; from and to are "closed",
	// "open" or "half-open".
	BreakerChanged(provider string, from, to string)
}

// Health is the state of a provider's circuit breaker.
type Health struct {
	// Breaker is "closed", "open" or "half-open".
	Breaker string `json:"breaker"`
	// ConsecutiveFailures counts back-end failures since the last success.
	ConsecutiveFailures uint32 `json:"consecutive_failures"`
	// LastError and LastErrorAt describe the most recent back-end failure.
	LastError   string    `json:"last_error,omitempty"`
	LastErrorAt time.Time `json:"last_error_at,omitzero"`
}

// Provider is one configured back-end as Berth's engine sees it. It is safe
// for concurrent use.
type Provider struct {
	d     driver.Driver
	cfg   Config
	log   *slog.Logger
	read  *rate.Limiter
	write *rate.Limiter
	cb    *gobreaker.TwoStepCircuitBreaker[struct{}]
	state driver.ListCache[*driver.PlatformState]

	mu          sync.Mutex
	consecutive uint32
	lastErr     string
	lastErrAt   time.Time
	openedAfter uint32    // consecutive failures when the breaker last opened
	retryAt     time.Time // when an open breaker lets a trial call through
	transitions []transition
}

type transition struct{ from, to string }

// New returns a Provider for d. It checks cfg and reports every bad field as
// a driver.FieldError (paths such as "name" or "read_burst"), wrapping
// driver.ErrInvalid.
func New(d driver.Driver, cfg Config) (*Provider, error) {
	var es driver.FieldErrors
	if d == nil {
		es.Add("driver", "required")
	}
	if cfg.Name == "" {
		es.Add("name", "required")
	}
	for _, f := range []struct {
		path string
		v    float64
	}{
		{"read_rate", cfg.ReadRate}, {"read_burst", float64(cfg.ReadBurst)},
		{"write_rate", cfg.WriteRate}, {"write_burst", float64(cfg.WriteBurst)},
		{"call_timeout", float64(cfg.CallTimeout)}, {"breaker_open_for", float64(cfg.BreakerOpenFor)},
		{"state_ttl", float64(cfg.StateTTL)}, {"watch_interval", float64(cfg.WatchInterval)},
	} {
		if f.v < 0 {
			es.Add(f.path, "must not be negative")
		}
	}
	if err := es.Err(); err != nil {
		return nil, fmt.Errorf("provider %q: %w", cfg.Name, err)
	}
	if cfg.CallTimeout == 0 {
		cfg.CallTimeout = DefaultCallTimeout
	}
	if cfg.BreakerFailures == 0 {
		cfg.BreakerFailures = DefaultBreakerFailures
	}
	if cfg.BreakerOpenFor == 0 {
		cfg.BreakerOpenFor = DefaultBreakerOpenFor
	}
	if cfg.StateTTL == 0 {
		cfg.StateTTL = DefaultStateTTL
	}
	if cfg.WatchInterval == 0 {
		cfg.WatchInterval = DefaultWatchInterval
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	p := &Provider{
		d:     d,
		cfg:   cfg,
		log:   cfg.Logger.With("provider", cfg.Name),
		read:  newLimiter(cfg.ReadRate, cfg.ReadBurst),
		write: newLimiter(cfg.WriteRate, cfg.WriteBurst),
	}
	p.cb = gobreaker.NewTwoStepCircuitBreaker[struct{}](gobreaker.Settings{
		Name:    cfg.Name,
		Timeout: cfg.BreakerOpenFor,
		ReadyToTrip: func(c gobreaker.Counts) bool {
			return c.ConsecutiveFailures >= cfg.BreakerFailures
		},
		IsExcluded:    func(err error) bool { return errors.Is(err, errExcluded) },
		OnStateChange: p.breakerChanged,
	})
	p.state.TTL = cfg.StateTTL
	p.state.Fetch = func(ctx context.Context) (*driver.PlatformState, error) {
		return call(ctx, p, callOpts{op: "state", budget: readBudget, timed: true}, p.d.State)
	}
	return p, nil
}

func newLimiter(r float64, burst int) *rate.Limiter {
	if r == 0 {
		return rate.NewLimiter(rate.Inf, 0)
	}
	return rate.NewLimiter(rate.Limit(r), max(burst, 1))
}

// Name returns the provider's name.
func (p *Provider) Name() string { return p.cfg.Name }

// Driver returns the wrapped driver, for code that needs a driver-specific
// interface. Calls made on it bypass limits, breaker and logging.
func (p *Provider) Driver() driver.Driver { return p.d }

// Capabilities returns the sorted optional capabilities the driver implements
// itself (driver.Capabilities); fallbacks are not counted.
func (p *Provider) Capabilities() []string { return driver.Capabilities(p.d) }

// Features returns the kinds and features the driver runs
// (driver.Features).
func (p *Provider) Features() []string { return driver.Features(p.d) }

// Health reports the circuit breaker's state and the last back-end failure.
func (p *Provider) Health() Health {
	st := p.cb.State()
	p.flushTransitions()
	p.mu.Lock()
	defer p.mu.Unlock()
	return Health{Breaker: st.String(), ConsecutiveFailures: p.consecutive, LastError: p.lastErr, LastErrorAt: p.lastErrAt}
}

// breakerChanged is the breaker's OnStateChange hook. The breaker calls it
// with its own lock held, so it only records the transition; flushTransitions
// reports it afterwards.
func (p *Provider) breakerChanged(_ string, from, to gobreaker.State) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if to == gobreaker.StateOpen {
		p.openedAfter = p.consecutive
		p.retryAt = time.Now().Add(p.cfg.BreakerOpenFor)
	}
	p.transitions = append(p.transitions, transition{from.String(), to.String()})
}

// flushTransitions logs pending breaker transitions and reports them to the
// Observer, outside any lock.
func (p *Provider) flushTransitions() {
	p.mu.Lock()
	ts := p.transitions
	p.transitions = nil
	p.mu.Unlock()
	for _, t := range ts {
		level := slog.LevelInfo
		if t.to == gobreaker.StateOpen.String() {
			level = slog.LevelWarn
		}
		p.log.Log(context.Background(), level, "circuit breaker changed", "from", t.from, "to", t.to)
		if p.cfg.Observer != nil {
			p.cfg.Observer.BreakerChanged(p.cfg.Name, t.from, t.to)
		}
	}
}

// errExcluded marks an outcome the breaker neither counts as a success nor
// as a failure.
var errExcluded = errors.New("excluded from the breaker")

// isFailure reports whether err means the back-end misbehaved: unclassified
// errors, ErrRetryable, ErrTimeout and ErrDeleteFailed. Every other class is
// an answer about the request (not found, invalid, quota, capacity,
// unsupported, permanent...) and proves the back-end is working.
func isFailure(err error) bool {
	if err == nil {
		return false
	}
	// A partial listing is an answer: the back-end listed what it could
	// reach and named the nodes it could not.
	var partial *driver.PartialListError
	if errors.As(err, &partial) {
		return false
	}
	switch driver.ClassOf(err) {
	case nil, driver.ErrRetryable, driver.ErrTimeout, driver.ErrDeleteFailed:
		return true
	}
	return false
}

// outcome maps a call's result to what the breaker records: nil for a
// success or an answer, errExcluded when the caller's own ctx ended (the
// caller gave up; the back-end is not to blame), err for a failure.
func (p *Provider) outcome(ctx context.Context, err error) error {
	switch {
	case !isFailure(err):
		p.mu.Lock()
		p.consecutive = 0
		p.mu.Unlock()
		return nil
	case ctx.Err() != nil:
		return errExcluded
	}
	p.mu.Lock()
	p.consecutive++
	p.lastErr, p.lastErrAt = err.Error(), time.Now()
	p.mu.Unlock()
	return err
}

// breakerError explains why the breaker refused a call. It is a
// *driver.NotAttemptedError (which matches driver.ErrRetryable): nothing
// reached the back-end, and nothing will before the breaker lets a call
// through again.
func (p *Provider) breakerError(op string, err error) error {
	p.mu.Lock()
	n, at, last := p.openedAfter, p.retryAt, p.lastErr
	p.mu.Unlock()
	if errors.Is(err, gobreaker.ErrTooManyRequests) {
		// The trial call ends within CallTimeout, or sooner.
		return &driver.NotAttemptedError{Until: time.Now().Add(min(p.cfg.CallTimeout, time.Second)), Err: fmt.Errorf(
			"provider %q: %s: circuit breaker is half-open and its trial call is still running; try again shortly", p.cfg.Name, op)}
	}
	return &driver.NotAttemptedError{Until: at, Err: fmt.Errorf(
		"provider %q: %s: circuit breaker is open after %d consecutive failures (last: %s); it lets a call through again at %s",
		p.cfg.Name, op, n, last, at.Format(time.RFC3339))}
}

// breakerWait is how long an Operation refused by the breaker should wait.
func (p *Provider) breakerWait() time.Duration {
	p.mu.Lock()
	at := p.retryAt
	p.mu.Unlock()
	return max(time.Until(at), 10*time.Millisecond)
}

type budget int

const (
	noBudget budget = iota
	readBudget
	writeBudget
)

func (b budget) String() string {
	switch b {
	case readBudget:
		return "read"
	case writeBudget:
		return "write"
	}
	return "none"
}

// callOpts describes one call through the provider.
type callOpts struct {
	op     string
	budget budget
	// timed applies CallTimeout, plus grace: a stop's grace, which the
	// back-end waits out before it forces the stop.
	timed bool
	grace time.Duration
	// advance makes the call non-blocking: over budget, or with the breaker
	// refusing, it returns a *Busy instead of waiting or failing.
	advance bool
	// noWait makes the call return a *Busy at once when its budget has
	// nothing to spare, instead of waiting (the breaker refuses it as any
	// call): Create and Delete, which reconciler workers make, never hold
	// a worker.
	noWait bool
	// long marks a call that may run for minutes (Watch, Logs follow,
	// Attach, Preload): it does not hold the breaker's half-open trial slot and its
	// outcome is recorded when it ends.
	long bool
	// quiet leaves the success log to the caller.
	quiet bool
	attrs []any
}

// Busy is the error of a call that did not reach the back-end because the
// provider's budget for it has nothing to spare now (or, for a step of an
// operation, because the breaker refuses calls): it may be made again
// after Wait. It matches driver.ErrRetryable.
type Busy struct {
	Provider, Op string
	// Why says what holds the call back.
	Why  string
	Wait time.Duration
}

func (b *Busy) Error() string {
	return fmt.Sprintf("provider %q: %s: %s; try again in %s", b.Provider, b.Op, b.Why, b.Wait)
}

func (b *Busy) Unwrap() error { return driver.ErrRetryable }

// call runs fn against the back-end under the budget, the breaker, the
// timeout, logging and metrics. Every driver call the provider makes goes
// through it.
func call[T any](ctx context.Context, p *Provider, o callOpts, fn func(ctx context.Context) (T, error)) (T, error) {
	var zero T
	refuse := func(err error) (T, error) {
		p.finish(o, 0, err)
		return zero, err
	}
	if p.cb.State() == gobreaker.StateOpen {
		p.flushTransitions()
		if o.advance {
			return zero, &Busy{Provider: p.cfg.Name, Op: o.op, Why: "its breaker refuses calls", Wait: p.breakerWait()}
		}
		return refuse(p.breakerError(o.op, gobreaker.ErrOpenState))
	}
	p.flushTransitions()

	if lim := p.limiter(o.budget); lim != nil {
		if o.advance || o.noWait {
			r := lim.Reserve()
			if d := r.Delay(); d > 0 {
				r.Cancel()
				return zero, &Busy{Provider: p.cfg.Name, Op: o.op, Why: "its " + o.budget.String() + " budget is spent", Wait: d}
			}
		} else if err := lim.Wait(ctx); err != nil {
			return refuse(fmt.Errorf("provider %q: %s: waiting for the %s budget: %w: %w", p.cfg.Name, o.op, o.budget, driver.ErrRetryable, err))
		}
	}

	var done func(error)
	if !o.long {
		var err error
		done, err = p.cb.Allow()
		p.flushTransitions()
		if err != nil {
			if o.advance {
				return zero, &Busy{Provider: p.cfg.Name, Op: o.op, Why: "its breaker refuses calls", Wait: p.breakerWait()}
			}
			return refuse(p.breakerError(o.op, err))
		}
	}

	recorded := false
	if done != nil {
		// A panicking driver must not keep the half-open trial slot forever.
		defer func() {
			if !recorded {
				done(fmt.Errorf("provider %q: %s: the driver panicked", p.cfg.Name, o.op))
				p.flushTransitions()
			}
		}()
	}

	cctx := ctx
	if o.timed {
		var cancel context.CancelFunc
		cctx, cancel = context.WithTimeout(ctx, p.cfg.CallTimeout+max(o.grace, 0))
		defer cancel()
	}
	start := time.Now()
	v, err := fn(cctx)
	d := time.Since(start)
	if err != nil && o.timed && ctx.Err() == nil && errors.Is(cctx.Err(), context.DeadlineExceeded) && !errors.Is(err, driver.ErrTimeout) {
		err = fmt.Errorf("provider %q: %s: no answer within %s: %w: %w", p.cfg.Name, o.op, p.cfg.CallTimeout+max(o.grace, 0), driver.ErrTimeout, err)
	}

	res := p.outcome(ctx, err)
	if o.long {
		// Record the outcome of a long call as one finished call.
		if rec, aerr := p.cb.Allow(); aerr == nil {
			rec(res)
		}
	} else {
		done(res)
	}
	recorded = true
	p.flushTransitions()
	p.finish(o, d, err)
	return v, err
}

func (p *Provider) limiter(b budget) *rate.Limiter {
	switch b {
	case readBudget:
		return p.read
	case writeBudget:
		return p.write
	}
	return nil
}

// finish logs one call and reports it to the Observer.
func (p *Provider) finish(o callOpts, d time.Duration, err error) {
	if p.cfg.Observer != nil {
		p.cfg.Observer.Call(p.cfg.Name, o.op, d, err)
	}
	if err != nil && o.long && errors.Is(err, context.Canceled) {
		// A stream whose reader went away (Ctrl-C on a follower) is no
		// failure.
		p.log.Debug(o.op+" ended by its caller", append([]any{"op", o.op, "duration", d}, o.attrs...)...)
	} else if err != nil {
		p.log.Warn(o.op+" failed", append([]any{"op", o.op, "duration", d, "error", err}, o.attrs...)...)
	} else if !o.quiet {
		p.log.Debug(o.op, append([]any{"op", o.op, "duration", d}, o.attrs...)...)
	}
}
