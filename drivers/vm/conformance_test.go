package vm_test

import (
	"testing"
	"time"

	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/driver/drivertest"
)

func TestConformance(t *testing.T) {
	o := options(t)
	drivertest.Run(t, drivertest.Harness{
		Open: func(t *testing.T) driver.Driver { return open(t, o) },
		Spec: helloSpec,
		MissingImage: func() *driver.Spec {
			sp := helloSpec()
			sp.Image = "missing"
			return sp
		},
		Parallel: 2,
		Timeout:  3 * time.Minute,
	})
}
