package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/pprof"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/berth-dev/berth/api"
	"github.com/berth-dev/berth/auth"
	"github.com/berth-dev/berth/config"
	"github.com/berth-dev/berth/control"
	"github.com/berth-dev/berth/dockerapi"
	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/driver/plugin"
	"github.com/berth-dev/berth/leader"
	"github.com/berth-dev/berth/metrics"
	"github.com/berth-dev/berth/provider"
	"github.com/berth-dev/berth/scheduler"
	"github.com/berth-dev/berth/store"
	"github.com/berth-dev/berth/store/bolt"
	"github.com/berth-dev/berth/store/etcd"
	"github.com/berth-dev/berth/web"
)

// serverFlags are the server's own flags; values set on the command line
// override the config file.
type serverFlags struct {
	configFile string
	listen     string
	dataDir    string
	dev        bool
	devRoot    bool // --dev made the local provider, as root: its processes run as devUser
	logFormat  string
	logLevel   string
	cluster    string
	// queuePolicy is --queue-policy.
	queuePolicy string
	// schedulers is --schedulers.
	schedulers int
	memLimit   string
	gcPercent  int
	tlsCert    string
	tlsKey     string
	clientCA   string
	insecure   bool
	origins    []string
	// driverOpts holds the generated --<driver>-<option> flags.
	driverOpts map[string]*string
	// dockerListen is the Docker Engine API's address (--docker-listen).
	dockerListen string
	dockerTLS    dockerTLS
	// ha keeps the state in etcd, for a highly available cluster.
	ha haFlags
}

func newServerCmd(c *cli) *cobra.Command {
	f := &serverFlags{driverOpts: map[string]*string{}}
	cmd := &cobra.Command{
		Use:   "server",
		Short: "Run the Berth server (API, scheduler, reconciler)",
		Long: `Run the Berth server: the REST API under /v1, the dashboard under /ui/,
Prometheus metrics at /metrics, the scheduler and the reconciler.

--dev needs no setup: an embedded store in the data directory (default
$XDG_DATA_HOME/berth, or ~/.local/share/berth when that is not set) and the
"local" back-end running processes on this host, listening on 127.0.0.1.

Every driver option can also be given as --<driver>-<option>; flags override
the config file. SIGTERM or SIGINT shut down gracefully; SIGUSR2 writes every
goroutine's stack to the log.`,
		Args: nArgs(0, 0),
		RunE: func(cmd *cobra.Command, args []string) error {
			return runServer(cmd, c, f)
		},
	}
	fl := cmd.Flags()
	fl.StringVarP(&f.configFile, "config", "c", "", "YAML configuration file")
	fl.StringVar(&f.listen, "listen", "", "API address host:port (default "+config.DefaultListen+"; port 0 picks a free port)")
	fl.StringVar(&f.dockerListen, "docker-listen", "", "serve the Docker Engine API on host:port or a unix socket path (needs token authentication)")
	fl.StringVar(&f.dockerTLS.cert, "docker-tls-cert", "", "TLS certificate of the Docker endpoint (PEM)")
	fl.StringVar(&f.dockerTLS.key, "docker-tls-key", "", "TLS key of the Docker endpoint (PEM)")
	fl.StringVar(&f.dockerTLS.ca, "docker-tls-ca", "", "CA whose client certificates the Docker endpoint accepts (CN names, OU the role, O the namespaces)")
	fl.StringVar(&f.dataDir, "data-dir", "", "directory for the store and the drivers' files")
	fl.BoolVar(&f.dev, "dev", false, "development mode: embedded store and the local back-end, no setup")
	fl.StringVar(&f.logFormat, "log-format", "", "log format: text or json")
	fl.StringVar(&f.logLevel, "log-level", "", "log level: debug, info, warn or error")
	fl.StringVar(&f.cluster, "cluster", "", "name of this Berth installation, written on every back-end resource")
	fl.StringVar(&f.queuePolicy, "queue-policy", "", "order of the groups waiting to be placed whole within a priority class: fifo (default), size or dynsize")
	fl.IntVar(&f.schedulers, "schedulers", 0, fmt.Sprintf("schedulers sharing each placement round of the waiting instances, with optimistic commits: 1 (default) to %d", control.MaxSchedulers))
	fl.StringVar(&f.memLimit, "memory-limit", "", "soft memory limit of the server, e.g. 3Gi (as GOMEMLIMIT; default: the runtime's)")
	fl.StringVar(&f.tlsCert, "tls-cert", "", "PEM file of the server's TLS certificate (with --tls-key)")
	fl.StringVar(&f.tlsKey, "tls-key", "", "PEM file of the server's TLS key")
	fl.StringVar(&f.clientCA, "tls-client-ca", "", "PEM file of the CAs whose client certificates are accepted (common name = a token's name)")
	fl.BoolVar(&f.insecure, "insecure", false, "allow a listen address off this host without TLS (tokens cross the network in clear)")
	fl.StringSliceVar(&f.origins, "allowed-origin", nil, "an Origin whose browser requests are served (repeatable; default none)")
	f.ha.register(fl)
	fl.IntVar(&f.gcPercent, "gc-percent", 0, fmt.Sprintf("garbage collection target, as GOGC (default: GOGC if set, else %d)", config.DefaultGCPercent))
	for _, df := range config.DriverFlags() {
		help := df.Option.Help
		if help == "" {
			help = df.Option.Type
		}
		if df.Option.Range != "" {
			lo, hi, _ := strings.Cut(df.Option.Range, ",")
			help += " (" + lo + " to " + hi + ")"
		}
		if df.Option.Default != "" {
			help += " (default " + df.Option.Default + ")"
		}
		f.driverOpts[df.Driver+"\x00"+df.Option.Name] = fl.String(df.Name, "", fmt.Sprintf("%s driver: %s", df.Driver, help))
	}
	return cmd
}

