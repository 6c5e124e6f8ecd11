// Command berth is Berth's one binary: the server (berth server) and the
// client verbs that talk to it over the REST API.
//
// Exit codes:
//
//	0  success
//	1  any other error
//	2  usage: bad flags or arguments
//	3  not found: no such instance, node, image or provider
//	4  invalid: the server rejected the input (the message names the field)
//	5  conflict: already exists, not suspended, no capacity, quota exceeded
//	6  unsupported: the back-end cannot do this
//	7  unavailable: the server cannot be reached or a back-end is down
//
// berth exec exits with the exit code of the command it ran; the codes
// above are then its own only when the command could not be run.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/berth-dev/berth/config"
	"github.com/berth-dev/berth/driver"

	// The back-ends Berth ships with; each registers itself.
	_ "github.com/berth-dev/berth/drivers/docker"
	_ "github.com/berth-dev/berth/drivers/kubernetes"
	_ "github.com/berth-dev/berth/drivers/local"
	_ "github.com/berth-dev/berth/drivers/plugin"
	_ "github.com/berth-dev/berth/drivers/sim"
	sshdriver "github.com/berth-dev/berth/drivers/ssh"
	_ "github.com/berth-dev/berth/drivers/vm"
)

// Exit codes; see the package comment.
const (
	exitOK          = 0
	exitError       = 1
	exitUsage       = 2
	exitNotFound    = 3
	exitInvalid     = 4
	exitConflict    = 5
	exitUnsupported = 6
	exitUnavailable = 7
)

// EnvAddr names the environment variable holding the server's address.
const EnvAddr = "BERTH_ADDR"

// defaultAddr is where client verbs look for the server by default.
var defaultAddr = fmt.Sprintf("http://127.0.0.1:%d", config.DefaultPort)

func main() {
	// The ssh back-end's supervisor, which runs on the hosts: hidden, it
	// is no verb of the client's.
	if len(os.Args) > 1 && os.Args[1] == sshdriver.SuperviseCommand {
		os.Exit(sshdriver.Supervise(os.Args[2:], os.Stdout, os.Stderr))
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// cli is what every verb shares: the global flags and the output streams.
type cli struct {
	addr      string
	addrSet   bool // --addr or $BERTH_ADDR given: it beats the context's
	token     string
	namespace string
	caFile    string
	context   string
	stdout    io.Writer
	stderr    io.Writer
}

// usageError marks a mistake in the command line (exit code 2).
type usageError struct{ error }

func (e usageError) Unwrap() error { return e.error }

func usagef(format string, args ...any) error { return usageError{fmt.Errorf(format, args...)} }

// run executes the command line args and returns the exit code.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return runIn(ctx, args, nil, stdout, stderr)
}

// runIn is run with stdin as the input (nil: the process's).
func runIn(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	root := newRoot(stdout, stderr)
	root.SetArgs(args)
	if stdin != nil {
		root.SetIn(stdin)
	}
	err := root.ExecuteContext(ctx)
	if err == nil {
		return exitOK
	}
	if unreachable(err) {
		addr := root.PersistentFlags().Lookup("addr").Value.String()
		fmt.Fprintf(stderr, "berth: cannot reach the Berth server at %s: is the server running at %s? (start one with: berth server --dev)\n", addr, addr)
		return exitUnavailable
	}
	var es exitStatus
	if errors.As(err, &es) {
		return int(es) // the command's own, which said why
	}
	var rep reported
	if !errors.As(err, &rep) {
		fmt.Fprintln(stderr, "berth:", err)
	}
	return exitCode(err)
}

// exitCode maps an error to the documented exit codes.
func exitCode(err error) int {
	var ue usageError
	switch {
	case err == nil:
		return exitOK
	case errors.As(err, &ue):
		return exitUsage
	case errors.Is(err, driver.ErrNotFound):
		return exitNotFound
	case errors.Is(err, driver.ErrAlreadyExists), errors.Is(err, driver.ErrNotSuspended),
		errors.Is(err, driver.ErrInsufficientCapacity), errors.Is(err, driver.ErrQuotaExceeded):
		return exitConflict
	case errors.Is(err, driver.ErrUnsupported):
		return exitUnsupported
	case errors.Is(err, driver.ErrRetryable), errors.Is(err, driver.ErrTimeout):
		return exitUnavailable
	case errors.Is(err, driver.ErrInvalid):
		// Last: other kinds may carry a field error naming the field.
		return exitInvalid
	}
	return exitError
}

func newRoot(stdout, stderr io.Writer) *cobra.Command {
	c := &cli{stdout: stdout, stderr: stderr}
	root := &cobra.Command{
		Use:   "berth",
		Short: "Berth places containers, processes and VMs onto nodes and runs them",
		Long: `Berth places workloads (containers, processes, VMs) onto nodes and runs them
through pluggable compute back-ends.

Start a server with "berth server --dev", then use the other verbs against it.
The server address comes from --addr, else $BERTH_ADDR, else ` + defaultAddr + `.
The token comes from --token, else $BERTH_TOKEN, else (for a server on this
host) the admin token the server wrote in its data directory.

Exit codes: 0 ok, 1 error, 2 usage, 3 not found, 4 invalid input,
5 conflict (exists, capacity, quota), 6 unsupported, 7 server or back-end unavailable.`,
		SilenceUsage:  true,
		SilenceErrors: true,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) > 0 {
				return usagef("unknown command %q; see berth --help", args[0])
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error { return cmd.Help() },
	}
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.SetFlagErrorFunc(func(cmd *cobra.Command, err error) error { return usageError{err} })
	addr := os.Getenv(EnvAddr)
	c.addrSet = addr != ""
	if addr == "" {
		addr = defaultAddr
	}
	root.PersistentPreRun = func(cmd *cobra.Command, args []string) {
		c.addrSet = c.addrSet || cmd.Flags().Changed("addr")
	}
	root.PersistentFlags().StringVar(&c.addr, "addr", addr, "server address (default from $"+EnvAddr+")")
	root.PersistentFlags().StringVar(&c.token, "token", "", "bearer token (default $"+EnvToken+"; for a server on this host, the admin token in its data directory)")
	root.PersistentFlags().StringVar(&c.caFile, "ca-file", os.Getenv("BERTH_CA_FILE"), "PEM file of the CAs of the server's TLS certificate (default $BERTH_CA_FILE)")
	root.PersistentFlags().StringVar(&c.context, "context", "", "the context (server and token) to use; default $"+EnvContext+", else the current one (berth context)")
	root.PersistentFlags().StringVar(&c.namespace, "namespace", os.Getenv(EnvNamespace), "namespace submissions land in, one of the token's (default $"+EnvNamespace+", else the token's first)")

	root.AddCommand(newServerCmd(c))
	root.AddCommand(clientCommands(c)...)
	root.AddCommand(tokenCmd(c), contextCmd(c), membersCmd(c))
	root.AddCommand(dockerCommands(c)...)
	root.AddCommand(newSimCmd())
	return root
}

// nArgs checks the number of positional arguments, as a usage error.
func nArgs(min, max int) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		switch {
		case len(args) < min && min == max:
			return usagef("%s takes %d argument(s), got %d", cmd.CommandPath(), min, len(args))
		case len(args) < min:
			return usagef("%s takes at least %d argument(s), got %d", cmd.CommandPath(), min, len(args))
		case max >= 0 && len(args) > max:
			return usagef("%s takes at most %d argument(s), got %d", cmd.CommandPath(), max, len(args))
		}
		return nil
	}
}
