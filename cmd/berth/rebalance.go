package main

import (
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"github.com/berth-dev/berth/control"
	"github.com/berth-dev/berth/scheduler"
)

func rebalanceCmd(c *cli) *cobra.Command {
	var opt control.RebalanceOptions
	var goal string
	var plan, asJSON bool
	cmd := &cobra.Command{
		Use:   "rebalance --plan [--goal binpack|spread] [--threshold F] [--load reserved|measured] [--max-moves N] [--json]",
		Short: "Plan moves of running instances that free nodes or even out the load",
		Long: `Rebalance --plan computes, from the cluster as it runs, the moves that empty the
most nodes (--goal binpack, the default) or bring the nodes loaded over
--threshold under it (--goal spread), keeping every constraint, affinity,
max_per_node, port and quota placement keeps. It prints the moves, the nodes
freed or the loads before and after, why the instances that could not move
stay, and the result of replaying the plan make-before-break on a fresh copy
of the scheduler's ledger. Nothing is changed. An operator's plan moves only
the instances of its namespaces.`,
		Args: nArgs(0, 0),
		RunE: func(cmd *cobra.Command, args []string) error {
			if !plan {
				return usagef("rebalance: --plan is required (moves are not carried out by this server yet)")
			}
			opt.Goal = scheduler.RebalanceGoal(goal)
			cl, err := c.client()
			if err != nil {
				return err
			}
			ans, err := cl.PlanRebalance(cmd.Context(), opt)
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
