// Package metrics exports Berth's measurements to Prometheus. A *Metrics is
// both the control plane's control.Metrics and every provider's
// provider.Observer; Handler serves them at /metrics.
package metrics

import (
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/berth-dev/berth/control"
	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/provider"
)

// Metrics holds Berth's collectors in its own registry (never the global
// one, so that several servers can live in one test binary). Its methods
// are safe for concurrent use and never block.
type Metrics struct {
	reg *prometheus.Registry

	schedule    *prometheus.HistogramVec
	conflicts   prometheus.Counter
	queueDepth  prometheus.Gauge
	launches    *prometheus.CounterVec
	failures    *prometheus.CounterVec
	quotaUsed   *prometheus.GaugeVec
	quotaLimit  *prometheus.GaugeVec
	leaks       *prometheus.CounterVec
	breaker     *prometheus.GaugeVec
	transitions *prometheus.CounterVec
	calls       *prometheus.CounterVec
	callTime    *prometheus.HistogramVec
	requests    *prometheus.HistogramVec
	leading     prometheus.Gauge
	terms       *prometheus.CounterVec
	fenced      prometheus.Counter
	storeTime   *prometheus.HistogramVec
	rebalance   rebalanceCollectors
}

// New returns a Metrics with every collector registered, plus the Go runtime
// and process collectors.
func New() *Metrics {
	m := &Metrics{
		reg: prometheus.NewRegistry(),
		schedule: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "berth_schedule_duration_seconds",
			Help:    "Time taken by one placement decision.",
			Buckets: prometheus.ExponentialBuckets(10e-6, 2.5, 14),
		}, []string{"placed"}),
		conflicts: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "berth_schedule_conflicts_total",
			Help: "Placements the scheduler's ledger refused because another scheduler had taken the room first (planned again).",
		}),
		queueDepth: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "berth_queue_depth",
			Help: "Instances waiting for placement.",
		}),
		launches: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "berth_launches_total",
			Help: "Create attempts that succeeded, per provider.",
		}, []string{"provider"}),
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "berth_launch_failures_total",
			Help: "Create attempts that failed, per provider and error kind.",
		}, []string{"provider", "kind"}),
		quotaUsed: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "berth_quota_used",
			Help: "What a quota's scope holds now (cpus in cores, memory in bytes).",
		}, []string{"scope", "name", "resource"}),
		quotaLimit: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "berth_quota_limit",
			Help: "A quota's limit (0 is unlimited).",
		}, []string{"scope", "name", "resource"}),
		leaks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "berth_leaks_deleted_total",
			Help: "Leaked back-end resources found and deleted, per provider.",
		}, []string{"provider"}),
		breaker: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "berth_breaker_state",
			Help: "Circuit breaker state per provider: 0 closed, 1 half-open, 2 open.",
		}, []string{"provider"}),
		transitions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "berth_breaker_transitions_total",
			Help: "Circuit breaker transitions per provider and new state.",
		}, []string{"provider", "to"}),
		calls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "berth_backend_calls_total",
			Help: "Calls to back-ends per provider, operation and outcome (ok or an error kind).",
		}, []string{"provider", "op", "outcome"}),
		callTime: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "berth_backend_call_duration_seconds",
			Help:    "Time back-ends took per call.",
			Buckets: prometheus.ExponentialBuckets(100e-6, 4, 10),
		}, []string{"provider", "op"}),
		requests: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "berth_api_request_duration_seconds",
			Help:    "API request latency per route and status class.",
			Buckets: prometheus.ExponentialBuckets(50e-6, 3, 12),
		}, []string{"route", "code"}),
		leading: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "berth_leader",
			Help: "1 while this server leads its cluster, else 0.",
		}),
		terms: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "berth_leadership_changes_total",
			Help: "Times this server was elected (to=leader) or stopped leading (to=follower).",
		}, []string{"to"}),
		fenced: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "berth_fence_rejections_total",
			Help: "Terms ended because the fence refused a write: this server wrote after it lost the lead.",
		}),
		storeTime: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "berth_etcd_request_duration_seconds",
			Help:    "Time etcd took per store call (get, list, txn, compact), by outcome.",
			Buckets: prometheus.ExponentialBuckets(100e-6, 3, 12),
		}, []string{"op", "outcome"}),
	}
	m.reg.MustRegister(m.schedule, m.conflicts, m.queueDepth, m.launches, m.failures, m.quotaUsed, m.quotaLimit,
		m.leaks, m.breaker, m.transitions, m.calls, m.callTime, m.requests, m.leading, m.terms, m.fenced, m.storeTime,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m.rebalance.register(m.reg)
	return m
}

// Leading records a change of this server's leadership.
func (m *Metrics) Leading(leading bool) {
	if leading {
		m.leading.Set(1)
		m.terms.WithLabelValues("leader").Inc()
		return
	}
	m.leading.Set(0)
	m.terms.WithLabelValues("follower").Inc()
}

