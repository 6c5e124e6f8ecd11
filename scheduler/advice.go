package scheduler

import (
	"cmp"
	"slices"

	"github.com/berth-dev/berth/driver"
)

// Right-sizing: what an instance reserves against what it was measured to
// use. The advice is a pure function of a reservation and samples, so that
// the server's advice and `berth sim`'s replay with advised sizes agree.

// AdviceOptions tune Advise; zero fields take the defaults below.
type AdviceOptions struct {
	// Percentile of the samples taken as the instance's use (0.95).
	Percentile float64
	// Margin is added on top of that use, as a fraction of it (0.2).
	Margin float64
	// MinCPU and MinMemory are the smallest sizes advised (0.01 cpu,
	// 16 MiB): below them a measurement says little.
	MinCPU    driver.MilliCPU
	MinMemory driver.Bytes
	// Factor is how far the reservation must be from the advised size, as
	// a ratio either way, for the advice to be given (2).
	Factor float64
}

func (o AdviceOptions) withDefaults() AdviceOptions {
	if o.Percentile <= 0 || o.Percentile > 1 {
		o.Percentile = 0.95
	}
	if o.Margin < 0 || o.Margin == 0 {
		o.Margin = 0.2
	}
	if o.MinCPU <= 0 {
		o.MinCPU = 10
	}
	if o.MinMemory <= 0 {
		o.MinMemory = 16 * driver.MiB
	}
	if o.Factor <= 1 {
		o.Factor = 2
	}
	return o
}

// Advice is a suggested size for an instance.
type Advice struct {
	// Reserved is what the instance reserves; Used the chosen percentile
	// of its measured use; Suggested what it should reserve.
	Reserved  driver.Resources
	Used      driver.Resources
	Suggested driver.Resources
	// Samples is how many measurements the advice rests on.
	Samples int
	// Saves is what the cluster gets back (negative: what it must add,
	// for an instance that uses more than it reserves).
	Saves driver.Resources
}

// Advise compares reserved with the measured use in samples and returns a
// suggested size for cpu and memory, and whether the reservation is far
// from it (by opt.Factor, either way) in either resource. Resources not
// reserved (0) are not advised on; nor is anything without samples.
func Advise(reserved driver.Resources, samples []driver.Usage, opt AdviceOptions) (Advice, bool) {
	opt = opt.withDefaults()
	a := Advice{Reserved: reserved, Suggested: reserved, Samples: len(samples)}
	if len(samples) == 0 {
		return a, false
	}
	cpus := make([]driver.MilliCPU, len(samples))
	mems := make([]driver.Bytes, len(samples))
	for i, s := range samples {
		cpus[i], mems[i] = s.CPU, s.Memory
	}
	a.Used.CPU = percentile(cpus, opt.Percentile)
	a.Used.Memory = percentile(mems, opt.Percentile)
	far := false
	if reserved.CPU > 0 {
		s := max(driver.MilliCPU(float64(a.Used.CPU)*(1+opt.Margin)), opt.MinCPU)
		a.Suggested.CPU = s
		far = far || float64(reserved.CPU) >= opt.Factor*float64(s) || float64(s) >= opt.Factor*float64(reserved.CPU)
	}
	if reserved.Memory > 0 {
		s := max(driver.Bytes(float64(a.Used.Memory)*(1+opt.Margin)), opt.MinMemory)
		s = (s + driver.MiB - 1) / driver.MiB * driver.MiB
		a.Suggested.Memory = s
		far = far || float64(reserved.Memory) >= opt.Factor*float64(s) || float64(s) >= opt.Factor*float64(reserved.Memory)
	}
	a.Saves = driver.Resources{CPU: reserved.CPU - a.Suggested.CPU, Memory: reserved.Memory - a.Suggested.Memory}
	return a, far
}

// percentile returns the p-th percentile (nearest rank) of xs, reordering
// them.
func percentile[T cmp.Ordered](xs []T, p float64) T {
	slices.Sort(xs)
	k := int(float64(len(xs))*p+0.999999) - 1
	return xs[min(max(k, 0), len(xs)-1)]
}
