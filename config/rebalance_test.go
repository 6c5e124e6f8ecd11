package config

import (
	"testing"
	"time"

	"github.com/berth-dev/berth/control"
)

func TestRebalanceSection(t *testing.T) {
	cfg, err := Load(writeFile(t, "rebalance: {every: 10m, goal: spread, threshold: 0.7, min_unloaded: 2, group_budget: 25%, rate: 0.5}\n"), nil)
	if err != nil {
		t.Fatal(err)
	}
	var pc control.Config
	cfg.Rebalance.Apply(&pc)
	a := pc.Rebalance
	if a.Every != 10*time.Minute || a.MinUnloaded != 2 || a.Options.Goal != "spread" || a.Options.Threshold != 0.7 || a.Options.GroupBudget != "25%" || a.Options.Rate != 0.5 {
		t.Fatalf("rebalance: %+v", a)
	}
	for _, c := range []struct{ body, path string }{
		{"rebalance: {every: 1s}\n", "rebalance.every"},
		{"rebalance: {goal: pack}\n", "rebalance.goal"},
		{"rebalance: {threshold: 2}\n", "rebalance.threshold"},
		{"rebalance: {group_budget: 0}\n", "rebalance.group_budget"},
		{"rebalance: {parallel: 65}\n", "rebalance.parallel"},
		{"rebalance: {max_moves: 501}\n", "rebalance.max_moves"},
		{"rebalance: {every: 10m, moves: 3}\n", "rebalance.moves"},
	} {
		_, err := Load(writeFile(t, c.body), nil)
		wantField(t, err, c.path)
	}
}
