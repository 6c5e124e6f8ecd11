package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/spf13/pflag"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/berth-dev/berth/api"
	"github.com/berth-dev/berth/auth"
	"github.com/berth-dev/berth/control"
	"github.com/berth-dev/berth/dockerapi"
	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/leader"
	"github.com/berth-dev/berth/metrics"
	"github.com/berth-dev/berth/store/etcd"
)

// haFlags configure a server that keeps its state in etcd: an external
// cluster (--etcd-endpoints) or a member run in this process (--etcd-name
// and the rest), so that several servers form one highly available
// cluster.
type haFlags struct {
	endpoints              []string
	caCert, cert, key      string
	prefix                 string
	name                   string
	peerURL, clientURL     string
	initialCluster         string
	initialClusterState    string
	peerCert, peerKey      string
	peerCA                 string
	lease                  time.Duration
	advertise              string
	dockerAdvertise        string
	leaderCA               string
	maxTxnOps, maxReqBytes int
	heartbeat, election    time.Duration
}

func (h *haFlags) register(fl *pflag.FlagSet) {
	fl.StringSliceVar(&h.endpoints, "etcd-endpoints", nil, "keep the state in this external etcd cluster (client URLs, comma-separated) instead of the embedded store")
	fl.StringVar(&h.caCert, "etcd-cacert", "", "CA of the external etcd cluster's certificates (PEM)")
	fl.StringVar(&h.cert, "etcd-cert", "", "client certificate for the external etcd cluster (PEM)")
	fl.StringVar(&h.key, "etcd-key", "", "key of --etcd-cert (PEM)")
	fl.StringVar(&h.prefix, "etcd-prefix", "", "prefix of this Berth cluster's keys in etcd (to share one etcd cluster between several)")
	fl.StringVar(&h.name, "etcd-name", "", "run an etcd member in this server, with this name: servers with members form one highly available cluster")
	fl.StringVar(&h.peerURL, "etcd-peer-url", "", "the member's URL for the other members (listened on and advertised)")
	fl.StringVar(&h.clientURL, "etcd-client-url", "", "the member's client URL (default http://127.0.0.1:2379)")
	fl.StringVar(&h.initialCluster, "etcd-initial-cluster", "", "every member of a new cluster: NAME=PEER-URL,NAME=PEER-URL,... (default: this member alone)")
	fl.StringVar(&h.initialClusterState, "etcd-initial-cluster-state", "new", "new, or existing to join a running cluster after berth members add")
	fl.StringVar(&h.peerCert, "etcd-peer-cert", "", "the member's certificate for peer traffic (PEM; with --etcd-peer-key and --etcd-peer-ca)")
	fl.StringVar(&h.peerKey, "etcd-peer-key", "", "key of --etcd-peer-cert")
	fl.StringVar(&h.peerCA, "etcd-peer-ca", "", "CA that signs every member's peer certificate")
	fl.DurationVar(&h.heartbeat, "etcd-heartbeat-interval", etcd.DefaultHeartbeat, "the members' Raft heartbeat (the same on every member)")
	fl.DurationVar(&h.election, "etcd-election-timeout", etcd.DefaultElectionTimeout, "the members' Raft election timeout (the same on every member; a failover takes one or two of these more when etcd's leader died with the Berth leader; --leader-lease must be at least 1.5 of these)")
	fl.DurationVar(&h.lease, "leader-lease", leader.DefaultTTL, "how long a leader that stops answering keeps the lead (whole seconds, at least 1.5 etcd election timeouts; one whose process died is replaced at once)")
	fl.StringVar(&h.advertise, "advertise-url", "", "URL at which the other servers reach this server's API, to forward to the leader (default: from --listen)")
	fl.StringVar(&h.dockerAdvertise, "docker-advertise-url", "", "URL at which the other servers reach this server's Docker endpoint, to forward docker requests to the leader (default: from --docker-listen)")
	fl.StringVar(&h.leaderCA, "leader-ca", "", "CA trusted for the other servers' API certificates when forwarding to the leader (default: the system's)")
	fl.IntVar(&h.maxTxnOps, "etcd-max-txn-ops", etcd.DefaultMaxTxnOps, "the external etcd cluster's --max-txn-ops")
	fl.IntVar(&h.maxReqBytes, "etcd-max-request-bytes", etcd.DefaultMaxRequestBytes, "the external etcd cluster's --max-request-bytes")
}

