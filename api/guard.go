package api

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"mime"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/time/rate"

	"github.com/berth-dev/berth/auth"
	"github.com/berth-dev/berth/control"
	"github.com/berth-dev/berth/driver"
)

// How a route is protected
//
// Every route is registered in routes() with the auth.Permission it needs:
// auth.Public (the health check only), auth.Read, auth.Operate or
// auth.Admin. Before a handler runs, the request's bearer token is checked
// against Options.Tokens (401 without a valid one), its role against the
// permission (403), and its rate (429 with Retry-After); the handler then
// finds the caller with auth.FromContext. What lives in a namespace is
// checked by the handler: s.visible for one instance, which answers 404 for
// what the caller may not see, as for what does not exist. Other handlers
// of the same server (the dashboard, the Docker endpoint) authenticate with
// the same auth.Tokens.

// Defaults of the request bounds.
const (
	// DefaultRate is the requests per second one token may make.
	DefaultRate = 2000
	// DefaultBurst is how many requests a token may make at once.
	DefaultBurst = 4000
	// DefaultStreams is how many log, stats, event and preload streams one
	// token may hold open at once; the server holds at most 8 times that.
	DefaultStreams = 32
)

// Error codes of access control.
const (
	CodeUnauthenticated = "unauthenticated"
	CodeForbidden       = "forbidden"
	CodeRateLimited     = "rate_limited"
	CodeBadHost         = "bad_host"
	CodeBadOrigin       = "bad_origin"
	CodeMediaType       = "unsupported_media_type"
)

// errRateLimited is a 429 whose Retry-After the handler sets.
var errRateLimited = &Error{Code: CodeRateLimited, Status: http.StatusTooManyRequests, Message: "too many requests for this token: slow down"}

// guard holds the per-token state of the bounds: rate limiters and open
// streams. Its mutex is a leaf: nothing else is locked while it is held.
type guard struct {
	rate    rate.Limit
	burst   int
	streams int // per token; the server's cap is 8 times it

	mu       sync.Mutex
	limiters map[string]*rate.Limiter // by accessor
	open     map[string]int           // streams by accessor
	total    int
}

func newGuard(o Options) *guard {
	g := &guard{rate: rate.Limit(o.Rate), burst: o.Burst, streams: o.MaxStreams,
		limiters: map[string]*rate.Limiter{}, open: map[string]int{}}
	if g.rate == 0 {
		g.rate = DefaultRate
	}
	if g.burst <= 0 {
		g.burst = max(DefaultBurst, int(g.rate))
	}
	if g.streams <= 0 {
		g.streams = DefaultStreams
	}
	return g
}

// allow takes one request from the token's budget, or says how long to wait.
func (g *guard) allow(accessor string) (time.Duration, bool) {
	if g.rate < 0 {
		return 0, true
	}
	g.mu.Lock()
	l := g.limiters[accessor]
	if l == nil {
		if len(g.limiters) >= auth.MaxTokens {
			clear(g.limiters) // tokens come and go; never grow without bound
		}
		l = rate.NewLimiter(g.rate, g.burst)
		g.limiters[accessor] = l
	}
	g.mu.Unlock()
	r := l.Reserve()
	if d := r.Delay(); d > 0 {
		r.Cancel()
		return d, false
	}
	return 0, true
}

// openStream counts one more stream of the token, or refuses it.
func (g *guard) openStream(accessor string) (func(), error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.open[accessor] >= g.streams {
		return nil, &Error{Code: CodeRateLimited, Status: http.StatusTooManyRequests, Message: fmt.Sprintf("this token holds %d streams open already: close some first", g.open[accessor])}
	}
	if g.total >= 8*g.streams {
		return nil, &Error{Code: CodeUnavailable, Status: http.StatusServiceUnavailable, Message: "the server holds as many streams open as it takes: try again later"}
	}
	g.open[accessor]++
	g.total++
	var once sync.Once
	return func() {
		once.Do(func() {
			g.mu.Lock()
			defer g.mu.Unlock()
			if g.open[accessor]--; g.open[accessor] <= 0 {
				delete(g.open, accessor)
			}
			g.total--
		})
	}, nil
}

