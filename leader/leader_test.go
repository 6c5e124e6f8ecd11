package leader_test

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
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
					tr.st = leader.Fenced(srv.st, tm, func() { tr.gone.Store(true); deposed() })
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

// A leader whose renewals are held up on the network past its lease (its
// own connection to etcd stops passing anything; its store's connection
// still works) stops writing before another server is elected: when the
// second server leads, the first knows its term is over, and none of its
// writes landed after the second's term began.
func TestALeaderWhoseRenewalsAreDelayedStopsBeforeAnotherLeads(t *testing.T) {
	m := etcdtest.Member(t)
	const prefix = "/c4"
	p := newHoldingProxy(t, m.ClientURL())
	ca, err := etcd.NewClient([]string{p.url()}, etcd.TLSFiles{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ca.Close() })
	cb := etcdtest.Client(t, m)
	sa := etcd.New(etcdtest.Client(t, m), etcd.Options{Prefix: prefix})
	sb := etcd.New(cb, etcd.Options{Prefix: prefix})
	t.Cleanup(func() { _ = sa.Close(); _ = sb.Close() })

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() {
		p.release() // let the first server's calls through, to end
		cancel()
		wg.Wait()
	}()
	first := make(chan leader.Term, 1)
	stopped := make(chan error, 1) // the first leader's refused write
	ended := make(chan struct{})
	var terms atomic.Int32
	wg.Go(func() {
		_ = leader.Run(ctx, leader.Config{Client: ca, Prefix: prefix, TTL: time.Second, Self: leader.Info{Name: "a", Address: "http://a"}},
			func(tctx context.Context, tm leader.Term, deposed func()) error {
				if terms.Add(1) > 1 {
					return nil // a later term, once the test is over
				}
				defer close(ended)
				first <- tm
				st := leader.Fenced(sa, tm, deposed)
				for {
					if _, err := st.Txn(tctx, nil, []store.Op{store.Put("/x", []byte("a"))}); err != nil {
						stopped <- err
						break
					}
					sleep(tctx, 20*time.Millisecond)
				}
				<-tctx.Done()
				return nil
			})
	})
	a := <-first
	began := make(chan int64, 1) // etcd's revision when b's term began
	aHeld := make(chan bool, 1)
	wg.Go(func() {
		_ = leader.Run(ctx, leader.Config{Client: cb, Prefix: prefix, TTL: time.Second, Self: leader.Info{Name: "b", Address: "http://b"}},
			func(tctx context.Context, tm leader.Term, _ func()) error {
				aHeld <- a.Held() // at the start of b's term
				resp, err := cb.Get(tctx, prefix+"/x")
				if err != nil {
					t.Error(err)
					resp = &clientv3.GetResponse{Header: &etcdserverpb.ResponseHeader{}}
				}
				began <- resp.Header.Revision
				<-tctx.Done()
				return nil
			})
	})
	// The first leader's renewals no longer reach etcd.
	p.hold()
	var rev int64
	select {
	case rev = <-began:
	case <-time.After(time.Minute):
		t.Fatal("nobody took the lead from a leader whose renewals are held up")
	}
	if <-aHeld {
		t.Fatal("the first leader still took its lease for held when the second was elected")
	}
	if err := <-stopped; !errors.Is(err, leader.ErrDeposed) {
		t.Fatalf("the first leader's writes ended with %v, want ErrDeposed", err)
	}
	<-ended
	kv, err := sb.Get(ctx, "/x")
	if err != nil {
		t.Fatal(err)
	}
	// Store revisions are etcd's less one.
	if kv.ModRevision >= rev-1 {
		t.Fatalf("the first leader's last write is at revision %d, after the second's term began (%d)", kv.ModRevision, rev-1)
	}
}

// sleep waits d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

// holdingProxy passes TCP connections on to a server, and holds every
// byte (in both directions) between hold and release, as a network that
// stopped delivering would.
type holdingProxy struct {
	ln   net.Listener
	mu   sync.Mutex
	open chan struct{} // closed while bytes pass
	wg   sync.WaitGroup
}

func newHoldingProxy(t *testing.T, to string) *holdingProxy {
	t.Helper()
	u, err := url.Parse(to)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &holdingProxy{ln: ln, open: make(chan struct{})}
	close(p.open)
	var conns []net.Conn
	var mu sync.Mutex
	p.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", u.Host)
			if err != nil {
				c.Close()
				continue
			}
			mu.Lock()
			conns = append(conns, c, s)
			mu.Unlock()
			p.wg.Go(func() { p.pipe(s, c) })
			p.wg.Go(func() { p.pipe(c, s) })
		}
	})
	t.Cleanup(func() {
		ln.Close()
		p.release()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		p.wg.Wait()
	})
	return p
}

func (p *holdingProxy) url() string { return "http://" + p.ln.Addr().String() }

// pipe copies from src to dst, waiting while bytes are held.
func (p *holdingProxy) pipe(dst, src net.Conn) {
	defer dst.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			open := p.open
			p.mu.Unlock()
			<-open
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

func (p *holdingProxy) hold() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.open:
		p.open = make(chan struct{})
	default:
	}
}

func (p *holdingProxy) release() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.open:
	default:
		close(p.open)
	}
}
