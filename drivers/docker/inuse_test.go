package docker

import (
	"context"
	"testing"
	"time"

	"github.com/berth-dev/berth/driver"
)

// TestNodeInUse runs a container that keeps a cpu busy (its limit is half a
// cpu) and waits for a State whose node reports it in use: cpus and memory
// measured in the background. With usage_interval 0 nothing is measured.
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
	create(t, d, "e1", spec)
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
