// Package dockerapi serves the Docker Engine API over a control.Plane, so
// that the docker CLI, Compose and the Docker SDKs drive the whole cluster
// as Swarm classic let them: a container created here is a Berth request,
// placed by Berth's scheduler across every provider, with constraints and
// affinities taken from its environment (constraint:disk==ssd,
// affinity:image==redis) or its labels (berth.constraint, berth.affinity).
//
// It speaks API version Version (and every version down to MinVersion),
// under versioned (/v1.41/containers/json) and unversioned paths, with the
// Engine API's own types from github.com/moby/moby/api. What Berth cannot do
// is answered in the Engine API's error shape, {"message": "..."}, with 501
// and a message that says what is not supported; never a 404 or a silent
// success.
//
// The endpoint is locked down: every request, /_ping included, must carry a
// bearer token that Options.Authenticator accepts (the docker CLI sends one
// from the HttpHeaders of its config.json). Without an Authenticator every
// request is refused. Readers may only read; operators and admins act, in
// their namespaces (an instance's owner is its namespace).
package dockerapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"regexp"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/berth-dev/berth/api"
	"github.com/berth-dev/berth/auth"
	"github.com/berth-dev/berth/control"
	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/store"
)

// Version is the Engine API version the endpoint advertises and answers.
const Version = "1.41"

// MinVersion is the oldest API version a client may ask for.
const MinVersion = "1.24"

// Defaults of Options.
const (
	DefaultMaxBodySize  = 1 << 20
	DefaultMaxStreams   = 256
	DefaultTokenStreams = 32
	DefaultMaxCreated   = 1000
)

// Authenticator answers the identity of a bearer token's secret, and of
// the token a verified client certificate's common name names (as the REST
// API does). *auth.Tokens is one. Errors wrapping auth.ErrUnauthenticated
// mean the token is unknown, revoked or expired.
type Authenticator interface {
	Authenticate(ctx context.Context, secret string) (auth.Identity, error)
	Named(ctx context.Context, name string) (auth.Identity, error)
}

// Options configures a Server.
type Options struct {
	// Authenticator checks bearer tokens. Nil refuses every request that
	// carries no accepted client certificate.
	Authenticator Authenticator
	// ClientCerts accepts the verified client certificate of a TLS
	// connection (the listener's tls.Config verifies it) as the token its
	// common name names.
	ClientCerts bool
	// ServerVersion is Berth's version, shown by docker version and info.
	ServerVersion string
	// Name names the cluster in docker info; default "berth".
	Name string
	// MaxBodySize caps request bodies; 0 means DefaultMaxBodySize.
	MaxBodySize int64
	// MaxStreams caps the open streams (attach, logs, events, wait, pull);
	// 0 means DefaultMaxStreams. Beyond it a stream is refused with 503.
	MaxStreams int
	// TokenStreams caps the open streams of one token, as the REST API's
	// max_streams; 0 means DefaultTokenStreams. Beyond it 429.
	TokenStreams int
	// MaxCreated caps the containers created and not yet started; 0 means
	// DefaultMaxCreated.
	MaxCreated int
	// Logger receives request errors; nil means slog.Default().
	Logger *slog.Logger
	// AuditLog receives one record per call that is not a read (api.Audit,
	// as the REST API's); nil means Logger.
	AuditLog *slog.Logger
	// WriteTimeout is the HTTP server's write timeout (0:
	// api.DefaultWriteTimeout): a stop whose grace it cannot wait out
	// (api.LongGrace) is answered once stored and carried out after.
	WriteTimeout time.Duration
	// Store keeps the networks (under PrefixNetworks), the volumes
	// (under PrefixVolumes) and the --rm marks (PrefixAutoRemove), so that
	// they outlive the server; the plane's store serves. Nil keeps them
	// in memory.
	Store store.Store
	// Leader, when set, makes this the Docker endpoint of a server that
	// does not lead, over its read-only plane: it serves the reads that
	// plane answers as the leader would, and hands every other request,
	// as it came, to Leader (follower.go). Store is then only read: a
	// follower's inspect shows AutoRemove from it.
	Leader http.Handler
}

