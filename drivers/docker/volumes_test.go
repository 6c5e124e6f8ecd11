package docker

import (
	"context"
	"errors"
	"testing"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/client"

	"github.com/berth-dev/berth/driver"
)

// TestRemoveVolume: a named volume a container uses is ErrPermanent and
// stays; once the container is gone RemoveVolume removes it from the
// engine, and removing it again is no error.
func TestRemoveVolume(t *testing.T) {
	leakCheck(t)
	d := openTest(t, testOptions(engineAddrs()...))
	run := randomID()
	vol := "berth-test-vol-" + run
	t.Cleanup(func() {
		removeByLabel(t, mainCli, "berth.test.run", run)
		_, _ = mainCli.VolumeRemove(context.Background(), vol, client.VolumeRemoveOptions{Force: true})
	})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	spec := helloSpec()
	spec.Tags = map[string]string{"berth.test.run": run}
	spec.Volumes = []driver.Volume{{Source: vol, Target: "/data"}}
	inst := create(t, d, "e1", spec)
	if err := d.RemoveVolume(ctx, "e1", vol); !errors.Is(err, driver.ErrPermanent) {
		t.Errorf("RemoveVolume of a volume in use: %v; want ErrPermanent", err)
	}
	remove(t, d, inst.ID)
	if err := d.RemoveVolume(ctx, "e1", vol); err != nil {
		t.Fatalf("RemoveVolume: %v", err)
	}
	if _, err := mainCli.VolumeInspect(ctx, vol, client.VolumeInspectOptions{}); !cerrdefs.IsNotFound(err) {
		t.Errorf("the engine's volume after RemoveVolume: %v; want it gone", err)
	}
	if err := d.RemoveVolume(ctx, "e1", vol); err != nil {
		t.Errorf("RemoveVolume of a volume not there: %v; want no error", err)
	}
	if err := d.RemoveVolume(ctx, "nowhere", vol); !errors.Is(err, driver.ErrNotFound) {
		t.Errorf("RemoveVolume on an unknown node: %v; want ErrNotFound", err)
	}
}
