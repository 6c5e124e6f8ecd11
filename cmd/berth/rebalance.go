package main

import (
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/berth-dev/berth/api/client"
	"github.com/berth-dev/berth/control"
	"github.com/berth-dev/berth/scheduler"
)

func rebalanceCmd(c *cli) *cobra.Command {
	var ao control.ApplyOptions
	opt := &ao.RebalanceOptions
	var goal string
	var plan, apply, status, wait, asJSON bool
	cmd := &cobra.Command{
		Use: "rebalance --plan|--apply|--status [--goal binpack|spread] [--threshold F] [--load reserved|measured] [--max-moves N]\n" +
			"          [--group-budget N|N%] [--namespace-budget N] [--parallel N] [--rate R] [--move-timeout D] [--wait] [--json]",
		Short: "Plan moves of running instances that free nodes or even out the load",
		Long: `Rebalance --plan computes, from the cluster as it runs, the moves that empty the
most nodes (--goal binpack, the default) or bring the nodes loaded over
--threshold under it (--goal spread), keeping every constraint, affinity,
max_per_node, port and quota placement keeps. It prints the moves, the nodes
freed or the loads before and after, why the instances that could not move
stay, and the result of replaying the plan make-before-break on a fresh copy
of the scheduler's ledger. Nothing is changed. An operator's plan moves only
the instances of its namespaces.

Rebalance --apply plans the same way and has the server carry the plan out:
each move starts a new copy of the instance on its target node, waits until
it runs, then deletes the old copy. At most --group-budget instances of a
group move at once (a count, or a share such as 25%), at most
--namespace-budget of a namespace, --parallel in all, --rate started a
second; the first failure stops the run. --wait follows the run until it
ends; --status shows the current or latest run.`,
		Args: nArgs(0, 0),
		RunE: func(cmd *cobra.Command, args []string) error {
			n := 0
			for _, b := range []bool{plan, apply, status} {
				if b {
					n++
				}
			}
			if n != 1 {
				return usagef("rebalance: give one of --plan, --apply and --status")
			}
			opt.Goal = scheduler.RebalanceGoal(goal)
			cl, err := c.client()
			if err != nil {
				return err
			}
			if apply || status {
				return runRebalance(cmd, c, cl, ao, apply, wait, asJSON)
			}
			ans, err := cl.PlanRebalance(cmd.Context(), *opt)
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(c.stdout, ans)
			}
			printRebalance(c, ans)
			return nil
		},
	}
	fl := cmd.Flags()
	fl.BoolVar(&plan, "plan", false, "compute and show the plan; change nothing")
	fl.BoolVar(&apply, "apply", false, "plan, then carry the moves out make-before-break")
	fl.BoolVar(&status, "status", false, "show the current or latest run")
	fl.BoolVar(&wait, "wait", false, "with --apply or --status: follow the run until it ends")
	fl.StringVar(&ao.GroupBudget, "group-budget", "", "instances of one group moving at once: N or N% (default 1)")
	fl.IntVar(&ao.NamespaceBudget, "namespace-budget", 0, "instances of one namespace moving at once (default no bound but --parallel)")
	fl.IntVar(&ao.Parallel, "parallel", 0, fmt.Sprintf("moves under way at once (default %d)", control.DefaultApplyParallel))
	fl.Float64Var(&ao.Rate, "rate", 0, fmt.Sprintf("moves started per second at most (default %g)", control.DefaultApplyRate))
	fl.DurationVar(&ao.MoveTimeout, "move-timeout", 0, "time a new copy has to run (default the server's launch timeout)")
	fl.StringVar(&goal, "goal", "binpack", "binpack (free the most nodes) or spread (bring loaded nodes under --threshold)")
	fl.Float64Var(&opt.Threshold, "threshold", 0, "spread: the load (share of cpu or memory) every node should stay under (default 0.8)")
	fl.StringVar(&opt.Load, "load", "", "spread: count load as reserved (default) or measured")
	fl.IntVar(&opt.MaxMoves, "max-moves", 0, fmt.Sprintf("at most this many moves (default %d)", scheduler.DefaultRebalanceMoves))
	fl.BoolVar(&asJSON, "json", false, "print the answer as JSON")
	return cmd
}

