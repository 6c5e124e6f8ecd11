package docker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/client"

	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/drivers/docker/dockertest"
)

// The images the tests use. There is no registry: TestMain builds them from
// a static Go program on the machine's engine. The tag is unique to the run,
// so that other test binaries sharing the engine cannot remove them.
var (
	imageTag     = randomID()
	helloImage   = "berth-test/docker-hello:" + imageTag
	preloadImage = "berth-test/docker-preload:" + imageTag // built on the main engine only
)

var (
	mainCli *client.Client     // the machine's engine, for checks behind the driver's back
	second  *dockertest.Engine // a second engine of the tests' own; nil when it cannot run
	// secondWhy says why there is no second engine.
	secondWhy string
)

func TestMain(m *testing.M) {
	os.Exit(runMain(m))
}

func runMain(m *testing.M) int {
	// A few containers per test: the machine's engine is shared with
	// dockerapi's tests, in turn with the packages that take it alone.
	unlock, err := dockertest.ShareMainEngine()
	if err != nil {
		fmt.Fprintln(os.Stderr, "lock the engine:", err)
		return 1
	}
	defer unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	mainCli, err = dockertest.Connect(ctx, DefaultHost)
	if err != nil {
		fmt.Fprintln(os.Stderr, "docker tests need the machine's engine:", err)
		return 1
	}
	defer mainCli.Close()
	defer dockertest.RemoveImages(context.Background(), mainCli, helloImage, preloadImage)
	if err := dockertest.BuildHello(ctx, mainCli, helloImage, preloadImage); err != nil {
		fmt.Fprintln(os.Stderr, "docker tests: build the test images:", err)
		return 1
	}
	second, err = dockertest.StartEngine(ctx, dockertest.EngineOptions{})
	switch {
	case errors.Is(err, dockertest.ErrUnavailable):
		secondWhy = err.Error()
		fmt.Fprintln(os.Stderr, "docker tests: no second engine:", secondWhy)
	case err != nil:
		fmt.Fprintln(os.Stderr, "docker tests: start a second engine:", err)
		return 1
	default:
		defer second.Destroy()
		if err := dockertest.CopyImage(ctx, mainCli, second.Client, helloImage); err != nil {
			fmt.Fprintln(os.Stderr, "docker tests: load the test image into the second engine:", err)
			return 1
		}
	}
	return m.Run()
}

func randomID() string { return dockertest.RandomID() }

// removeByLabel removes every container on c carrying label k=v (test
// cleanup, behind the driver's back) and reports how many there were.
func removeByLabel(t *testing.T, c *client.Client, k, v string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	list, err := c.ContainerList(ctx, client.ContainerListOptions{All: true, Filters: make(client.Filters).Add("label", k+"="+v)})
	if err != nil {
		t.Errorf("cleanup: list containers: %v", err)
		return 0
	}
	for _, ct := range list.Items {
		if _, err := c.ContainerRemove(ctx, ct.ID, client.ContainerRemoveOptions{Force: true, RemoveVolumes: true}); err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("cleanup: remove %s: %v", ct.ID, err)
		}
	}
	return len(list.Items)
}

func jsonMarshal(v any) ([]byte, error) { return json.Marshal(v) }

func configWithLabels(labels map[string]string) *container.Config {
	return &container.Config{Labels: labels}
}

// syncEvents collects the events a watcher reports.
type syncEvents struct {
	mu  sync.Mutex
	evs []driver.Event
}

func (s *syncEvents) add(e driver.Event) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.evs = append(s.evs, e)
}

func (s *syncEvents) list() []driver.Event {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.evs)
}

func (s *syncEvents) has(instance string, typ driver.EventType) bool {
	for _, e := range s.list() {
		if e.Instance == instance && e.Type == typ {
			return true
		}
	}
	return false
}

// wait polls cond until it holds, failing the test after a minute (a
// liveness bound, not a timing assertion).
func wait(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within a minute")
		}
		time.Sleep(20 * time.Millisecond)
	}
}
