// Package leader elects one leader among the Berth servers of a cluster on
// etcd, and fences the leader's writes.
//
// Every server campaigns (the scheme of etcd's concurrency.Election) on a
// lease of a second or two that it renews itself, every fifth of the TTL,
// in a goroutine of its own (keeper). The winner's election key, with its
// revision, is the fence: the leader's store (Fenced) adds to each of its
// transactions the comparison that the key still has that revision, in
// the same transaction. A leader that lost its lease (frozen, cut off, too
// slow) has lost its key, so each of its writes fails; Fenced then reports
// ErrDeposed and the leader stops at once. No write of a deposed leader
// ever lands, whatever it still believes.
//
// A leader also knows, from its own clock, when its lease may be lost:
// etcd cannot let a lease expire before the TTL has passed since the
// renewal that was last acknowledged was sent. Once four fifths of the
// TTL have passed since then, the term ends (Term.Held turns false, the
// term's context ends, Fenced sends nothing more): a leader whose
// renewals are delayed stops before etcd can let its lease expire, so
// before any other server is elected.
//
// A leader that stops answering loses the lead when its lease runs out. One
// whose process died is replaced sooner: the other servers revoke its lease
// as soon as the etcd member that ran in its process refuses connections
// (Info.Member). And the leader hands the lead of etcd itself to another
// member (Config.HandOff), so that its death never costs an etcd election
// first.
package leader

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"strings"
	"sync"
	"syscall"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/berth-dev/berth/store"
)

// ErrDeposed is the error of a write refused because its server no longer
// leads.
var ErrDeposed = errors.New("leader: this server no longer leads the cluster")

// DefaultTTL is the leader's lease: how long a leader that stopped
// answering keeps the lead before another server takes it. etcd grants
// no lease shorter than 1.5 of its election timeouts, rounded up to whole
// seconds: one second needs an election timeout of at most 666 ms.
const DefaultTTL = time.Second

// ElectionKey is the store key under which the servers campaign.
const ElectionKey = "/berth/leader/"

// Info is what the leader says of itself, the election key's value.
type Info struct {
	// Name is the server's name (its etcd member's name).
	Name string `json:"name"`
	// Address is the URL of its API.
	Address string `json:"address"`
	// Docker is the URL of its Docker endpoint, when it serves one.
	Docker string `json:"docker,omitempty"`
	// Member is the peer URL of the etcd member that runs in the server's
	// process, when one does: the server's only way to etcd. While it
	// leads, the other servers take that member refusing connections for
	// the death of its process, and revoke its lease at once.
	Member string `json:"member,omitempty"`
}

// Config configures Run.
type Config struct {
	// Client reaches etcd. The lease is renewed on it: it should be a
	// client of its own, whose connection no heavy traffic delays.
	Client *clientv3.Client
	// Prefix is the store's key prefix in etcd (store/etcd Options.Prefix).
	Prefix string
	// Self is this server.
	Self Info
	// TTL is the lease (0: DefaultTTL; etcd rounds it up to whole seconds
	// and to its own minimum, 1.5 election timeouts).
	TTL    time.Duration
	Logger *slog.Logger
	// Changed, when set, is called with each change of leadership seen by
	// this server (elected, deposed).
	Changed func(leading bool)
	// HandOff, when set, passes the lead of the etcd cluster away from the
	// etcd member that runs in this server (etcd.Member.HandOff), so that
	// this server's death does not cost an etcd election on top of its
	// lease. Run calls it when elected, before lead, and every
	// HandOffInterval of the term.
	HandOff func(ctx context.Context) error
}

// ProbeInterval is how often the servers look whether the leader's etcd
// member (Info.Member) still accepts connections.
const ProbeInterval = 200 * time.Millisecond

// HandOffInterval is how often a leader checks that its own etcd member
// has not become etcd's leader again (Config.HandOff).
const HandOffInterval = 2 * time.Second

// Term is one term of this server as leader.
type Term struct {
	// Fence is the comparison every write of the term carries.
	Fence store.Cmp
	// Rev is the term's revision in etcd: later terms have larger ones.
	Rev int64

	k *keeper
}

// Held reports whether this server knows its lease still holds: a renewal
// it sent less than four fifths of the TTL ago was acknowledged. Once
// false it stays false, and the term's context ends. No other server can
// be elected while it is true. A Term that Run did not make holds nothing.
func (t Term) Held() bool { return t.k != nil && t.k.held() }

