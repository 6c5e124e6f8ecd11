package ssh_test

import (
	"context"
	"errors"
	"io"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/driver/drivertest"
	"github.com/berth-dev/berth/internal/procfs"
)

// TestExec runs commands over SSH in an instance of a user of its own,
// beyond the conformance case: as the instance's user, as users given
// with the exec, as one the host lacks; and for a caller that leaves (its
// context ends), whose command is killed while the instance runs on.
func TestExec(t *testing.T) {
	t.Parallel()
	f := newFleet(t, 1)
	d := f.open(t, nil)
	defer d.Close(context.Background())
	sp := shSpec(serviceScript)
	sp.User, sp.Group = "nobody", "nogroup"
	in := create(t, d, "h0", sp)
	ex := d.(driver.Execer)
	for _, c := range []struct{ user, want string }{
		{"", "65534 65534\n"},
		{"root", "0 0\n"},
		{"daemon:nogroup", "1 65534\n"},
		{"1234", "1234 1234\n"},
	} {
		var out, errOut drivertest.SyncBuffer
		code, err := ex.Exec(ctxT(t), in.ID, driver.ExecOptions{Cmd: []string{"sh", "-c", `echo $(id -u) $(id -g)`}, User: c.user}, nil, &out, &errOut)
		if err != nil || code != 0 || out.String() != c.want {
			t.Errorf("Exec as %q: code %d, %v, stdout %q, stderr %q; want %q", c.user, code, err, out.String(), errOut.String(), c.want)
		}
	}
	_, err := ex.Exec(ctxT(t), in.ID, driver.ExecOptions{Cmd: []string{"true"}, User: "no-such-user-here"}, nil, io.Discard, io.Discard)
	if !errors.Is(err, driver.ErrPermanent) || !strings.Contains(err.Error(), "no-such-user-here") {
		t.Errorf("Exec as a user the host lacks: %v, want ErrPermanent naming the user", err)
	}

	ctx, cancel := context.WithCancel(ctxT(t))
	defer cancel()
	var out drivertest.SyncBuffer
	done := make(chan error, 1)
	go func() {
		_, err := ex.Exec(ctx, in.ID, driver.ExecOptions{Cmd: []string{"sh", "-c", "echo $$; exec sleep 1000"}}, nil, &out, io.Discard)
		done <- err
	}()
	waitOutput(t, &out, "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(out.String()))
	if err != nil {
		t.Fatalf("the exec's pid %q: %v", out.String(), err)
	}
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("Exec when its context ended: %v, want context.Canceled", err)
		}
	case <-time.After(testTimeout):
		t.Fatal("Exec never returned after its context ended")
	}
	for deadline := time.Now().Add(testTimeout); procfs.Running(pid); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the exec's command %d still runs after its caller left", pid)
		}
	}
	if got, err := d.Get(ctxT(t), in.ID); err != nil || got.State != driver.StateRunning {
		t.Errorf("the instance after the exec's caller left: %v, %v; want running", got, err)
	}
}
