package driver

import "math"

// Range is the values an integer field may take, both ends included. Each
// number of an input has one Range, declared once next to its field;
// validation checks it before anything is stored, and the stored forms
// rely on it (a record keeps some numbers in fewer bits than an int).
type Range struct {
	Min, Max int64
}

// Has reports whether v is in r.
func (r Range) Has(v int64) bool { return r.Min <= v && v <= r.Max }

// Check adds to es, for path, a field error saying v is out of r when it
// is. It reports whether v is in r.
func (r Range) Check(es *FieldErrors, path string, v int64) bool {
	if r.Has(v) {
		return true
	}
	es.Add(path, "%d is out of range [%d, %d]", v, r.Min, r.Max)
	return false
}

// Err returns nil when v is in r, else a *FieldError for path.
func (r Range) Err(path string, v int64) error {
	var es FieldErrors
	if r.Check(&es, path, v) {
		return nil
	}
	return es[0]
}

// The ranges of a spec's numbers. Amounts are bounded so that the sums
// kept of many instances cannot overflow: a request's million instances
// (scheduler.MaxCount) of the largest spec still add up within an int64.
var (
	// RangeCPU bounds cpus (in MilliCPU): up to about a million cpus.
	RangeCPU = Range{0, 1 << 30}
	// RangeBytes bounds memory, memory_reservation and disk: up to 8 TiB.
	RangeBytes = Range{0, 1 << 43}
	// RangeGPUs bounds gpus.
	RangeGPUs = Range{0, 1 << 16}
	// RangeOther bounds each of a spec's other resources.
	RangeOther = Range{0, 1 << 40}
	// RangeContainerPort and RangeHostPort bound a port's numbers; a host
	// port of 0 means any free port.
	RangeContainerPort = Range{1, math.MaxUint16}
	RangeHostPort      = Range{0, math.MaxUint16}
	// RangeFileMode bounds a config file's mode.
	RangeFileMode = Range{0, 0o7777}
	// RangeRetries bounds restart_policy.max_retries.
	RangeRetries = Range{0, 1 << 20}
)
