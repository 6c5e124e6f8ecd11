package scheduler

import (
	"testing"

	"github.com/berth-dev/berth/driver"
)

func TestAdvise(t *testing.T) {
	use := func(cpus float64, mib int64, n int) []driver.Usage {
		out := make([]driver.Usage, n)
		for i := range out {
			out[i] = driver.Usage{CPU: driver.CPUs(cpus), Memory: driver.Bytes(mib) * driver.MiB}
		}
		return out
	}
	res := func(cpus float64, mib int64) driver.Resources {
		return driver.Resources{CPU: driver.CPUs(cpus), Memory: driver.Bytes(mib) * driver.MiB}
	}
	// 19 quiet samples and one spike: the 95th percentile is quiet.
	spiky := append(use(0.1, 100, 19), driver.Usage{CPU: driver.CPUs(3), Memory: 900 * driver.MiB})
	tests := []struct {
		name      string
		reserved  driver.Resources
		samples   []driver.Usage
		far       bool
		suggested driver.Resources
	}{
		{"reserves 2 cpus, uses almost none", res(2, 512), use(0.002, 20, 10), true, res(0.01, 24)},
		{"close to its use", res(0.5, 256), use(0.4, 200, 10), false, res(0.48, 240)},
		{"uses more than it reserves", res(0.5, 256), use(2, 200, 10), true, res(2.4, 240)},
		{"the spike is above the 95th percentile", res(1, 1024), spiky, true, res(0.12, 120)},
		{"no samples", res(2, 512), nil, false, res(2, 512)},
		{"nothing reserved", driver.Resources{}, use(1, 100, 3), false, driver.Resources{}},
	}
	for _, tt := range tests {
		a, far := Advise(tt.reserved, tt.samples, AdviceOptions{})
		if far != tt.far || a.Suggested.CPU != tt.suggested.CPU || a.Suggested.Memory != tt.suggested.Memory {
			t.Errorf("%s: far %v, suggested %s / %s; want %v, %s / %s", tt.name, far, a.Suggested.CPU, a.Suggested.Memory,
				tt.far, tt.suggested.CPU, tt.suggested.Memory)
		}
		if a.Saves.CPU != tt.reserved.CPU-a.Suggested.CPU || a.Samples != len(tt.samples) {
			t.Errorf("%s: saves %s, samples %d", tt.name, a.Saves.CPU, a.Samples)
		}
	}
}
