package e2e

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/internal/procfs"
	"github.com/berth-dev/berth/scheduler"
	"github.com/berth-dev/berth/store/etcd"
)

var (
	failovers = flag.Int("failovers", 3, "how many times TestFailover kills the leader")
	freeze    = flag.Bool("freeze", false, "TestFailover freezes the leader with SIGSTOP (as a machine that died, or was cut off, would look) instead of killing it")
)

// settle is how long TestFailover lets the cluster place requests before
// it kills the leader.
const settle = 5 * time.Second

// TestFailover runs three servers on etcd with the sim back-end and kills
// the leader with SIGKILL (SIGSTOP with -freeze) -failovers times while
// requests are submitted through a follower: each time a request sent
// after the kill must be placed, by a new leader, and the killed server is
// started again. It logs, for each kill, the time from the signal to the
// first request the new leader placed (the failover figure; never
// asserted: the machine may be loaded), with the times its log gives for
// its election and its control plane, and which server's member led etcd.
func TestFailover(t *testing.T) {
	t.Parallel()
	h := newHACluster(t, false)
	// Nodes large enough for every request of the test: the answer to
	// one that does not fit names no node.
	body := "cluster: " + h.name + "\nproviders:\n  - name: sim\n    driver: sim\n    options: {nodes: 3, shape: '{\"cpus\": 64, \"memory\": \"256Gi\"}'}\n"
	if err := os.WriteFile(h.cfg, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	h.start(0, 1, 2)
	var took, named []time.Duration
	for round := range *failovers {
		lead := h.leader(0, 1, 2)
		through := (lead + 1) % 3
		raft := h.etcdLeader(through)
		placed, killedAt, seen := h.placeAcrossKill(round, lead, through)
		d := placed.Sub(killedAt)
		took = append(took, d)
		named = append(named, seen.Sub(killedAt))
		since := func(msg string) string {
			if at, ok := h.loggedAfter(msg, killedAt); ok {
				return fmt.Sprintf("%.2fs", at.Sub(killedAt).Seconds())
			}
			return "?"
		}
		t.Logf("failover %d: killed %s (etcd's leader: %s); a new leader elected after %s, answering after %s, named by both others' /v1/health after %.2fs, its first request placed %.2fs after the kill",
			round+1, memberNames[lead], raft, since("elected leader"), since("leading: the control plane answers"), seen.Sub(killedAt).Seconds(), d.Seconds())
		h.start(lead)
	}
	sorted := func(ds []time.Duration) string {
		slices.Sort(ds)
		var s []string
		for _, d := range ds {
			s = append(s, strconv.FormatFloat(d.Seconds(), 'f', 2, 64))
		}
		return strings.Join(s, " ")
	}
	t.Logf("failover over %d kills, sorted: %s s", len(took), sorted(took))
	t.Logf("the new leader named by both other servers' /v1/health (polled every 20 ms), sorted: %s s", sorted(named))
	// One term for each kill and the first: any other is a lease a live
	// leader lost (a needless failover: a loaded machine, too short a
	// lease).
	if n := h.terms(); n != len(took)+1 {
		t.Logf("%d terms of leadership, %d without a needless failover:\n%s", n, len(took)+1, h.leadership())
	} else {
		t.Logf("%d terms of leadership, none for a needless failover", n)
	}
}

// loggedAfter returns when a server first logged msg after t.
func (h *haCluster) loggedAfter(msg string, t time.Time) (time.Time, bool) {
	for _, sv := range h.servers {
		for _, l := range strings.Split(sv.logs(), "\n") {
			var rec struct {
				Time time.Time `json:"time"`
				Msg  string    `json:"msg"`
			}
			if json.Unmarshal([]byte(l), &rec) == nil && rec.Msg == msg && rec.Time.After(t) {
				return rec.Time, true
			}
		}
	}
	return time.Time{}, false
}

// sleep waits d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

// stopped reports whether the process pid is stopped by a signal.
func stopped(pid int) bool {
	st, err := procfs.ReadStat(pid)
	return err == nil && st.State == 'T'
}

// etcdLeader names the server whose member leads etcd, asking server i's
// member.
func (h *haCluster) etcdLeader(i int) string {
	h.t.Helper()
	url := ""
	for k, a := range h.args[i] {
		if a == "--etcd-client-url" {
			url = h.args[i][k+1]
		}
	}
	c, err := etcd.NewClient([]string{url}, etcd.TLSFiles{})
	if err != nil {
		h.t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := c.Status(ctx, url)
	if err != nil {
		h.t.Fatal(err)
	}
	ms, err := c.MemberList(ctx, clientv3.WithSerializable())
	if err != nil {
		h.t.Fatal(err)
	}
	for _, m := range ms.Members {
		if m.ID == st.Leader {
			return m.Name
		}
	}
	return "none"
}

// placeAcrossKill submits requests through server through, kills server
// lead once a few are placed, and returns the time of the kill, when the
// first request sent after it was answered placed, and when the /v1/health
// of both other servers first named the same new leader.
func (h *haCluster) placeAcrossKill(round, lead, through int) (placed, killedAt, named time.Time) {
	h.t.Helper()
	c := h.client(through)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var (
		mu    sync.Mutex
		n     int
		first time.Time
		kill  = make(chan struct{})
		errs  []string
		// unplaced are the requests answered without a node, which
		// the nodes' size should never let happen.
		unplaced []string
	)
	var killed time.Time
	var wg sync.WaitGroup
	// Four submitters, and once the leader is gone a new one every 50 ms,
	// since those before may wait on it until their requests time out
	// (a frozen leader never answers what was forwarded to it).
	spawn := func(from, count int) {
		for w := from; w < from+count; w++ {
			wg.Go(func() {
				for k := 0; ctx.Err() == nil && (w < 4 || k == 0); k++ {
					sent := time.Now()
					r := scheduler.Request{ID: fmt.Sprintf("f%d-%d-%d", round, w, k), Spec: driver.Spec{Image: "busybox", Resources: driver.Resources{Memory: 8 * driver.MiB}}}
					rctx, rcancel := context.WithTimeout(ctx, 10*time.Second)
					ans, err := c.Submit(rctx, r)
					rcancel()
					now := time.Now()
					mu.Lock()
					switch {
					case err != nil:
						if len(errs) < 5 && !killed.IsZero() {
							errs = append(errs, err.Error())
						}
					case len(ans.Instances) == 0 || ans.Instances[0].Node == nil:
						unplaced = append(unplaced, r.ID)
					case killed.IsZero():
						// The cluster runs steadily for a while first: etcd
						// extends every lease when its leader changes (as the
						// leader hands it off, at the start of a term).
						if n++; n == 1 {
							time.AfterFunc(settle, func() { close(kill) })
						}
					case sent.After(killed) && first.IsZero():
						first = now
						cancel()
					}
					mu.Unlock()
					if err != nil {
						time.Sleep(20 * time.Millisecond)
					}
				}
			})
		}
	}
	spawn(0, 4)
	select {
	case <-kill:
		// Requests sent once the process is gone are the new leader's;
		// the failover counts from the signal.
		killedAt = time.Now()
		if *freeze {
			if err := h.servers[lead].cmd.Process.Signal(syscall.SIGSTOP); err != nil {
				h.t.Fatal(err)
			}
			defer h.servers[lead].kill9(h.t)
			waitFor(h.t, "the leader to be stopped", func() bool { return stopped(h.servers[lead].cmd.Process.Pid) })
		} else {
			h.servers[lead].kill9(h.t)
		}
		mu.Lock()
		killed = time.Now()
		mu.Unlock()
		wg.Go(func() {
			hctx, hcancel := context.WithTimeout(context.Background(), time.Minute)
			defer hcancel()
			for hctx.Err() == nil {
				var names []string
				for i := range 3 {
					if i == lead {
						continue
					}
					if hl, err := h.health(i); err == nil && hl.Leader != nil && hl.Leader.Name != memberNames[lead] {
						names = append(names, hl.Leader.Name)
					}
				}
				if len(names) == 2 && names[0] == names[1] {
					mu.Lock()
					named = time.Now()
					mu.Unlock()
					return
				}
				sleep(hctx, 20*time.Millisecond)
			}
		})
		for w := 4; ctx.Err() == nil; w++ {
			spawn(w, 1)
			sleep(ctx, 50*time.Millisecond)
		}
	case <-ctx.Done():
	}
	wg.Wait()
	if len(unplaced) > 0 {
		h.t.Errorf("round %d: %d requests answered without a node, as %s", round, len(unplaced), unplaced[0])
	}
	if first.IsZero() {
		h.t.Fatalf("round %d: nothing placed after killing %s: %s", round, memberNames[lead], strings.Join(errs, "; "))
	}
	if named.IsZero() {
		h.t.Fatalf("round %d: the other servers' /v1/health never named a new leader", round)
	}
	return first, killedAt, named
}
