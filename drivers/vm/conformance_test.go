package vm_test

import (
	"testing"
	"time"

	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/driver/drivertest"
)

// TestConformance runs the suite on two nodes that are this machine's
// daemon, one over its unix socket and one through sshd. The image
// "preload" is on the first only (the second has it at a path that does
// not exist yet), for the suite's Preload to copy. Two cases run at once:
// a case spends most of its time on a guest booting, which keeps one cpu
// busy under TCG, and the machine has two.
func TestConformance(t *testing.T) {
	o := options(t)
	twoNodes(t, &o, "preload")
	drivertest.Run(t, drivertest.Harness{
		Open: func(t *testing.T) driver.Driver { return open(t, o) },
		Spec: helloSpec,
		MissingImage: func() *driver.Spec {
			sp := helloSpec()
			sp.Image = "missing"
			return sp
		},
		PreloadImage: "preload",
		Parallel:     2,
		Timeout:      5 * time.Minute,
		Concurrent:   2,
	})
}