// enabled reports whether the server keeps its state in etcd.
func (h *haFlags) enabled() bool { return len(h.endpoints) > 0 || h.name != "" }

// check validates the flags; listen is the API's address.
func (h *haFlags) check(insecure bool) error {
	var es driver.FieldErrors
	if len(h.endpoints) > 0 && h.name != "" {
		es.Add("etcd-endpoints", "give either --etcd-endpoints (an external cluster) or --etcd-name (a member in this server), not both")
	}
	for i, e := range h.endpoints {
		if u, err := url.Parse(e); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			es.Add("etcd-endpoints", "entry %d %q: want http(s)://HOST:PORT", i, e)
		}
	}
	if (h.cert == "") != (h.key == "") {
		es.Add("etcd-cert", "--etcd-cert and --etcd-key go together")
	}
	if h.name == "" {
		for _, f := range []struct{ flag, val string }{{"etcd-peer-url", h.peerURL}, {"etcd-client-url", h.clientURL}, {"etcd-initial-cluster", h.initialCluster}, {"etcd-peer-cert", h.peerCert}} {
			if f.val != "" {
				es.Add(f.flag, "needs --etcd-name (a member in this server)")
			}
		}
	} else if h.peerURL == "" {
		es.Add("etcd-peer-url", "required with --etcd-name")
	}
	if h.name != "" && h.peerURL != "" {
		mc := h.member("data-dir", insecure)
		if err := mc.Check(); err != nil {
			var fes driver.FieldErrors
			if errors.As(err, &fes) {
				es = append(es, fes...)
			}
		}
	}
	if h.initialClusterState != "new" && h.initialClusterState != "existing" {
		es.Add("etcd-initial-cluster-state", "%q: want new or existing", h.initialClusterState)
	}
	n := 0
	for _, v := range []string{h.peerCert, h.peerKey, h.peerCA} {
		if v != "" {
			n++
		}
	}
	if n != 0 && n != 3 {
		es.Add("etcd-peer-cert", "peer TLS needs --etcd-peer-cert, --etcd-peer-key and --etcd-peer-ca")
	}
	switch mc := h.member("", insecure); {
	case h.lease < time.Second || h.lease > time.Minute || h.lease%time.Second != 0:
		es.Add("leader-lease", "%s: want whole seconds, 1s to 1m", h.lease)
	case h.name != "" && h.lease < mc.MinLeaseTTL():
		// etcd would lengthen it silently.
		es.Add("leader-lease", "%s: etcd grants no lease shorter than %s with --etcd-election-timeout %s; lengthen the lease or shorten the election timeout", h.lease, mc.MinLeaseTTL(), h.election)
	}
	if h.advertise != "" {
		if u, err := url.Parse(h.advertise); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.Path != "" && u.Path != "/" {
			es.Add("advertise-url", "%q: want http(s)://HOST:PORT", h.advertise)
		}
	}
	if h.dockerAdvertise != "" {
		if u, err := url.Parse(h.dockerAdvertise); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.Path != "" && u.Path != "/" {
			es.Add("docker-advertise-url", "%q: want http(s)://HOST:PORT", h.dockerAdvertise)
		}
	}
	if h.prefix != "" && !strings.HasPrefix(h.prefix, "/") {
		es.Add("etcd-prefix", "%q: start it with /", h.prefix)
	}
	if h.maxTxnOps < 128 || h.maxTxnOps > 1<<20 {
		es.Add("etcd-max-txn-ops", "%d: want 128 to %d", h.maxTxnOps, 1<<20)
	}
	if h.maxReqBytes < 1<<20 || h.maxReqBytes > 1<<30 {
		es.Add("etcd-max-request-bytes", "%d: want 1 MiB to 1 GiB", h.maxReqBytes)
	}
	if err := es.Err(); err != nil {
		return usagef("%v", err)
	}
	return nil
}