// overrides returns the --<driver>-<option> flags that were set.
func (f *serverFlags) overrides(cmd *cobra.Command) map[string]map[string]string {
	out := map[string]map[string]string{}
	for _, df := range config.DriverFlags() {
		if !cmd.Flags().Changed(df.Name) {
			continue
		}
		if out[df.Driver] == nil {
			out[df.Driver] = map[string]string{}
		}
		out[df.Driver][df.Option.Name] = *f.driverOpts[df.Driver+"\x00"+df.Option.Name]
	}
	return out
}

// load builds the configuration: the file, then the flags, then --dev.
func (f *serverFlags) load(cmd *cobra.Command) (*config.Config, error) {
	cfg := config.Default()
	if f.configFile != "" {
		var err error
		if cfg, err = config.ReadFile(f.configFile); err != nil {
			return nil, err
		}
	}
	set := func(name string, dst *string, v string) {
		if cmd.Flags().Changed(name) {
			*dst = v
		}
	}
	set("listen", &cfg.Listen, f.listen)
	set("data-dir", &cfg.DataDir, f.dataDir)
	set("log-format", &cfg.Log.Format, f.logFormat)
	set("log-level", &cfg.Log.Level, f.logLevel)
	set("cluster", &cfg.Cluster, f.cluster)
	if cmd.Flags().Changed("queue-policy") {
		cfg.QueuePolicy = scheduler.Policy(f.queuePolicy)
	}
	if cmd.Flags().Changed("schedulers") {
		cfg.Schedulers = f.schedulers
	}
	set("tls-cert", &cfg.TLS.Cert, f.tlsCert)
	set("tls-key", &cfg.TLS.Key, f.tlsKey)
	set("tls-client-ca", &cfg.TLS.ClientCA, f.clientCA)
	if cmd.Flags().Changed("insecure") {
		cfg.Insecure = f.insecure
	}
	if cmd.Flags().Changed("allowed-origin") {
		cfg.AllowedOrigins = f.origins
	}
	if cmd.Flags().Changed("gc-percent") {
		cfg.GCPercent = f.gcPercent
	}
	if cmd.Flags().Changed("memory-limit") {
		b, err := driver.ParseBytes(f.memLimit)
		if err != nil {
			return nil, usagef("--memory-limit: %v", err)
		}
		cfg.MemoryLimit = b
	}
	if f.dev {
		if cfg.DataDir == "" {
			dir, err := devDataDir()
			if err != nil {
				return nil, err
			}
			cfg.DataDir = dir
		}
		if len(cfg.Providers) == 0 {
			opts := map[string]any{"address": "127.0.0.1"}
			if os.Geteuid() == 0 {
				// --dev as root runs processes as an unprivileged user
				// unless a request names one, and never as root; runServer
				// says so.
				opts["default_user"] = devUser
				f.devRoot = true
			}
			cfg.Providers = []config.Provider{{Name: "local", Driver: "local", Options: opts}}
		}
	}
	if err := cfg.Finish(f.configFile, f.overrides(cmd)); err != nil {
		return nil, err
	}
	if cfg.DataDir == "" {
		return nil, usagef("a data directory is required: --data-dir, data_dir in the config file, or --dev")
	}
	if len(cfg.Providers) == 0 {
		return nil, usagef("no providers are configured: add providers to the config file, or use --dev")
	}
	return cfg, nil
}

