package docker

import (
	"context"
	"sync"
	"testing"

	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/drivers/docker/dockertest"
)

// TestHealthEvents runs two containers of an image with a health check, one
// passing it and one failing it: Watch reports a health event for each,
// "healthy" and "unhealthy", and Get shows the health in the message.
func TestHealthEvents(t *testing.T) {
	leakCheck(t)
	ctx := context.Background()
	image := "berth-test/docker-health:" + randomID()
	if err := dockertest.BuildHealthChecked(ctx, mainCli, image); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dockertest.RemoveImages(context.Background(), mainCli, image) })
	d := openTest(t, testOptions(DefaultHost))

	var mu sync.Mutex
	health := map[string]string{} // instance id → the last health event's message
	wctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- d.Watch(wctx, func(ev driver.Event) {
			if ev.Type == driver.EventHealth {
				mu.Lock()
				health[ev.Instance] = ev.Message
				mu.Unlock()
			}
		})
	}()
	t.Cleanup(func() {
		stop()
		<-done
	})

	run := randomID()
	spec := func(env map[string]string) *driver.Spec {
		return &driver.Spec{Image: image, Env: env, Resources: driver.Resources{CPU: 100, Memory: 32 * driver.MiB},
			Tags: map[string]string{driver.TagManaged: "true", "berth.test.run": run}}
	}
	good := create(t, d, "e1", spec(nil))
	bad := create(t, d, "e1", spec(map[string]string{"HELLO_UNHEALTHY": "1"}))
	for id, want := range map[string]string{good.ID: "healthy", bad.ID: "unhealthy"} {
		wait(t, func() bool {
			mu.Lock()
			defer mu.Unlock()
			return health[id] == want
		})
		got, err := d.Get(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if got.Message != "health: "+want {
			t.Errorf("Get(%s).Message = %q, want %q", id, got.Message, "health: "+want)
		}
	}
}
