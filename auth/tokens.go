package auth

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/store"
)

// PrefixTokens holds one Token per digest, as PrefixTokens+<digest>.
const PrefixTokens = "/berth/tokens/"

// CacheFor is how long a token read from the store is trusted before it is
// read again. A token revoked through this Tokens stops working at once;
// one revoked through another server sharing the store, within CacheFor.
const CacheFor = 2 * time.Second

// Tokens checks secrets against the tokens kept in a store, and makes and
// revokes them. It is safe for concurrent use.
type Tokens struct {
	st  store.Store
	now func() time.Time

	// mu guards cache. It is never held across a store call.
	mu    sync.Mutex
	cache map[string]cached // by digest
}

type cached struct {
	tok  *Token // nil: no such token
	read time.Time
}

// maxCached bounds the cache; unknown secrets are cached too (briefly), so
// a flood of bad tokens cannot grow it without bound.
const maxCached = 4 * MaxTokens

// NewTokens returns the tokens kept in st. now is the clock; nil means
// time.Now.
func NewTokens(st store.Store, now func() time.Time) *Tokens {
	if now == nil {
		now = time.Now
	}
	return &Tokens{st: st, now: now, cache: map[string]cached{}}
}

// Authenticate returns the identity secret stands for, or an error wrapping
// ErrUnauthenticated when it is empty, unknown, revoked or expired.
func (t *Tokens) Authenticate(ctx context.Context, secret string) (Identity, error) {
	if secret == "" || len(secret) > MaxSecretSize {
		return Identity{}, ErrUnauthenticated
	}
	d := Digest(secret)
	now := t.now()
	t.mu.Lock()
	c, ok := t.cache[d]
	t.mu.Unlock()
	if !ok || now.Sub(c.read) >= CacheFor || now.Before(c.read) {
		tok, err := t.get(ctx, d)
		if err != nil && !errors.Is(err, store.ErrNotFound) {
			return Identity{}, err
		}
		c = cached{tok: tok, read: now}
		t.mu.Lock()
		if len(t.cache) >= maxCached {
			clear(t.cache)
		}
		t.cache[d] = c
		t.mu.Unlock()
	}
	if c.tok == nil || c.tok.Expired(now) {
		return Identity{}, ErrUnauthenticated
	}
	return c.tok.Identity, nil
}

// get reads one token by digest; store.ErrNotFound when there is none.
func (t *Tokens) get(ctx context.Context, digest string) (*Token, error) {
	kv, err := t.st.Get(ctx, PrefixTokens+digest)
	if err != nil {
		return nil, err
	}
	var tok Token
	if err := json.Unmarshal(kv.Value, &tok); err != nil {
		return nil, fmt.Errorf("auth: token %s: %w", digest[:12], err)
	}
	return &tok, nil
}

// Create makes a token from s and returns its secret, which is never kept:
// the caller shows it once. A name already taken is driver.ErrAlreadyExists.
func (t *Tokens) Create(ctx context.Context, s Spec) (string, Token, error) {
	if err := s.Validate(); err != nil {
		return "", Token{}, err
	}
	for range 10 {
		secret, tok, done, err := t.create(ctx, s)
		if done || err != nil {
			return secret, tok, err
		}
	}
	return "", Token{}, fmt.Errorf("auth: the tokens keep changing: try again")
}

// create is one attempt of Create; done is false when another change of
// the tokens came first.
func (t *Tokens) create(ctx context.Context, s Spec) (string, Token, bool, error) {
	list, rev, err := t.list(ctx)
	if err != nil {
		return "", Token{}, false, err
	}
	if len(list) >= MaxTokens {
		return "", Token{}, false, &driver.FieldError{Path: "name", Reason: fmt.Sprintf("this cluster keeps at most %d tokens: revoke some first", MaxTokens)}
	}
	for _, o := range list {
		if o.Name == s.Name {
			return "", Token{}, false, fmt.Errorf("%w: %w", &driver.FieldError{Path: "name", Reason: fmt.Sprintf("a token named %q exists (accessor %s)", s.Name, o.Accessor)}, driver.ErrAlreadyExists)
		}
	}
	secret := newSecret()
	now := t.now().UTC()
	tok := Token{
		Identity: Identity{Accessor: newAccessor(), Name: s.Name, Role: s.Role, Namespaces: slices.Clone(s.Namespaces)},
		Digest:   Digest(secret), Created: now,
	}
	if tok.Namespaces == nil {
		tok.Namespaces = []string{}
	}
	if s.Role == RoleAdmin && len(tok.Namespaces) == 0 {
		tok.Namespaces = []string{AllNamespaces}
	}
	if s.TTL > 0 {
		tok.Expires = now.Add(s.TTL)
	}
	b, err := json.Marshal(&tok)
	if err != nil {
		return "", Token{}, false, err
	}
	// The names are unique: the transaction fails if any token changed
	// since the listing, and Create then lists again.
	res, err := t.st.Txn(ctx, []store.Cmp{{Key: PrefixTokens + tok.Digest}, {Key: tokensGuard, ModRevision: rev}}, []store.Op{store.Put(PrefixTokens+tok.Digest, b), store.Put(tokensGuard, []byte(tok.Accessor))})
	if err != nil {
		return "", Token{}, false, err
	}
	if !res.Succeeded {
		return "", Token{}, false, nil
	}
	t.forget(tok.Digest)
	return secret, tok, true, nil
}

