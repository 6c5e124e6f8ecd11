package drivertest

import "github.com/berth-dev/berth/driver"

// Bare returns d with every optional capability hidden: what a driver with
// the required interface only looks like to its callers, for tests of their
// fallbacks and refusals (package provider's). Closing it closes d.
func Bare(d driver.Driver) driver.Driver { return bare{d} }

type bare struct{ driver.Driver }
