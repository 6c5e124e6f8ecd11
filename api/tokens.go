package api

import (
	"fmt"
	"net/http"
	"time"

	"github.com/berth-dev/berth/auth"
	"github.com/berth-dev/berth/driver"
)

// TokenRequest is the body of POST /v1/tokens.
type TokenRequest struct {
	Name       string    `json:"name"`
	Role       auth.Role `json:"role"`
	Namespaces []string  `json:"namespaces,omitempty"`
	// Expires is how long the token is accepted, as a Go duration ("720h");
	// empty means for ever.
	Expires string `json:"expires,omitempty"`
}

// TokenInfo is a token as the API shows it: never its secret or digest.
type TokenInfo struct {
	auth.Identity
	Created time.Time `json:"created"`
	Expires time.Time `json:"expires,omitzero"`
}

// NewToken answers POST /v1/tokens: the token, and its secret, shown this
// once.
type NewToken struct {
	TokenInfo
	Token string `json:"token"`
}

func tokenInfo(t auth.Token) TokenInfo {
	return TokenInfo{Identity: t.Identity, Created: t.Created, Expires: t.Expires}
}

// maxTokenTTL bounds a token's lifetime when one is given.
const maxTokenTTL = 10 * 365 * 24 * time.Hour

func (s *Server) createToken(w http.ResponseWriter, r *http.Request) error {
	var req TokenRequest
	if err := decodeBody(w, r, s.maxBody, &req); err != nil {
		return err
	}
	spec := auth.Spec{Name: req.Name, Role: req.Role, Namespaces: req.Namespaces}
	if req.Expires != "" {
		d, err := time.ParseDuration(req.Expires)
		if err != nil || d <= 0 || d > maxTokenTTL {
			return &driver.FieldError{Path: "expires", Reason: fmt.Sprintf("%q: want a positive duration such as 720h, at most %s", req.Expires, maxTokenTTL)}
		}
		spec.TTL = d
	}
	secret, tok, err := s.tokens.Create(r.Context(), spec)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusCreated, NewToken{TokenInfo: tokenInfo(tok), Token: secret})
}

func (s *Server) listTokens(w http.ResponseWriter, r *http.Request) error {
	list, err := s.tokens.List(r.Context())
	if err != nil {
		return err
	}
	out := make([]TokenInfo, len(list))
	for i, t := range list {
		out[i] = tokenInfo(t)
	}
	return writeJSON(w, http.StatusOK, out)
}

func (s *Server) revokeToken(w http.ResponseWriter, r *http.Request) error {
	tok, err := s.tokens.Revoke(r.Context(), r.PathValue("ref"))
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, tokenInfo(tok))
}

// whoami answers the caller's identity.
func (s *Server) whoami(w http.ResponseWriter, r *http.Request) error {
	return writeJSON(w, http.StatusOK, caller(r))
}