// Run campaigns until ctx ends. Each time this server is elected it calls
// lead with a context that ends when the term does (the lease lost or
// taken for lost, the fence refused a write: lead's store is to be Fenced
// with the term and that context's cancel), waits for lead to return,
// then campaigns again. It returns ctx's error.
//
// The lease is renewed by a goroutine of its own (keeper) every fifth of
// its TTL, on cfg.Client: give Run a client that the control plane does
// not load. The term ends, and Term.Held turns false, once no renewal
// sent in the last four fifths of the TTL was acknowledged: before etcd
// can let the lease expire, so before another server can be elected.
func Run(ctx context.Context, cfg Config, lead func(ctx context.Context, term Term, deposed func()) error) error {
	ttl := cfg.TTL
	if ttl <= 0 {
		ttl = DefaultTTL
	}
	secs := max(int64((ttl+time.Second-1)/time.Second), 1)
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	value, err := json.Marshal(cfg.Self)
	if err != nil {
		return err
	}
	var reaping sync.WaitGroup
	defer reaping.Wait()
	reaping.Go(func() { reap(ctx, cfg.Client, cfg.Prefix, log) })
	warned := false
	for ctx.Err() == nil {
		sent := time.Now()
		grant, err := cfg.Client.Grant(ctx, secs)
		if err != nil {
			if ctx.Err() == nil {
				log.Warn("leader election: no lease", "err", err)
				sleep(ctx, time.Second)
			}
			continue
		}
		if grant.TTL > secs && !warned {
			warned = true
			log.Warn("etcd lengthened the leader's lease to its minimum, 1.5 election timeouts", "asked", time.Duration(secs)*time.Second, "got", time.Duration(grant.TTL)*time.Second)
		}
		id := grant.ID
		k := newKeeper(time.Now, sent, time.Duration(grant.TTL)*time.Second, renewer(cfg.Client, id))
		term, err := session(ctx, cfg, log, k, id, string(value), lead)
		// Give the lead up at once when the lease still holds, so that
		// another server need not wait for it to expire.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
		_, _ = cfg.Client.Revoke(rctx, id)
		cancel()
		if err != nil && ctx.Err() == nil {
			log.Warn("leader election", "err", err)
			sleep(ctx, time.Second)
		}
		if term != 0 {
			log.Info("no longer leader", "name", cfg.Self.Name, "term", term)
		}
	}
	return ctx.Err()
}

// renewer returns the renewal of lease id on c.
func renewer(c *clientv3.Client, id clientv3.LeaseID) func(ctx context.Context) (time.Duration, error) {
	return func(ctx context.Context) (time.Duration, error) {
		resp, err := c.KeepAliveOnce(ctx, id)
		switch {
		case errors.Is(err, rpctypes.ErrLeaseNotFound) || errors.Is(err, rpctypes.ErrGRPCLeaseNotFound):
			return 0, errLeaseGone
		case err != nil:
			return 0, err
		case resp.TTL <= 0:
			return 0, errLeaseGone
		}
		return time.Duration(resp.TTL) * time.Second, nil
	}
}

// session campaigns on the lease that k keeps and, once elected, leads
// until the term ends. It returns the term's revision (0: not elected)
// and why it could not campaign.
func session(ctx context.Context, cfg Config, log *slog.Logger, k *keeper, id clientv3.LeaseID, value string, lead func(ctx context.Context, term Term, deposed func()) error) (int64, error) {
	var keeping sync.WaitGroup
	defer keeping.Wait()
	sctx, end := context.WithCancel(ctx)
	defer end()
	keeping.Go(func() { k.run(sctx) })
	keeping.Go(func() {
		select {
		case <-k.done:
			end()
		case <-sctx.Done():
		}
	})
	key, rev, err := campaign(sctx, cfg.Client, cfg.Prefix+ElectionKey+"/", id, value)
	if err != nil {
		if sctx.Err() != nil && ctx.Err() == nil {
			return 0, nil // the lease was lost while waiting: campaign again
		}
		return 0, err
	}
	// Campaign may return after the lease was lost: then the term is over
	// before it began.
	if !k.held() {
		return 0, nil
	}
	term := Term{Fence: store.Cmp{Key: strings.TrimPrefix(key, cfg.Prefix), ModRevision: rev - 1}, Rev: rev, k: k}
	log.Info("elected leader", "name", cfg.Self.Name, "term", term.Rev)
	if cfg.Changed != nil {
		cfg.Changed(true)
	}
	var handing sync.WaitGroup
	if cfg.HandOff != nil {
		handing.Go(handOff(sctx, cfg.HandOff, log))
	}
	if err := lead(sctx, term, end); err != nil && sctx.Err() == nil {
		log.Error("leading", "err", err)
	}
	end()
	handing.Wait()
	if cfg.Changed != nil {
		cfg.Changed(false)
	}
	if why := k.reason(); why != "" {
		log.Warn("the term's lease lapsed", "why", why, "term", term.Rev)
	}
	return term.Rev, nil
}

