package dockerapi_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/client"

	"github.com/berth-dev/berth/drivers/docker/dockertest"
	"github.com/berth-dev/berth/reconciler"
)

// noEngineVolume fails t when the engine of cli holds the volume name.
func noEngineVolume(t *testing.T, cli *client.Client, name string) {
	t.Helper()
	_, err := cli.VolumeInspect(context.Background(), name, client.VolumeInspectOptions{})
	if !cerrdefs.IsNotFound(err) {
		t.Errorf("engine volume %s: %v; want it removed", name, err)
	}
}

// removeEngineVolume removes what a failed test left of the volume name.
func removeEngineVolume(cli *client.Client, name string) {
	_, _ = cli.VolumeRemove(context.Background(), name, client.VolumeRemoveOptions{Force: true})
}

// TestVolumes: create, ls, inspect, rm and prune through the CLI; what one
// container writes in a named volume a later one reads; the volume is the
// engine's volume "team.NAME", another namespace does not see it, rm is
// refused while a container uses it and removes it from the engine after.
func TestVolumes(t *testing.T) {
	e := setup(t)
	vol := "data-" + dockertest.RandomID()
	t.Cleanup(func() { removeEngineVolume(mainCli, "team."+vol) })

	e.must(t, "volume", "create", "--label", "k=v", vol)
	if out := e.must(t, "volume", "ls", "-q"); strings.TrimSpace(out) != vol {
		t.Errorf("volume ls -q: %q; want %s", out, vol)
	}
	if out := e.must(t, "volume", "inspect", "-f", "{{.Name}} {{.Driver}} {{.Labels.k}}", vol); strings.TrimSpace(out) != vol+" local v" {
		t.Errorf("volume inspect: %q", out)
	}
	for _, args := range [][]string{{"--driver", "nfs"}, {"-o", "type=tmpfs"}} {
		_, errs, code := e.docker(t, append(append([]string{"volume", "create"}, args...), "x")...)
		if code == 0 || !strings.Contains(errs, args[0]) {
			t.Errorf("volume create %v: exit %d, %q; want it refused by name", args, code, errs)
		}
	}

	// Another namespace sees none of it.
	other := e.dockerConfig(t, e.newToken(t, "other", "operator", "elsewhere"))
	if out, _, _ := e.dockerWith(t, other, "volume", "ls", "-q"); strings.TrimSpace(out) != "" {
		t.Errorf("another namespace's volume ls: %q; want nothing", out)
	}
	if _, errs, code := e.dockerWith(t, other, "volume", "inspect", vol); code == 0 {
		t.Errorf("another namespace's volume inspect %s: exit 0; want no such volume", vol)
	} else if !strings.Contains(errs, "no such volume") {
		t.Errorf("another namespace's volume inspect %s: %q", vol, errs)
	}

	// One container writes, a later one reads.
	w := strings.TrimSpace(e.must(t, "run", "-d", "--name", "writer", "-v", vol+":/data", helloImage))
	e.waitPhase(t, "writer", reconciler.Running)
	src := filepath.Join(t.TempDir(), "msg")
	if err := os.WriteFile(src, []byte("kept in the volume\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	e.must(t, "cp", src, "writer:/data/msg")
	if _, errs, code := e.docker(t, "volume", "rm", vol); code == 0 || !strings.Contains(errs, "in use") {
		t.Errorf("volume rm of a volume in use: exit %d, %q; want it refused", code, errs)
	}
	if _, err := mainCli.VolumeInspect(context.Background(), "team."+vol, client.VolumeInspectOptions{}); err != nil {
		t.Errorf("engine volume team.%s: %v", vol, err)
	}
	e.must(t, "rm", "-f", "writer")
	e.waitGone(t, w)
	r := strings.TrimSpace(e.must(t, "run", "-d", "--name", "reader", "-v", vol+":/data:ro", helloImage))
	e.waitPhase(t, "reader", reconciler.Running)
	if out := e.must(t, "cp", "reader:/data/msg", "-"); !strings.Contains(out, "kept in the volume") {
		t.Errorf("the later container reads %q from the volume", out)
	}
	e.must(t, "rm", "-f", "reader")
	e.waitGone(t, r)

	e.must(t, "volume", "rm", vol)
	noEngineVolume(t, mainCli, "team."+vol)
	e.must(t, "volume", "create", "spare")
	if out := e.must(t, "volume", "prune", "-f"); !strings.Contains(out, "spare") {
		t.Errorf("volume prune: %q; want spare deleted", out)
	}
	if out := e.must(t, "volume", "ls", "-q"); strings.TrimSpace(out) != "" {
		t.Errorf("volume ls after rm and prune: %q", out)
	}
}

// waitMessage waits until the pending instance ref's message holds want.
func (e *env) waitMessage(t *testing.T, ref, want string) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		in := e.waitPhase(t, ref, reconciler.Pending, reconciler.Running)
		if in.Phase == reconciler.Running {
			t.Fatalf("%s runs on %s; want it waiting", ref, in.Node)
		}
		if strings.Contains(in.Message, want) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s waits, saying %q; want %q named", ref, in.Message, want)
		}
		sleep()
	}
}

