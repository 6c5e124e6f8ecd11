package etcd_test

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/freeport"
	"github.com/berth-dev/berth/store/etcd"
	"github.com/berth-dev/berth/store/etcd/etcdtest"
)

// Three members: HandOff on the leader passes etcd's lead to another
// member, on a follower it does nothing, and with a member down the lead
// goes to the one that is up.
func TestHandOff(t *testing.T) {
	names := []string{"a", "b", "c"}
	members, clients := startMembers(t, names, func(c *etcd.MemberConfig) { c.SkipFsync = true })
	closed := make([]bool, len(members))
	for i, m := range members {
		t.Cleanup(func() {
			if !closed[i] {
				m.Close()
			}
		})
	}
	c := etcdtest.Client(t, members[0])
	ctx := context.Background()
	// leader returns the index of the member that leads etcd, as member i
	// sees it, once one does.
	leader := func(i int) int {
		t.Helper()
		for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
			st, err := c.Status(ctx, clients[i])
			if err != nil || st.Leader == 0 {
				continue
			}
			for k, m := range members {
				if m.ID() == st.Leader {
					return k
				}
			}
		}
		t.Fatalf("member %s sees no leader", names[i])
		return -1
	}

	l := leader(0)
	follower := (l + 1) % 3
	if err := members[follower].HandOff(ctx); err != nil {
		t.Fatalf("HandOff on follower %s: %v", names[follower], err)
	}
	if got := leader(follower); got != l {
		t.Fatalf("after a follower's HandOff %s leads, want %s still", names[got], names[l])
	}
	if err := members[l].HandOff(ctx); err != nil {
		t.Fatalf("HandOff on leader %s: %v", names[l], err)
	}
	l2 := leader(l)
	if l2 == l {
		t.Fatalf("%s still leads after its HandOff", names[l])
	}

	// One member down: the lead can go only to the third.
	down := 3 - l - l2
	members[down].Close()
	closed[down] = true
	if err := members[l2].HandOff(ctx); err != nil {
		t.Fatalf("HandOff on leader %s with %s down: %v", names[l2], names[down], err)
	}
	if got := leader(l2); got != l {
		t.Fatalf("with %s down, %s leads after %s's HandOff, want %s", names[down], names[got], names[l2], names[l])
	}
}

// MinLeaseTTL is the TTL etcd grants for a one-second lease: one second
// with the Berth server's timings, two with etcd's own.
func TestMinLeaseTTL(t *testing.T) {
	for _, tc := range []struct {
		name                string
		heartbeat, election time.Duration
		want                time.Duration
	}{
		{"the Berth server's", etcd.DefaultHeartbeat, etcd.DefaultElectionTimeout, time.Second},
		{"etcd's", 0, 0, 2 * time.Second},
		{"600ms in 100ms heartbeats", 100 * time.Millisecond, 600 * time.Millisecond, time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := etcd.MemberConfig{
				Name: "m", Dir: filepath.Join(t.TempDir(), "etcd"),
				PeerURL:   fmt.Sprintf("http://127.0.0.1:%d", freeport.Port(t)),
				ClientURL: fmt.Sprintf("http://127.0.0.1:%d", freeport.Port(t)),
				SkipFsync: true, Heartbeat: tc.heartbeat, ElectionTimeout: tc.election,
			}
			if got := cfg.MinLeaseTTL(); got != tc.want {
				t.Fatalf("MinLeaseTTL = %s, want %s", got, tc.want)
			}
			m, err := etcd.StartMember(t.Context(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(m.Close)
			c := etcdtest.Client(t, m)
			resp, err := c.Grant(t.Context(), 1)
			if err != nil {
				t.Fatal(err)
			}
			if got := time.Duration(resp.TTL) * time.Second; got != tc.want {
				t.Fatalf("etcd granted a one-second lease %s, MinLeaseTTL says %s", got, tc.want)
			}
		})
	}
}

// startMembers starts a new cluster of one member per name in this
// process, with set applied to each member's configuration, and returns
// the members and their client URLs. The caller closes the members.
func startMembers(tb testing.TB, names []string, set func(*etcd.MemberConfig)) ([]*etcd.Member, []string) {
	tb.Helper()
	var peers, clients, initial []string
	for _, n := range names {
		peers = append(peers, fmt.Sprintf("http://127.0.0.1:%d", freeport.Port(tb)))
		clients = append(clients, fmt.Sprintf("http://127.0.0.1:%d", freeport.Port(tb)))
		initial = append(initial, n+"="+peers[len(peers)-1])
	}
	dir := tb.TempDir()
	members := make([]*etcd.Member, len(names))
	errs := make([]error, len(names))
	var wg sync.WaitGroup
	for i, n := range names {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			c := etcd.MemberConfig{
				Name: n, Dir: filepath.Join(dir, n), PeerURL: peers[i], ClientURL: clients[i],
				InitialCluster: strings.Join(initial, ","),
			}
			set(&c)
			members[i], errs[i] = etcd.StartMember(ctx, c)
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			for _, m := range members {
				if m != nil {
					m.Close()
				}
			}
			tb.Fatalf("member %s: %v", names[i], err)
		}
	}
	return members, clients
}