// devUser is who the processes of --dev started as root run as when their
// request names no user.
const devUser = "nobody"

func devDataDir() (string, error) {
	if d := os.Getenv("XDG_DATA_HOME"); d != "" {
		return filepath.Join(d, "berth"), nil
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return "", usagef("--dev needs --data-dir: %v", err)
	}
	return filepath.Join(home, ".local", "share", "berth"), nil
}

func newLogger(cfg *config.Config, w io.Writer) *slog.Logger {
	level := slog.LevelInfo
	switch cfg.Log.Level {
	case "debug":
		level = slog.LevelDebug
	case "warn":
		level = slog.LevelWarn
	case "error":
		level = slog.LevelError
	}
	opts := &slog.HandlerOptions{Level: level}
	if cfg.Log.Format == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

// server is one run of berth server: what each step of its start makes,
// for the steps after it. runServer takes the steps in order.
type server struct {
	f   *serverFlags
	cfg *config.Config
	log *slog.Logger
	m   *metrics.Metrics

	loopback  bool        // the API listens on loopback only
	tlsConfig *tls.Config // the API's, nil without TLS
	dockerTLS *tls.Config // the Docker endpoint's

	st      store.Store
	client  *clientv3.Client                // on etcd: the plane's client
	elect   *clientv3.Client                // on etcd: the leader election's own
	handOff func(ctx context.Context) error // passes etcd's lead off this server's member

	tokens     *auth.Tokens
	providers  []*provider.Provider
	planeCfg   control.Config
	apiOpts    api.Options
	dockerOpts dockerapi.Options

	mux      *http.ServeMux
	guard    *api.Server // authenticates the routes outside a plane's API
	single   *front      // the one plane of a server on bbolt
	dockerEP *dockerEndpoint
	runAll   func(ctx context.Context) error // runs the plane (or the campaign for it)

	closers []func() // run last first when the server ends
}

// front serves the API and the dashboard of one plane.
type front struct {
	plane *control.Plane
	api   *api.Server
	ui    *web.Server
	mux   *http.ServeMux
}

// runServer starts a server and serves until ctx ends: configure, open
// the store, open the providers, listen, build the planes' fronts (one,
// or a campaign for the lead on etcd), then serve.
func runServer(cmd *cobra.Command, c *cli, f *serverFlags) error {
	s := &server{f: f}
	defer func() {
		for i := len(s.closers) - 1; i >= 0; i-- {
			s.closers[i]()
		}
	}()
	if err := s.configure(cmd, c); err != nil {
		return err
	}
	ctx := cmd.Context()
	if err := s.openStore(ctx); err != nil {
		return err
	}
	if err := s.openProviders(ctx); err != nil {
		return err
	}
	ln, err := net.Listen("tcp", s.cfg.Listen)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	s.guard = api.New(nil, s.apiOpts)
	s.mux = http.NewServeMux()
	s.mux.Handle("GET /metrics", s.guard.Protect(auth.Read, s.m.Handler()))
	if !f.ha.enabled() {
		err = s.buildSingle(ctx)
	} else {
		err = s.buildReplicated(ctx, ln.Addr())
	}
	if err != nil {
		_ = ln.Close()
		return err
	}
	if s.tlsConfig != nil {
		ln = tls.NewListener(ln, s.tlsConfig)
	}
	return s.serve(ctx, ln)
}

// configure reads the configuration and the flags, checks what they
// allow, and sets up the logger, the data directory and TLS.
func (s *server) configure(cmd *cobra.Command, c *cli) error {
	f := s.f
	cfg, err := f.load(cmd)
	if err != nil {
		return err
	}
	if err := f.ha.check(cfg.Insecure); err != nil {
		return err
	}
	if !f.ha.enabled() {
		for _, name := range []string{"leader-lease", "advertise-url", "docker-advertise-url", "leader-ca", "etcd-prefix", "etcd-cacert", "etcd-cert", "etcd-key", "etcd-max-txn-ops", "etcd-max-request-bytes", "etcd-initial-cluster-state", "etcd-heartbeat-interval", "etcd-election-timeout"} {
			if cmd.Flags().Changed(name) {
				return usagef("--%s is for servers on etcd: add --etcd-name or --etcd-endpoints", name)
			}
		}
	}
	s.cfg = cfg
	s.log = newLogger(cfg, c.stderr)
	slog.SetDefault(s.log)
	cfg.SetRuntime()
	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return fmt.Errorf("data dir: %w", err)
	}
	if f.devRoot {
		s.log.Warn("--dev as root: the local back-end runs processes as user "+devUser+" unless a request names another user, and never as root (a config file's local provider may set allow_root)",
			"default_user", devUser)
	}
	if s.loopback, err = loopbackListen(cfg.Listen); err != nil {
		return err
	}
	if !s.loopback && !cfg.TLS.Enabled() {
		if !cfg.Insecure {
			return usagef("listen %s is reachable from other machines: serve TLS (--tls-cert and --tls-key), listen on 127.0.0.1, or pass --insecure to send tokens in clear", cfg.Listen)
		}
		s.log.Warn("INSECURE: the API listens off this host without TLS; bearer tokens and every request cross the network in clear", "listen", cfg.Listen)
	}
	if s.tlsConfig, err = serverTLS(cfg.TLS); err != nil {
		return err
	}
	if f.dockerListen != "" {
		if s.dockerTLS, err = f.dockerTLS.config(); err != nil {
			return err
		}
		if _, isUnix := unixPath(f.dockerListen); isUnix && f.ha.enabled() && f.ha.dockerAdvertise == "" {
			return usagef("--docker-listen %s: on etcd the Docker endpoint listens on TCP, where the other servers can forward docker requests to it (or give --docker-advertise-url)", f.dockerListen)
		}
		if f.ha.enabled() && s.dockerTLS != nil && s.dockerTLS.ClientAuth == tls.RequireAndVerifyClientCert {
			return usagef("--docker-tls-ca: a server on etcd forwards the Docker endpoint's requests to the leader, and client certificates do not pass through; authenticate the docker CLI with tokens")
		}
	}
	s.m = metrics.New()
	return nil
}