// openEtcd connects to the external cluster or starts this server's
// member, and returns two clients (the store's, and the leader election's
// own, so that the store's traffic never delays a renewal of the
// leader's lease), the member (nil for an external cluster) and the
// store's options.
func (h *haFlags) openEtcd(ctx context.Context, dataDir string, insecure bool, m *metrics.Metrics) (c, elect *clientv3.Client, member *etcd.Member, opts etcd.Options, err error) {
	opts = etcd.Options{Prefix: h.prefix, MaxTxnOps: h.maxTxnOps, MaxRequestBytes: h.maxReqBytes, Observe: m.StoreCall}
	dial := func() (*clientv3.Client, error) {
		return etcd.NewClient(h.endpoints, etcd.TLSFiles{CertFile: h.cert, KeyFile: h.key, CAFile: h.caCert})
	}
	if len(h.endpoints) == 0 {
		if member, err = etcd.StartMember(ctx, h.member(dataDir, insecure)); err != nil {
			return nil, nil, nil, opts, err
		}
		dial = member.Client
		opts.MaxTxnOps, opts.MaxRequestBytes = etcd.DefaultMaxTxnOps, etcd.DefaultMaxRequestBytes
	}
	if c, err = dial(); err == nil {
		if elect, err = dial(); err != nil {
			_ = c.Close()
		}
	}
	if err != nil {
		if member != nil {
			member.Close()
		}
		return nil, nil, nil, opts, err
	}
	return c, elect, member, opts, nil
}

// member is the embedded member's configuration, its data under dataDir.
func (h *haFlags) member(dataDir string, insecure bool) etcd.MemberConfig {
	client := h.clientURL
	if client == "" {
		client = "http://127.0.0.1:2379"
	}
	return etcd.MemberConfig{
		Name: h.name, Dir: filepath.Join(dataDir, "etcd"), PeerURL: h.peerURL, ClientURL: client,
		InitialCluster: h.initialCluster, Join: h.initialClusterState == "existing",
		PeerTLS:  etcd.TLSFiles{CertFile: h.peerCert, KeyFile: h.peerKey, CAFile: h.peerCA},
		Insecure: insecure, LogFile: filepath.Join(dataDir, "etcd.log"),
		Heartbeat: h.heartbeat, ElectionTimeout: h.election,
	}
}

// advertiseURL is the URL the other servers reach this one's API at.
func (h *haFlags) advertiseURL(ln net.Addr, withTLS bool) (string, error) {
	return listenerURL(h.advertise, ln, withTLS, "--listen", "--advertise-url")
}

// listenerURL is advertise when given, else the URL of the TCP listener
// ln; a listener on every interface says nothing of where it is reached,
// and needs advertise (the flag advertiseFlag), as does one on a unix
// socket.
func listenerURL(advertise string, ln net.Addr, withTLS bool, listenFlag, advertiseFlag string) (string, error) {
	if advertise != "" {
		return strings.TrimSuffix(advertise, "/"), nil
	}
	if ln.Network() != "tcp" {
		return "", usagef("%s %s: on etcd it listens on TCP, where the other servers can forward to it (or give %s)", listenFlag, ln, advertiseFlag)
	}
	host, port, err := net.SplitHostPort(ln.String())
	if err != nil {
		return "", err
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
		return "", usagef("%s %s binds every interface: say with %s where the other servers reach this one", listenFlag, ln, advertiseFlag)
	}
	scheme := "http"
	if withTLS {
		scheme = "https"
	}
	return scheme + "://" + net.JoinHostPort(host, port), nil
}

// dockerAdvertiseURL is the URL the other servers reach this one's Docker
// endpoint at, listening on ln.
func (h *haFlags) dockerAdvertiseURL(ln net.Addr, withTLS bool) (string, error) {
	return listenerURL(h.dockerAdvertise, ln, withTLS, "--docker-listen", "--docker-advertise-url")
}

