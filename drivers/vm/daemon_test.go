package vm_test

import (
	"fmt"
	"net"
	"os/exec"
	"time"
)

// daemon is a server process a test started (sshd, libvirtd), watched
// until it ends.
type daemon struct {
	cmd    *exec.Cmd
	exited chan struct{} // closed when the process has ended, err set
	err    error
}

// watch watches cmd, started, until it ends.
func watch(cmd *exec.Cmd) *daemon {
	d := &daemon{cmd: cmd, exited: make(chan struct{})}
	go func() {
		d.err = cmd.Wait()
		close(d.exited)
	}()
	return d
}

// listening waits until something accepts connections at each of addrs. It
// fails if the process ends first, or after a minute.
func (d *daemon) listening(addrs ...string) error {
	deadline := time.Now().Add(time.Minute)
	for _, addr := range addrs {
		for {
			c, err := net.Dial("tcp", addr)
			if err == nil {
				c.Close()
				break
			}
			select {
			case <-d.exited:
				return fmt.Errorf("it ended (%v) before it listened on %s", d.err, addr)
			case <-time.After(100 * time.Millisecond):
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("nothing listens on %s after a minute", addr)
			}
		}
	}
	return nil
}
