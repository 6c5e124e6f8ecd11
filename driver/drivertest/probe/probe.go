// Package probe is the program the conformance suite's exec case runs in
// an instance (drivertest.Harness.Exec): each argument is one step, done in
// order, and the program exits 0 after the last.
//
//	out=TEXT   writes TEXT and a newline to stdout
//	err=TEXT   writes TEXT and a newline to stderr
//	env=NAME   writes "NAME=value" (or "NAME unset") to stdout
//	pwd        writes the working directory to stdout
//	cat        copies stdin to stdout until its end
//	tty        writes "tty true" or "tty false": whether stdin is a terminal
//	sizes      writes "size ROWSxCOLS", the terminal's size, for each line
//	           it reads, until the end of stdin
//	touch=PATH creates the file PATH, empty
//	read=PATH  writes "PATH: exists" or "PATH: missing" to stdout
//	exit=N     exits with code N at once
//
// A driver's test image or test binary calls Main with its arguments.
package probe

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"golang.org/x/term"
)

// Main runs the steps of args with the process's standard streams and
// returns the exit code.
func Main(args []string) int {
	return Run(args, os.Stdin, os.Stdout, os.Stderr)
}

// Run runs the steps of args and returns the exit code: N for exit=N, 2
// for a step it does not know or that failed, else 0.
func Run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	for _, a := range args {
		verb, arg, _ := strings.Cut(a, "=")
		var err error
		switch verb {
		case "out":
			_, err = fmt.Fprintln(stdout, arg)
		case "err":
			_, err = fmt.Fprintln(stderr, arg)
		case "env":
			if v, ok := os.LookupEnv(arg); ok {
				_, err = fmt.Fprintf(stdout, "%s=%s\n", arg, v)
			} else {
				_, err = fmt.Fprintf(stdout, "%s unset\n", arg)
			}
		case "pwd":
			var dir string
			if dir, err = os.Getwd(); err == nil {
				_, err = fmt.Fprintln(stdout, dir)
			}
		case "cat":
			_, err = io.Copy(stdout, stdin)
		case "tty", "sizes":
			f, ok := stdin.(*os.File)
			isTTY := ok && term.IsTerminal(int(f.Fd()))
			if verb == "tty" {
				_, err = fmt.Fprintf(stdout, "tty %v\n", isTTY)
				break
			}
			if !isTTY {
				err = fmt.Errorf("stdin is no terminal")
				break
			}
			sc := bufio.NewScanner(stdin)
			for err == nil && sc.Scan() {
				var cols, rows int
				if cols, rows, err = term.GetSize(int(f.Fd())); err == nil {
					_, err = fmt.Fprintf(stdout, "size %dx%d\n", rows, cols)
				}
			}
		case "touch":
			err = os.WriteFile(arg, nil, 0o644)
		case "read":
			state := "exists"
			if _, serr := os.Stat(arg); serr != nil {
				state = "missing"
			}
			_, err = fmt.Fprintf(stdout, "%s: %s\n", arg, state)
		case "exit":
			n, perr := strconv.Atoi(arg)
			if perr != nil {
				err = perr
				break
			}
			return n
		default:
			err = fmt.Errorf("unknown step %q", a)
		}
		if err != nil {
			fmt.Fprintf(stderr, "probe: %s: %v\n", a, err)
			return 2
		}
	}
	return 0
}