// frontDoor routes the API of a server in a highly available cluster: to
// this server's own handlers while it leads; else the reads its read-only
// plane answers to that plane, and the rest to the leader.
type frontDoor struct {
	self    leader.Info
	leading atomic.Pointer[http.Handler] // set while this server leads
	reads   atomic.Pointer[localReads]   // set while a read-only plane follows the store
	current atomic.Pointer[forwardTo]    // the leader, as last seen
	proxy   *httputil.ReverseProxy
	log     *slog.Logger
	// docker is this server's Docker endpoint while it leads;
	// dockerProxy forwards to the leader's otherwise.
	docker      atomic.Pointer[dockerapi.Server]
	dockerProxy *httputil.ReverseProxy
}

func newFrontDoor(self leader.Info, leaderCA string, log *slog.Logger) (*frontDoor, error) {
	fd := &frontDoor{self: self, log: log}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	if leaderCA != "" {
		pem, err := os.ReadFile(leaderCA)
		if err != nil {
			return nil, usagef("--leader-ca: %v", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, usagef("--leader-ca %s: no PEM certificate in it", leaderCA)
		}
		tr.TLSClientConfig = &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: pool}
	}
	fd.proxy = &httputil.ReverseProxy{
		Transport:     tr,
		FlushInterval: -1, // streams (logs, events) pass at once
		Rewrite: func(r *httputil.ProxyRequest) {
			in := r.In.Context().Value(leaderKey{}).(leader.Info)
			u, _ := url.Parse(in.Address)
			r.SetURL(u)
			r.SetXForwarded()
			r.Out.Header.Set("Berth-Forwarded-By", fd.self.Name)
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			in := r.Context().Value(leaderKey{}).(leader.Info)
			if cause := context.Cause(r.Context()); errors.Is(cause, errLeaderChanged) {
				writeUnavailable(w, "the leader ("+in.Address+") lost the lead before it answered: "+leaderChangedAdvice)
				return
			}
			fd.log.Warn("forwarding to the leader", "err", err)
			writeUnavailable(w, "the leader ("+in.Address+") did not answer: "+err.Error())
		},
	}
	// Docker requests go to the leader's Docker endpoint; attach's
	// upgraded connections pass through (ReverseProxy splices them).
	fd.dockerProxy = &httputil.ReverseProxy{
		Transport:     tr,
		FlushInterval: -1,
		Rewrite: func(r *httputil.ProxyRequest) {
			in := r.In.Context().Value(leaderKey{}).(leader.Info)
			u, _ := url.Parse(in.Docker)
			r.SetURL(u)
			r.SetXForwarded()
			r.Out.Header.Set("Berth-Forwarded-By", fd.self.Name)
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			in := r.Context().Value(leaderKey{}).(leader.Info)
			if cause := context.Cause(r.Context()); errors.Is(cause, errLeaderChanged) {
				writeDockerUnavailable(w, "the leader's Docker endpoint ("+in.Docker+") lost the lead before it answered: "+leaderChangedAdvice)
				return
			}
			fd.log.Warn("forwarding a docker request to the leader", "err", err)
			writeDockerUnavailable(w, "the leader's Docker endpoint ("+in.Docker+") did not answer: "+err.Error())
		},
	}
	return fd, nil
}

// leadDocker serves the Docker endpoint with s while this server leads;
// nil hands it back to forwarding.
func (fd *frontDoor) leadDocker(s *dockerapi.Server) { fd.docker.Store(s) }

// dockerDoor is a frontDoor's Docker endpoint.
type dockerDoor struct{ fd *frontDoor }

func dockerDoorOf(fd *frontDoor) http.Handler { return dockerDoor{fd} }

func (d dockerDoor) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	fd := d.fd
	if s := fd.docker.Load(); s != nil {
		s.ServeHTTP(w, r)
		return
	}
	if lr := fd.reads.Load(); lr != nil && lr.docker != nil {
		// It hands what it does not serve to forwardDocker.
		w.Header().Set("Berth-Served-By", fd.self.Name)
		w.Header().Set("Berth-Revision", strconv.FormatInt(lr.plane.Followed(), 10))
		lr.docker.ServeHTTP(w, r)
		return
	}
	fd.forwardDocker(w, r)
}

