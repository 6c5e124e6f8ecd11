package docker

import (
	"context"
	"testing"
	"time"

	"github.com/berth-dev/berth/driver"
)

// TestNodeInUse runs a container that keeps a cpu busy (its limit is half a
// cpu) and waits for a State whose node reports it in use: cpus and memory
// measured in the background; Usage measures the container itself, the
// first time over a second, then since the reading before. With
// usage_interval 0 nothing is measured in the background.
func TestNodeInUse(t *testing.T) {
	leakCheck(t)
	o := testOptions(DefaultHost)
	o.UsageInterval = 200 * time.Millisecond
	d := openTest(t, o)
	ctx := context.Background()
	spec := helloSpec()
	spec.CPU = driver.CPUs(0.5)
	spec.Env = map[string]string{"HELLO_BURN": "1"}
	spec.Tags = map[string]string{driver.TagManaged: "true", "berth.test.run": randomID()}
	inst := create(t, d, "e1", spec)
	var last *driver.Resources
	wait(t, func() bool {
		ps, err := d.State(ctx)
		if err != nil {
			t.Fatal(err)
		}
		last = ps.Nodes[0].InUse
		// Other tests' containers may add to it; the busy one alone uses
		// about half a cpu.
		return last != nil && last.CPU >= driver.CPUs(0.2) && last.Memory > 0
	})
	t.Logf("in use: %s cpus, %s memory", last.CPU, last.Memory)

	// At most half a cpu, and some of it whenever the container gets its
	// share: readings of a few tenths, never of more than the limit.
	var readings []driver.MilliCPU
	wait(t, func() bool {
		u, err := d.Usage(ctx, inst.ID)
		if err != nil {
			t.Fatal(err)
		}
		if u.CPU > driver.CPUs(0.7) || u.Memory <= 0 || u.Time.IsZero() {
			t.Fatalf("Usage of a container limited to half a cpu: %+v", u)
		}
		readings = append(readings, u.CPU)
		return len(readings) >= 3 && u.CPU >= driver.CPUs(0.2)
	})
	t.Logf("Usage: %v cpus", readings)

	off := testOptions(DefaultHost)
	off.UsageInterval = 0
	d2 := openTest(t, off)
	time.Sleep(3 * o.UsageInterval) // what a measurement would need
	ps, err := d2.State(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if ps.Nodes[0].InUse != nil {
		t.Errorf("usage_interval 0: InUse = %+v, want nil", ps.Nodes[0].InUse)
	}
}