// openStore opens the store: etcd (an embedded member, or a cluster's
// endpoints) or the data directory's bbolt file.
func (s *server) openStore(ctx context.Context) error {
	if s.f.ha.enabled() {
		client, elect, member, opts, err := s.f.ha.openEtcd(ctx, s.cfg.DataDir, s.cfg.Insecure, s.m)
		if err != nil {
			return err
		}
		s.client, s.elect = client, elect
		if member != nil {
			s.handOff = member.HandOff
		}
		s.closers = append(s.closers, func() {
			_ = elect.Close()
			_ = client.Close()
			if member != nil {
				member.Close()
			}
		})
		s.st = etcd.New(client, opts)
	} else {
		b, err := bolt.Open(filepath.Join(s.cfg.DataDir, "berth.db"), bolt.Options{})
		if err != nil {
			return err
		}
		s.st = b
	}
	s.closers = append(s.closers, func() {
		if err := s.st.Close(); err != nil {
			s.log.Error("closing the store", "error", err)
		}
	})
	return nil
}

// openProviders makes the first admin token when there is none, opens the
// providers, and settles the options of the planes, the API and the
// Docker endpoint.
func (s *server) openProviders(ctx context.Context) error {
	cfg, log := s.cfg, s.log
	s.tokens = auth.NewTokens(s.st, nil)
	tokenFile := filepath.Join(cfg.DataDir, auth.BootstrapFile)
	if made, err := s.tokens.Bootstrap(ctx, tokenFile); err != nil {
		return fmt.Errorf("admin token: %w", err)
	} else if made {
		log.Info("made the first admin token; its secret is in the file (mode 0600), read by berth's client verbs on this host", "file", tokenFile)
	}
	providers, err := openProviders(ctx, cfg, log, s.m)
	s.closers = append(s.closers, func() { closeProviders(providers, log) })
	if err != nil {
		return err
	}
	s.providers = providers
	s.planeCfg = control.Config{
		Store: s.st, Providers: providers, Cluster: cfg.Cluster, Pools: cfg.Pools, Quotas: cfg.Quotas, RunAs: cfg.RunAs, QueuePolicy: cfg.QueuePolicy,
		Schedulers: cfg.Schedulers, Overcommit: cfg.Overcommit(), Logger: log, Metrics: s.m,
	}
	cfg.Reconcile.Apply(&s.planeCfg)
	cfg.Rebalance.Apply(&s.planeCfg)
	s.apiOpts = api.Options{
		MaxBodySize: int64(cfg.MaxBodySize), MaxCount: cfg.MaxCount, Logger: log,
		Tokens: s.tokens, LoopbackOnly: s.loopback, AllowedOrigins: cfg.AllowedOrigins,
		Rate: cfg.TokenRate, Burst: cfg.TokenBurst, MaxStreams: cfg.MaxStreams, WriteTimeout: cfg.Timeouts.Write,
		Plugins: func() []api.DriverInfo { return pluginDrivers(providers) },
	}
	s.dockerOpts = dockerOptions(s.dockerTLS, cfg.MaxStreams, s.tokens, int64(cfg.MaxBodySize), log)
	s.dockerOpts.WriteTimeout = cfg.Timeouts.Write
	return nil
}

