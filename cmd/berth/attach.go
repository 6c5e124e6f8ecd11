package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"
	"golang.org/x/term"

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
	in := cmd.InOrStdin()
	if stdin {
		opts.Stdin = in
	}
	if f, ok := in.(*os.File); ok && tty && term.IsTerminal(int(f.Fd())) {
		fd := int(f.Fd())
		if stdin {
			old, err := term.MakeRaw(fd)
			if err != nil {
				return fmt.Errorf("put the terminal in raw mode: %w", err)
			}
			defer func() { _ = term.Restore(fd, old) }()
		}
		sizes := make(chan driver.TTYSize, 1)
		send := func() {
			if w, h, err := term.GetSize(fd); err == nil && w > 0 && h > 0 {
				select {
				case <-sizes:
				default:
				}
				sizes <- driver.TTYSize{Rows: uint16(h), Cols: uint16(w)}
			}
		}
		send()
		winch := make(chan os.Signal, 1)
		signal.Notify(winch, syscall.SIGWINCH)
		defer signal.Stop(winch)
		wctx, cancel := context.WithCancel(ctx)
		defer cancel()
		go func() {
			for {
				select {
				case <-wctx.Done():
					return
				case <-winch:
					send()
				}
			}
		}()
		opts.Resize = sizes
	}
	return cl.Attach(ctx, id, opts)
}
