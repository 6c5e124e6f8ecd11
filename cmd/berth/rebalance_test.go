package main

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/berth-dev/berth/api"
	"github.com/berth-dev/berth/api/apitest"
	"github.com/berth-dev/berth/api/client"
	"github.com/berth-dev/berth/auth"
	"github.com/berth-dev/berth/control"
	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/scheduler"
	"github.com/berth-dev/berth/store/memory"
)

// TestRebalancePlan spreads a service over four sim nodes of 4 cpus, then
// plans a rebalance through the CLI: the plan frees nodes, keeps the
// instance that opts out where it is, changes nothing and replays valid;
// an operator of another namespace moves nothing; --apply --wait carries
// the plan out and --status shows it; a reader may not ask.
func TestRebalancePlan(t *testing.T) {
	e := apitest.Start(t, memory.New(memory.Options{}), map[string]any{"nodes": 4}, api.Options{})
	t.Setenv(EnvToken, e.Token)
	addr := e.HTTP.URL
	ctx := context.Background()
	cl := e.Client(t, "", client.WithNamespace("shop"))
	one := driver.Resources{CPU: driver.CPUs(1), Memory: 256 * driver.MiB}
	no := false
	for _, r := range []scheduler.Request{
		{ID: "web", Count: 4, Spec: driver.Spec{Image: "web", Resources: one}},
		{ID: "db", Spec: driver.Spec{Image: "db", Resources: one}, Movable: &no},
	} {
		if _, err := cl.Submit(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "five running instances", func() bool {
		list, err := cl.Instances(ctx, control.Filter{Phases: []control.Phase{"running"}})
		return err == nil && len(list) == 5
	})
	before, err := cl.Instances(ctx, control.Filter{})
	if err != nil {
		t.Fatal(err)
	}

	code, out, errOut := berth(t, addr, "rebalance", "--plan", "--json")
	if code != 0 {
		t.Fatalf("rebalance --plan --json: exit %d: %s", code, errOut)
	}
	var ans control.RebalanceAnswer
	if err := driver.UnmarshalOutput([]byte(out), &ans); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if ans.NodesBefore != 4 || ans.NodesAfter != 2 || len(ans.Freed) != 2 || !ans.Check.OK() || ans.Check.Moved != len(ans.Moves) {
		t.Fatalf("plan: %s", out)
	}
	for _, m := range ans.Moves {
		if m.Instance == "db" {
			t.Fatalf("db opted out and moved: %+v", m)
		}
	}
	after, err := cl.Instances(ctx, control.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	for k := range before {
		if before[k].Node != after[k].Node || before[k].Revision != after[k].Revision {
			t.Fatalf("planning changed %s: %+v -> %+v", before[k].ID, before[k], after[k])
		}
	}

	code, out, _ = berth(t, addr, "rebalance", "--plan")
	t.Logf("rebalance --plan:\n%s", out)
	if code != 0 || !strings.Contains(out, "moves free 2 nodes: 4 nodes in use -> 2") || !strings.Contains(out, ": valid") {
		t.Fatalf("rebalance --plan: exit %d:\n%s", code, out)
	}
	if code, _, errOut := berth(t, addr, "rebalance"); code != exitUsage || !strings.Contains(errOut, "--plan") {
		t.Fatalf("rebalance without --plan: exit %d: %s", code, errOut)
	}
	if code, _, errOut := berth(t, addr, "rebalance", "--plan", "--goal", "pack"); code == 0 || !strings.Contains(errOut, "goal") {
		t.Fatalf("rebalance --goal pack: exit %d: %s", code, errOut)
	}

	op := e.Client(t, e.NewToken(t, "other", auth.RoleOperator, "other"))
	theirs, err := op.PlanRebalance(ctx, control.RebalanceOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(theirs.Moves) != 0 || theirs.StaysTotal != 0 || len(theirs.Stays) != 0 {
		t.Fatalf("another namespace's plan: %+v", theirs)
	}
	code, out, errOut = berth(t, addr, "rebalance", "--apply", "--wait", "--json")
	if code != 0 {
		t.Fatalf("rebalance --apply --wait: exit %d: %s %s", code, out, errOut)
	}
	var run control.RebalanceRun
	if err := driver.UnmarshalOutput([]byte(out), &run); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if run.State != control.RunDone || len(run.Moves) != 2 {
		t.Fatalf("run: %s", out)
	}
	nodes := map[string]int{}
	list, err := cl.Instances(ctx, control.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	for _, in := range list {
		if in.Phase == "running" {
			nodes[in.Node]++
		}
	}
	if len(nodes) != 2 {
		t.Fatalf("after the run, instances run on %v", nodes)
	}
	if code, out, _ := berth(t, addr, "rebalance", "--status"); code != 0 || !strings.Contains(out, "2 moves: 2 done") {
		t.Fatalf("rebalance --status: exit %d:\n%s", code, out)
	}

	reader := e.Client(t, e.NewToken(t, "ro", auth.RoleReader, "shop"))
	var ae *api.Error
	if _, err := reader.PlanRebalance(ctx, control.RebalanceOptions{}); !errors.As(err, &ae) || ae.Status != http.StatusForbidden {
		t.Fatalf("a reader's plan: %v", err)
	}
}