// newFront makes a plane on pc with its API and dashboard.
func (s *server) newFront(ctx context.Context, pc control.Config) (*front, error) {
	plane, err := control.New(ctx, pc)
	if err != nil {
		return nil, err
	}
	apiServer := api.New(plane, s.apiOpts)
	ui, err := web.New(plane, web.Options{Logger: s.log, Authenticator: webAuth(s.tokens), SecureCookies: s.cfg.TLS.Enabled()})
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.Handle(web.Prefix, timed(s.m, apiServer.CheckHost(ui)))
	mux.Handle("/", timed(s.m, apiServer))
	return &front{plane: plane, api: apiServer, ui: ui, mux: mux}, nil
}

// run runs fr's plane and dashboard until ctx ends, then ends its streams.
func (fr *front) run(ctx context.Context) error {
	uiDone := make(chan struct{})
	go func() {
		defer close(uiDone)
		_ = fr.ui.Run(ctx)
	}()
	err := fr.plane.Run(ctx)
	fr.api.CloseStreams()
	fr.ui.CloseStreams()
	<-uiDone
	return err
}

// buildSingle builds the one plane of a server on bbolt, its routes and
// its Docker endpoint.
func (s *server) buildSingle(ctx context.Context) error {
	single, err := s.newFront(ctx, s.planeCfg)
	if err != nil {
		return err
	}
	s.single = single
	s.mux.Handle("/", single.mux)
	s.runAll = single.run
	if s.f.dockerListen != "" {
		opts := s.dockerOpts
		// The networks, volumes and created containers outlive the
		// server.
		opts.Store = s.planeCfg.Store
		ds, err := dockerapi.Open(ctx, single.plane, opts)
		if err != nil {
			return err
		}
		if s.dockerEP, err = listenDocker(s.f.dockerListen, s.dockerTLS, s.cfg.Insecure, s.cfg.Timeouts, ds, ds.Close, s.log); err != nil {
			return err
		}
	}
	return nil
}

