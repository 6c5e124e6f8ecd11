package etcd

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.etcd.io/etcd/server/v3/etcdserver/api/membership"
	"go.uber.org/zap"

	"github.com/berth-dev/berth/driver"
)

// TLSFiles are the files of one side's TLS: a certificate and its key,
// and the authority that signs the other side's certificates.
type TLSFiles struct {
	CertFile, KeyFile, CAFile string
}

// IsZero reports whether no file is set.
func (f TLSFiles) IsZero() bool { return f == TLSFiles{} }

// MemberConfig configures an etcd member run inside the Berth server.
type MemberConfig struct {
	// Name names the member in InitialCluster.
	Name string
	// Dir holds the member's data (its write-ahead log and snapshots).
	Dir string
	// PeerURL is where the other members reach this one (listened on and
	// advertised); ClientURL is where clients reach it.
	PeerURL, ClientURL string
	// InitialCluster is every member of a new cluster, "a=URL,b=URL,c=URL"
	// with their peer URLs; empty means this member alone. It is read
	// only when Dir holds no data yet.
	InitialCluster string
	// Join makes the member join a running cluster that lists it already
	// (berth members add) instead of starting a new one.
	Join bool
	// PeerTLS secures the traffic between members: when set, each member
	// presents its certificate and accepts only peers signed by CAFile.
	// ClientTLS secures the client URL the same way.
	PeerTLS, ClientTLS TLSFiles
	// Insecure allows a peer or client URL off the loopback interface
	// without TLS (anyone who reaches it reads and writes everything).
	Insecure bool
	// LogFile receives the member's own log (errors and warnings); empty
	// discards it.
	LogFile string
	// SkipFsync lets writes return before they reach the disk: for tests
	// only, a crash may lose acknowledged writes.
	SkipFsync bool
	// Heartbeat and ElectionTimeout are etcd's Raft timings (0: etcd's
	// defaults, 100 ms and 1 s). Every member of a cluster needs the same.
	Heartbeat, ElectionTimeout time.Duration
}

// DefaultHeartbeat and DefaultElectionTimeout are the Raft timings of the
// Berth server's member (its flags' defaults): an election timeout short
// enough for etcd to grant the leader a lease of one second (MinLeaseTTL).
const (
	DefaultHeartbeat       = 50 * time.Millisecond
	DefaultElectionTimeout = 500 * time.Millisecond
)

// MinLeaseTTL is the shortest lease the member's cluster grants: etcd
// lengthens a shorter one to 1.5 election timeouts (counted in whole
// heartbeats), rounded up to whole seconds.
func (c *MemberConfig) MinLeaseTTL() time.Duration {
	hb, et := c.Heartbeat, c.ElectionTimeout
	if hb <= 0 {
		hb = 100 * time.Millisecond
	}
	if et <= 0 {
		et = time.Second
	}
	ticks := int64(et / hb)
	least := time.Duration(3*ticks/2) * hb
	return (least + time.Second - 1) / time.Second * time.Second
}

// Check validates c, naming the flag of each bad field.
func (c *MemberConfig) Check() error {
	var es driver.FieldErrors
	if c.Name == "" {
		es.Add("etcd-name", "required")
	}
	if c.Dir == "" {
		es.Add("data-dir", "required")
	}
	for _, u := range []struct {
		flag, val string
		tls       TLSFiles
	}{{"etcd-peer-url", c.PeerURL, c.PeerTLS}, {"etcd-client-url", c.ClientURL, c.ClientTLS}} {
		if err := checkURL(u.val, !u.tls.IsZero(), c.Insecure); err != nil {
			es.Add(u.flag, "%v", err)
		}
		if !u.tls.IsZero() && (u.tls.CertFile == "" || u.tls.KeyFile == "" || u.tls.CAFile == "") {
			es.Add(u.flag, "TLS needs a certificate, its key and a CA file")
		}
	}
	switch {
	case c.Heartbeat < 0 || c.ElectionTimeout < 0:
		es.Add("etcd-heartbeat-interval", "must not be negative")
	case c.Heartbeat > 0 && c.Heartbeat < 10*time.Millisecond:
		es.Add("etcd-heartbeat-interval", "%s: at least 10ms", c.Heartbeat)
	case c.ElectionTimeout > 50*time.Second:
		es.Add("etcd-election-timeout", "%s: at most 50s", c.ElectionTimeout)
	case c.Heartbeat > 0 && c.ElectionTimeout > 0 && c.ElectionTimeout < 5*c.Heartbeat:
		es.Add("etcd-election-timeout", "%s: at least five heartbeats (%s)", c.ElectionTimeout, 5*c.Heartbeat)
	}
	if c.InitialCluster != "" {
		self := false
		for i, part := range strings.Split(c.InitialCluster, ",") {
			name, u, ok := strings.Cut(part, "=")
			if !ok || name == "" {
				es.Add("etcd-initial-cluster", "entry %d %q: want NAME=PEER-URL", i, part)
				continue
			}
			if _, err := url.Parse(u); err != nil || !strings.Contains(u, "://") {
				es.Add("etcd-initial-cluster", "entry %d %q: %q is not a URL", i, part, u)
			}
			if name == c.Name {
				self = true
				if u != c.PeerURL {
					es.Add("etcd-initial-cluster", "names this member %s with %s, but --etcd-peer-url is %s", name, u, c.PeerURL)
				}
			}
		}
		if !self {
			es.Add("etcd-initial-cluster", "does not name this member (%s)", c.Name)
		}
	}
	return es.Err()
}