// tokensGuard is a key every change of the tokens rewrites, so that a
// transaction can check that none changed since a listing.
const tokensGuard = "/berth/tokens-changed"

// list returns every token, sorted by name, and the guard's mod revision.
func (t *Tokens) list(ctx context.Context) ([]Token, int64, error) {
	// The guard first: a change that lands between the two reads leaves
	// the guard older than the listing, so a transaction comparing it
	// fails rather than act on a listing that misses the change.
	guard := int64(0)
	if kv, err := t.st.Get(ctx, tokensGuard); err == nil {
		guard = kv.ModRevision
	} else if !errors.Is(err, store.ErrNotFound) {
		return nil, 0, err
	}
	kvs, _, err := t.st.List(ctx, PrefixTokens)
	if err != nil {
		return nil, 0, err
	}
	out := make([]Token, 0, len(kvs))
	for _, kv := range kvs {
		var tok Token
		if err := json.Unmarshal(kv.Value, &tok); err != nil {
			return nil, 0, fmt.Errorf("auth: %s: %w", kv.Key, err)
		}
		out = append(out, tok)
	}
	slices.SortFunc(out, func(a, b Token) int { return strings.Compare(a.Name, b.Name) })
	return out, guard, nil
}

// List returns every token, sorted by name. Tokens hold no secrets.
func (t *Tokens) List(ctx context.Context) ([]Token, error) {
	list, _, err := t.list(ctx)
	return list, err
}

// Revoke deletes the token whose accessor id or name is ref; it stops being
// accepted at once here (within CacheFor on other servers sharing the
// store). An unknown ref is driver.ErrNotFound.
func (t *Tokens) Revoke(ctx context.Context, ref string) (Token, error) {
	list, _, err := t.list(ctx)
	if err != nil {
		return Token{}, err
	}
	i := slices.IndexFunc(list, func(tok Token) bool { return tok.Accessor == ref || tok.Name == ref })
	if i < 0 {
		return Token{}, fmt.Errorf("token %q: %w", ref, driver.ErrNotFound)
	}
	tok := list[i]
	if _, err := t.st.Txn(ctx, nil, []store.Op{store.Delete(PrefixTokens + tok.Digest), store.Put(tokensGuard, []byte(tok.Accessor))}); err != nil {
		return Token{}, err
	}
	t.forget(tok.Digest)
	return tok, nil
}

func (t *Tokens) forget(digest string) {
	t.mu.Lock()
	delete(t.cache, digest)
	t.mu.Unlock()
}

// BootstrapFile is the name of the file in the data directory that holds
// the first admin token's secret.
const BootstrapFile = "admin.token"

// Bootstrap makes the first admin token when the store has no token at
// all, and writes its secret to path (mode 0600). It reports whether it
// made one. Once any token exists it does nothing, so the secret is written
// only once. A file left at path from a store since removed names no token
// and is replaced.
func (t *Tokens) Bootstrap(ctx context.Context, path string) (bool, error) {
	list, _, err := t.list(ctx)
	if err != nil {
		return false, err
	}
	if len(list) > 0 {
		return false, nil
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return false, err
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return false, err
	}
	// O_EXCL: never write through a link someone put there.
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return false, err
	}
	secret, tok, err := t.Create(ctx, Spec{Name: "bootstrap", Role: RoleAdmin})
	if errors.Is(err, driver.ErrAlreadyExists) {
		// Another server on the same store made it first.
		_ = f.Close()
		_ = os.Remove(path)
		return false, nil
	}
	if err == nil {
		if _, err = f.WriteString(secret + "\n"); err == nil {
			err = f.Sync()
		}
		if err != nil {
			// Nobody could use it: take it back, so the next start
			// makes another.
			_, _ = t.Revoke(context.WithoutCancel(ctx), tok.Accessor)
		}
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		_ = os.Remove(path)
		return false, err
	}
	return true, nil
}

// Named returns the identity of the token named name (for a client
// certificate whose common name names it), or an error wrapping
// ErrUnauthenticated when there is none or it expired.
func (t *Tokens) Named(ctx context.Context, name string) (Identity, error) {
	list, _, err := t.list(ctx)
	if err != nil {
		return Identity{}, err
	}
	i := slices.IndexFunc(list, func(tok Token) bool { return tok.Name == name })
	if i < 0 || list[i].Expired(t.now()) {
		return Identity{}, ErrUnauthenticated
	}
	return list[i].Identity, nil
}
