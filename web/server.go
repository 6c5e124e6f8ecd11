// Package web is Berth's dashboard, served by the server itself under
// /ui/: pages rendered with html/template from the control plane, assets
// embedded in the binary, and live updates over server-sent events that a
// small script turns into fresh page regions.
//
// Security: every page needs a signed-in session (a token given once on
// the sign-in page; the session cookie is HttpOnly, SameSite=Strict, and
// Secure where TLS is on) or an Authorization: Bearer header. Without an
// Options.Authenticator every page refuses. What an identity may see and
// do is auth.Identity.Authorize's answer, as for the REST API and the
// Docker endpoint: readers see, operators also act, in their namespaces. Every form carries the session's CSRF token and every
// post is also checked by net/http's cross-origin protection. Secrets of a
// spec (env values, user data, config file contents) are shown as their
// size and SHA-256 digest only; the event streams carry ids and phases,
// never specs.
//
// Bounds: instance tables page like GET /v1/instances; log and event
// streams are capped in number (Options.MaxStreams); a what-if run is
// capped in body size, nodes, instances, time, and runs one at a time.
package web

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/http"
	"runtime/debug"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"

	"github.com/berth-dev/berth/api"
	"github.com/berth-dev/berth/control"
)

//go:embed templates/*.html
var templateFS embed.FS

//go:embed static
var staticFS embed.FS

// Prefix is where the dashboard is mounted.
const Prefix = "/ui/"

// Defaults of Options.
const (
	DefaultSessionTTL  = 12 * time.Hour
	DefaultMaxSessions = 10_000
	DefaultPageSize    = 100
	DefaultMaxStreams  = 64
)

// Failed sign-ins the dashboard takes, from all browsers together, before
// it refuses sign-ins for a moment: a bound on guessing tokens.
const (
	SignInRate  = rate.Limit(5)
	SignInBurst = 20
)

