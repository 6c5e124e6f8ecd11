package main

import (
	"context"
	"io"

	"github.com/spf13/cobra"

	"github.com/berth-dev/berth/api/client"
	"github.com/berth-dev/berth/driver"
)

func attachCmd(c *cli) *cobra.Command {
	var noStdin bool
	cmd := &cobra.Command{
		Use:   "attach REF",
		Short: "Connect this terminal to a running instance's input and output",
		Long: `Connect this terminal to a running instance's input and output.

Input is sent when the instance was made with stdin (run -i) and --no-stdin
is not given; the end of this input (Ctrl-D on a terminal) ends the
instance's. An instance with a terminal (run -t) gets this terminal's size,
and this terminal is put in raw mode while attached.`,
		Args: nArgs(1, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := c.client()
			if err != nil {
				return err
			}
			in, err := cl.Instance(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			stdin, tty := in.Spec != nil && in.Spec.Stdin && !noStdin, in.Spec != nil && in.Spec.TTY
			return c.attach(cmd.Context(), cmd, cl, in.ID, stdin, tty, false)
		},
	}
	cmd.Flags().BoolVar(&noStdin, "no-stdin", false, "do not send this input")
	cmd.ValidArgsFunction = c.completeInstances
	return cmd
}

// attach connects cmd's input and c's output to the instance id: input
// when stdin, a raw terminal and its size when tty and this input is a
// terminal. logs replays what the instance wrote before.
func (c *cli) attach(ctx context.Context, cmd *cobra.Command, cl *client.Client, id string, stdin, tty, logs bool) error {
	opts := client.AttachOptions{Stdout: c.stdout, Stderr: c.stderr, Logs: logs}
	if tty {
		opts.Stderr = c.stdout
	}
	restore, err := c.terminal(ctx, cmd.InOrStdin(), stdin, tty, func(in io.Reader, sizes <-chan driver.TTYSize) {
		if stdin {
			opts.Stdin = in
		}
		opts.Resize = sizes
	})
	if err != nil {
		return err
	}
	defer restore()
	return cl.Attach(ctx, id, opts)
}