// checkURL checks a member URL: http or https with a host and port, https
// exactly when TLS is set, and on the loopback interface unless TLS
// protects it or insecure allows it.
func checkURL(raw string, withTLS, insecure bool) error {
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" || u.Port() == "" {
		return fmt.Errorf("%q: want http(s)://HOST:PORT", raw)
	}
	switch {
	case u.Scheme != "http" && u.Scheme != "https":
		return fmt.Errorf("%q: want http or https", raw)
	case withTLS != (u.Scheme == "https"):
		return fmt.Errorf("%q: use https with TLS files, http without", raw)
	}
	if withTLS || insecure {
		return nil
	}
	ip := net.ParseIP(u.Hostname())
	if u.Hostname() == "localhost" || (ip != nil && ip.IsLoopback()) {
		return nil
	}
	return fmt.Errorf("%q is off the loopback interface without TLS: anyone who reaches it could read and change the cluster's state; give TLS files, or --insecure", raw)
}

// Member is a running embedded etcd member.
type Member struct {
	e   *embed.Etcd
	cfg MemberConfig
}

// StartMember starts an etcd member and waits until it has joined its
// cluster (for a new cluster: until enough members started for a quorum)
// or ctx ends.
func StartMember(ctx context.Context, c MemberConfig) (*Member, error) {
	if err := c.Check(); err != nil {
		return nil, err
	}
	cfg := embed.NewConfig()
	cfg.Name = c.Name
	cfg.Dir = c.Dir
	peer, _ := url.Parse(c.PeerURL)
	client, _ := url.Parse(c.ClientURL)
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{*peer}, []url.URL{*peer}
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{*client}, []url.URL{*client}
	cfg.InitialCluster = c.InitialCluster
	if cfg.InitialCluster == "" {
		cfg.InitialCluster = c.Name + "=" + c.PeerURL
	}
	cfg.ClusterState = embed.ClusterStateFlagNew
	if c.Join {
		cfg.ClusterState = embed.ClusterStateFlagExisting
	}
	cfg.InitialClusterToken = "berth"
	cfg.MaxTxnOps = DefaultMaxTxnOps
	cfg.MaxRequestBytes = DefaultMaxRequestBytes
	// Berth's entries are large (one admission carries every instance
	// of a request), and etcd keeps every entry since its last snapshot
	// in memory: with etcd's 10,000 a million instances stayed in each
	// member's log (about 1 GiB more at the peak of w3 on three
	// members, docs/benchmarks.md). A follower further behind than the
	// catch-up entries is sent a snapshot of the database instead.
	cfg.SnapshotCount = 1000
	cfg.SnapshotCatchUpEntries = 500
	// The Berth store compacts the history itself (Options.History).
	cfg.AutoCompactionMode = embed.CompactorModeRevision
	cfg.AutoCompactionRetention = "0"
	cfg.UnsafeNoFsync = c.SkipFsync
	if c.Heartbeat > 0 {
		cfg.TickMs = uint(c.Heartbeat.Milliseconds())
	}
	if c.ElectionTimeout > 0 {
		cfg.ElectionMs = uint(c.ElectionTimeout.Milliseconds())
	}
	cfg.LogLevel = "warn"
	if c.LogFile == "" {
		cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	} else {
		cfg.LogOutputs = []string{c.LogFile}
	}
	if !c.PeerTLS.IsZero() {
		cfg.PeerTLSInfo = transport.TLSInfo{CertFile: c.PeerTLS.CertFile, KeyFile: c.PeerTLS.KeyFile, TrustedCAFile: c.PeerTLS.CAFile, ClientCertAuth: true}
	}
	if !c.ClientTLS.IsZero() {
		cfg.ClientTLSInfo = transport.TLSInfo{CertFile: c.ClientTLS.CertFile, KeyFile: c.ClientTLS.KeyFile, TrustedCAFile: c.ClientTLS.CAFile, ClientCertAuth: true}
	}
	if err := os.MkdirAll(filepath.Dir(c.Dir), 0o700); err != nil {
		return nil, fmt.Errorf("store/etcd: member data directory: %w", err)
	}
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return nil, fmt.Errorf("store/etcd: start member %s: %w", c.Name, err)
	}
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		e.Close()
		return nil, fmt.Errorf("store/etcd: member %s: %w", c.Name, err)
	case <-ctx.Done():
		e.Close()
		return nil, fmt.Errorf("store/etcd: member %s did not join its cluster: %w", c.Name, ctx.Err())
	}
	return &Member{e: e, cfg: c}, nil
}