// Server serves the Engine API over a plane. It is an http.Handler; Close
// ends its streams and waits for the removals it started (--rm).
type Server struct {
	plane   *control.Plane
	st      store.Store  // Options.Store
	leader  http.Handler // Options.Leader
	auth    Authenticator
	certs   bool
	log     *slog.Logger
	audit   *slog.Logger
	version string
	name    string
	maxBody int64
	streams chan struct{} // a slot per open stream
	maxNew  int
	mux     *http.ServeMux

	closeOnce sync.Once
	closing   chan struct{}  // closed by Close: streams and background work end
	wg        sync.WaitGroup // background removals

	tokenStreams int
	writeTimeout time.Duration

	// mu guards created (and its containers' fields), autoRm, attached,
	// sizes, execs and open. Lock order: a created container's keeping
	// before mu; mu is a leaf, never held while calling the plane or the
	// store.
	mu       sync.Mutex
	open     map[string]int      // open streams, by token accessor
	created  map[string]*created // containers created, not yet started, by id
	autoRm   map[string]struct{} // started containers to remove when they end
	attached map[string]int      // open attach streams, by container id
	// exits keeps the exit codes of the --rm containers removed lately
	// (at most maxExits, oldest dropped first, in exitOrder), for a wait
	// on condition "removed" that saw the container last while it ran.
	exits     map[string]int
	exitOrder []string
	// sizes are the terminal sizes clients asked for, by container id,
	// kept while the container may not run yet (bounded by MaxCreated).
	sizes map[string]driver.TTYSize
	// execs are the execs made lately, by id (at most maxNew).
	execs map[string]*execRec

	nets *netStore // the networks of every namespace
	// placing holds, by a hash of a network's back-end name, a lock taken
	// while the first of the network's members to be placed is submitted
	// and placed, so that two first members started at once do not go to
	// two engines (placingLock).
	placing [64]sync.Mutex

	vols *volStore // the volumes of every namespace
	// volPlacing holds, by a hash of a volume's back-end name, a lock taken
	// while the first of the volume's users is submitted and placed, so
	// that two first users started at once do not go to two nodes
	// (volumeLock).
	volPlacing [64]sync.Mutex
}

// New returns the Engine API server for plane.
func New(plane *control.Plane, opts Options) *Server {
	s := &Server{
		plane: plane, st: opts.Store, leader: opts.Leader, auth: opts.Authenticator, certs: opts.ClientCerts, log: opts.Logger, version: opts.ServerVersion, name: opts.Name,
		maxBody: opts.MaxBodySize, maxNew: opts.MaxCreated, mux: http.NewServeMux(),
		created: map[string]*created{}, autoRm: map[string]struct{}{}, attached: map[string]int{}, open: map[string]int{}, exits: map[string]int{},
		sizes: map[string]driver.TTYSize{}, execs: map[string]*execRec{},
		tokenStreams: opts.TokenStreams, writeTimeout: opts.WriteTimeout,
		nets: newNetStore(opts.Store, opts.Leader != nil), vols: newVolStore(opts.Store, opts.Leader != nil),
	}
	if s.log == nil {
		s.log = slog.Default()
	}
	if s.audit = opts.AuditLog; s.audit == nil {
		s.audit = s.log
	}
	if s.name == "" {
		s.name = "berth"
	}
	if s.version == "" {
		s.version = "devel"
		if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" {
			s.version = bi.Main.Version
		}
	}
	if s.maxBody <= 0 {
		s.maxBody = DefaultMaxBodySize
	}
	if s.maxNew <= 0 {
		s.maxNew = DefaultMaxCreated
	}
	n := opts.MaxStreams
	if n <= 0 {
		n = DefaultMaxStreams
	}
	s.streams = make(chan struct{}, n)
	if s.tokenStreams <= 0 {
		s.tokenStreams = DefaultTokenStreams
	}
	s.closing = make(chan struct{})
	s.routes()
	if s.st != nil && !s.follower() {
		s.wg.Go(s.resumeAutoRemove)
	}
	return s
}

// Close ends every open stream and waits for the removals of --rm
// containers in flight to finish or be abandoned.
func (s *Server) Close() {
	s.closeOnce.Do(func() { close(s.closing) })
	s.wg.Wait()
}