// authenticate returns the identity of r's bearer token.
func (s *Server) authenticate(r *http.Request) (auth.Identity, error) {
	if s.tokens == nil {
		return auth.Identity{}, &Error{Code: CodeUnauthenticated, Status: http.StatusUnauthorized, Message: "this server has no token authentication configured"}
	}
	secret, ok := bearer(r)
	if !ok && r.TLS != nil && len(r.TLS.VerifiedChains) > 0 {
		// A verified client certificate acts as the token its common
		// name names.
		cn := r.TLS.VerifiedChains[0][0].Subject.CommonName
		id, err := s.tokens.Named(r.Context(), cn)
		if errors.Is(err, auth.ErrUnauthenticated) {
			return auth.Identity{}, &Error{Code: CodeUnauthenticated, Status: http.StatusUnauthorized, Message: fmt.Sprintf("the client certificate's common name %q names no valid token", cn)}
		}
		return id, err
	}
	if !ok {
		return auth.Identity{}, &Error{Code: CodeUnauthenticated, Status: http.StatusUnauthorized, Message: "a bearer token is required (Authorization: Bearer <token>)"}
	}
	id, err := s.tokens.Authenticate(r.Context(), secret)
	if errors.Is(err, auth.ErrUnauthenticated) {
		return auth.Identity{}, &Error{Code: CodeUnauthenticated, Status: http.StatusUnauthorized, Message: "the bearer token is unknown, revoked or expired"}
	}
	return id, err
}