// Options configures a Server.
type Options struct {
	// Authenticator checks tokens. Nil refuses every page: the dashboard
	// starts locked.
	Authenticator Authenticator
	// SecureCookies marks the session cookie Secure even on requests that
	// did not arrive over TLS (a TLS-terminating proxy in front). Requests
	// that arrive over TLS always get Secure cookies.
	SecureCookies bool
	// SessionTTL is how long a sign-in lasts; 0 means DefaultSessionTTL.
	SessionTTL time.Duration
	// MaxSessions caps the signed-in browsers kept; the oldest is signed
	// out first. 0 means DefaultMaxSessions.
	MaxSessions int
	// PageSize is the instance table's page when the query gives no
	// limit; 0 means DefaultPageSize. Limits are at most api.MaxPageSize.
	PageSize int
	// MaxStreams caps the open log and event streams together; 0 means
	// DefaultMaxStreams.
	MaxStreams int
	// Sim bounds the what-if simulator; zero fields take the defaults.
	Sim SimLimits
	// Logger receives errors; nil means slog.Default().
	Logger *slog.Logger
	// AuditLog receives one record per action on an instance (api.Audit,
	// as the API's); nil means Logger.
	AuditLog *slog.Logger
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// Server serves the dashboard over a plane. It is an http.Handler; Run
// follows the plane's events for the live updates and instance histories.
type Server struct {
	plane    *control.Plane
	auth     Authenticator
	secure   bool
	pageSize int
	log      *slog.Logger
	audit    *slog.Logger
	now      func() time.Time
	sessions *sessions
	signins  *rate.Limiter // sign-in attempts, all browsers together
	pages    *pages
	hub      *hub
	sim      *simRunner
	streams  chan struct{} // a slot per open stream
	mux      *http.ServeMux
	cop      *http.CrossOriginProtection
	static   http.Handler
	closing  chan struct{}
	closed   atomic.Bool
}

// New returns the dashboard for plane.
func New(plane *control.Plane, opts Options) (*Server, error) {
	p, err := parsePages()
	if err != nil {
		return nil, err
	}
	if opts.SessionTTL <= 0 {
		opts.SessionTTL = DefaultSessionTTL
	}
	if opts.MaxSessions <= 0 {
		opts.MaxSessions = DefaultMaxSessions
	}
	if opts.PageSize <= 0 {
		opts.PageSize = DefaultPageSize
	}
	if opts.MaxStreams <= 0 {
		opts.MaxStreams = DefaultMaxStreams
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.AuditLog == nil {
		opts.AuditLog = opts.Logger
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	sub, err := fs.Sub(staticFS, "static")
	if err != nil {
		return nil, err
	}
	s := &Server{
		plane: plane, auth: opts.Authenticator, secure: opts.SecureCookies,
		pageSize: min(opts.PageSize, api.MaxPageSize), log: opts.Logger, audit: opts.AuditLog, now: opts.Now,
		sessions: newSessions(opts.SessionTTL, opts.MaxSessions), signins: rate.NewLimiter(SignInRate, SignInBurst), pages: p,
		hub: newHub(), sim: newSimRunner(opts.Sim), streams: make(chan struct{}, opts.MaxStreams),
		mux: http.NewServeMux(), cop: http.NewCrossOriginProtection(),
		static: http.StripPrefix(Prefix+"static/", http.FileServerFS(sub)), closing: make(chan struct{}),
	}
	s.routes()
	return s, nil
}

// Run follows the plane's events until ctx ends, for the pages' live
// updates and the instances' histories, and returns ctx's error. A broken
// watch is opened again after a pause.
func (s *Server) Run(ctx context.Context) error {
	for {
		err := s.plane.Events(ctx, 0, s.hub.publish)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		s.log.Warn("web: following events", "error", err)
		s.hub.reset()
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Second):
		}
	}
}

// CloseStreams ends every open log and event stream, so that a graceful
// shutdown is not held up by browsers.
func (s *Server) CloseStreams() {
	if s.closed.CompareAndSwap(false, true) {
		close(s.closing)
	}
}

func (s *Server) routes() {
	page := func(pattern string, fn handlerFunc) { s.mux.Handle(pattern, handler{s, fn, false}) }
	open := func(pattern string, fn handlerFunc) { s.mux.Handle(pattern, handler{s, fn, true}) }
	open("GET /ui/signin", s.signinPage)
	open("POST /ui/signin", s.signin)
	page("POST /ui/signout", s.signout)
	page("GET /ui/{$}", s.overview)
	page("GET /ui/instances", s.instances)
	page("GET /ui/instances/{ref}", s.instance)
	page("POST /ui/instances/{ref}/{action}", s.act)
	page("GET /ui/instances/{ref}/logs", s.logs)
	page("GET /ui/pending", s.pending)
	page("GET /ui/whatif", s.whatifPage)
	page("POST /ui/whatif", s.whatif)
	page("GET /ui/rebalance", s.rebalance)
	page("GET /ui/events", s.events)
	s.mux.Handle("GET /ui/static/", s.static)
}

// ServeHTTP serves the dashboard. Every response forbids framing, inline
// scripts and content from elsewhere.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Content-Security-Policy", "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; frame-ancestors 'none'; form-action 'self'; base-uri 'none'")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Referrer-Policy", "same-origin")
	if _, pattern := s.mux.Handler(r); pattern == "" {
		s.renderError(w, r, nil, &httpError{http.StatusNotFound, "no such page: " + r.URL.Path})
		return
	}
	s.mux.ServeHTTP(w, r)
}

type handlerFunc func(w http.ResponseWriter, r *http.Request, c *caller) error

// handler authenticates a request, checks posts for cross-origin use,
// and renders the error a page returns.
type handler struct {
	s    *Server
	fn   handlerFunc
	open bool // no sign-in needed (the sign-in page itself)
}

