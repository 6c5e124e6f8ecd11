// Command hello is the program inside the test image dockertest builds: it
// writes "hello stdout" to stdout and "hello stderr" to stderr, prints the
// files named in HELLO_FILES (comma separated), serves "hello" on TCP port
// HELLO_LISTEN when set, and then runs until SIGTERM or SIGINT, when it
// exits 0. HELLO_EXIT=<n> makes it exit with code n at once instead;
// HELLO_BURN=1 keeps one cpu busy meanwhile. "hello health" is a health
// check: it exits 1 when HELLO_UNHEALTHY=1, else 0. "hello echo ARGS..."
// prints ARGS, as echo does, and exits 0. "hello cat" copies stdin to
// stdout, as cat does, and exits 0 at its end. "hello tty" prints "tty
// true" or "tty false" (whether stdin is a terminal) and exits 0; "hello
// size" prints the same, then, for each line it reads, "size ROWSxCOLS" of
// the terminal, and exits 0 at the end of stdin. "hello probe STEPS..." is
// the conformance suite's probe (package probe). "hello dial ADDR" connects
// to the TCP address ADDR (a name the container's DNS resolves, and a port),
// trying for up to a minute (HELLO_DIAL_FOR, a duration, sets another
// bound), prints "dial ADDR: " and the first line it reads, and exits 0;
// it exits 1 when no connection came.
package main

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/term"

	"github.com/berth-dev/berth/driver/drivertest/probe"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "probe" {
		os.Exit(probe.Main(os.Args[2:]))
	}
	if len(os.Args) > 1 && os.Args[1] == "health" {
		if os.Getenv("HELLO_UNHEALTHY") == "1" {
			os.Exit(1)
		}
		os.Exit(0)
	}
	if len(os.Args) > 1 && os.Args[1] == "echo" {
		fmt.Println(strings.Join(os.Args[2:], " "))
		os.Exit(0)
	}
	if len(os.Args) > 2 && os.Args[1] == "dial" {
		os.Exit(dial(os.Args[2]))
	}
	if len(os.Args) > 1 && os.Args[1] == "cat" {
		if _, err := io.Copy(os.Stdout, os.Stdin); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	if len(os.Args) > 1 && (os.Args[1] == "tty" || os.Args[1] == "size") {
		fmt.Printf("tty %v\n", term.IsTerminal(0))
		if os.Args[1] == "tty" {
			os.Exit(0)
		}
		sc := bufio.NewScanner(os.Stdin)
		for sc.Scan() {
			cols, rows, err := term.GetSize(0)
			if err != nil {
				fmt.Printf("size: %v\n", err)
				continue
			}
			fmt.Printf("size %dx%d\n", rows, cols)
		}
		os.Exit(0)
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	fmt.Fprintln(os.Stdout, "hello stdout")
	fmt.Fprintln(os.Stderr, "hello stderr")
	for _, f := range strings.Split(os.Getenv("HELLO_FILES"), ",") {
		if f == "" {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			fmt.Fprintf(os.Stdout, "file %s: %v\n", f, err)
			continue
		}
		fmt.Fprintf(os.Stdout, "file %s: %s\n", f, b)
	}
	if code := os.Getenv("HELLO_EXIT"); code != "" {
		n, _ := strconv.Atoi(code)
		os.Exit(n)
	}
	if os.Getenv("HELLO_BURN") == "1" {
		go func() {
			for n := 0; ; n++ {
				_ = n * n
			}
		}()
	}
	if addr := os.Getenv("HELLO_LISTEN"); addr != "" {
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				fmt.Fprintln(c, "hello")
				c.Close()
			}
		}()
	}
	<-sig
	fmt.Fprintln(os.Stdout, "bye")
}

// dial is "hello dial ADDR".
func dial(addr string) int {
	var err error
	bound := time.Minute
	if v := os.Getenv("HELLO_DIAL_FOR"); v != "" {
		if bound, err = time.ParseDuration(v); err != nil {
			fmt.Printf("HELLO_DIAL_FOR: %v\n", err)
			return 2
		}
	}
	for deadline := time.Now().Add(bound); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		var c net.Conn
		if c, err = net.DialTimeout("tcp", addr, min(5*time.Second, bound)); err != nil {
			continue
		}
		line, rerr := bufio.NewReader(c).ReadString('\n')
		c.Close()
		if rerr != nil {
			err = rerr
			continue
		}
		fmt.Printf("dial %s: %s", addr, line)
		return 0
	}
	fmt.Printf("dial %s: %v\n", addr, err)
	return 1
}
