package main

import (
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"github.com/berth-dev/berth/reconciler"
)

// whyCmd says why an instance is where it is: pending and the reasons per
// node, the nodes that refused it, those it avoids, or how it failed.
func whyCmd(c *cli) *cobra.Command {
	return &cobra.Command{
		Use:   "why REF",
		Short: "Say why an instance waits, failed or runs where it does",
		Args:  nArgs(1, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := c.client()
			if err != nil {
				return err
			}
			in, err := cl.Instance(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			fmt.Fprintf(c.stdout, "%s is %s", in.ID, in.Phase)
			if in.Node != "" {
				fmt.Fprintf(c.stdout, " on %s/%s", in.Provider, in.Node)
			}
			fmt.Fprintln(c.stdout)
			if in.Message != "" {
				// The scheduler's reasons read "N nodes: reason; M: other".
				fmt.Fprintln(c.stdout, "  "+strings.ReplaceAll(in.Message, "; ", "\n  "))
			}
			for _, r := range in.Refused {
				fmt.Fprintln(c.stdout, "  refused by "+r)
			}
			for _, x := range in.Exclude {
				fmt.Fprintf(c.stdout, "  avoiding %s until %s\n", x, in.ExcludeUntil.Format("15:04:05"))
			}
			if in.Attempts > 0 {
				fmt.Fprintf(c.stdout, "  %d failed create attempts\n", in.Attempts)
			}
			if in.Phase == reconciler.Failed {
				return fmt.Errorf("instance %s failed", in.ID)
			}
			return nil
		},
	}
}