// campaign puts value under pfx on lease id, as etcd's
// concurrency.Election does (the key is pfx and the lease in hex, so that
// servers of other versions campaign in the same election), and returns
// once every key created before it is gone: this server leads. It returns
// the key and its create revision.
func campaign(ctx context.Context, c *clientv3.Client, pfx string, id clientv3.LeaseID, value string) (string, int64, error) {
	key := fmt.Sprintf("%s%x", pfx, int64(id))
	resp, err := c.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
		Then(clientv3.OpPut(key, value, clientv3.WithLease(id))).Else(clientv3.OpGet(key)).Commit()
	if err != nil {
		return "", 0, err
	}
	rev := resp.Header.Revision
	if !resp.Succeeded {
		rev = resp.Responses[0].GetResponseRange().Kvs[0].CreateRevision
	}
	older := append(clientv3.WithLastCreate(), clientv3.WithMaxCreateRev(rev-1))
	for {
		g, err := c.Get(ctx, pfx, older...)
		if err != nil {
			return "", 0, err
		}
		if len(g.Kvs) == 0 {
			return key, rev, nil
		}
		if err := awaitDelete(ctx, c, string(g.Kvs[0].Key), g.Header.Revision); err != nil {
			return "", 0, err
		}
	}
}

// awaitDelete returns once key is deleted, looking from revision rev on.
func awaitDelete(ctx context.Context, c *clientv3.Client, key string, rev int64) error {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for resp := range c.Watch(wctx, key, clientv3.WithRev(rev)) {
		if err := resp.Err(); err != nil {
			return err
		}
		for _, ev := range resp.Events {
			if ev.Type == mvccpb.DELETE {
				return nil
			}
		}
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	return errors.New("leader: the watch of the previous candidate ended")
}

// reap revokes the lease of a leader whose process died, until ctx ends:
// one whose etcd member (Info.Member) refuses connections twice in a row.
// That member runs in the leader's process and is its only way to etcd: a
// member that refuses connections is a leader that can neither write nor
// keep its lease, which would run out within its TTL; revoking it at once
// saves that wait, and the fence makes it as safe as the lease running
// out. A leader that is frozen, or cut off, or whose whole machine died,
// does not refuse connections (they hang): its lease runs out.
func reap(ctx context.Context, c *clientv3.Client, prefix string, log *slog.Logger) {
	var suspect int64 // the lease of a leader whose member refused once
	for ctx.Err() == nil {
		if suspect != 0 {
			sleep(ctx, ProbeInterval/2)
		} else {
			sleep(ctx, ProbeInterval)
		}
		// A local read: a leader seen a moment late is probed a moment
		// late, and revoking a lease that is gone already does nothing.
		resp, err := c.Get(ctx, prefix+ElectionKey, append(clientv3.WithFirstCreate(), clientv3.WithSerializable())...)
		if err != nil || len(resp.Kvs) == 0 {
			suspect = 0
			continue
		}
		kv := resp.Kvs[0]
		var in Info
		if json.Unmarshal(kv.Value, &in) != nil || in.Member == "" || !refused(ctx, in.Member) {
			suspect = 0
			continue
		}
		if suspect != kv.Lease {
			suspect = kv.Lease
			continue
		}
		suspect = 0
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err = c.Revoke(rctx, clientv3.LeaseID(kv.Lease))
		cancel()
		if err == nil {
			log.Warn("the leader's etcd member refuses connections: its process is gone; its lease revoked", "leader", in.Name, "member", in.Member)
		}
	}
}

// refused reports whether nothing listens at the peer URL raw: the
// connection was refused (not timed out, not unreachable).
func refused(ctx context.Context, raw string) bool {
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" {
		return false
	}
	dctx, cancel := context.WithTimeout(ctx, ProbeInterval)
	defer cancel()
	conn, err := (&net.Dialer{}).DialContext(dctx, "tcp", u.Host)
	if err == nil {
		_ = conn.Close()
		return false
	}
	return errors.Is(err, syscall.ECONNREFUSED)
}

