package api_test

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/api"
	"github.com/berth-dev/berth/api/apitest"
	"github.com/berth-dev/berth/control"
	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/drivers/local"
	"github.com/berth-dev/berth/internal/procfs"
	"github.com/berth-dev/berth/provider"
	"github.com/berth-dev/berth/reconciler"
	"github.com/berth-dev/berth/scheduler"
	"github.com/berth-dev/berth/store/memory"
)

// TestStopLongerThanTheAnswerIsAccepted: a stop whose grace is longer
// than the answer's deadline allows, of a real process that ignores
// SIGTERM, is answered 202 with the instance stopping, and then carried
// out: the process is killed once the grace is over and the instance is
// stopped. (Before, the back-end's call timeout cut the stop with a 504
// and left the process running.) A restart with as long a grace is
// answered likewise, and the instance runs again once stopped.
func TestStopLongerThanTheAnswerIsAccepted(t *testing.T) {
	dir := t.TempDir()
	e := apitest.StartWith(t, memory.New(memory.Options{}), nil, api.Options{WriteTimeout: 4 * time.Second}, func(c *control.Config) {
		opts := local.DefaultOptions()
		opts.DataDir, opts.NodeName, opts.CgroupRoot, opts.AllowRoot = filepath.Join(dir, "local"), "host", "", true
		opts.PollInterval = 20 * time.Millisecond
		d, err := local.Open(context.Background(), opts, driver.Env{Provider: "local", Cluster: "test"})
		if err != nil {
			t.Fatal(err)
		}
		// A call timeout shorter than the grace, as 30s is shorter than a
		// grace of minutes.
		p, err := provider.New(d, provider.Config{Name: "local", CallTimeout: time.Second, StateTTL: time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = p.Close(context.Background()) })
		c.Providers = []*provider.Provider{p}
	})
	ctx := context.Background()
	c := e.Client(t, "")
	pidFile := filepath.Join(dir, "pid")
	_, err := c.Submit(ctx, scheduler.Request{ID: "stubborn", Spec: driver.Spec{
		Kind:       driver.KindProcess,
		Entrypoint: []string{"/bin/sh", "-c", `trap "" TERM; echo $$ > ` + pidFile + `; exec sleep 300`},
		Resources:  driver.Resources{CPU: driver.CPUs(0.1), Memory: 16 * driver.MiB},
	}})
	if err != nil {
		t.Fatal(err)
	}
	var pid int
	waitUntil(t, "the process to run", func() bool {
		in, err := c.Instance(ctx, "stubborn")
		b, _ := os.ReadFile(pidFile)
		pid, _ = strconv.Atoi(strings.TrimSpace(string(b)))
		return err == nil && in.Phase == reconciler.Running && pid > 0
	})

	// A grace of 5s: more than the 4s the answer may take, and more than
	// the back-end's call timeout.
	req, err := http.NewRequest(http.MethodPost, e.HTTP.URL+"/v1/instances/stubborn/stop?grace=5s", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+e.Token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var in control.Instance
	if err := json.NewDecoder(resp.Body).Decode(&in); err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusAccepted {
		t.Fatalf("stop with a long grace: %d, want 202", resp.StatusCode)
	}
	// The answer comes before the grace is over: the process ignores
	// SIGTERM, so it cannot have stopped yet.
	if in.Phase != reconciler.Stopping {
		t.Fatalf("the answer shows the instance %s, want stopping", in.Phase)
	}
	// The reconciler carries the stop out: SIGTERM is ignored, SIGKILL
	// after the grace ends the process.
	waitPhase(t, c, "stubborn", reconciler.Stopped)
	if procfs.Running(pid) {
		t.Fatalf("process %d still runs after the stop", pid)
	}

	// A restart with as long a grace: answered at once, the instance
	// started again once the stop is over.
	if _, err := c.Start(ctx, "stubborn"); err != nil {
		t.Fatal(err)
	}
	first := pid
	waitUntil(t, "the process to run again", func() bool {
		b, _ := os.ReadFile(pidFile)
		pid, _ = strconv.Atoi(strings.TrimSpace(string(b)))
		return pid != first && procfs.Running(pid)
	})
	req, err = http.NewRequest(http.MethodPost, e.HTTP.URL+"/v1/instances/stubborn/restart?grace=5s", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+e.Token)
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(&in); err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusAccepted || in.Phase != reconciler.Stopping || in.Want != reconciler.Running {
		t.Fatalf("restart with a long grace: %d, the instance %s (want %q); want 202, stopping, to run", resp.StatusCode, in.Phase, in.Want)
	}
	second := pid
	waitUntil(t, "the process to run once more", func() bool {
		b, _ := os.ReadFile(pidFile)
		pid, _ = strconv.Atoi(strings.TrimSpace(string(b)))
		return pid != second && procfs.Running(pid)
	})
	if procfs.Running(second) {
		t.Fatalf("process %d still runs after the restart", second)
	}
	waitPhase(t, c, "stubborn", reconciler.Running)
}

// waitUntil polls cond; the limit only guards against a hung test.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
