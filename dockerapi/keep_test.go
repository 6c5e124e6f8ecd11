package dockerapi_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/dockerapi"
	"github.com/berth-dev/berth/reconciler"
	"github.com/berth-dev/berth/store"
)

// TestAutoRemoveOutlivesTheServer: a --rm container whose server stops (it
// no longer leads) before the container ends is removed by the next
// server over the same store once it ends, and its mark goes with it.
func TestAutoRemoveOutlivesTheServer(t *testing.T) {
	e := setup(t)
	id := strings.TrimSpace(e.must(t, "run", "-d", "--rm", "--name", "tmp", helloImage))
	e.server.Close()
	ctx := context.Background()
	if _, err := e.store.Get(ctx, dockerapi.PrefixAutoRemove+id); err != nil {
		t.Fatalf("the --rm mark of %s after the server closed: %v", id, err)
	}
	next := dockerapi.New(e.plane, dockerapi.Options{Authenticator: e.tokens, Logger: quiet, ServerVersion: "test", Store: e.store, WriteTimeout: writeTimeout})
	t.Cleanup(next.Close)
	if err := e.plane.Stop(ctx, id, time.Second); err != nil {
		t.Fatal(err)
	}
	e.waitGone(t, id)
	waitFor(t, "the --rm mark to go", func() bool {
		_, err := e.store.Get(ctx, dockerapi.PrefixAutoRemove+id)
		return errors.Is(err, store.ErrNotFound)
	})
}

// TestCreatedOutlivesTheServer: the containers created and not started
// through a server that then stops (it no longer leads) are taken on by
// the next server over the same store (dockerapi.Open) as they were last
// changed, and start there; one whose start had submitted it is not shown
// twice.
func TestCreatedOutlivesTheServer(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	idle := strings.TrimSpace(e.must(t, "create", "--name", "idle", helloImage))
	e.must(t, "update", "--cpus", "0.5", "idle")
	e.must(t, "rename", "idle", "later")
	gone := strings.TrimSpace(e.must(t, "create", "--name", "gone", helloImage))
	e.must(t, "rm", "gone")
	e.must(t, "run", "-d", "--name", "ran", helloImage)
	e.server.Close()
	if _, err := e.store.Get(ctx, dockerapi.PrefixCreated+idle); err != nil {
		t.Fatalf("the created container %s after the server closed: %v", idle, err)
	}
	if _, err := e.store.Get(ctx, dockerapi.PrefixCreated+gone); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("the removed container %s is still kept: %v", gone, err)
	}

	next, err := dockerapi.Open(ctx, e.plane, dockerapi.Options{Authenticator: e.tokens, Logger: quiet, ServerVersion: "test", Store: e.store, WriteTimeout: writeTimeout})
	if err != nil {
		t.Fatal(err)
	}
	host := "unix://" + serveUnix(t, next)
	must := func(args ...string) string {
		t.Helper()
		out, errs, code := dockerAt(t, host, e.config, args...)
		if code != 0 {
			t.Fatalf("docker %s through the next server: exit %d, %q %q", strings.Join(args, " "), code, out, errs)
		}
		return out
	}
	ps := strings.Split(strings.TrimSpace(must("ps", "-a", "--format", "{{.Names}} {{.State}}")), "\n")
	if len(ps) != 2 || !strings.Contains(strings.Join(ps, ","), "later created") || !strings.Contains(strings.Join(ps, ","), "ran running") {
		t.Errorf("docker ps -a through the next server: %q; want later created and ran running, once each", ps)
	}
	if out := strings.TrimSpace(must("inspect", "--format", "{{.HostConfig.NanoCpus}} {{.Id}}", "later")); out != "500000000 "+idle {
		t.Errorf("docker inspect later through the next server: %q, want its update and id %s", out, idle)
	}
	must("start", "later")
	e.waitPhase(t, idle, reconciler.Running)
	if _, err := e.store.Get(ctx, dockerapi.PrefixCreated+idle); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("the started container %s is still kept as created: %v", idle, err)
	}
}