// handOff returns the term's loop of hand-offs, the first of which has
// happened when it returns (before the term's lead starts).
func handOff(ctx context.Context, fn func(ctx context.Context) error, log *slog.Logger) func() {
	warned := false
	try := func() {
		if err := fn(ctx); err != nil && ctx.Err() == nil && !warned {
			warned = true
			log.Warn("etcd's lead stays with this server's member: its death would cost an etcd election too", "err", err)
		}
	}
	try()
	return func() {
		for {
			sleep(ctx, HandOffInterval)
			if ctx.Err() != nil {
				return
			}
			try()
		}
	}
}

// Current returns the leader now, or false when there is none.
func Current(ctx context.Context, c *clientv3.Client, prefix string) (Info, bool, error) {
	in, ok, _, err := current(ctx, c, prefix)
	return in, ok, err
}

// current is Current with the store revision it read at.
func current(ctx context.Context, c *clientv3.Client, prefix string) (Info, bool, int64, error) {
	resp, err := c.Get(ctx, prefix+ElectionKey, clientv3.WithFirstCreate()...)
	if err != nil {
		return Info{}, false, 0, err
	}
	if len(resp.Kvs) == 0 {
		return Info{}, false, resp.Header.Revision, nil
	}
	var in Info
	if err := json.Unmarshal(resp.Kvs[0].Value, &in); err != nil {
		return Info{}, false, 0, fmt.Errorf("leader: the election key holds %q: %w", resp.Kvs[0].Value, err)
	}
	return in, true, resp.Header.Revision, nil
}

// afterRead, when set (by tests), runs between Watch's read of the leader
// and the start of its watch.
var afterRead func()

// Watch keeps the current leader in step with etcd until ctx ends: it
// calls fn with each leader seen (ok false when there is none). Each watch
// starts just after the revision of the read before it, so that no change
// between the two goes unseen.
func Watch(ctx context.Context, c *clientv3.Client, prefix string, fn func(in Info, ok bool)) {
	for ctx.Err() == nil {
		in, ok, rev, err := current(ctx, c, prefix)
		if err != nil {
			sleep(ctx, 200*time.Millisecond)
			continue
		}
		fn(in, ok)
		if afterRead != nil {
			afterRead()
		}
		wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
		ch := c.Watch(wctx, prefix+ElectionKey, clientv3.WithPrefix(), clientv3.WithRev(rev+1))
		for resp := range ch {
			if resp.Err() != nil {
				break // no etcd leader, or the revision compacted: read again
			}
			in, ok, _, err := current(ctx, c, prefix)
			if err != nil {
				break
			}
			fn(in, ok)
		}
		cancel()
		sleep(ctx, 200*time.Millisecond)
	}
}

// Fenced returns st whose every transaction also compares the term's
// fence, in the same transaction, and is sent only while the term is Held.
// When the term is not held, or a transaction fails and the fence no
// longer holds, it returns an error wrapping ErrDeposed and calls deposed
// (once): the caller stops leading.
func Fenced(st store.Store, term Term, deposed func()) store.Store {
	return &fenced{Store: st, term: term, deposed: deposed}
}

type fenced struct {
	store.Store
	term    Term
	deposed func()
	once    sync.Once
}

func (f *fenced) Txn(ctx context.Context, cmps []store.Cmp, ops []store.Op) (store.TxnResult, error) {
	if !f.term.Held() {
		f.once.Do(f.deposed)
		return store.TxnResult{}, fmt.Errorf("%w (no renewal of its lease acknowledged in time)", ErrDeposed)
	}
	fence := f.term.Fence
	all := make([]store.Cmp, 0, len(cmps)+1)
	all = append(append(all, cmps...), fence)
	res, err := f.Store.Txn(ctx, all, ops)
	if err != nil || res.Succeeded {
		return res, err
	}
	kv, gerr := f.Store.Get(ctx, fence.Key)
	if gerr == nil && kv.ModRevision == fence.ModRevision {
		// One of the caller's own comparisons failed.
		return res, nil
	}
	if gerr != nil && !errors.Is(gerr, store.ErrNotFound) {
		return res, gerr
	}
	f.once.Do(f.deposed)
	return res, fmt.Errorf("%w (its term's key %s is gone)", ErrDeposed, fence.Key)
}

// sleep waits d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
