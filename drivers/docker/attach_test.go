package docker

import (
	"context"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/driver/drivertest"
)

// TestAttachStdin pipes input to a container that copies it out, as
// echo ... | docker run -i IMAGE cat: the end of the input closes the
// container's, and the container exits 0.
func TestAttachStdin(t *testing.T) {
	leakCheck(t)
	d := openTest(t, testOptions(DefaultHost))
	spec := helloSpec()
	spec.Command = []string{"cat"}
	spec.Stdin = true
	spec.Tags = map[string]string{"berth.test.run": randomID()}
	inst := create(t, d, "e1", spec)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var out, errOut drivertest.SyncBuffer
	if err := d.Attach(ctx, inst.ID, driver.AttachOptions{Replay: true}, strings.NewReader("hello\nworld\n"), &out, &errOut); err != nil {
		t.Fatal(err)
	}
	if out.String() != "hello\nworld\n" || errOut.String() != "" {
		t.Errorf("attach: stdout %q, stderr %q", out.String(), errOut.String())
	}
	wait(t, func() bool {
		got, err := d.Get(ctx, inst.ID)
		return err == nil && got.State == driver.StateExited && got.ExitCode != nil && *got.ExitCode == 0
	})
	// The input is closed for good: a second attach only replays.
	out.Reset()
	if err := d.Attach(ctx, inst.ID, driver.AttachOptions{Replay: true}, nil, &out, &errOut); err != nil {
		t.Fatal(err)
	}
	if out.String() != "hello\nworld\n" {
		t.Errorf("replay of an ended container: %q", out.String())
	}
}

// TestAttachTTY runs a program on a terminal: it sees one, and its size
// follows ResizeTTY.
func TestAttachTTY(t *testing.T) {
	leakCheck(t)
	d := openTest(t, testOptions(DefaultHost))
	spec := helloSpec()
	spec.Command = []string{"size"}
	spec.Stdin, spec.TTY = true, true
	spec.Tags = map[string]string{"berth.test.run": randomID()}
	inst := create(t, d, "e1", spec)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pr, pw := io.Pipe()
	defer pr.Close()
	var out, errOut drivertest.SyncBuffer
	done := make(chan error, 1)
	go func() { done <- d.Attach(ctx, inst.ID, driver.AttachOptions{Replay: true}, pr, &out, &errOut) }()
	wait(t, func() bool { return strings.Contains(out.String(), "tty true") })
	if err := d.ResizeTTY(ctx, inst.ID, driver.TTYSize{Rows: 30, Cols: 100}); err != nil {
		t.Fatal(err)
	}
	if _, err := io.WriteString(pw, "x\r"); err != nil {
		t.Fatal(err)
	}
	wait(t, func() bool { return strings.Contains(out.String(), "size 30x100") })
	// Ctrl-D: the end of the terminal's input.
	if _, err := io.WriteString(pw, "\x04"); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Attach: %v", err)
		}
	case <-ctx.Done():
		t.Fatalf("Attach did not end with the program; output %q", out.String())
	}
	pw.Close()
	if errOut.String() != "" {
		t.Errorf("a terminal has one stream; stderr got %q", errOut.String())
	}
}

// TestAttachRefusals: input to a container made without it, a terminal
// size for one without a terminal, and an attach ended by its caller.
func TestAttachRefusals(t *testing.T) {
	leakCheck(t)
	d := openTest(t, testOptions(DefaultHost))
	spec := helloSpec()
	spec.Tags = map[string]string{"berth.test.run": randomID()}
	inst := create(t, d, "e1", spec)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var out drivertest.SyncBuffer
	if err := d.Attach(ctx, inst.ID, driver.AttachOptions{}, strings.NewReader("x"), &out, &out); !errors.Is(err, driver.ErrInvalid) || !drivertest.HasField(err, "stdin") {
		t.Errorf("stdin to a container without it: %v", err)
	}
	if err := d.ResizeTTY(ctx, inst.ID, driver.TTYSize{Rows: 24, Cols: 80}); !errors.Is(err, driver.ErrInvalid) || !drivertest.HasField(err, "tty") {
		t.Errorf("resize without a terminal: %v", err)
	}
	actx, acancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- d.Attach(actx, inst.ID, driver.AttachOptions{Replay: true}, nil, &out, &out) }()
	wait(t, func() bool { return strings.Contains(out.String(), "hello stdout") })
	acancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("attach ended by its caller: %v", err)
	}
	if err := d.Attach(ctx, "e1/nosuchcontainer", driver.AttachOptions{}, nil, &out, &out); !errors.Is(err, driver.ErrNotFound) {
		t.Errorf("attach to a missing container: %v", err)
	}
}