// Client returns a client of this member's own client URL.
func (m *Member) Client() (*clientv3.Client, error) {
	return NewClient([]string{m.cfg.ClientURL}, m.cfg.ClientTLS)
}

// ClientURL is the member's client URL.
func (m *Member) ClientURL() string { return m.cfg.ClientURL }

// Err delivers an error when the member fails while it runs.
func (m *Member) Err() <-chan error { return m.e.Err() }

// ID is the member's id in its cluster.
func (m *Member) ID() uint64 { return uint64(m.e.Server.MemberID()) }

// Close stops the member.
func (m *Member) Close() { m.e.Close() }

// HandOff passes the lead of the etcd cluster to another voting member
// that is up, when this member has it, and returns once another member
// leads (or ctx ends). It does nothing when this member does not lead or
// is the only voting member.
//
// The Berth server that leads hands its member's lead off: its death then
// costs the cluster one failure detection (its lease runs out) instead of
// two in a row (etcd elects a leader first, and the new etcd leader
// extends every lease by an election timeout before it lets one expire).
func (m *Member) HandOff(ctx context.Context) error {
	s := m.e.Server
	self := s.MemberID()
	if s.Lead() != uint64(self) {
		return nil
	}
	var others []*membership.Member
	for _, mb := range s.Cluster().Members() {
		if mb.ID != self && !mb.IsLearner && len(mb.ClientURLs) > 0 {
			others = append(others, mb)
		}
	}
	if len(others) == 0 {
		return nil
	}
	c, err := m.Client()
	if err != nil {
		return err
	}
	defer c.Close()
	// Only to a member that answers now, the first to: one that is frozen
	// or cut off would hold every write up for an election timeout, the
	// time etcd gives a transfer before it gives up.
	pctx, cancel := context.WithTimeout(ctx, handOffProbe)
	up := make(chan *membership.Member, len(others))
	var wg sync.WaitGroup
	for _, mb := range others {
		wg.Go(func() {
			if _, err := c.Status(pctx, mb.ClientURLs[0]); err == nil {
				up <- mb
			}
		})
	}
	var to *membership.Member
	select {
	case to = <-up:
	case <-pctx.Done():
	}
	cancel()
	wg.Wait()
	if to == nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return fmt.Errorf("store/etcd: member %s could not pass the lead on: no other member answered within %s", m.cfg.Name, handOffProbe)
	}
	cfg := s.Config()
	tctx, cancel := context.WithTimeout(ctx, 2*cfg.ElectionTimeout())
	defer cancel()
	if err := s.MoveLeader(tctx, uint64(self), uint64(to.ID)); err != nil && s.Lead() == uint64(self) {
		return fmt.Errorf("store/etcd: member %s could not pass the lead to %s: %w", m.cfg.Name, to.Name, err)
	}
	return nil
}

// handOffProbe bounds how long HandOff waits for another member to say
// it is up.
const handOffProbe = 500 * time.Millisecond

// NewClient connects to an etcd cluster's client URLs, with TLS when
// files are given (a client certificate, its key and the cluster's CA).
func NewClient(endpoints []string, files TLSFiles) (*clientv3.Client, error) {
	cfg := clientv3.Config{
		Endpoints: endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop(),
		MaxCallSendMsgSize: DefaultMaxRequestBytes + 1<<20, MaxCallRecvMsgSize: 1 << 30,
		// A member that stops answering is noticed within seconds.
		DialKeepAliveTime: 5 * time.Second, DialKeepAliveTimeout: 3 * time.Second,
	}
	if !files.IsZero() {
		info := transport.TLSInfo{CertFile: files.CertFile, KeyFile: files.KeyFile, TrustedCAFile: files.CAFile}
		tc, err := info.ClientConfig()
		if err != nil {
			return nil, fmt.Errorf("store/etcd: client TLS: %w", err)
		}
		tc.MinVersion = tls.VersionTLS12
		cfg.TLS = tc
	}
	c, err := clientv3.New(cfg)
	if err != nil {
		return nil, fmt.Errorf("store/etcd: connect to %s: %w", strings.Join(endpoints, ","), err)
	}
	return c, nil
}