// forwardDocker passes r on to the leader's Docker endpoint (Options.Leader
// of a follower's Docker endpoint, for what it leaves to the leader, and
// the Docker door for the rest). The leader's answer says who served it.
func (fd *frontDoor) forwardDocker(w http.ResponseWriter, r *http.Request) {
	to := fd.leaderFor(w, r)
	switch {
	case to == nil:
		writeDockerUnavailable(w, "no Berth server leads right now; try again in a few seconds")
		return
	case to.info.Docker == "":
		writeDockerUnavailable(w, "the leader ("+to.info.Name+") serves no Docker endpoint: start it with --docker-listen")
		return
	}
	passOn(w, r, to, fd.dockerProxy)
}

// writeDockerUnavailable answers 503 in the Engine API's error shape.
func writeDockerUnavailable(w http.ResponseWriter, msg string) {
	w.Header().Set("Retry-After", "1")
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusServiceUnavailable)
	_ = printJSONLine(w, map[string]string{"message": msg})
}

type leaderKey struct{}

// errLeaderChanged ends what a follower forwarded to a leader once another
// leader, or none, is seen: a leader that froze or was cut off answers
// nothing, and its lease bounds how long its requests wait.
var errLeaderChanged = errors.New("the leader changed")

// leaderChangedAdvice tells the client of a forwarded request cut short
// by a change of leader what it may have left behind.
const leaderChangedAdvice = "the request may or may not have been carried out; look before trying it again"

// forwardTo is a leader as seen by a follower, and the context of what is
// forwarded to it, which ends (errLeaderChanged) when another leader or
// none is seen.
type forwardTo struct {
	info   leader.Info
	ctx    context.Context
	cancel context.CancelCauseFunc
}

// bind returns the context of a request forwarded to f: parent's, which
// also ends when f's does and carries f's Info; done releases it.
func (f *forwardTo) bind(parent context.Context) (context.Context, func()) {
	ctx, cancel := context.WithCancelCause(context.WithValue(parent, leaderKey{}, f.info))
	stop := context.AfterFunc(f.ctx, func() { cancel(context.Cause(f.ctx)) })
	return ctx, func() {
		stop()
		cancel(nil)
	}
}

// lead serves h as this server's own API while it leads; nil stops that.
func (fd *frontDoor) lead(h http.Handler) {
	if h == nil {
		fd.leading.Store(nil)
		return
	}
	fd.leading.Store(&h)
}

// seen records the leader as watched in etcd (it is called from one
// goroutine). What was forwarded to an earlier leader ends then.
func (fd *frontDoor) seen(in leader.Info, ok bool) {
	old := fd.current.Load()
	if ok && old != nil && old.info == in {
		return
	}
	var next *forwardTo
	if ok {
		ctx, cancel := context.WithCancelCause(context.Background())
		next = &forwardTo{info: in, ctx: ctx, cancel: cancel}
	}
	fd.current.Store(next)
	if old != nil {
		old.cancel(errLeaderChanged)
	}
}

func (fd *frontDoor) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if h := fd.leading.Load(); h != nil {
		(*h).ServeHTTP(w, r)
		return
	}
	if lr := fd.reads.Load(); lr != nil {
		if _, pattern := lr.mux.Handler(r); pattern != "" {
			lr.mux.ServeHTTP(w, r)
			return
		}
	}
	fd.forward(w, r)
}

// forward passes r on to the leader (api.Options.Leader of a follower's
// read-only API, for the reads it leaves to the leader, and the front
// door for the rest). The leader's answer says who served it.
func (fd *frontDoor) forward(w http.ResponseWriter, r *http.Request) {
	to := fd.leaderFor(w, r)
	if to == nil {
		writeUnavailable(w, "no leader is elected right now; try again in a few seconds")
		return
	}
	passOn(w, r, to, fd.proxy)
}

