package leader_test

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.uber.org/goleak"

	"github.com/berth-dev/berth/leader"
	"github.com/berth-dev/berth/store"
	"github.com/berth-dev/berth/store/etcd"
	"github.com/berth-dev/berth/store/etcd/etcdtest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// Two servers campaign: one leads and writes through its fenced store;
// when its lease is revoked (as when it froze past its TTL) the other
// leads, and every later write of the first is refused with ErrDeposed
// and changes nothing.
func TestOneLeaderAndTheFence(t *testing.T) {
	m := etcdtest.Member(t)
	ca, cb := etcdtest.Client(t, m), etcdtest.Client(t, m)
	const prefix = "/c1"
	sa, sb := etcd.New(ca, etcd.Options{Prefix: prefix}), etcd.New(cb, etcd.Options{Prefix: prefix})
	t.Cleanup(func() { _ = sa.Close(); _ = sb.Close() })

	type term struct {
		name  string
		term  leader.Term
		st    store.Store
		ended chan struct{}
		gone  atomic.Bool
	}
	terms := make(chan *term, 4)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{}, 2)
	for _, srv := range []struct {
		name string
		st   *etcd.Store
		cli  *clientv3.Client
	}{{"a", sa, ca}, {"b", sb, cb}} {
		cli := srv.cli
		var handedOff atomic.Int64
		go func() {
			defer func() { done <- struct{}{} }()
			_ = leader.Run(ctx, leader.Config{Client: cli, Prefix: prefix, Self: leader.Info{Name: srv.name, Address: "http://" + srv.name}, TTL: time.Second,
				HandOff: func(context.Context) error { handedOff.Add(1); return nil }},
				func(tctx context.Context, tm leader.Term, deposed func()) error {
					if handedOff.Load() == 0 {
						t.Errorf("%s leads before it handed etcd's lead off", srv.name)
					}
					tr := &term{name: srv.name, term: tm, ended: make(chan struct{})}
					tr.st = leader.Fenced(srv.st, tm.Fence, func() { tr.gone.Store(true); deposed() })
					terms <- tr
					<-tctx.Done()
					close(tr.ended)
					// Hold on until the test is done with this term's
					// store, as a deposed leader still running would.
					return nil
				})
		}()
	}
	defer func() {
		cancel()
		<-done
		<-done
	}()
	first := <-terms
	if info, ok, err := leader.Current(ctx, ca, prefix); err != nil || !ok || info.Name != first.name {
		t.Fatalf("Current = %+v %v %v, want %s", info, ok, err, first.name)
	}
	res, err := first.st.Txn(ctx, nil, []store.Op{store.Put("/x", []byte("first"))})
	if err != nil || !res.Succeeded {
		t.Fatalf("the leader's write: %+v %v", res, err)
	}
	// A comparison of the caller's own that fails is no deposition.
	if res, err := first.st.Txn(ctx, []store.Cmp{{Key: "/x"}}, []store.Op{store.Put("/x", []byte("again"))}); err != nil || res.Succeeded {
		t.Fatalf("a failed compare of the leader's own: %+v %v, want not succeeded and no error", res, err)
	}

	// The first leader's lease ends: the other server is elected.
	lease := leaseOf(t, ca, prefix, first.name)
	if _, err := ca.Revoke(ctx, lease); err != nil {
		t.Fatal(err)
	}
	second := <-terms
	if second.name == first.name {
		t.Fatalf("%s leads again", second.name)
	}
	if second.term.Rev <= first.term.Rev {
		t.Fatalf("the second term's revision %d is not after the first's %d", second.term.Rev, first.term.Rev)
	}
	<-first.ended
	// The deposed leader writes anyway: refused, and nothing changes.
	_, err = first.st.Txn(ctx, nil, []store.Op{store.Put("/x", []byte("stale"))})
	if !errors.Is(err, leader.ErrDeposed) || !first.gone.Load() {
		t.Fatalf("deposed leader's write: %v (deposed called: %v), want ErrDeposed", err, first.gone.Load())
	}
	if kv, err := sb.Get(ctx, "/x"); err != nil || string(kv.Value) != "first" {
		t.Fatalf("/x = %q %v, want the first leader's write only", kv.Value, err)
	}
	if res, err := second.st.Txn(ctx, nil, []store.Op{store.Put("/x", []byte("second"))}); err != nil || !res.Succeeded {
		t.Fatalf("the new leader's write: %+v %v", res, err)
	}
}

