// Package auth is Berth's access control: bearer tokens with a role and
// namespaces (Nomad's ACL tokens), kept hashed in the state store.
//
// A token has an accessor id, safe to show and to log, and a secret, shown
// once when the token is made and stored only as its SHA-256 digest. A
// request presents the secret as "Authorization: Bearer <secret>"; the
// Tokens it is checked against answer the Identity it stands for.
//
// Roles, from least to most allowed:
//
//	reader    sees the instances, requests and groups of its namespaces, and
//	          the cluster (nodes, providers, drivers, images)
//	operator  also runs, stops, resizes and deletes in its namespaces
//	admin     everything, in every namespace, tokens and preloads included
//
// A namespace is a DNS label. The namespace of a submission is its token's
// (its first, or the one the submission names among the token's); quotas,
// pools and listings are per namespace. Identity.Authorize is the one rule
// of what a token may do to what, applied by every surface of the server
// (the REST API, the Docker endpoint, the dashboard).
package auth

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/berth-dev/berth/driver"
)

// Role is what an identity may do.
type Role string

// Roles.
const (
	RoleReader   Role = "reader"
	RoleOperator Role = "operator"
	RoleAdmin    Role = "admin"
)

// Roles lists the roles from least to most allowed.
var Roles = []Role{RoleReader, RoleOperator, RoleAdmin}

// rank orders roles; an unknown role ranks below every known one.
func (r Role) rank() int { return slices.Index(Roles, r) }

// Valid reports whether r is a known role.
func (r Role) Valid() bool { return r.rank() >= 0 }

// Permission is what a route needs. Each route of the API names one where
// it is registered; see Identity.Allows.
type Permission int

// Permissions.
const (
	// Public needs no token: the health check only.
	Public Permission = iota
	// Read needs any valid token: readers see their namespaces and the
	// cluster.
	Read
	// Operate changes instances in the token's namespaces.
	Operate
	// Admin manages tokens and the cluster itself.
	Admin
)

func (p Permission) String() string {
	switch p {
	case Public:
		return "public"
	case Read:
		return "read"
	case Operate:
		return "operate"
	case Admin:
		return "admin"
	}
	return fmt.Sprintf("Permission(%d)", int(p))
}

// AllNamespaces among an admin token's namespaces means every namespace.
const AllNamespaces = "*"

// Identity is who a request speaks for: a token's public part.
type Identity struct {
	// Accessor is the token's public id; safe to log.
	Accessor string `json:"accessor"`
	// Name is the token's name; safe to log.
	Name       string   `json:"name"`
	Role       Role     `json:"role"`
	Namespaces []string `json:"namespaces"`
}

// Allows reports whether id may use a route that needs p.
func (id Identity) Allows(p Permission) bool {
	switch p {
	case Public:
		return true
	case Read:
		return id.Role.rank() >= RoleReader.rank()
	case Operate:
		return id.Role.rank() >= RoleOperator.rank()
	case Admin:
		return id.Role == RoleAdmin
	}
	return false
}

// Sees reports whether id may see what lives in namespace. Admins see
// every namespace, the empty one (the cluster's own instances: warm pool
// instances not handed out) included.
func (id Identity) Sees(namespace string) bool {
	if id.Role == RoleAdmin || slices.Contains(id.Namespaces, AllNamespaces) {
		return true
	}
	return namespace != "" && slices.Contains(id.Namespaces, namespace)
}

// Authorize is the one access rule of every surface (the REST API, the
// Docker endpoint, the dashboard): whether id may do what needs p to an
// object of namespace ("" is the cluster's own: warm pool instances not
// handed out, groups of none). It answers nil, ErrForbidden when id's role
// does not allow p whatever the object (checked first: it tells nothing of
// the object), or ErrNotVisible when the object lives where id does not
// see, which every surface answers as it answers for an object that does
// not exist. What belongs to no namespace but the cluster as a whole
// (nodes, providers, the simulator) needs only Allows.
func (id Identity) Authorize(p Permission, namespace string) error {
	if !id.Allows(p) {
		return ErrForbidden
	}
	if p != Public && !id.Sees(namespace) {
		return ErrNotVisible
	}
	return nil
}

// All reports whether id sees every namespace.
func (id Identity) All() bool {
	return id.Role == RoleAdmin || slices.Contains(id.Namespaces, AllNamespaces)
}

// DefaultNamespace is where the submissions of a token for every namespace
// land when they name none.
const DefaultNamespace = "default"

// Namespace returns the namespace a submission by id lands in: want when
// given (it must be one of id's), else id's first (DefaultNamespace for a
// token of every namespace).
func (id Identity) Namespace(want string) (string, error) {
	if want == "" {
		if len(id.Namespaces) == 0 || id.Namespaces[0] == AllNamespaces {
			return DefaultNamespace, nil
		}
		return id.Namespaces[0], nil
	}
	if err := ValidName(want); err != nil {
		return "", &driver.FieldError{Path: "namespace", Reason: err.Error()}
	}
	if !id.Sees(want) {
		return "", &driver.FieldError{Path: "namespace", Reason: fmt.Sprintf("%q is not among the namespaces of token %q", want, id.Name)}
	}
	return want, nil
}

