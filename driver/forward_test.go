package driver_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/berth-dev/berth/driver"
)

// forwarder has the methods of Stopper and Starter, but says it has only
// stop.
type forwarder struct{ driver.Driver }

func (forwarder) Has(c string) bool                                 { return c == driver.CapStop }
func (forwarder) Stop(context.Context, string, time.Duration) error { return nil }
func (forwarder) Start(context.Context, string) error               { return nil }

func TestAsHonoursForwarder(t *testing.T) {
	var d driver.Driver = forwarder{}
	if _, ok := driver.As[driver.Stopper](d, driver.CapStop); !ok {
		t.Error("As[Stopper] of a forwarder that has stop: not found")
	}
	if _, ok := driver.As[driver.Starter](d, driver.CapStart); ok {
		t.Error("As[Starter] of a forwarder that lacks start: found")
	}
	if got := driver.Capabilities(d); !slices.Equal(got, []string{driver.CapStop}) {
		t.Errorf("Capabilities = %v, want [stop]", got)
	}
	if f := driver.Features(d); slices.Contains(f, driver.CapTTY) {
		t.Errorf("Features = %v: a forwarder without attach has tty", f)
	}
}