// buildReplicated builds a server on etcd: the front door that forwards to
// the leader, the routes a follower answers itself, and the campaign that
// runs a plane while this server leads.
func (s *server) buildReplicated(ctx context.Context, listening net.Addr) error {
	f, log := s.f, s.log
	addr, err := f.ha.advertiseURL(listening, s.tlsConfig != nil)
	if err != nil {
		return err
	}
	self := leader.Info{Name: f.ha.name, Address: addr}
	if s.handOff != nil {
		self.Member = f.ha.peerURL // a member runs in this process
	}
	if self.Name == "" {
		self.Name, _ = os.Hostname()
	}
	door, err := newFrontDoor(self, f.ha.leaderCA, log)
	if err != nil {
		return err
	}
	if f.dockerListen != "" {
		if s.dockerEP, err = listenDocker(f.dockerListen, s.dockerTLS, s.cfg.Insecure, s.cfg.Timeouts, dockerDoorOf(door), func() {}, log); err != nil {
			return err
		}
		if self.Docker, err = f.ha.dockerAdvertiseURL(s.dockerEP.ln.Addr(), s.dockerTLS != nil); err != nil {
			s.dockerEP.shutdown(ctx, log)
			return err
		}
		door.self = self
	}
	s.mux.Handle("GET /v1/health", s.guard.CheckHost(http.HandlerFunc(door.health)))
	members{c: s.client}.routes(s.mux, s.guard)
	// The Host check happens here too: forwarding rewrites Host to the
	// leader's, which would hide a rebinding page's name from the leader.
	s.mux.Handle("/", s.guard.CheckHost(door))
	// While this server follows, a read-only plane answers the reads
	// it can from its copy of the state.
	reads := &followerReads{fd: door, log: log, open: func(ctx context.Context) (*localReads, error) {
		pc := s.planeCfg
		pc.ReadOnly = true
		plane, err := control.New(ctx, pc)
		if err != nil {
			return nil, err
		}
		opts := s.apiOpts
		opts.Leader = http.HandlerFunc(door.forward)
		lr := newLocalReads(self.Name, plane, api.New(plane, opts), func(h http.Handler) http.Handler { return timed(s.m, h) })
		if s.dockerEP != nil {
			dopts := s.dockerOpts
			dopts.Store = s.st // read only: the --rm marks
			dopts.Leader = http.HandlerFunc(door.forwardDocker)
			lr.docker = dockerapi.New(plane, dopts)
		}
		return lr, nil
	}}
	s.runAll = func(ctx context.Context) error {
		go leader.Watch(ctx, s.client, f.ha.prefix, door.seen)
		reads.start(ctx)
		defer reads.stop()
		return leader.Run(ctx, leader.Config{
			Client: s.elect, Prefix: f.ha.prefix, Self: self, TTL: f.ha.lease, Logger: log, Changed: s.m.Leading, HandOff: s.handOff,
		}, func(tctx context.Context, term leader.Term, deposed func()) error {
			return s.lead(ctx, tctx, term, deposed, door, reads)
		})
	}
	return nil
}

// lead runs the plane of one term of this server as leader until tctx
// ends; ctx is the campaign's, for the follower's reads once it does.
func (s *server) lead(ctx, tctx context.Context, term leader.Term, deposed func(), door *frontDoor, reads *followerReads) error {
	log := s.log
	pc := s.planeCfg
	pc.Store = leader.Fenced(s.st, term, func() {
		s.m.Fenced()
		log.Warn("a write was refused: this server's term is over (its lease was not renewed in time, or another server leads); stopping", "term", term.Rev)
		deposed()
	})
	start := time.Now()
	fr, err := s.newFront(tctx, pc)
	if err != nil {
		return err
	}
	var ds *dockerapi.Server
	if s.dockerEP != nil {
		opts := s.dockerOpts
		opts.Store = pc.Store // fenced: only the leader keeps what the endpoint keeps
		if ds, err = dockerapi.Open(tctx, fr.plane, opts); err != nil {
			return err
		}
	}
	door.lead(fr.mux)
	log.Info("leading: the control plane answers", "term", term.Rev, "loaded_in", time.Since(start).Round(time.Millisecond).String())
	// Leading, the full plane answers every request; deposed, the reads
	// are served from a read-only copy again.
	reads.stop()
	defer reads.start(ctx)
	defer door.lead(nil)
	if ds != nil {
		door.leadDocker(ds)
		defer func() {
			door.leadDocker(nil)
			ds.Close()
		}()
	}
	return fr.run(tctx)
}