func (s *Server) routes() {
	h := func(pattern string, fn func(http.ResponseWriter, *http.Request) error) {
		s.mux.Handle(pattern, handler{s, fn})
	}
	h("GET /_ping", s.ping)
	h("HEAD /_ping", s.ping)
	h("GET /version", s.versionInfo)
	h("GET /info", s.info)

	h("GET /containers/json", s.list)
	h("POST /containers/create", s.create)
	h("GET /containers/{id}/json", s.inspect)
	h("POST /containers/{id}/start", s.start)
	h("POST /containers/{id}/stop", s.stop)
	h("POST /containers/{id}/restart", s.restart)
	h("POST /containers/{id}/kill", s.kill)
	h("DELETE /containers/{id}", s.remove)
	h("POST /containers/{id}/wait", s.wait)
	h("POST /containers/{id}/attach", s.attach)
	h("POST /containers/{id}/resize", s.resize)
	h("GET /containers/{id}/logs", s.logs)
	h("GET /containers/{id}/stats", s.stats)
	h("POST /containers/{id}/pause", s.pause)
	h("POST /containers/{id}/unpause", s.unpause)
	h("POST /containers/{id}/rename", s.rename)
	h("GET /containers/{id}/top", s.top)
	h("HEAD /containers/{id}/archive", s.archiveStat)
	h("GET /containers/{id}/archive", s.archiveGet)
	h("PUT /containers/{id}/archive", s.archivePut)
	h("POST /containers/{id}/update", s.update)
	h("POST /containers/{id}/exec", s.execCreate)
	h("POST /exec/{id}/start", s.execStart)
	h("POST /exec/{id}/resize", s.execResize)
	h("GET /exec/{id}/json", s.execInspect)

	h("GET /events", s.events)
	h("GET /images/json", s.images)
	h("POST /images/create", s.pull)
	h("GET /images/{rest...}", s.imageRoute)
	h("GET /system/df", s.systemDF)

	h("GET /networks", s.networkList)
	h("GET /networks/{id}", s.networkInspect)
	h("POST /networks/create", s.networkCreate)
	h("DELETE /networks/{id}", s.networkRemove)
	h("POST /networks/prune", s.networkPrune)
	h("POST /networks/{id}/connect", s.networkConnect)
	h("POST /networks/{id}/disconnect", s.networkDisconnect)

	h("GET /volumes", s.volumeList)
	h("GET /volumes/{name}", s.volumeInspect)
	h("POST /volumes/create", s.volumeCreate)
	h("DELETE /volumes/{name}", s.volumeRemove)
	h("POST /volumes/prune", s.volumePrune)
}

// versionPrefix matches the /v1.NN prefix of versioned paths.
var versionPrefix = regexp.MustCompile(`^/v([0-9]+\.[0-9]+)(/.*)$`)

// ServeHTTP authenticates r, strips the API version from its path and
// routes it. Paths with no handler are answered 501: the Engine API has
// them, Berth does not. A follower's endpoint hands what it does not serve
// (followerRoutes) to the leader.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	id, err := s.authenticate(r)
	if err != nil {
		w.Header().Set("WWW-Authenticate", `Bearer realm="berth"`)
		writeError(w, err)
		return
	}
	orig := r
	if m := versionPrefix.FindStringSubmatch(r.URL.Path); m != nil {
		if err := checkVersion(m[1]); err != nil {
			writeError(w, err)
			return
		}
		r2 := new(http.Request)
		*r2 = *r
		u := *r.URL
		u.Path, u.RawPath = m[2], ""
		r2.URL = &u
		r = r2
	}
	if s.follower() {
		if _, pattern := s.mux.Handler(r); !followerRoutes[pattern] {
			s.leader.ServeHTTP(w, orig)
			return
		}
	}
	if err := permit(id, r); err != nil {
		writeError(w, err)
		return
	}
	ctx := auth.NewContext(r.Context(), id)
	if s.follower() {
		ctx = context.WithValue(ctx, origKey{}, orig)
	}
	r = r.WithContext(ctx)
	r.Body = http.MaxBytesReader(w, r.Body, s.bodyLimit(r))
	if _, pattern := s.mux.Handler(r); pattern == "" {
		writeError(w, unsupported("%s %s is not supported by Berth's Docker endpoint", r.Method, r.URL.Path))
		return
	}
	s.mux.ServeHTTP(w, r)
}

