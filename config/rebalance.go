package config

import (
	"errors"
	"time"

	"github.com/berth-dev/berth/control"
	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/scheduler"
)

// Rebalance configures the continuous mode of rebalancing
// (control.AutoRebalance): at most one round every Every, carried out when
// it frees at least MinFreed nodes (binpack) or brings at least
// MinUnloaded nodes under Threshold (spread), within the budgets. Off
// while Every is 0, the default.
type Rebalance struct {
	Every           time.Duration `yaml:"every"`
	Goal            string        `yaml:"goal"`
	Threshold       float64       `yaml:"threshold"`
	Load            string        `yaml:"load"`
	MinFreed        int           `yaml:"min_freed"`
	MinUnloaded     int           `yaml:"min_unloaded"`
	MaxMoves        int           `yaml:"max_moves"`
	GroupBudget     string        `yaml:"group_budget"`
	NamespaceBudget int           `yaml:"namespace_budget"`
	Parallel        int           `yaml:"parallel"`
	Rate            float64       `yaml:"rate"`
	MoveTimeout     time.Duration `yaml:"move_timeout"`
}

func (r Rebalance) options() control.ApplyOptions {
	return control.ApplyOptions{
		RebalanceOptions: control.RebalanceOptions{Goal: scheduler.RebalanceGoal(r.Goal), Threshold: r.Threshold, Load: r.Load, MaxMoves: r.MaxMoves},
		GroupBudget:      r.GroupBudget, NamespaceBudget: r.NamespaceBudget, Parallel: r.Parallel, Rate: r.Rate, MoveTimeout: r.MoveTimeout,
	}
}

// Apply copies r into cfg.
func (r Rebalance) Apply(cfg *control.Config) {
	cfg.Rebalance = control.AutoRebalance{Every: r.Every, MinFreed: r.MinFreed, MinUnloaded: r.MinUnloaded, Options: r.options()}
}

func (r Rebalance) validate(es *driver.FieldErrors) {
	checkRange(es, "rebalance.every", r.Every, 0, 24*time.Hour, time.Minute)
	checkRange(es, "rebalance.min_freed", r.MinFreed, 0, 1_000_000)
	checkRange(es, "rebalance.min_unloaded", r.MinUnloaded, 0, 1_000_000)
	o := r.options()
	if err := o.Check(); err != nil {
		var fe driver.FieldErrors
		if errors.As(err, &fe) {
			for _, e := range fe {
				es.Add("rebalance."+e.Path, "%s", e.Reason)
			}
		}
	}
}