// serve serves the API on ln and runs the plane until ctx ends (or either
// stops), then shuts down: the listener, the streams and the requests in
// flight first, the plane after, within the shutdown timeout.
func (s *server) serve(ctx context.Context, ln net.Listener) error {
	cfg, log := s.cfg, s.log
	// Every phase of a request is bounded; streams (logs, events) lift the
	// write deadline for themselves.
	to := cfg.Timeouts
	httpServer := &http.Server{Handler: s.mux, ReadHeaderTimeout: to.ReadHeader, ReadTimeout: to.Read, WriteTimeout: to.Write,
		IdleTimeout: to.Idle, MaxHeaderBytes: 64 << 10, TLSConfig: s.tlsConfig, ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)}

	// The plane runs under its own context so that it stops only after the
	// API has finished the requests in flight.
	planeCtx, stopPlane := context.WithCancel(context.WithoutCancel(ctx))
	defer stopPlane()
	planeDone := make(chan error, 1)
	go func() { planeDone <- s.runAll(planeCtx) }()
	serveDone := make(chan error, 1)
	go func() { serveDone <- httpServer.Serve(ln) }()

	stacks := make(chan os.Signal, 1)
	signal.Notify(stacks, syscall.SIGUSR2)
	defer signal.Stop(stacks)

	log.Info("listening", "addr", ln.Addr().String(), "data_dir", cfg.DataDir, "providers", strings.Join(cfg.ProviderNames(), ","))
	var runErr error
loop:
	for {
		select {
		case <-stacks:
			dumpStacks(log)
		case <-ctx.Done():
			log.Info("shutting down", "reason", context.Cause(ctx))
			break loop
		case err := <-serveDone:
			runErr = fmt.Errorf("api server: %w", err)
			break loop
		case err := <-planeDone:
			planeDone <- err
			runErr = fmt.Errorf("control plane stopped: %w", err)
			break loop
		}
	}

	// Stop accepting, end the streams, finish the requests in flight.
	shutdownCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cfg.ShutdownTimeout)
	defer cancel()
	if s.single != nil {
		s.single.api.CloseStreams()
		s.single.ui.CloseStreams()
	}
	s.dockerEP.shutdown(shutdownCtx, log)
	if err := httpServer.Shutdown(shutdownCtx); err != nil {
		log.Error("api shutdown", "error", err)
		_ = httpServer.Close()
	}
	// Then stop the plane (and give up the lead); the closers close the
	// providers and the store. The plane gets what is left of the grace: a
	// plane that does not stop in it (a bug) does not keep the process
	// alive.
	stopPlane()
	select {
	case err := <-planeDone:
		if err != nil && !errors.Is(err, context.Canceled) {
			log.Error("control plane", "error", err)
		}
	case <-shutdownCtx.Done():
		dumpStacks(log)
		log.Error("the control plane did not stop within the shutdown timeout; stopping without it", "shutdown_timeout", cfg.ShutdownTimeout)
		if runErr == nil {
			runErr = errors.New("the control plane did not stop within the shutdown timeout")
		}
	}
	log.Info("stopped")
	return runErr
}