func (h handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s := h.s
	w.Header().Set("Cache-Control", "no-store")
	defer func() {
		if p := recover(); p != nil {
			if p == http.ErrAbortHandler {
				panic(p)
			}
			s.log.Error("web: panic", "method", r.Method, "path", r.URL.Path, "panic", p, "stack", string(debug.Stack()))
			s.renderError(w, r, nil, &httpError{http.StatusInternalServerError, "internal error"})
		}
	}()
	if r.Method == http.MethodPost {
		if err := s.cop.Check(r); err != nil {
			s.renderError(w, r, nil, &httpError{http.StatusForbidden, "cross-origin request refused"})
			return
		}
		r.Body = http.MaxBytesReader(w, r.Body, maxFormSize(r))
	}
	var c *caller
	if !h.open {
		var err error
		if c, err = s.authenticate(r); err != nil {
			s.renderError(w, r, nil, err)
			return
		}
		if r.Method == http.MethodPost {
			// ParseForm first: ParseMultipartForm drops its error for a
			// body that is not multipart.
			if err := r.ParseForm(); err != nil {
				s.renderError(w, r, c, formError(w, err, "reading the form"))
				return
			}
			if err := r.ParseMultipartForm(maxFormSize(r)); err != nil && !errors.Is(err, http.ErrNotMultipart) {
				s.renderError(w, r, c, formError(w, err, "reading the form"))
				return
			}
			if err := checkCSRF(r, c); err != nil {
				s.renderError(w, r, c, err)
				return
			}
		}
	}
	cw := &committedWriter{ResponseWriter: w}
	if err := h.fn(cw, r, c); err != nil {
		if cw.committed {
			return
		}
		s.renderError(w, r, c, err)
	}
}

// formError is the answer to a form whose body could not be read or
// parsed: what the API answers a body it could not read (413 too large,
// 408 too slow), else errBadForm (400).
func formError(w http.ResponseWriter, err error, what string) error {
	re := api.ReadError(w, err)
	if be := (*api.BodyError)(nil); errors.As(re, &be) && !be.Timeout() {
		return fmt.Errorf("%w: %s: %v", errBadForm, what, err)
	}
	return re
}

// maxFormSize bounds a post body: the what-if form carries a workload
// file, the others a few fields.
func maxFormSize(r *http.Request) int64 {
	if r.URL.Path == Prefix+"whatif" {
		return MaxWorkloadSize + 64<<10
	}
	return 64 << 10
}

// committedWriter remembers whether the response started.
type committedWriter struct {
	http.ResponseWriter
	committed bool
}

func (w *committedWriter) WriteHeader(code int) {
	w.committed = true
	w.ResponseWriter.WriteHeader(code)
}

func (w *committedWriter) Write(b []byte) (int, error) {
	w.committed = true
	return w.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the flusher.
func (w *committedWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// The dashboard's own errors; the plane's are mapped by api.ErrorOf.
var (
	errNoAuth   = errors.New("web: the dashboard is locked: this server has no token authentication configured")
	errCSRF     = errors.New("web: the form's CSRF token is missing or wrong: reload the page and try again")
	errDenied   = errors.New("web: your token may not do this")
	errBadForm  = errors.New("web: bad form")
	errBusy     = errors.New("web: too many open streams; close a tab and try again")
	errSimBusy  = errors.New("web: another simulation is running; try again when it ends")
	errNotFound = errors.New("web: not found")
)

// httpError is an error with its status.
type httpError struct {
	status int
	msg    string
}

func (e *httpError) Error() string { return e.msg }

// statusOf maps an error to its HTTP status and the message shown.
func statusOf(err error) (int, string) {
	var he *httpError
	switch {
	case errors.As(err, &he):
		return he.status, he.msg
	case errors.Is(err, errNoAuth):
		return http.StatusServiceUnavailable, err.Error()
	case errors.Is(err, ErrUnauthenticated):
		return http.StatusUnauthorized, "sign in with a token to see this page"
	case errors.Is(err, errCSRF), errors.Is(err, errDenied):
		return http.StatusForbidden, err.Error()
	case errors.Is(err, errBadForm):
		return http.StatusBadRequest, err.Error()
	case errors.Is(err, errBusy), errors.Is(err, errSimBusy):
		return http.StatusTooManyRequests, err.Error()
	case errors.Is(err, errNotFound):
		return http.StatusNotFound, err.Error()
	}
	e := api.ErrorOf(err)
	return e.Status, e.Message
}