func checkVersion(v string) error {
	if versionLess(Version, v) {
		return &httpError{http.StatusBadRequest, fmt.Sprintf("client version %s is too new. Maximum supported API version is %s", v, Version)}
	}
	if versionLess(v, MinVersion) {
		return &httpError{http.StatusBadRequest, fmt.Sprintf("client version %s is too old. Minimum supported API version is %s, please upgrade your client to a newer version", v, MinVersion)}
	}
	return nil
}

// versionLess reports whether API version a is older than b.
func versionLess(a, b string) bool {
	pa, pb := strings.SplitN(a, ".", 2), strings.SplitN(b, ".", 2)
	for i := range 2 {
		x, _ := strconv.Atoi(pa[min(i, len(pa)-1)])
		y, _ := strconv.Atoi(pb[min(i, len(pb)-1)])
		if x != y {
			return x < y
		}
	}
	return false
}

func identityOf(r *http.Request) auth.Identity {
	id, _ := auth.FromContext(r.Context())
	return id
}

// authenticate returns the identity of r's bearer token, else of the token
// its verified client certificate names.
func (s *Server) authenticate(r *http.Request) (auth.Identity, error) {
	if s.auth == nil {
		return auth.Identity{}, &httpError{http.StatusUnauthorized, "Berth's Docker endpoint has no token authentication configured and refuses every request"}
	}
	tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if (!ok || tok == "") && s.certs && r.TLS != nil && len(r.TLS.VerifiedChains) > 0 && len(r.TLS.VerifiedChains[0]) > 0 {
		cn := r.TLS.VerifiedChains[0][0].Subject.CommonName
		id, err := s.auth.Named(r.Context(), cn)
		if errors.Is(err, auth.ErrUnauthenticated) {
			return auth.Identity{}, &httpError{http.StatusUnauthorized, fmt.Sprintf("the client certificate's common name %q names no valid token", cn)}
		}
		return id, err
	}
	if !ok || tok == "" {
		return auth.Identity{}, &httpError{http.StatusUnauthorized, `Berth needs a bearer token: put {"HttpHeaders": {"Authorization": "Bearer <token>"}} in the docker CLI's config.json`}
	}
	id, err := s.auth.Authenticate(r.Context(), tok)
	if errors.Is(err, auth.ErrUnauthenticated) {
		return auth.Identity{}, &httpError{http.StatusUnauthorized, "the bearer token is unknown, revoked or expired"}
	}
	return id, err
}

// permission is what a request needs, as the REST API's routes: reading
// needs a token, pulling (a preload) an admin's, anything else an
// operator's.
func permission(r *http.Request) auth.Permission {
	switch {
	case r.Method == http.MethodGet || r.Method == http.MethodHead:
		return auth.Read
	case r.URL.Path == "/images/create":
		return auth.Admin
	}
	return auth.Operate
}

// permit refuses what id's role does not allow.
func permit(id auth.Identity, r *http.Request) error {
	if p := permission(r); !id.Allows(p) {
		return &httpError{http.StatusForbidden, fmt.Sprintf("token %q (%s) may not %s here: it needs the %s permission", id.Name, id.Role, r.Method, p)}
	}
	return nil
}

// authorized reports whether r's caller may do what r asks (its
// permission) to an object of namespace: the rule of auth.Identity.Authorize,
// the same as the REST API's and the dashboard's.
func authorized(r *http.Request, namespace string) bool {
	return identityOf(r).Authorize(permission(r), namespace) == nil
}

// acquire takes a stream slot of the server and of r's token for the
// response w, and lifts the server's write deadline, which bounds every
// other response; release gives the slots back.
func (s *Server) acquire(w http.ResponseWriter, r *http.Request) (release func(), err error) {
	tok := identityOf(r).Accessor
	s.mu.Lock()
	if s.open[tok] >= s.tokenStreams {
		s.mu.Unlock()
		return nil, &httpError{http.StatusTooManyRequests, fmt.Sprintf("token %q has %d streams open, the most it may: close one first", identityOf(r).Name, s.tokenStreams)}
	}
	s.open[tok]++
	s.mu.Unlock()
	untoken := func() {
		s.mu.Lock()
		if s.open[tok]--; s.open[tok] <= 0 {
			delete(s.open, tok)
		}
		s.mu.Unlock()
	}
	select {
	case s.streams <- struct{}{}:
		_ = http.NewResponseController(w).SetWriteDeadline(time.Time{})
		return func() { <-s.streams; untoken() }, nil
	default:
		untoken()
		return nil, &httpError{http.StatusServiceUnavailable, fmt.Sprintf("too many open streams (at most %d); try again later", cap(s.streams))}
	}
}

