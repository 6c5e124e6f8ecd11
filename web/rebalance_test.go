package web_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/control"
	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/scheduler"
)

// TestRebalancePage shows the plan for a service spread over four nodes:
// the moves and the nodes they free, the replay, what stays; an operator
// of another namespace plans nothing of it, a reader may not plan.
func TestRebalancePage(t *testing.T) {
	plane := simPlane(t, 4)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- plane.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	submit(t, plane, "team-a", "web", 4, func(r *scheduler.Request) { r.CPU = driver.CPUs(1) })
	deadline := time.Now().Add(20 * time.Second)
	for {
		list, err := plane.Instances(context.Background(), control.Filter{Phases: []control.Phase{"running"}})
		if err != nil {
			t.Fatal(err)
		}
		if len(list) == 4 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of 4 running", len(list))
		}
		time.Sleep(10 * time.Millisecond)
	}
	s := newWeb(t, plane, nil)
	wantBody(t, get(s, "/ui/rebalance", "admin-secret"), http.StatusOK,
		"3 moves free 3 nodes: 4 nodes in use before, 1 after", "<strong>valid</strong>", "empties node-")
	wantBody(t, get(s, "/ui/rebalance", "operator-secret"), http.StatusOK, "3 moves free 3 nodes")
	body := wantBody(t, get(s, "/ui/rebalance", "other-secret"), http.StatusOK, "0 moves free 0 nodes", "<td colspan=\"3\">None.</td>")
	if strings.Contains(body, "web-0") {
		t.Fatalf("another namespace's instances shown:\n%s", body)
	}
	wantBody(t, get(s, "/ui/rebalance?goal=spread&threshold=0.2", "admin-secret"), http.StatusOK, "nodes over 0.2: 4 before, 4 after", "would go over the threshold")
	wantBody(t, get(s, "/ui/rebalance?threshold=2", "admin-secret"), http.StatusOK, "threshold")
	if w := get(s, "/ui/rebalance", "reader-secret"); w.Code != http.StatusForbidden {
		t.Fatalf("a reader's plan: %d", w.Code)
	}
}