// bearer returns the token of r's Authorization header.
func bearer(r *http.Request) (string, bool) {
	h := r.Header.Get("Authorization")
	scheme, tok, ok := strings.Cut(h, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	tok = strings.TrimSpace(tok)
	return tok, tok != ""
}

// admit checks what every request must satisfy before it is routed: a Host
// this server answers to, no foreign Origin, and a JSON body.
func (s *Server) admit(r *http.Request) *Error {
	if s.loopbackOnly && !loopbackHost(r.Host) {
		return &Error{Code: CodeBadHost, Status: http.StatusMisdirectedRequest, Message: fmt.Sprintf("host %q: this server listens on a loopback address and answers only to loopback host names", r.Host)}
	}
	if o := r.Header.Get("Origin"); o != "" && !slices.Contains(s.origins, o) {
		return &Error{Code: CodeBadOrigin, Status: http.StatusForbidden, Message: fmt.Sprintf("origin %q is not allowed: cross-site requests are refused (allowed_origins in the config file)", o)}
	}
	if r.ContentLength != 0 && r.Body != nil && r.Body != http.NoBody {
		mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
		if err != nil || mt != "application/json" {
			return &Error{Code: CodeMediaType, Status: http.StatusUnsupportedMediaType, Message: fmt.Sprintf("content type %q: a body must be application/json", r.Header.Get("Content-Type"))}
		}
	}
	return nil
}

// loopbackHost reports whether host (a Host header: name or address, with
// or without a port) names this machine's loopback interface.
func loopbackHost(host string) bool {
	h, _, err := net.SplitHostPort(host)
	if err != nil {
		h = strings.Trim(host, "[]")
	}
	if strings.EqualFold(h, "localhost") {
		return true
	}
	ip := net.ParseIP(h)
	return ip != nil && ip.IsLoopback()
}

// guarded runs the checks of a route that needs perm and hands the handler
// a request whose context carries the caller.
func (h handler) guarded(w http.ResponseWriter, r *http.Request) (*http.Request, error) {
	if h.perm == auth.Public {
		return r, nil
	}
	id, err := h.s.authenticate(r)
	if err != nil {
		w.Header().Set("WWW-Authenticate", `Bearer realm="berth"`)
		return nil, err
	}
	if !id.Allows(h.perm) {
		return nil, &Error{Code: CodeForbidden, Status: http.StatusForbidden, Message: fmt.Sprintf("token %q (role %s) may not do this: it needs %s", id.Name, id.Role, h.perm)}
	}
	if wait, ok := h.s.guard.allow(id.Accessor); !ok {
		w.Header().Set("Retry-After", strconv.Itoa(max(1, int((wait+time.Second-1)/time.Second))))
		return nil, errRateLimited
	}
	ctx := context.WithValue(auth.NewContext(r.Context(), id), permKey{}, h.perm)
	return r.WithContext(ctx), nil
}

type permKey struct{}

// permission is what r's route needs, set by its guard.
func permission(r *http.Request) auth.Permission {
	p, _ := r.Context().Value(permKey{}).(auth.Permission)
	return p
}

// audit writes one mutating call to the audit log (Audit).
func (s *Server) audit(r *http.Request, status int, err error) {
	Audit(s.auditLog, r, caller(r), status, err)
}

// Audit writes one mutating call to log as an audit record: who (the
// token's name and accessor, never its secret), what (method and path),
// from where, and how it ended (the status, and the error's message as
// the API shows it). It is the one form of audit record of every surface
// of the server: the REST API, the dashboard and the Docker endpoint.
func Audit(log *slog.Logger, r *http.Request, id auth.Identity, status int, err error) {
	attrs := []slog.Attr{
		slog.String("method", r.Method), slog.String("path", r.URL.Path),
		slog.String("token", id.Name), slog.String("accessor", id.Accessor),
		slog.String("remote", r.RemoteAddr), slog.Int("status", status),
	}
	if err != nil {
		attrs = append(attrs, slog.String("error", toError(err).Message))
	}
	log.LogAttrs(context.WithoutCancel(r.Context()), slog.LevelInfo, "audit", attrs...)
}

// caller returns the identity of r, set by the route's guard.
func caller(r *http.Request) auth.Identity {
	id, _ := auth.FromContext(r.Context())
	return id
}

// visible returns the instance r's {ref} names when the caller may see it;
// otherwise the same not-found error as for an instance that does not
// exist, so that nothing is learnt of other namespaces.
//
// A name is looked up among the caller's namespaces only, and the caller
// must be authorized (auth.Identity.Authorize) for the route's permission
// on the instance's namespace.
func (s *Server) visible(r *http.Request) (control.Instance, error) {
	ref := r.PathValue("ref")
	id := caller(r)
	in, err := s.plane.Lookup(r.Context(), ref, control.ScopeOf(id))
	if err != nil {
		return in, err
	}
	if err := id.Authorize(permission(r), in.Owner); err != nil {
		if errors.Is(err, auth.ErrNotVisible) {
			return control.Instance{}, notFound(ref)
		}
		return control.Instance{}, err
	}
	return in, nil
}

// notFound is the error of an instance ref that names nothing the caller
// may see.
func notFound(ref string) error { return driver.Errorf(driver.ErrNotFound, "instance %q", ref) }

// redacted returns in with its spec redacted: the API never shows secrets.
func redacted(in control.Instance) control.Instance {
	in.Spec = in.Spec.Redacted()
	return in
}

// redactPlaced redacts every instance of ps in place (ps is the caller's).
func redactPlaced(ps []control.Placed) {
	for i := range ps {
		ps[i].Instance = redacted(ps[i].Instance)
	}
}

// Protect serves h, another handler of the same server (metrics), behind
// the API's checks: the request's Host and Origin, and a token that allows
// perm.
func (s *Server) Protect(perm auth.Permission, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if e := s.admit(r); e != nil {
			writeError(w, e)
			return
		}
		r, err := handler{s: s, perm: perm}.guarded(w, r)
		if err != nil {
			writeError(w, toError(err))
			return
		}
		h.ServeHTTP(w, r)
	})
}

// CheckHost serves h only for requests whose Host this server answers to
// (see Options.LoopbackOnly); for handlers with checks of their own
// otherwise (the dashboard's sessions and CSRF tokens).
func (s *Server) CheckHost(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if s.loopbackOnly && !loopbackHost(r.Host) {
			writeError(w, &Error{Code: CodeBadHost, Status: http.StatusMisdirectedRequest, Message: fmt.Sprintf("host %q: this server listens on a loopback address and answers only to loopback host names", r.Host)})
			return
		}
		h.ServeHTTP(w, r)
	})
}