// streamContext ends with the request or with Close.
func (s *Server) streamContext(r *http.Request) (context.Context, context.CancelFunc) {
	return s.until(r.Context())
}

// until derives a context of parent that also ends with Close.
func (s *Server) until(parent context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(parent)
	go func() {
		select {
		case <-s.closing:
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx, cancel
}

// httpError is an error with the status it is answered with.
type httpError struct {
	status int
	msg    string
}

func (e *httpError) Error() string { return e.msg }

// unsupported is the error for what the Engine API has and Berth does not.
func unsupported(format string, args ...any) error {
	return &httpError{http.StatusNotImplemented, fmt.Sprintf(format, args...)}
}

func badRequest(format string, args ...any) error {
	return &httpError{http.StatusBadRequest, fmt.Sprintf(format, args...)}
}

// noSuch is the Engine API's answer for a missing container.
func noSuch(ref string) error {
	return &httpError{http.StatusNotFound, "No such container: " + ref}
}

// statusOf maps err to a status: httpError's own, else the REST API's one
// mapping.
func statusOf(err error) int {
	var he *httpError
	if errors.As(err, &he) {
		return he.status
	}
	var mbe *http.MaxBytesError
	if errors.As(err, &mbe) {
		return http.StatusRequestEntityTooLarge
	}
	if errors.Is(err, driver.ErrUnsupported) {
		return http.StatusNotImplemented
	}
	if st := api.StatusOf(err); st != 0 {
		return st
	}
	return http.StatusInternalServerError
}

// errorBody is the Engine API's error shape.
type errorBody struct {
	Message string `json:"message"`
}

func writeError(w http.ResponseWriter, err error) {
	_ = writeJSON(w, statusOf(err), errorBody{Message: err.Error()})
}

func writeJSON(w http.ResponseWriter, status int, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, err = w.Write(append(b, '\n'))
	return err
}

type handler struct {
	s  *Server
	fn func(http.ResponseWriter, *http.Request) error
}

func (h handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	cw := &committedWriter{ResponseWriter: w}
	defer func() {
		if p := recover(); p != nil {
			if p == http.ErrAbortHandler {
				panic(p)
			}
			h.s.log.Error("dockerapi: panic", "method", r.Method, "path", r.URL.Path, "panic", p, "stack", string(debug.Stack()))
			if !cw.committed {
				writeError(cw, fmt.Errorf("internal error: %v", p))
			}
		}
	}()
	err := h.fn(cw, r)
	if errors.Is(err, errForward) && !cw.committed && !cw.hijacked {
		h.s.forward(w, r)
		return
	}
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		status := cw.code
		if err != nil && !cw.committed && !cw.hijacked {
			status = statusOf(err)
		}
		api.Audit(h.s.audit, r, identityOf(r), status, err)
	}
	if err == nil {
		return
	}
	if statusOf(err) >= 500 && statusOf(err) != http.StatusNotImplemented {
		h.s.log.Error("dockerapi: request failed", "method", r.Method, "path", r.URL.Path, "error", err)
	}
	if !cw.committed && !cw.hijacked {
		writeError(cw, err)
	}
}

// committedWriter remembers whether the status line was sent.
type committedWriter struct {
	http.ResponseWriter
	committed bool
	hijacked  bool
	code      int // the status sent, once committed
}

func (w *committedWriter) WriteHeader(code int) {
	if !w.committed {
		w.code = code
	}
	w.committed = true
	w.ResponseWriter.WriteHeader(code)
}

func (w *committedWriter) Write(b []byte) (int, error) {
	if !w.committed {
		w.code = http.StatusOK
	}
	w.committed = true
	return w.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the flusher and the hijacker.
func (w *committedWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// OpenStreams returns how many streams (attach, logs, events, wait, pull,
// stats) are open now.
func (s *Server) OpenStreams() int { return len(s.streams) }