// leaderFor takes off w the headers of an answer this server gives
// itself and returns the leader to forward r to: nil when there is no
// leader, or one that is this server in name only (it is starting or
// stopping), or r was sent here by another follower believing this server
// leads (no loops).
func (fd *frontDoor) leaderFor(w http.ResponseWriter, r *http.Request) *forwardTo {
	w.Header().Del("Berth-Served-By")
	w.Header().Del("Berth-Revision")
	to := fd.current.Load()
	if to == nil || to.info.Name == fd.self.Name || r.Header.Get("Berth-Forwarded-By") != "" {
		return nil
	}
	return to
}

// passOn sends r to the leader to through proxy; what was forwarded ends
// when another leader, or none, is seen (forwardTo.bind).
func passOn(w http.ResponseWriter, r *http.Request, to *forwardTo, proxy *httputil.ReverseProxy) {
	// A forwarded stream outlives the follower's write timeout; the leader
	// bounds it.
	_ = http.NewResponseController(w).SetWriteDeadline(time.Time{})
	ctx, done := to.bind(r.Context())
	defer done()
	proxy.ServeHTTP(w, r.WithContext(ctx))
}

// health answers GET /v1/health on every server: its role and the leader.
func (fd *frontDoor) health(w http.ResponseWriter, r *http.Request) {
	out := map[string]any{"status": "ok", "role": "follower", "name": fd.self.Name}
	if fd.leading.Load() != nil {
		out["role"] = "leader"
	} else if lr := fd.reads.Load(); lr != nil {
		out["reads"] = map[string]any{"served": "locally", "revision": lr.plane.Followed()}
	}
	if to := fd.current.Load(); to != nil {
		shown := to.info
		shown.Member = "" // the etcd members are for authenticated eyes (berth members)
		out["leader"] = shown
	}
	w.Header().Set("Content-Type", "application/json")
	_ = printJSONLine(w, out)
}

func writeUnavailable(w http.ResponseWriter, msg string) {
	w.Header().Set("Retry-After", "1")
	api.WriteError(w, fmt.Errorf("%w: %s", driver.ErrRetryable, msg))
}

// members serves /v1/members: the etcd cluster's members, adding and
// removing them. Admin only (guard.Protect).
type members struct {
	c *clientv3.Client
}

func (m members) routes(mux *http.ServeMux, guard *api.Server) {
	mux.Handle("GET /v1/members", guard.Protect(auth.Read, http.HandlerFunc(m.list)))
	mux.Handle("POST /v1/members", guard.Protect(auth.Admin, http.HandlerFunc(m.add)))
	mux.Handle("DELETE /v1/members/{id}", guard.Protect(auth.Admin, http.HandlerFunc(m.remove)))
}

func (m members) list(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
	defer cancel()
	resp, err := m.c.MemberList(ctx)
	if err != nil {
		writeUnavailable(w, "etcd: "+err.Error())
		return
	}
	out := make([]api.Member, 0, len(resp.Members))
	for _, mb := range resp.Members {
		out = append(out, api.Member{ID: strconv.FormatUint(mb.ID, 16), Name: mb.Name, PeerURLs: mb.PeerURLs, ClientURLs: mb.ClientURLs, Learner: mb.IsLearner})
	}
	w.Header().Set("Content-Type", "application/json")
	_ = printJSONLine(w, out)
}

