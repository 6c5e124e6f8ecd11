package metrics

import (
	"fmt"
	"io"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/control"
	"github.com/berth-dev/berth/driver"
)

func scrape(t *testing.T, m *Metrics) string {
	t.Helper()
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	b, _ := io.ReadAll(rec.Body)
	return string(b)
}

func TestMetricsAreExported(t *testing.T) {
	m := New()
	m.Scheduled(3*time.Millisecond, true)
	m.QueueDepth(7)
	m.Launched("sim", nil)
	m.Launched("sim", nil)
	m.Launched("sim", fmt.Errorf("create: %w", driver.ErrQuotaExceeded))
	m.LeakFound("docker")
	m.Conflicts(2)
	m.Conflicts(1)
	m.QuotaUse(control.QuotaUse{Quota: control.Quota{Owner: "alice", Instances: 10, CPU: 4000}, UsedInstances: 3, UsedCPU: 1500})
	m.Call("sim", "create", 2*time.Millisecond, nil)
	m.Call("sim", "get", 0, driver.ErrNotFound)
	m.BreakerChanged("docker", "closed", "open")
	m.Request("POST /v1/requests", 201, time.Millisecond)
	m.RebalanceRound(false, 0, 0)
	m.RebalanceRound(true, 5, 2)
	m.RebalanceEnded("aborted", 3, 1)
	out := scrape(t, m)
	for _, want := range []string{
		`berth_schedule_duration_seconds_count{placed="true"} 1`,
		`berth_queue_depth 7`,
		`berth_launches_total{provider="sim"} 2`,
		`berth_launch_failures_total{kind="quota_exceeded",provider="sim"} 1`,
		`berth_leaks_deleted_total{provider="docker"} 1`,
		`berth_schedule_conflicts_total 3`,
		`berth_rebalance_rounds_total{applied="false"} 1`,
		`berth_rebalance_planned_freed_nodes_total 2`,
		`berth_rebalance_runs_total{state="aborted"} 1`,
		`berth_rebalance_moves_total{outcome="undone"} 1`,
		`berth_quota_used{name="alice",resource="cpus",scope="owner"} 1.5`,
		`berth_quota_used{name="alice",resource="instances",scope="owner"} 3`,
		`berth_quota_limit{name="alice",resource="instances",scope="owner"} 10`,
		`berth_backend_calls_total{op="get",outcome="not_found",provider="sim"} 1`,
		`berth_backend_call_duration_seconds_count{op="create",provider="sim"} 1`,
		`berth_breaker_state{provider="docker"} 2`,
		`berth_breaker_transitions_total{provider="docker",to="open"} 1`,
		`berth_api_request_duration_seconds_count{code="2xx",route="POST /v1/requests"} 1`,
		`go_goroutines`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("missing %s", want)
		}
	}
	m.BreakerChanged("docker", "open", "half-open")
	if out := scrape(t, m); !strings.Contains(out, `berth_breaker_state{provider="docker"} 1`) {
		t.Error("half-open not exported as 1")
	}
}

func TestTwoInstancesDoNotCollide(t *testing.T) {
	a, b := New(), New()
	a.QueueDepth(1)
	b.QueueDepth(2)
	if !strings.Contains(scrape(t, a), "berth_queue_depth 1") || !strings.Contains(scrape(t, b), "berth_queue_depth 2") {
		t.Fatal("registries are shared")
	}
}
