package metrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/berth-dev/berth/control"
)

// rebalanceCollectors count rebalancing (control.RebalanceMetrics).
type rebalanceCollectors struct {
	rounds  *prometheus.CounterVec
	planned prometheus.Counter
	freed   prometheus.Counter
	runs    *prometheus.CounterVec
	moves   *prometheus.CounterVec
}

func (r *rebalanceCollectors) register(reg *prometheus.Registry) {
	r.rounds = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "berth_rebalance_rounds_total",
		Help: "Rounds of the continuous rebalancing, by whether their plan was carried out (applied=true) or not worth it.",
	}, []string{"applied"})
	r.planned = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "berth_rebalance_planned_moves_total",
		Help: "Moves planned by the rounds of the continuous rebalancing that were carried out.",
	})
	r.freed = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "berth_rebalance_planned_freed_nodes_total",
		Help: "Nodes the carried-out rounds of the continuous rebalancing planned to free.",
	})
	r.runs = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "berth_rebalance_runs_total",
		Help: "Rebalance runs ended, by state (done, aborted).",
	}, []string{"state"})
	r.moves = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "berth_rebalance_moves_total",
		Help: "Moves of ended rebalance runs, by outcome (done, undone).",
	}, []string{"outcome"})
	reg.MustRegister(r.rounds, r.planned, r.freed, r.runs, r.moves)
}

// RebalanceRound implements control.RebalanceMetrics.
func (m *Metrics) RebalanceRound(applied bool, moves, freed int) {
	r := &m.rebalance
	if !applied {
		r.rounds.WithLabelValues("false").Inc()
		return
	}
	r.rounds.WithLabelValues("true").Inc()
	r.planned.Add(float64(moves))
	r.freed.Add(float64(freed))
}

// RebalanceEnded implements control.RebalanceMetrics.
func (m *Metrics) RebalanceEnded(state string, done, undone int) {
	r := &m.rebalance
	r.runs.WithLabelValues(state).Inc()
	r.moves.WithLabelValues("done").Add(float64(done))
	r.moves.WithLabelValues("undone").Add(float64(undone))
}

var _ control.RebalanceMetrics = (*Metrics)(nil)