func (m members) add(w http.ResponseWriter, r *http.Request) {
	var body api.MemberRequest
	data, err := io.ReadAll(http.MaxBytesReader(w, r.Body, 4<<10))
	if err == nil {
		err = driver.DecodeJSON(data, &body, "body")
	}
	if err != nil || body.PeerURL == "" {
		api.WriteError(w, &driver.FieldError{Path: "peer_url", Reason: `want {"peer_url": "http(s)://HOST:PORT"}`})
		return
	}
	if u, err := url.Parse(body.PeerURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Port() == "" {
		api.WriteError(w, &driver.FieldError{Path: "peer_url", Reason: fmt.Sprintf("%q: want http(s)://HOST:PORT", body.PeerURL)})
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
	defer cancel()
	resp, err := m.c.MemberAdd(ctx, []string{body.PeerURL})
	if err != nil {
		api.WriteError(w, fmt.Errorf("%w: etcd: %w", driver.ErrAlreadyExists, err))
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	_ = printJSONLine(w, api.Member{ID: strconv.FormatUint(resp.Member.ID, 16), PeerURLs: resp.Member.PeerURLs})
}

func (m members) remove(w http.ResponseWriter, r *http.Request) {
	id, err := strconv.ParseUint(r.PathValue("id"), 16, 64)
	if err != nil {
		api.WriteError(w, &driver.FieldError{Path: "id", Reason: fmt.Sprintf("%q: want the hexadecimal id berth members list shows", r.PathValue("id"))})
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
	defer cancel()
	if _, err := m.c.MemberRemove(ctx, id); err != nil {
		api.WriteError(w, fmt.Errorf("%w: etcd: %w", driver.ErrNotFound, err))
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// readRoutes are the API routes a follower answers from its read-only
// plane: they read only the records the store's watch feeds it (or the
// store itself), or, for logs and stats, a shared back-end
// (driver.SharedBackend) through the follower's own provider; the logs
// and stats of an instance on another back-end go on to the leader
// (api.Options.Leader). The rest (nodes, providers, plans...) need the
// back-ends or the leader's memory, and are forwarded.
var readRoutes = []string{
	"GET /v1/instances",
	"GET /v1/instances/{ref}",
	"GET /v1/instances/{ref}/logs",
	"GET /v1/instances/{ref}/stats",
	"GET /v1/groups/{id}",
	"GET /v1/events",
	"GET /v1/quotas",
}

// localReads serves readRoutes from a read-only plane. Every answer says
// which server gave it (Berth-Served-By) and the store revision its copy
// reflected then (Berth-Revision): it may be behind the leader's by the
// watch's delay.
type localReads struct {
	plane *control.Plane
	api   *api.Server
	mux   *http.ServeMux
	// docker is the follower's Docker endpoint over plane, when the
	// server serves one (dockerapi.Options.Leader).
	docker *dockerapi.Server
}

func newLocalReads(self string, plane *control.Plane, apiServer *api.Server, wrap func(http.Handler) http.Handler) *localReads {
	lr := &localReads{plane: plane, api: apiServer, mux: http.NewServeMux()}
	h := wrap(apiServer)
	for _, route := range readRoutes {
		lr.mux.Handle(route, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Berth-Served-By", self)
			w.Header().Set("Berth-Revision", strconv.FormatInt(plane.Followed(), 10))
			h.ServeHTTP(w, r)
		}))
	}
	return lr
}

// followerReads runs a read-only plane while this server does not lead
// and hands its reads to the front door: start when the server follows,
// stop when it leads. stop waits for every goroutine start began.
type followerReads struct {
	fd   *frontDoor
	open func(ctx context.Context) (*localReads, error)
	log  *slog.Logger

	mu   sync.Mutex
	halt func() // ends the running plane and waits; nil when none runs
}

// start runs a read-only plane until stop (or ctx ends), making it again
// after a failure.
func (f *followerReads) start(ctx context.Context) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.halt != nil {
		return
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		f.run(ctx)
	}()
	f.halt = func() {
		cancel()
		<-done
	}
}

// stop ends the read-only plane; its reads go to the leader again.
func (f *followerReads) stop() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.halt != nil {
		f.halt()
		f.halt = nil
	}
}

func (f *followerReads) run(ctx context.Context) {
	for ctx.Err() == nil {
		lr, err := f.open(ctx)
		if err != nil {
			if ctx.Err() == nil {
				f.log.Warn("read-only plane: reads go to the leader meanwhile", "err", err)
				t := time.NewTimer(time.Second)
				select {
				case <-ctx.Done():
				case <-t.C:
				}
				t.Stop()
			}
			continue
		}
		f.fd.reads.Store(lr)
		err = lr.plane.Run(ctx)
		f.fd.reads.Store(nil)
		lr.api.CloseStreams()
		if lr.docker != nil {
			lr.docker.Close()
		}
		if ctx.Err() == nil {
			f.log.Warn("read-only plane stopped", "err", err)
		}
	}
}
