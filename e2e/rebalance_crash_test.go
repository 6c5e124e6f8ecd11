package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/berth-dev/berth/control"
	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/scheduler"
)

// TestRebalanceKillDuringApply spreads instances over the nodes of a sim
// provider, starts `berth rebalance --apply` at a slow rate, kills the
// server with SIGKILL once a move is under way and starts it again on the
// same data directory. The run must end abandoned (docs/rebalance.md, "A
// restart during a run"), every submitted request must have exactly one
// running instance, and each node's back-end must run exactly the
// instances the plane places there. The sim holds its instances in the
// server's memory, so the restarted server finds its back-end empty: the
// instances (restart policy always) are found lost and placed again, and
// a copy the settling deletes must not be left running. The server is
// killed once while a move's new copy is being created (the settling
// undoes the move) and once after it ran (the move is finished).
func TestRebalanceKillDuringApply(t *testing.T) {
	t.Parallel()
	t.Run("new copy stored", func(t *testing.T) { t.Parallel(); rebalanceKill(t, false) })
	t.Run("new copy running", func(t *testing.T) { t.Parallel(); rebalanceKill(t, true) })
}

// rebalanceKill is TestRebalanceKillDuringApply, killing the server once a
// move's new copy is stored, or, with copyRuns, once it runs.
func rebalanceKill(t *testing.T, copyRuns bool) {
	const nodes, total = 4, 8
	dir := t.TempDir()
	dataDir := filepath.Join(dir, "data")
	cfg := filepath.Join(dir, "berth.yaml")
	// A create takes a second, so that a move's new copy is seen under way.
	body := "listen: 127.0.0.1:0\ndata_dir: " + dataDir + "\n" +
		"providers:\n  - name: sim\n    driver: sim\n    options: {nodes: " + itoa(nodes) +
		", create_latency: 1s, shape: '{\"cpus\": 8, \"memory\": \"16Gi\"}'}\n"
	if err := os.WriteFile(cfg, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	start := func() *server {
		s := startServerWith(t, "--config", cfg)
		s.dataDir = dataDir
		return s
	}
	s := start()
	cl := newClient(t, s)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	requests := map[string]bool{}
	for i := range total {
		id := fmt.Sprintf("r%d", i)
		requests[id] = true
		_, err := cl.Submit(ctx, scheduler.Request{
			ID:       id,
			Strategy: scheduler.StrategySpread,
			Spec: driver.Spec{
				Kind:      driver.KindContainer,
				Image:     "busybox:latest",
				Resources: driver.Resources{CPU: 1, Memory: 256 << 20},
				// The sim keeps its instances in the server's memory: the
				// kill loses them all, and the plane places them again.
				RestartPolicy: driver.RestartPolicy{Name: "always"},
			},
		})
		if err != nil {
			t.Fatalf("submit %s: %v", id, err)
		}
	}
	waitFor(t, "every request to run", func() bool {
		return len(runningByRequest(ctx, t, cl)) == total
	})

	var plan control.RebalanceAnswer
	if err := driver.UnmarshalOutput([]byte(mustBerth(t, s, "rebalance", "--plan", "--json")), &plan); err != nil {
		t.Fatal(err)
	}
	if len(plan.Moves) < 3 {
		t.Fatalf("the binpack plan has %d moves, want several: %+v", len(plan.Moves), plan)
	}
	mustBerth(t, s, "rebalance", "--apply", "--rate", "0.5", "--parallel", "1")
	var run *control.RebalanceRun
	// A move is under way once its new copy is stored: the run records
	// the copy's id before the copy is created.
	waitFor(t, "a move's new copy to be stored", func() bool {
		var err error
		run, err = cl.RebalanceStatus(ctx)
		if err != nil || run.State != control.RunRunning {
			return false
		}
		list, err := cl.Instances(ctx, control.Filter{All: true})
		if err != nil {
			return false
		}
		for _, m := range run.Moves {
			for _, in := range list {
				if m.New != "" && in.ID == m.New && (!copyRuns || in.Phase == "running") {
					return true
				}
			}
		}
		return false
	})
	s.kill9(t)
	t.Logf("killed with the run at %s", movesStates(run))

	s = start()
	cl = newClient(t, s)
	waitFor(t, "the run to be abandoned", func() bool {
		var err error
		run, err = cl.RebalanceStatus(ctx)
		return err == nil && run.State != control.RunRunning
	})
	t.Logf("after the restart: %s %s: %s", run.State, run.Error, movesStates(run))
	if run.State != control.RunAbandoned {
		t.Fatalf("the run is %s, want %s", run.State, control.RunAbandoned)
	}
	for _, m := range run.Moves {
		switch m.State {
		case control.MoveCreating, control.MoveDeleting:
			t.Errorf("move of %s left %s", m.Instance, m.State)
		}
	}
	if copyRuns && run.Moves[0].State != control.MoveDone {
		t.Errorf("the first move, whose new copy ran, is %s, want %s", run.Moves[0].State, control.MoveDone)
	}

	// Settled: every instance the plane keeps runs, and the back-end runs
	// what the plane places: per node, as many instances as the plane's
	// records put there (no leaked copy), total in all.
	var (
		views  []control.NodeView
		onNode map[string]int
	)
	defer func() {
		if t.Failed() {
			for _, v := range views {
				t.Logf("node %s: the back-end runs %d, the plane counts %d, its records place %d", v.Name, v.Instances, v.BerthCount, onNode[v.Name])
			}
			t.Logf("server log:\n%s", tail(s.logs(), 40))
		}
	}()
	waitFor(t, "each node's back-end to run the plane's instances", func() bool {
		var err error
		views, err = cl.Nodes(ctx, "sim")
		if err != nil {
			return false
		}
		list, err := cl.Instances(ctx, control.Filter{})
		if err != nil {
			return false
		}
		onNode = map[string]int{}
		for _, in := range list {
			if in.Phase != "running" {
				return false
			}
			onNode[in.Node]++
		}
		sum := 0
		for _, v := range views {
			if v.Instances != onNode[v.Name] || v.BerthCount != onNode[v.Name] {
				return false
			}
			sum += v.Instances
		}
		return sum == total
	})
	// Once the back-end agrees, one running instance a request.
	byReq := runningByRequest(ctx, t, cl)
	for id := range requests {
		if byReq[id] != 1 {
			t.Errorf("request %s runs %d instances, want 1", id, byReq[id])
		}
	}
	if err := s.stop(t); err != nil {
		t.Fatalf("SIGTERM: %v", err)
	}
}

// runningByRequest counts the running instances of each request.
func runningByRequest(ctx context.Context, t *testing.T, cl interface {
	Instances(context.Context, control.Filter) ([]control.Instance, error)
}) map[string]int {
	t.Helper()
	list, err := cl.Instances(ctx, control.Filter{})
	if err != nil {
		return nil
	}
	out := map[string]int{}
	for _, in := range list {
		if in.Phase == "running" {
			out[in.Request]++
		}
	}
	return out
}

// movesStates lists a run's moves as instance:state.
func movesStates(run *control.RebalanceRun) string {
	s := ""
	for _, m := range run.Moves {
		s += fmt.Sprintf(" %s:%s", m.Instance, m.State)
	}
	return s
}
