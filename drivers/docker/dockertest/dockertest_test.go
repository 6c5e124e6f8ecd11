package dockertest_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/client"
	"go.uber.org/goleak"

	"github.com/berth-dev/berth/drivers/docker/dockertest"
)

// TestEngineLifecycle starts an engine with labels, builds the test image
// there and runs it, stops the engine and starts it again, and destroys
// it: its containers, its process and its directory are gone.
func TestEngineLifecycle(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	e, err := dockertest.StartEngine(ctx, dockertest.EngineOptions{Labels: map[string]string{"disk": "ssd", "zone": "b"}})
	if errors.Is(err, dockertest.ErrUnavailable) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	destroyed := false
	defer func() {
		if !destroyed {
			e.Destroy()
		}
	}()
	if !e.Running() || !strings.HasPrefix(e.Address(), "unix:///tmp/") {
		t.Fatalf("running %v at %s", e.Running(), e.Address())
	}
	info, err := e.Client.Info(ctx, client.InfoOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(info.Info.Labels, "disk=ssd") || !slices.Contains(info.Info.Labels, "zone=b") || info.Info.Driver != "vfs" {
		t.Errorf("engine labels %v, storage %s; want disk=ssd, zone=b on vfs", info.Info.Labels, info.Info.Driver)
	}

	image := "berth-test/dockertest:" + dockertest.RandomID()
	if err := dockertest.BuildHello(ctx, e.Client, image); err != nil {
		t.Fatal(err)
	}
	run := dockertest.RandomID()
	res, err := e.Client.ContainerCreate(ctx, client.ContainerCreateOptions{
		Config: &container.Config{Image: image, Labels: map[string]string{"run": run}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.Client.ContainerStart(ctx, res.ID, client.ContainerStartOptions{}); err != nil {
		t.Fatal(err)
	}

	e.Stop()
	if e.Running() {
		t.Error("Running after Stop")
	}
	pctx, pcancel := context.WithTimeout(ctx, 5*time.Second)
	_, err = e.Client.Ping(pctx, client.PingOptions{})
	pcancel()
	if err == nil {
		t.Error("the stopped engine still answers")
	}
	if err := e.Start(ctx); err != nil {
		t.Fatal(err)
	}
	// The engine keeps its containers across a restart.
	if n, err := dockertest.RemoveByLabel(ctx, e.Client, "run", run); err != nil || n != 1 {
		t.Errorf("RemoveByLabel after the restart: %d removed, %v; want the 1 container", n, err)
	}
	if n, err := dockertest.RemoveByLabel(ctx, e.Client, "run", run); err != nil || n != 0 {
		t.Errorf("RemoveByLabel again: %d, %v; want 0", n, err)
	}
	dir := strings.TrimSuffix(strings.TrimPrefix(e.Address(), "unix://"), "/docker.sock")
	e.Destroy()
	destroyed = true
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the engine's directory %s is left: %v", dir, err)
	}
	waitGone(t, dir)
}

// waitGone fails the test unless every process of the engine in dir ends
// (killed processes are reaped by their parents: a liveness bound).
func waitGone(t *testing.T, dir string) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for len(processesIn(t, dir)) > 0 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if left := processesIn(t, dir); len(left) > 0 {
		t.Errorf("processes of the engine are left: %v", left)
	}
}

// processesIn returns the live processes whose command line names dir.
func processesIn(t *testing.T, dir string) []string {
	t.Helper()
	procs, err := filepath.Glob("/proc/[0-9]*")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, p := range procs {
		cmdline, err := os.ReadFile(p + "/cmdline")
		if err != nil || !bytes.Contains(cmdline, []byte(dir+"/")) {
			continue
		}
		if stat, err := os.ReadFile(p + "/stat"); err == nil && bytes.Contains(stat, []byte(") Z ")) {
			continue // a zombie: ended, waiting for its parent
		}
		out = append(out, filepath.Base(p)+": "+string(bytes.ReplaceAll(cmdline, []byte{0}, []byte{' '})))
	}
	return out
}
