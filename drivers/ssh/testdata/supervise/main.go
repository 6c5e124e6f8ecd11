// Command supervise is the ssh back-end's supervisor alone, for the tests:
// a binary built without the race detector, which starts fast on the
// test hosts. Berth's own binary runs the same code as `berth ssh-supervise`.
// Run as `supervise probe STEPS...` it is the conformance suite's probe
// (package probe), which the exec case runs in an instance.
package main

import (
	"os"

	"github.com/berth-dev/berth/driver/drivertest/probe"
	"github.com/berth-dev/berth/drivers/ssh"
)

func main() {
	if len(os.Args) >= 2 && os.Args[1] == "probe" {
		os.Exit(probe.Main(os.Args[2:]))
	}
	if len(os.Args) < 2 || os.Args[1] != ssh.SuperviseCommand {
		os.Stderr.WriteString("usage: supervise " + ssh.SuperviseCommand + " VERB ARGS... | supervise probe STEPS...\n")
		os.Exit(2)
	}
	os.Exit(ssh.Supervise(os.Args[2:], os.Stdout, os.Stderr))
}
