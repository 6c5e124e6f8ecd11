package web

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/berth-dev/berth/auth"
)

// Identity is who a token speaks for: the API's (auth.Identity), whose
// Authorize is the one access rule of the dashboard as of the API and the
// Docker endpoint.
type Identity = auth.Identity

// Role is what an identity may do (auth.Role).
type Role = auth.Role

// Roles, from least to most allowed.
const (
	RoleReader   = auth.RoleReader
	RoleOperator = auth.RoleOperator
	RoleAdmin    = auth.RoleAdmin
)

// Authenticator turns a bearer token into the identity it stands for. An
// unknown, revoked or expired token is an error (ErrUnauthenticated or one
// wrapping it); the dashboard asks again on every request, so revoking a
// token ends the sessions signed in with it.
type Authenticator interface {
	Authenticate(ctx context.Context, token string) (Identity, error)
}

// AuthenticatorFunc adapts a function to Authenticator.
type AuthenticatorFunc func(ctx context.Context, token string) (Identity, error)

// Authenticate calls f.
func (f AuthenticatorFunc) Authenticate(ctx context.Context, token string) (Identity, error) {
	return f(ctx, token)
}

// ErrUnauthenticated is the error for a missing, unknown or expired token.
var ErrUnauthenticated = errors.New("web: not signed in")

// Cookie names.
const (
	sessionCookie = "berth_session"
	signinCookie  = "berth_signin"
)

// session is one signed-in browser. The token stays on the server: the
// cookie holds only the session id.
type session struct {
	token   string
	csrf    string
	expires time.Time
}

// sessions holds the signed-in browsers, at most max of them; the oldest
// is forgotten first when full.
type sessions struct {
	ttl time.Duration
	max int

	mu sync.Mutex // guards m
	m  map[string]*session
}

func newSessions(ttl time.Duration, max int) *sessions {
	return &sessions{ttl: ttl, max: max, m: map[string]*session{}}
}

// add starts a session for token and returns its id.
func (s *sessions) add(token string, now time.Time) (string, *session) {
	id := randomToken()
	ses := &session{token: token, csrf: randomToken(), expires: now.Add(s.ttl)}
	s.mu.Lock()
	defer s.mu.Unlock()
	for k, v := range s.m {
		if now.After(v.expires) {
			delete(s.m, k)
		}
	}
	for len(s.m) >= s.max {
		var oldest string
		for k, v := range s.m {
			if oldest == "" || v.expires.Before(s.m[oldest].expires) {
				oldest = k
			}
		}
		delete(s.m, oldest)
	}
	s.m[id] = ses
	return id, ses
}

// get returns the live session with id, or nil.
func (s *sessions) get(id string, now time.Time) *session {
	s.mu.Lock()
	defer s.mu.Unlock()
	ses := s.m[id]
	if ses == nil {
		return nil
	}
	if now.After(ses.expires) {
		delete(s.m, id)
		return nil
	}
	return ses
}

func (s *sessions) remove(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.m, id)
}

// randomToken returns 32 random bytes, base64url.
func randomToken() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b) // crypto/rand.Read never fails (it panics instead).
	return base64.RawURLEncoding.EncodeToString(b)
}

// sameSecret compares two secrets in constant time; empty never matches.
func sameSecret(a, b string) bool {
	return a != "" && subtle.ConstantTimeCompare([]byte(a), []byte(b)) == 1
}

// caller is the identity of a request and how it proved it.
type caller struct {
	Identity
	// csrf is the session's CSRF token; empty for bearer requests, which
	// a browser never sends by itself and so need none.
	csrf      string
	sessionID string
	bearer    bool
}

// bearerToken returns the token of an Authorization: Bearer header.
func bearerToken(r *http.Request) (string, bool) {
	h := r.Header.Get("Authorization")
	scheme, tok, ok := strings.Cut(h, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") || strings.TrimSpace(tok) == "" {
		return "", false
	}
	return strings.TrimSpace(tok), true
}

// authenticate finds the caller of r: a bearer header first, else the
// session cookie.
func (s *Server) authenticate(r *http.Request) (*caller, error) {
	if s.auth == nil {
		return nil, errNoAuth
	}
	if tok, ok := bearerToken(r); ok {
		id, err := s.auth.Authenticate(r.Context(), tok)
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrUnauthenticated, err)
		}
		return &caller{Identity: id, bearer: true}, nil
	}
	c, err := r.Cookie(sessionCookie)
	if err != nil {
		return nil, ErrUnauthenticated
	}
	ses := s.sessions.get(c.Value, s.now())
	if ses == nil {
		return nil, ErrUnauthenticated
	}
	id, err := s.auth.Authenticate(r.Context(), ses.token)
	if err != nil {
		s.sessions.remove(c.Value)
		return nil, fmt.Errorf("%w: %w", ErrUnauthenticated, err)
	}
	return &caller{Identity: id, csrf: ses.csrf, sessionID: c.Value}, nil
}

// checkCSRF refuses a form post of a session whose csrf field is not the
// session's token. Bearer requests pass: a browser never adds the header
// on its own.
func checkCSRF(r *http.Request, c *caller) error {
	if c.bearer {
		return nil
	}
	if !sameSecret(r.PostFormValue("csrf"), c.csrf) {
		return errCSRF
	}
	return nil
}
