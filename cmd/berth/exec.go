package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/berth-dev/berth/api/client"
	"github.com/berth-dev/berth/driver"
)

// exitStatus is the exit code of a command berth ran for the user (berth
// exec): berth exits with it and prints nothing more.
type exitStatus int

func (e exitStatus) Error() string { return fmt.Sprintf("the command exited with code %d", int(e)) }

func execCmd(c *cli) *cobra.Command {
	var interactive, tty bool
	var env []string
	var user, workdir string
	cmd := &cobra.Command{
		Use:   "exec [-i] [-t] REF -- CMD [ARG...]",
		Short: "Run a command in a running instance",
		Long: `Run a command in a running instance, as docker exec does, and exit with
its exit code.

The command runs with the instance's environment (-e adds to it), as its
user (-u another), in its working directory (-w another). -i sends this
input to the command until its end; -t runs it on a terminal, which gets
this terminal's size, and this terminal is put in raw mode with -i.
A back-end that cannot run commands in its instances refuses (exit 6).`,
		Args: func(cmd *cobra.Command, args []string) error {
			return nArgs(2, -1)(cmd, dropDash(args))
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			args = dropDash(args)
			cl, err := c.client()
			if err != nil {
				return err
			}
			opts := client.ExecOptions{Cmd: args[1:], Env: env, User: user, WorkDir: workdir, TTY: tty, Stdout: c.stdout, Stderr: c.stderr}
			if tty {
				opts.Stderr = c.stdout
			}
			restore, err := c.terminal(cmd.Context(), cmd.InOrStdin(), interactive, tty, func(in io.Reader, sizes <-chan driver.TTYSize) {
				if interactive {
					opts.Stdin = in
				}
				opts.Resize = sizes
			})
			if err != nil {
				return err
			}
			code, err := cl.Exec(cmd.Context(), args[0], opts)
			restore()
			if err != nil {
				return err
			}
			if code != 0 {
				return exitStatus(code)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.SetInterspersed(false) // what follows REF is the command's
	f.BoolVarP(&interactive, "interactive", "i", false, "send this input to the command")
	f.BoolVarP(&tty, "tty", "t", false, "run the command on a terminal")
	f.StringArrayVarP(&env, "env", "e", nil, "set an environment variable, NAME=value (repeatable)")
	f.StringVarP(&user, "user", "u", "", "run as this user (name or id, optionally :group)")
	f.StringVarP(&workdir, "workdir", "w", "", "run in this directory")
	cmd.ValidArgsFunction = c.completeInstances
	return cmd
}

// dropDash removes the "--" that may follow REF: flags stop at REF, so
// it is left among the arguments.
func dropDash(args []string) []string {
	if len(args) > 1 && args[1] == "--" {
		return append(args[:1:1], args[2:]...)
	}
	return args
}

// terminal prepares in for a stream to an instance: with tty and in a
// terminal, the terminal in raw mode when stdin (the input is sent) and
// its sizes, the current one first, on the channel given to use; use gets
// in and the sizes (nil without a terminal). restore puts the terminal
// back and stops following its size.
func (c *cli) terminal(ctx context.Context, in io.Reader, stdin, tty bool, use func(io.Reader, <-chan driver.TTYSize)) (restore func(), err error) {
	f, ok := in.(*os.File)
	if !ok || !tty || !term.IsTerminal(int(f.Fd())) {
		use(in, nil)
		return func() {}, nil
	}
	fd := int(f.Fd())
	undo := []func(){}
	restore = func() {
		for i := len(undo) - 1; i >= 0; i-- {
			undo[i]()
		}
	}
	if stdin {
		old, err := term.MakeRaw(fd)
		if err != nil {
			return nil, fmt.Errorf("put the terminal in raw mode: %w", err)
		}
		undo = append(undo, func() { _ = term.Restore(fd, old) })
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
	wctx, cancel := context.WithCancel(ctx)
	undo = append(undo, func() { signal.Stop(winch) }, cancel)
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
	use(in, sizes)
	return restore, nil
}