// TestVolumeNodeGone: a volume whose first user ran on an engine that the
// server, started again over its store, no longer has (the engine is
// gone and out of the provider's configuration) refuses a container
// mounting it at start, naming the volume and the node (the container
// stays created, as after the engine's failed start); volume rm forgets
// it, and the next user makes it anew where it is placed.
func TestVolumeNodeGone(t *testing.T) {
	cluster := "dapi-" + dockertest.RandomID()
	db := filepath.Join(t.TempDir(), "berth.db")
	vol := "old-" + dockertest.RandomID()
	t.Cleanup(func() { removeEngineVolume(mainCli, "team."+vol) })
	placed := false
	t.Run("on the second engine", func(t *testing.T) {
		e, _ := twoEnginesAt(t, cluster, db)
		id := strings.TrimSpace(e.must(t, "run", "-d", "--name", "first", "-e", "constraint:node==second", "-v", vol+":/data", helloImage))
		e.waitPhase(t, "first", reconciler.Running)
		if got := strings.TrimSpace(e.must(t, "volume", "inspect", "-f", "{{.Status.Node}}", vol)); got != "docker/second" {
			t.Fatalf("volume inspect: node %q, want docker/second", got)
		}
		e.must(t, "rm", "-f", "first")
		e.waitGone(t, id)
		placed = true
	})
	if !placed {
		return // the subtest failed, or had no second engine
	}
	// The server again over its store, with the machine's engine only.
	e := setupStore(t, fmt.Sprintf(`[{"name":"main","address":%q}]`, dockertest.MainHost), cluster, db)
	// Once the provider has reported its nodes.
	e.must(t, "run", "-d", "--name", "other", helloImage)
	e.waitPhase(t, "other", reconciler.Running)

	_, errs, code := e.docker(t, "run", "-d", "--name", "user", "-v", vol+":/data", helloImage)
	if code == 0 || !strings.Contains(errs, "volume "+vol) || !strings.Contains(errs, "docker/second") {
		t.Errorf("docker run -v %s:/data with the volume's node gone: exit %d, %s; want a refusal naming the volume and its node", vol, code, errs)
	}
	// As the engine's failed start, the container stays created; it is
	// what holds the volume until it is removed.
	if out := e.must(t, "ps", "-a", "--format", "{{.Names}} {{.State}}", "--filter", "name=user"); strings.TrimSpace(out) != "user created" {
		t.Errorf("the refused container: %q, want it created", out)
	}
	if _, errs, code := e.docker(t, "volume", "rm", vol); code == 0 || !strings.Contains(errs, "in use") {
		t.Errorf("volume rm while user mounts it: exit %d, %s", code, errs)
	}
	e.must(t, "rm", "user")
	if got := strings.TrimSpace(e.must(t, "volume", "inspect", "-f", "{{.Status.Node}}", vol)); got != "docker/second" {
		t.Errorf("volume inspect: node %q, want docker/second", got)
	}
	e.must(t, "volume", "rm", vol)
	e.must(t, "run", "-d", "--name", "user2", "-v", vol+":/data", helloImage)
	e.waitPhase(t, "user2", reconciler.Running)
	if got := strings.TrimSpace(e.must(t, "volume", "inspect", "-f", "{{.Status.Node}}", vol)); got != "docker/main" {
		t.Errorf("volume inspect after its new first user: node %q, want docker/main", got)
	}
	e.must(t, "rm", "-f", "other", "user2")
}
