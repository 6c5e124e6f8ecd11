package integration_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/moby/moby/client"

	"github.com/berth-dev/berth/control"
	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/reconciler"
	"github.com/berth-dev/berth/scheduler"
)

// TestRebalanceMovesMakeBeforeBreak spreads a service of 4 containers over
// the two engines and applies a binpack rebalance with a group budget of
// 1: the containers of one engine move to the other, and a client polling
// both engines throughout never sees fewer than 3 of them running.
func TestRebalanceMovesMakeBeforeBreak(t *testing.T) {
	e := setup(t, nil)
	ctx := context.Background()
	e.afterSyncs(t, 1)
	if _, err := e.plane.Submit(ctx, e.named(scheduler.Request{ID: "web", Count: 4, Spec: helloSpec()}), "it"); err != nil {
		t.Fatal(err)
	}
	before := e.allIn(t, reconciler.Running, 4)
	per := map[string]int{}
	for _, in := range before {
		per[in.Node]++
	}
	if per[mainNode] != 2 || per[secondNode] != 2 {
		t.Fatalf("the service is not spread over both engines: %v", per)
	}

	// The client: running containers of this cluster on both engines.
	running := func() (int, error) {
		n := 0
		for _, c := range engines() {
			ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			list, err := c.ContainerList(ctx, client.ContainerListOptions{Filters: make(client.Filters).Add("label", driver.TagCluster+"="+e.plane.ClusterID())})
			cancel()
			if err != nil {
				return 0, err
			}
			n += len(list.Items)
		}
		return n, nil
	}
	var mu sync.Mutex
	fewest, polls := 4, 0
	var pollErr error
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			n, err := running()
			mu.Lock()
			if err != nil {
				pollErr = err
			} else {
				fewest, polls = min(fewest, n), polls+1
			}
			mu.Unlock()
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	})

	run, err := e.plane.ApplyRebalance(ctx, control.ApplyOptions{GroupBudget: "1", Parallel: 4, Rate: 10})
	if err != nil {
		close(stop)
		wg.Wait()
		t.Fatal(err)
	}
	if len(run.Moves) != 2 || run.Plan.NodesAfter != 1 || !run.Check.OK {
		close(stop)
		wg.Wait()
		t.Fatalf("run: %+v", run)
	}
	e.waitFor(t, "the run to end", func() bool {
		run, err = e.plane.RebalanceStatus(ctx)
		return err == nil && run.State != control.RunRunning
	})
	close(stop)
	wg.Wait()
	if run.State != control.RunDone {
		t.Fatalf("run: %+v", run)
	}
	if pollErr != nil {
		t.Fatalf("polling the engines: %v", pollErr)
	}
	t.Logf("%d polls, fewest running containers seen: %d", polls, fewest)
	if fewest < 3 || polls < 2 {
		t.Fatalf("a client saw %d running containers (in %d polls), want at least 3", fewest, polls)
	}
	after := e.allIn(t, reconciler.Running, 4)
	nodes := map[string]bool{}
	for _, in := range after {
		nodes[in.Node] = true
	}
	if len(nodes) != 1 {
		t.Fatalf("after the run the service runs on %v", nodes)
	}
	e.waitFor(t, "one container per instance", func() bool {
		n := len(e.raw(t, mainCli)) + len(e.raw(t, second.Client))
		return n == 4
	})
	e.matchStore(t)
	e.deleteAll(t)
}