// printRebalance writes a plan as tables and a summary.
func printRebalance(c *cli, ans *control.RebalanceAnswer) {
	out := c.stdout
	tw := table(out, "INSTANCE", "NAMESPACE", "FROM", "TO", "CPUS", "MEMORY", "WHY")
	for _, m := range ans.Moves {
		row(tw, m.Name, m.Owner, m.Provider+"/"+m.From, m.Provider+"/"+m.To, m.Resources.CPU, m.Resources.Memory.Human(), m.Reason)
	}
	_ = tw.Flush()
	if len(ans.Stays) > 0 {
		fmt.Fprintln(out)
		tw = table(out, "STAYS", "NODE", "WHY")
		for _, s := range ans.Stays {
			row(tw, s.Name, s.Provider+"/"+s.Node, s.Reason)
		}
		_ = tw.Flush()
		if ans.StaysTotal > len(ans.Stays) {
			fmt.Fprintf(out, "(%d of %d instances that stay)\n", len(ans.Stays), ans.StaysTotal)
		}
	}
	fmt.Fprintln(out)
	if ans.Goal == scheduler.RebalanceSpread {
		if len(ans.Loads) > 0 {
			tw = table(out, "NODE", "LOAD BEFORE", "LOAD AFTER")
			for _, l := range ans.Loads {
				row(tw, l.Provider+"/"+l.Node, fmt.Sprintf("%.1f%%", 100*l.Before), fmt.Sprintf("%.1f%%", 100*l.After))
			}
			_ = tw.Flush()
		}
		fmt.Fprintf(out, "%d moves; nodes over %.0f%%: %d -> %d; most loaded node %.1f%% -> %.1f%%\n", len(ans.Moves),
			100*ans.Threshold, ans.OverBefore, ans.OverAfter, 100*ans.MaxLoadBefore, 100*ans.MaxLoadAfter)
	} else {
		fmt.Fprintf(out, "%d moves free %d nodes: %d nodes in use -> %d (no packing uses fewer than %d)\n", len(ans.Moves),
			len(ans.Freed), ans.NodesBefore, ans.NodesAfter, ans.LowerBound)
		if len(ans.Freed) > 0 {
			fmt.Fprintf(out, "freed: %s\n", strings.Join(ans.Freed, ", "))
		}
	}
	if ans.Truncated {
		fmt.Fprintln(out, "the plan stopped at its bound on moves (--max-moves)")
	}
	ck := ans.Check
	verdict := "valid"
	if !ck.OK() {
		verdict = "NOT VALID"
	}
	fmt.Fprintf(out, "replayed on a fresh ledger: %d of %d moves accepted, %d overbooked nodes, %d instances misplaced, %d nodes in use: %s\n",
		ck.Moved, len(ans.Moves), len(ck.Overbooked), len(ck.Misplaced), ck.NodesAfter, verdict)
	for _, r := range ck.Refused {
		fmt.Fprintf(out, "  refused %s\n", r)
	}
	fmt.Fprintf(out, "planned in %.3f s, replayed in %.3f s\n", ans.PlanSeconds, ans.CheckSeconds)
}

// runRebalance starts a run (apply) or reads the current one, and
// follows it until it ends when wait is set.
func runRebalance(cmd *cobra.Command, c *cli, cl *client.Client, ao control.ApplyOptions, apply, wait, asJSON bool) error {
	ctx := cmd.Context()
	var run *control.RebalanceRun
	var err error
	if apply {
		ao.MoveTimeoutSeconds = ao.MoveTimeout.Seconds()
		ao.MoveTimeout = 0
		run, err = cl.ApplyRebalance(ctx, ao)
	} else {
		run, err = cl.RebalanceStatus(ctx)
	}
	if err != nil {
		return err
	}
	for wait && run.State == control.RunRunning {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
		if run, err = cl.RebalanceStatus(ctx); err != nil {
			return err
		}
	}
	if asJSON {
		return printJSON(c.stdout, run)
	}
	tw := table(c.stdout, "INSTANCE", "NEW COPY", "FROM", "TO", "STATE", "ERROR")
	counts := map[string]int{}
	for _, m := range run.Moves {
		counts[m.State]++
		row(tw, m.Name, m.New, m.Provider+"/"+m.From, m.Provider+"/"+m.To, m.State, m.Error)
	}
	_ = tw.Flush()
	fmt.Fprintf(c.stdout, "run %s: %s; %d moves: %d done, %d undone, %d under way, %d not started\n", run.ID, run.State, len(run.Moves),
		counts[control.MoveDone], counts[control.MoveUndone], counts[control.MoveCreating]+counts[control.MoveDeleting], counts[control.MovePlanned])
	if run.Error != "" {
		fmt.Fprintf(c.stdout, "why: %s\n", run.Error)
	}
	if run.State == control.RunAborted {
		return fmt.Errorf("rebalance %s aborted: %s", run.ID, run.Error)
	}
	return nil
}
