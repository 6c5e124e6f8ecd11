package control_test

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"testing/synctest"

	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/driver/drivertest"
	"github.com/berth-dev/berth/reconciler"
	"github.com/berth-dev/berth/store/memory"
)

// TestStdinNeedsAnAttacher: a request with stdin or a terminal is refused
// at submit, naming the field, when no provider can attach; attaching to
// an instance made without them is refused naming the field too.
func TestStdinNeedsAnAttacher(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		_, prov := newSim(t, 1, nil)
		p, _ := start(t, config(memory.New(memory.Options{}), prov))
		ctx := context.Background()
		for _, field := range []string{"stdin", "tty"} {
			r := req("interactive", 1)
			r.Stdin, r.TTY = field == "stdin", field == "tty"
			_, err := p.Submit(ctx, r, "")
			if !errors.Is(err, driver.ErrUnsupported) || !drivertest.HasField(err, field) || !strings.Contains(err.Error(), "cannot run "+field) {
				t.Errorf("submit with %s on a provider that cannot attach: %v, want unsupported naming %s", field, err, field)
			}
		}
		if _, err := p.Submit(ctx, req("app", 1), ""); err != nil {
			t.Fatal(err)
		}
		waitPhase(t, p, "app", reconciler.Running)
		var out bytes.Buffer
		if err := p.Attach(ctx, "app", driver.AttachOptions{}, strings.NewReader("x"), &out, &out); !errors.Is(err, driver.ErrInvalid) || !drivertest.HasField(err, "stdin") {
			t.Errorf("input to an instance made without stdin: %v", err)
		}
		if err := p.ResizeTTY(ctx, "app", driver.TTYSize{Rows: 24, Cols: 80}); !errors.Is(err, driver.ErrInvalid) || !drivertest.HasField(err, "tty") {
			t.Errorf("resize of an instance without a terminal: %v", err)
		}
		if err := p.Attach(ctx, "app", driver.AttachOptions{}, nil, &out, &out); !errors.Is(err, driver.ErrUnsupported) {
			t.Errorf("attach on a provider that cannot: %v, want unsupported", err)
		}
		if err := p.Attach(ctx, "nosuch", driver.AttachOptions{}, nil, &out, &out); !errors.Is(err, driver.ErrNotFound) {
			t.Errorf("attach to an unknown instance: %v", err)
		}
	})
}
