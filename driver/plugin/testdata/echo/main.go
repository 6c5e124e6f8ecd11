// Command echo is a plugin serving the sim with an Attacher that echoes
// its input, in capitals, to stdout and counts the bytes on stderr, for
// the test of attach through the wire; it says its back-end is shared.
package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"

	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/driver/plugin"
	_ "github.com/berth-dev/berth/drivers/sim"
)

type echo struct{ driver.Driver }

func (echo) Attach(ctx context.Context, id string, _ driver.AttachOptions, stdin io.Reader, stdout, stderr io.Writer) error {
	if id != "echo" {
		return driver.Errorf(driver.ErrNotFound, "no instance %q", id)
	}
	if stdin == nil {
		return nil
	}
	b, err := io.ReadAll(stdin)
	if err != nil {
		return err
	}
	if _, err := stdout.Write(bytes.ToUpper(b)); err != nil {
		return err
	}
	_, err = fmt.Fprintf(stderr, "%d bytes", len(b))
	return err
}

func (echo) ResizeTTY(_ context.Context, _ string, size driver.TTYSize) error {
	if size.Rows == 0 {
		return &driver.FieldError{Path: "rows", Reason: "must not be 0"}
	}
	return nil
}

// SharedBackend: the test of attach checks that a plugin's driver can
// say so through the wire.
func (echo) SharedBackend() bool { return true }

var (
	_ driver.Attacher      = echo{}
	_ driver.SharedBackend = echo{}
)

func main() {
	def, err := driver.Lookup("sim")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	open := def.OpenWith
	def.OpenWith = func(ctx context.Context, opts any, env driver.Env) (driver.Driver, error) {
		d, err := open(ctx, opts, env)
		if err != nil {
			return nil, err
		}
		return echo{d}, nil
	}
	plugin.Serve(def, "0.0.1")
}
