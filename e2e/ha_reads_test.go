package e2e

import (
	"context"
	"errors"
	"net/http"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/control"
	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/scheduler"
)

// TestFollowersServeReads runs three servers on etcd with the sim
// back-end: a follower answers GET /v1/instances from its own copy of
// the state (saying so in Berth-Served-By), still forwards a write to the
// leader, and once the leader is killed the follower elected in its place
// takes writes.
func TestFollowersServeReads(t *testing.T) {
	t.Parallel()
	h := newHACluster(t, false)
	body := "cluster: " + h.name + "\nproviders:\n  - name: sim\n    driver: sim\n    options: {nodes: 3}\n"
	if err := os.WriteFile(h.cfg, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	h.start(0, 1, 2)
	l := h.leader(0, 1, 2)
	var followers []int
	for i := range 3 {
		if i != l {
			followers = append(followers, i)
		}
	}
	f := followers[0]

	submit := func(through int, id string) {
		t.Helper()
		r := scheduler.Request{ID: id, Spec: driver.Spec{Image: "busybox", Resources: driver.Resources{Memory: 8 * driver.MiB}}}
		waitFor(t, "submitting "+id+" through "+memberNames[through], func() bool {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			_, err := h.client(through).Submit(ctx, r)
			return err == nil || errors.Is(err, driver.ErrAlreadyExists)
		})
	}
	// readLocally waits until server i answers GET /v1/instances itself
	// with the instance id in it.
	readLocally := func(i int, id string) {
		t.Helper()
		waitFor(t, memberNames[i]+" to list "+id+" from its own copy", func() bool {
			resp, b, err := h.get(i, "/v1/instances")
			if err != nil {
				return false
			}
			if resp.StatusCode != http.StatusOK || resp.Header.Get("Berth-Served-By") != memberNames[i] || resp.Header.Get("Berth-Revision") == "" {
				return false
			}
			var list []control.Instance
			if err := driver.UnmarshalOutput(b, &list); err != nil {
				t.Fatalf("GET /v1/instances on %s: %v: %s", memberNames[i], err, b)
			}
			return slices.ContainsFunc(list, func(in control.Instance) bool { return in.ID == id })
		})
	}

	submit(l, "through-leader")
	readLocally(f, "through-leader")
	// One instance, once its copy holds the store's record.
	waitFor(t, memberNames[f]+" to answer GET /v1/instances/through-leader from its own copy", func() bool {
		resp, b, err := h.get(f, "/v1/instances/through-leader")
		return err == nil && resp.StatusCode == http.StatusOK && resp.Header.Get("Berth-Served-By") == memberNames[f] && strings.Contains(string(b), `"through-leader"`)
	})

	// A write on a follower goes to the leader, and the follower then
	// reads it back from its copy.
	submit(f, "through-follower")
	readLocally(f, "through-follower")
	readLocally(followers[1], "through-follower")

	// A route the follower does not answer itself is still forwarded, and
	// so are the logs and stats of an instance on the sim, which only the
	// leader reaches (the sim is its process's own).
	for _, path := range []string{"/v1/nodes", "/v1/instances/through-leader/logs", "/v1/instances/through-leader/stats?stream=false"} {
		waitFor(t, "GET "+path+" on a follower, forwarded", func() bool {
			resp, b, err := h.get(f, path)
			if err != nil {
				return false
			}
			if by := resp.Header.Get("Berth-Served-By"); by != "" {
				t.Fatalf("GET %s on a follower: %s, served by %q: %s", path, resp.Status, by, b)
			}
			return resp.StatusCode == http.StatusOK && len(b) > 0
		})
	}

	h.servers[l].kill9(t)
	nl := h.leader(followers...)
	submit(nl, "after-failover")
	other := followers[0]
	if other == nl {
		other = followers[1]
	}
	submit(other, "after-failover-forwarded")
	readLocally(other, "after-failover")
	readLocally(other, "after-failover-forwarded")
	// The new leader answers from its full plane, not a read-only copy.
	waitFor(t, "the new leader to answer from its own plane", func() bool {
		resp, _, err := h.get(nl, "/v1/instances/after-failover")
		if err != nil {
			return false
		}
		return resp.StatusCode == http.StatusOK && resp.Header.Get("Berth-Served-By") == ""
	})
}
