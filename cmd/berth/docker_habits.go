package main

import "github.com/spf13/cobra"

// dockerCommands are the verbs that follow Docker's habits: compose and
// group.
func dockerCommands(c *cli) []*cobra.Command {
	return []*cobra.Command{composeCmd(c), groupCmd(c)}
}