// Token is one token as stored: never its secret, only the secret's digest.
type Token struct {
	Identity
	// Digest is the hex SHA-256 of the secret.
	Digest  string    `json:"digest"`
	Created time.Time `json:"created"`
	// Expires is when the token stops being accepted; zero never.
	Expires time.Time `json:"expires,omitzero"`
}

// Expired reports whether t is no longer accepted at now.
func (t *Token) Expired(now time.Time) bool { return !t.Expires.IsZero() && !now.Before(t.Expires) }

// Errors.
var (
	// ErrUnauthenticated: no token, or one that is unknown, revoked or
	// expired. The API answers 401.
	ErrUnauthenticated = errors.New("auth: a valid bearer token is required")
	// ErrForbidden: the token is valid but its role may not do this. The
	// API answers 403. What a token may not see is answered as not found
	// instead, so that it learns nothing of other namespaces.
	ErrForbidden = errors.New("auth: the token's role does not allow this")
	// ErrNotVisible: the object lives in a namespace the token does not
	// see. Every surface answers it as not found (404), with the same
	// message as for an object that does not exist.
	ErrNotVisible = errors.New("auth: not in the token's namespaces")
)

// secretPrefix starts every secret, so that a leaked one is recognisable
// (and scanners can find it).
const secretPrefix = "berth_"

// newSecret returns a fresh secret: 256 random bits.
func newSecret() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b) // never fails (crypto/rand)
	return secretPrefix + base64.RawURLEncoding.EncodeToString(b)
}

// newAccessor returns a fresh accessor id: 96 random bits in hex.
func newAccessor() string {
	b := make([]byte, 12)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// Digest returns the hex SHA-256 of secret.
func Digest(secret string) string {
	s := sha256.Sum256([]byte(secret))
	return hex.EncodeToString(s[:])
}

// MaxSecretSize bounds what Authenticate hashes.
const MaxSecretSize = 256

var dnsLabel = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)

// ValidName checks a namespace, provider or pool name: a DNS label (RFC
// 1123): 1 to 63 lower-case letters, digits and '-', starting and ending
// with a letter or digit.
func ValidName(s string) error {
	if len(s) == 0 || len(s) > 63 || !dnsLabel.MatchString(s) {
		return fmt.Errorf("%q: want a DNS label (1 to 63 of a-z, 0-9 and '-', starting and ending with a letter or digit)", s)
	}
	return nil
}

// validTokenName checks a token's name: a DNS label, or several joined by
// '.' (like a host name), at most 253 bytes.
func validTokenName(s string) error {
	if len(s) == 0 || len(s) > 253 {
		return fmt.Errorf("%q: want 1 to 253 bytes", s)
	}
	for part := range strings.SplitSeq(s, ".") {
		if ValidName(part) != nil {
			return fmt.Errorf("%q: want DNS labels joined by '.' (a-z, 0-9 and '-')", s)
		}
	}
	return nil
}

// Spec is what a new token is made from.
type Spec struct {
	Name       string
	Role       Role
	Namespaces []string
	// TTL is how long the token is accepted; zero means for ever.
	TTL time.Duration
}

// Validate checks s; every error names its field.
func (s *Spec) Validate() error {
	var es driver.FieldErrors
	if err := validTokenName(s.Name); err != nil {
		es = append(es, &driver.FieldError{Path: "name", Reason: err.Error()})
	}
	if !s.Role.Valid() {
		es = append(es, &driver.FieldError{Path: "role", Reason: fmt.Sprintf("%q: want reader, operator or admin", s.Role)})
	}
	if len(s.Namespaces) == 0 && s.Role != RoleAdmin {
		es = append(es, &driver.FieldError{Path: "namespaces", Reason: "a reader or operator token needs at least one namespace"})
	}
	if len(s.Namespaces) > MaxNamespaces {
		es = append(es, &driver.FieldError{Path: "namespaces", Reason: fmt.Sprintf("%d: at most %d", len(s.Namespaces), MaxNamespaces)})
	}
	seen := map[string]bool{}
	for i, ns := range s.Namespaces {
		path := fmt.Sprintf("namespaces[%d]", i)
		if ns == AllNamespaces {
			if s.Role != RoleAdmin && s.Role != RoleReader {
				es = append(es, &driver.FieldError{Path: path, Reason: `"*" (every namespace) is for admin and reader tokens`})
			}
		} else if err := ValidName(ns); err != nil {
			es = append(es, &driver.FieldError{Path: path, Reason: err.Error()})
		}
		if seen[ns] {
			es = append(es, &driver.FieldError{Path: path, Reason: fmt.Sprintf("%q is given twice", ns)})
		}
		seen[ns] = true
	}
	if s.TTL < 0 {
		es = append(es, &driver.FieldError{Path: "expires", Reason: fmt.Sprintf("%s: must not be negative", s.TTL)})
	}
	return es.Err()
}

// MaxNamespaces bounds the namespaces of one token.
const MaxNamespaces = 64

// MaxTokens bounds the tokens a cluster keeps.
const MaxTokens = 10_000

type ctxKey struct{}

// NewContext returns ctx carrying id, the caller of a request.
func NewContext(ctx context.Context, id Identity) context.Context {
	return context.WithValue(ctx, ctxKey{}, id)
}

// FromContext returns the caller ctx carries, set by NewContext.
func FromContext(ctx context.Context) (Identity, bool) {
	id, ok := ctx.Value(ctxKey{}).(Identity)
	return id, ok
}