// Fenced records a term ended by the fence.
func (m *Metrics) Fenced() { m.fenced.Inc() }

// StoreCall records one call to etcd.
func (m *Metrics) StoreCall(op string, d time.Duration, err error) {
	outcome := "ok"
	if err != nil {
		outcome = "error"
	}
	m.storeTime.WithLabelValues(op, outcome).Observe(d.Seconds())
}

// Registry returns the registry holding Berth's collectors.
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// Handler serves the metrics in Prometheus' text format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError})
}

// Scheduled implements control.Metrics.
func (m *Metrics) Scheduled(d time.Duration, placed bool) {
	l := "false"
	if placed {
		l = "true"
	}
	m.schedule.WithLabelValues(l).Observe(d.Seconds())
}

// QueueDepth implements control.Metrics.
func (m *Metrics) QueueDepth(n int) { m.queueDepth.Set(float64(n)) }

// Launched implements control.Metrics.
func (m *Metrics) Launched(provider string, err error) {
	if err == nil {
		m.launches.WithLabelValues(provider).Inc()
		return
	}
	m.failures.WithLabelValues(provider, kindLabel(err)).Inc()
}

// QuotaUse implements control.Metrics.
func (m *Metrics) QuotaUse(q control.QuotaUse) {
	scope, name := "owner", q.Owner
	switch {
	case q.Provider != "":
		scope, name = "provider", q.Provider
	case q.Pool != "":
		scope, name = "pool", q.Pool
	}
	m.quotaUsed.WithLabelValues(scope, name, "instances").Set(float64(q.UsedInstances))
	m.quotaUsed.WithLabelValues(scope, name, "cpus").Set(q.UsedCPU.CPUs())
	m.quotaUsed.WithLabelValues(scope, name, "memory").Set(float64(q.UsedMemory))
	m.quotaLimit.WithLabelValues(scope, name, "instances").Set(float64(q.Instances))
	m.quotaLimit.WithLabelValues(scope, name, "cpus").Set(q.CPU.CPUs())
	m.quotaLimit.WithLabelValues(scope, name, "memory").Set(float64(q.Memory))
}

// LeakFound implements control.Metrics.
func (m *Metrics) LeakFound(provider string) { m.leaks.WithLabelValues(provider).Inc() }

// Conflicts implements control.Metrics.
func (m *Metrics) Conflicts(n int) { m.conflicts.Add(float64(n)) }

// Call implements provider.Observer.
func (m *Metrics) Call(provider, op string, d time.Duration, err error) {
	outcome := "ok"
	if err != nil {
		outcome = kindLabel(err)
	}
	m.calls.WithLabelValues(provider, op, outcome).Inc()
	if d > 0 {
		m.callTime.WithLabelValues(provider, op).Observe(d.Seconds())
	}
}

// BreakerChanged implements provider.Observer.
func (m *Metrics) BreakerChanged(provider, from, to string) {
	m.breaker.WithLabelValues(provider).Set(breakerValue(to))
	m.transitions.WithLabelValues(provider, to).Inc()
}

// Breaker records a provider's current breaker state (for providers whose
// breaker never changed since start).
func (m *Metrics) Breaker(provider, state string) {
	m.breaker.WithLabelValues(provider).Set(breakerValue(state))
}

// Request records one API request.
func (m *Metrics) Request(route string, status int, d time.Duration) {
	m.requests.WithLabelValues(route, statusClass(status)).Observe(d.Seconds())
}

func statusClass(s int) string {
	switch {
	case s >= 500:
		return "5xx"
	case s >= 400:
		return "4xx"
	case s >= 300:
		return "3xx"
	}
	return "2xx"
}

func breakerValue(state string) float64 {
	switch state {
	case "open":
		return 2
	case "half-open":
		return 1
	}
	return 0
}

// kindLabel names err's driver error kind ("not_found"...), or "other".
func kindLabel(err error) string {
	switch driver.ClassOf(err) {
	case driver.ErrRetryable:
		return "retryable"
	case driver.ErrPermanent:
		return "permanent"
	case driver.ErrNotFound:
		return "not_found"
	case driver.ErrAlreadyExists:
		return "already_exists"
	case driver.ErrUnsupported:
		return "unsupported"
	case driver.ErrNotSuspended:
		return "not_suspended"
	case driver.ErrQuotaExceeded:
		return "quota_exceeded"
	case driver.ErrInsufficientCapacity:
		return "insufficient_capacity"
	case driver.ErrInvalid:
		return "invalid"
	case driver.ErrTimeout:
		return "timeout"
	case driver.ErrDeleteFailed:
		return "delete_failed"
	}
	return "other"
}

// Interface guards.
var (
	_ control.Metrics   = (*Metrics)(nil)
	_ provider.Observer = (*Metrics)(nil)
)