// leaseOf returns the lease of name's election key.
func leaseOf(t *testing.T, c *clientv3.Client, prefix, name string) clientv3.LeaseID {
	t.Helper()
	resp, err := c.Get(context.Background(), prefix+leader.ElectionKey, clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	for _, kv := range resp.Kvs {
		var in leader.Info
		if json.Unmarshal(kv.Value, &in) == nil && in.Name == name {
			return clientv3.LeaseID(kv.Lease)
		}
	}
	t.Fatalf("no election key of %s", name)
	return 0
}

// A leader whose etcd member refuses connections (its process died) loses
// its lease at once: another server leads long before the lease would run
// out. While the member accepts connections, nobody takes the lead.
func TestLeaderWithADeadMemberIsReaped(t *testing.T) {
	m := etcdtest.Member(t)
	const prefix = "/c2"
	type server struct {
		name string
		cli  *clientv3.Client
		ln   net.Listener // stands for the server's etcd member
	}
	var servers []*server
	for _, name := range []string{"a", "b"} {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ln.Close() })
		servers = append(servers, &server{name: name, cli: etcdtest.Client(t, m), ln: ln})
	}
	leaders := make(chan string, 4)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() {
		cancel()
		wg.Wait()
	}()
	for _, srv := range servers {
		wg.Go(func() {
			// A lease far longer than the test may wait.
			_ = leader.Run(ctx, leader.Config{Client: srv.cli, Prefix: prefix, TTL: time.Hour,
				Self: leader.Info{Name: srv.name, Address: "http://" + srv.name, Member: "http://" + srv.ln.Addr().String()}},
				func(tctx context.Context, _ leader.Term, _ func()) error {
					leaders <- srv.name
					<-tctx.Done()
					return nil
				})
		})
	}
	first := <-leaders
	// Several probes of a member that answers change nothing.
	time.Sleep(5 * leader.ProbeInterval)
	select {
	case other := <-leaders:
		t.Fatalf("%s took the lead from %s, whose member answers", other, first)
	default:
	}
	for _, srv := range servers {
		if srv.name == first {
			srv.ln.Close()
		}
	}
	select {
	case second := <-leaders:
		if second == first {
			t.Fatalf("%s leads again", first)
		}
	case <-time.After(time.Minute):
		t.Fatalf("nobody took the lead from %s, whose member refuses connections", first)
	}
}

// A leader elected between Watch's read and the start of its watch is
// seen all the same: the watch starts from the read's revision.
func TestWatchSeesALeaderElectedRightAfterItsRead(t *testing.T) {
	m := etcdtest.Member(t)
	c := etcdtest.Client(t, m)
	const prefix = "/c3"
	ctx, cancel := context.WithCancel(context.Background())
	sess, err := concurrency.NewSession(c, concurrency.WithTTL(60))
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close()
	val, _ := json.Marshal(leader.Info{Name: "a", Address: "http://a"})
	var once sync.Once
	restore := leader.SetAfterRead(func() {
		once.Do(func() {
			if err := concurrency.NewElection(sess, prefix+leader.ElectionKey).Campaign(ctx, string(val)); err != nil {
				t.Error(err)
			}
		})
	})
	var wg sync.WaitGroup
	defer func() {
		cancel()
		wg.Wait()
		restore() // once Watch has returned
	}()
	seen := make(chan string, 8)
	wg.Go(func() {
		leader.Watch(ctx, c, prefix, func(in leader.Info, ok bool) {
			if !ok {
				in.Name = ""
			}
			select {
			case seen <- in.Name:
			default:
			}
		})
	})
	if got := <-seen; got != "" {
		t.Fatalf("first seen %q, want no leader", got)
	}
	select {
	case got := <-seen:
		if got != "a" {
			t.Fatalf("then seen %q, want a", got)
		}
	case <-time.After(time.Minute):
		t.Fatal("the leader elected between the read and the watch was never seen")
	}
}