// loopbackListen reports whether the listen address binds only this host's
// loopback interface.
func loopbackListen(listen string) (bool, error) {
	host, _, err := net.SplitHostPort(listen)
	if err != nil {
		return false, usagef("listen %q: %v", listen, err)
	}
	if host == "localhost" {
		return true, nil
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback(), nil
}

// serverTLS builds the listener's TLS configuration, or nil without TLS.
func serverTLS(t config.TLS) (*tls.Config, error) {
	if !t.Enabled() {
		return nil, nil
	}
	cert, err := tls.LoadX509KeyPair(t.Cert, t.Key)
	if err != nil {
		return nil, usagef("tls: %v", err)
	}
	c := &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{cert}}
	if t.ClientCA != "" {
		pem, err := os.ReadFile(t.ClientCA)
		if err != nil {
			return nil, usagef("tls client_ca: %v", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, usagef("tls client_ca %s: no PEM certificate in it", t.ClientCA)
		}
		c.ClientCAs, c.ClientAuth = pool, tls.VerifyClientCertIfGiven
	}
	return c, nil
}

// webAuth lets the dashboard sign in with the API's tokens.
func webAuth(tokens *auth.Tokens) web.Authenticator {
	return web.AuthenticatorFunc(func(ctx context.Context, secret string) (web.Identity, error) {
		id, err := tokens.Authenticate(ctx, secret)
		if errors.Is(err, auth.ErrUnauthenticated) {
			return web.Identity{}, web.ErrUnauthenticated
		}
		if err != nil {
			return web.Identity{}, err
		}
		return id, nil
	})
}

// timed records each API request's latency by route pattern.
func timed(m *metrics.Metrics, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		sw := &statusWriter{ResponseWriter: w, status: http.StatusOK}
		h.ServeHTTP(sw, r)
		route := r.Pattern
		if route == "" {
			route = "other"
		}
		m.Request(route, sw.status, time.Since(start))
	})
}

type statusWriter struct {
	http.ResponseWriter
	status int
	wrote  bool
}

func (w *statusWriter) WriteHeader(code int) {
	if !w.wrote {
		w.status, w.wrote = code, true
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// openProviders opens every configured back-end. On error the providers
// opened so far are returned too, for the caller to close.
func openProviders(ctx context.Context, cfg *config.Config, log *slog.Logger, m *metrics.Metrics) ([]*provider.Provider, error) {
	var out []*provider.Provider
	for i, pc := range cfg.Providers {
		def, err := driver.Lookup(pc.Driver)
		if err != nil {
			return out, fmt.Errorf("providers[%d]: %w", i, err)
		}
		dir := filepath.Join(cfg.DataDir, "providers", pc.Name)
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return out, err
		}
		d, err := def.Open(ctx, pc.Options, driver.Env{Provider: pc.Name, Cluster: cfg.Cluster, DataDir: dir, Logger: log})
		if err != nil {
			return out, fmt.Errorf("provider %q: %w", pc.Name, err)
		}
		p, err := provider.New(d, provider.Config{
			Name:     pc.Name,
			ReadRate: pc.RateLimit.Reads, ReadBurst: pc.RateLimit.ReadBurst,
			WriteRate: pc.RateLimit.Writes, WriteBurst: pc.RateLimit.WriteBurst,
			CallTimeout:     pc.Timeout,
			BreakerFailures: uint32(pc.Breaker.Failures),
			BreakerOpenFor:  pc.Breaker.OpenFor,
			Logger:          log,
			Observer:        m,
		})
		if err != nil {
			_ = d.Close(ctx)
			return out, fmt.Errorf("provider %q: %w", pc.Name, err)
		}
		m.Breaker(pc.Name, p.Health().Breaker)
		out = append(out, p)
	}
	return out, nil
}

// pluginDrivers describes the driver each provider served by a plugin
// runs, as the plugin describes it.
func pluginDrivers(ps []*provider.Provider) []api.DriverInfo {
	var out []api.DriverInfo
	for _, p := range ps {
		pd, ok := p.Driver().(*plugin.Driver)
		if !ok {
			continue
		}
		info := pd.Info()
		opts := info.Options
		if opts == nil {
			opts = []driver.Option{}
		}
		out = append(out, api.DriverInfo{Name: info.Name, Summary: info.Summary, Options: opts, Provider: p.Name(), Plugin: pd.Path(), Version: info.Version})
	}
	return out
}

func closeProviders(ps []*provider.Provider, log *slog.Logger) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, p := range ps {
		if err := p.Close(ctx); err != nil {
			log.Error("closing provider", "provider", p.Name(), "error", err)
		}
	}
}

// dumpStacks writes every goroutine's stack to the log (SIGUSR2).
func dumpStacks(log *slog.Logger) {
	var buf bytes.Buffer
	_ = pprof.Lookup("goroutine").WriteTo(&buf, 2)
	log.Info("goroutine stacks", "stacks", buf.String())
}
