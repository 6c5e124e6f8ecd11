// Command supervise is the ssh back-end's supervisor alone, for the tests:
// a binary built without the race detector, which starts fast on the
// test hosts. Berth's own binary runs the same code as `berth ssh-supervise`.
package main

import (
	"os"

	"github.com/berth-dev/berth/drivers/ssh"
)

func main() {
	if len(os.Args) < 2 || os.Args[1] != ssh.SuperviseCommand {
		os.Stderr.WriteString("usage: supervise " + ssh.SuperviseCommand + " VERB ARGS...\n")
		os.Exit(2)
	}
	os.Exit(ssh.Supervise(os.Args[2:], os.Stdout, os.Stderr))
}
