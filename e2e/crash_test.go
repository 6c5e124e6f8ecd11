package e2e

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/berth-dev/berth/api/client"
	"github.com/berth-dev/berth/control"
	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/scheduler"
)

// TestCrashDuring200Launches submits 200 process launches to the local
// back-end, kills the server with SIGKILL at a random moment, restarts it on
// the same data directory, and repeats. At the end every accepted request is
// running or terminal, every running instance has exactly one process, and
// no process of the run is unknown to Berth (no leak) or runs twice.
func TestCrashDuring200Launches(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("crash test skipped in -short mode")
	}
	const total, kills, workers = 200, 3, 4
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, seed>>1))
	dataDir := t.TempDir()
	mark := fmt.Sprintf("crash-%d", seed)
	t.Cleanup(func() { killMarked("E2E_CRASH", mark+"-") })

	id := func(i int) string { return fmt.Sprintf("c%d", i) }
	accepted := map[string]bool{}
	todo := make([]int, total)
	for i := range todo {
		todo[i] = i
	}
	var s *server
	for round := 0; ; round++ {
		s = startServer(t, dataDir)
		cl := newClient(t, s)
		// Kill after a random number of the remaining submissions, or (one
		// time in four) after all of them, while the launches are under way.
		killAfter := -1
		if round < kills {
			killAfter = rng.IntN(len(todo) + len(todo)/3 + 1)
		}
		var (
			mu      sync.Mutex
			failed  []int
			lastErr error
			next    atomic.Int64
			count   atomic.Int64
			wg      sync.WaitGroup
		)
		killed := make(chan struct{})
		var once sync.Once
		kill := func() { once.Do(func() { s.kill9(t); close(killed) }) }
		for range workers {
			wg.Go(func() {
				for {
					k := int(next.Add(1) - 1)
					if k >= len(todo) {
						return
					}
					i := todo[k]
					ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
					_, err := cl.Submit(ctx, request(mark, i, id(i)))
					cancel()
					mu.Lock()
					switch {
					case err == nil, errors.Is(err, driver.ErrAlreadyExists):
						accepted[id(i)] = true
					default:
						failed = append(failed, i)
						lastErr = err
					}
					mu.Unlock()
					if killAfter >= 0 && int(count.Add(1)) == killAfter {
						kill()
					}
				}
			})
		}
		wg.Wait()
		if killAfter >= 0 {
			if killAfter > len(todo) {
				// Everything was submitted: kill while launches run.
				time.Sleep(time.Duration(rng.IntN(500)) * time.Millisecond)
			}
			kill()
			<-killed
			slices.Sort(failed)
			t.Logf("round %d: killed after %d of %d submissions; %d to resubmit", round, min(killAfter, len(todo)), len(todo), len(failed))
			todo = failed
			continue
		}
		if len(failed) > 0 {
			t.Fatalf("round %d without a kill: %d submissions failed, the last with %v\n%s", round, len(failed), lastErr, tail(s.logs(), 30))
		}
		break
	}
	if len(accepted) != total {
		t.Fatalf("%d requests accepted, want %d", len(accepted), total)
	}

	cl := newClient(t, s)
	var list []control.Instance
	waitFor(t, "every accepted instance to be running or terminal", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		var err error
		list, err = cl.Instances(ctx, control.Filter{All: true})
		if err != nil {
			return false
		}
		settled := 0
		for _, in := range list {
			if accepted[in.ID] && (in.Phase == "running" || in.Phase.Terminal()) {
				settled++
			}
		}
		return settled == total
	})
	byID := map[string]control.Instance{}
	for _, in := range list {
		byID[in.ID] = in
	}
	for idv := range accepted {
		if _, ok := byID[idv]; !ok {
			t.Errorf("accepted request %s is not in the store", idv)
		}
	}
	// /proc agrees with the store: one process per running instance, none
	// twice, none unknown. Give the reconciler a moment to finish deleting
	// leaks it found after the last restart.
	waitFor(t, "the processes to match the running instances", func() bool {
		procs := marked("E2E_CRASH", mark+"-")
		for k, pids := range procs {
			in, ok := byID[strings.Replace(k, mark+"-", "c", 1)]
			if len(pids) != 1 || !ok || in.Phase != "running" {
				return false
			}
		}
		running := 0
		for _, in := range byID {
			if in.Phase == "running" {
				running++
			}
		}
		return running == len(procs)
	})
	procs := marked("E2E_CRASH", mark+"-")
	for k, pids := range procs {
		if len(pids) > 1 {
			t.Errorf("%s runs %d times: pids %v", k, len(pids), pids)
		}
	}
	failedCount := 0
	for _, in := range byID {
		if in.Phase == "failed" {
			failedCount++
			t.Logf("%s failed: %s", in.ID, in.Message)
		}
	}
	t.Logf("%d running, %d failed, %d processes", len(byID)-failedCount, failedCount, len(procs))

	// Clean up through Berth and check that nothing is left behind.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for idv := range accepted {
		if _, err := cl.Delete(ctx, idv); err != nil {
			t.Fatalf("delete %s: %v", idv, err)
		}
	}
	waitFor(t, "every instance to be deleted", func() bool {
		list, err := cl.Instances(ctx, control.Filter{All: true})
		if err != nil {
			return false
		}
		for _, in := range list {
			if !in.Phase.Terminal() {
				return false
			}
		}
		return true
	})
	waitFor(t, "every process to end", func() bool { return len(marked("E2E_CRASH", mark+"-")) == 0 })
	if err := s.stop(t); err != nil {
		t.Fatalf("SIGTERM: %v", err)
	}
}

func newClient(t *testing.T, s *server) *client.Client {
	t.Helper()
	cl, err := client.New("http://"+s.addr, client.WithToken(s.token(t)), client.WithHTTPClient(&http.Client{Timeout: 20 * time.Second}))
	if err != nil {
		t.Fatal(err)
	}
	return cl
}

func request(mark string, i int, id string) scheduler.Request {
	return scheduler.Request{
		ID: id,
		Spec: driver.Spec{
			Kind:    driver.KindProcess,
			Command: []string{"sleep", "600"},
			Env:     map[string]string{"E2E_CRASH": fmt.Sprintf("%s-%d", mark, i)},
		},
	}
}
