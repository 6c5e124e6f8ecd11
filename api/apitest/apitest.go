// Package apitest serves Berth's REST API over a real control plane with a
// sim back-end, for the tests of the API and of its clients.
package apitest

import (
	"context"
	"log/slog"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/berth-dev/berth/api"
	"github.com/berth-dev/berth/api/client"
	"github.com/berth-dev/berth/auth"
	"github.com/berth-dev/berth/control"
	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/driver/drivertest"
	_ "github.com/berth-dev/berth/drivers/sim" // the back-end Start opens
	"github.com/berth-dev/berth/provider"
	"github.com/berth-dev/berth/store"
)

// Env is a running API: the server, its HTTP listener and the plane
// behind it.
type Env struct {
	API   *api.Server
	HTTP  *httptest.Server
	Plane *control.Plane
	// Tokens are the server's tokens; Token is the secret of an admin
	// token made by Start.
	Tokens *auth.Tokens
	Token  string
}

// NewToken makes a token and returns its secret.
func (e *Env) NewToken(tb testing.TB, name string, role auth.Role, namespaces ...string) string {
	tb.Helper()
	secret, _, err := e.Tokens.Create(context.Background(), auth.Spec{Name: name, Role: role, Namespaces: namespaces})
	if err != nil {
		tb.Fatal(err)
	}
	return secret
}

// Client returns a client of the server with token secret (the admin
// token when secret is "").
func (e *Env) Client(tb testing.TB, secret string, opts ...client.Option) *client.Client {
	tb.Helper()
	if secret == "" {
		secret = e.Token
	}
	c, err := client.New(e.HTTP.URL, append([]client.Option{client.WithToken(secret)}, opts...)...)
	if err != nil {
		tb.Fatal(err)
	}
	return c
}

// Start opens a sim back-end with simOpts as the provider "sim" of cluster
// "test", runs a control plane over it and st, and serves the API with
// opts; unless opts.Tokens is set, the tokens are kept in st. Start makes
// an admin token (Env.Token). When tb ends the streams, the listener, the plane, the provider and
// st are closed, in that order.
func Start(tb testing.TB, st store.Store, simOpts map[string]any, opts api.Options) *Env {
	tb.Helper()
	return StartWith(tb, st, simOpts, opts, nil)
}

// StartBare is Start over a provider named "plain" whose driver is the sim
// with every optional capability hidden (drivertest.Bare): instances run,
// and suspend, usage, logs and the like are refused as unsupported.
func StartBare(tb testing.TB, st store.Store, simOpts map[string]any, opts api.Options) *Env {
	tb.Helper()
	return StartWith(tb, st, simOpts, opts, func(c *control.Config) {
		// The sim's own provider still closes the driver.
		p, err := provider.New(drivertest.Bare(c.Providers[0].Driver()), provider.Config{Name: "plain"})
		if err != nil {
			tb.Fatal(err)
		}
		c.Providers = []*provider.Provider{p}
	})
}

// SimProvider opens a sim provider named "sim" of the cluster "test" with
// the given options. The caller closes it.
func SimProvider(tb testing.TB, simOpts map[string]any) *provider.Provider {
	tb.Helper()
	def, err := driver.Lookup("sim")
	if err != nil {
		tb.Fatal(err)
	}
	d, err := def.Open(context.Background(), simOpts, driver.Env{Provider: "sim", Cluster: "test"})
	if err != nil {
		tb.Fatal(err)
	}
	p, err := provider.New(d, provider.Config{Name: "sim"})
	if err != nil {
		tb.Fatal(err)
	}
	return p
}

// StartWith is Start with tune applied to the plane's configuration.
func StartWith(tb testing.TB, st store.Store, simOpts map[string]any, opts api.Options, tune func(*control.Config)) *Env {
	tb.Helper()
	ctx := context.Background()
	p := SimProvider(tb, simOpts)
	cfg := control.Config{Store: st, Providers: []*provider.Provider{p}, Cluster: "test"}
	if tune != nil {
		tune(&cfg)
	}
	plane, err := control.New(ctx, cfg)
	if err != nil {
		_ = p.Close(ctx)
		tb.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = plane.Run(runCtx)
	}()
	if opts.AuditLog == nil {
		opts.AuditLog = slog.New(slog.DiscardHandler)
	}
	tokens := opts.Tokens
	if tokens == nil {
		tokens = auth.NewTokens(st, nil)
		opts.Tokens = tokens
	}
	// A store started on again holds the admin tokens of the starts
	// before: each start makes its own.
	admin, _, err := tokens.Create(ctx, auth.Spec{Name: "test-admin-" + strconv.FormatInt(time.Now().UnixNano(), 36), Role: auth.RoleAdmin})
	if err != nil {
		cancel()
		<-done
		_ = p.Close(ctx)
		tb.Fatal(err)
	}
	s := api.New(plane, opts)
	hs := httptest.NewServer(s)
	tb.Cleanup(func() {
		s.CloseStreams()
		hs.Close()
		cancel()
		<-done
		_ = p.Close(ctx)
		_ = st.Close()
	})
	return &Env{API: s, HTTP: hs, Plane: plane, Tokens: tokens, Token: admin}
}
