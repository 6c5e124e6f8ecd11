package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"

	"github.com/berth-dev/berth/api"
	"github.com/berth-dev/berth/config"
	"github.com/berth-dev/berth/dockerapi"
)

// dockerEndpoint is the Docker Engine API listener of berth server
// --docker-listen.
type dockerEndpoint struct {
	// close ends the streams of the endpoint's handler.
	close func()
	http  *http.Server
	ln    net.Listener
	done  chan error
}

// dockerTLS are the --docker-tls-* flags: the endpoint's certificate and
// the CA that signs the client certificates it accepts.
type dockerTLS struct {
	cert, key, ca string
}

// config returns the listener's TLS configuration, nil without --docker-tls-cert.
// With a CA, clients must present a certificate it signed.
func (t dockerTLS) config() (*tls.Config, error) {
	if t.cert == "" && t.key == "" && t.ca == "" {
		return nil, nil
	}
	if t.cert == "" || t.key == "" {
		return nil, usagef("--docker-tls-cert and --docker-tls-key go together")
	}
	pair, err := tls.LoadX509KeyPair(t.cert, t.key)
	if err != nil {
		return nil, fmt.Errorf("--docker-tls-cert: %w", err)
	}
	cfg := &tls.Config{Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12}
	if t.ca != "" {
		pem, err := os.ReadFile(t.ca)
		if err != nil {
			return nil, fmt.Errorf("--docker-tls-ca: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("--docker-tls-ca %s: no certificate in it", t.ca)
		}
		cfg.ClientCAs, cfg.ClientAuth = pool, tls.RequireAndVerifyClientCert
	}
	return cfg, nil
}

// dockerOptions are the Docker endpoint's options for tlsCfg: the same
// tokens as the REST API (auth), or a client certificate tlsCfg verifies
// whose common name names one; with no auth every request is refused.
func dockerOptions(tlsCfg *tls.Config, tokenStreams int, auth dockerapi.Authenticator, maxBody int64, log *slog.Logger) dockerapi.Options {
	certs := tlsCfg != nil && tlsCfg.ClientAuth == tls.RequireAndVerifyClientCert
	return dockerapi.Options{Authenticator: auth, ClientCerts: certs, MaxBodySize: maxBody, TokenStreams: tokenStreams, Logger: log, ServerVersion: api.BuildVersion()}
}

// unixPath returns the socket path of a --docker-listen address that names
// a unix socket (unix://PATH, or any address with a '/').
func unixPath(addr string) (string, bool) {
	if path, ok := strings.CutPrefix(addr, "unix://"); ok {
		return path, true
	}
	return addr, strings.Contains(addr, "/")
}

// listenDocker listens on addr, a host:port or a unix socket path (made
// 0600: only this user reaches it), with TLS when tlsCfg is set, and serves
// h there; closeH ends h's streams at shutdown.
//
// A TCP address off this host without TLS is refused unless insecure, as
// the REST API's listener is: tokens would cross the network in clear.
func listenDocker(addr string, tlsCfg *tls.Config, insecure bool, to config.Timeouts, h http.Handler, closeH func(), log *slog.Logger) (*dockerEndpoint, error) {
	network := "tcp"
	if path, isUnix := unixPath(addr); isUnix {
		network = "unix"
		if fi, err := os.Lstat(path); err == nil {
			if fi.Mode().Type() != fs.ModeSocket {
				return nil, fmt.Errorf("--docker-listen %s: the path exists and is not a socket", addr)
			}
			if c, err := net.Dial("unix", path); err == nil {
				c.Close()
				return nil, fmt.Errorf("--docker-listen %s: another server is listening there", addr)
			}
			_ = os.Remove(path)
		}
		addr = path
	} else if tlsCfg == nil {
		loopback, err := loopbackListen(addr)
		if err != nil {
			return nil, err
		}
		if !loopback && !insecure {
			return nil, usagef("--docker-listen %s is reachable from other machines: serve TLS (--docker-tls-cert and --docker-tls-key), listen on 127.0.0.1 or a unix socket, or pass --insecure to send tokens in clear", addr)
		}
		if !loopback {
			log.Warn("INSECURE: the Docker endpoint listens off this host without TLS; bearer tokens cross the network in clear", "listen", addr)
		}
	}
	ln, err := net.Listen(network, addr)
	if err != nil {
		return nil, fmt.Errorf("--docker-listen: %w", err)
	}
	if network == "unix" {
		if err := os.Chmod(addr, 0o600); err != nil {
			ln.Close()
			return nil, fmt.Errorf("--docker-listen: %w", err)
		}
	}
	if tlsCfg != nil {
		ln = tls.NewListener(ln, tlsCfg)
	}
	e := &dockerEndpoint{close: closeH, ln: ln, done: make(chan error, 1),
		// The REST API's bounds; streams lift the write deadline.
		http: &http.Server{Handler: h, ReadHeaderTimeout: to.ReadHeader, ReadTimeout: to.Read, WriteTimeout: to.Write,
			IdleTimeout: to.Idle, MaxHeaderBytes: 64 << 10, ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)}}
	go func() { e.done <- e.http.Serve(ln) }()
	log.Info("docker endpoint listening", "addr", ln.Addr().String())
	return e, nil
}

// shutdown ends the endpoint's streams, finishes its requests and waits
// for its background work.
func (e *dockerEndpoint) shutdown(ctx context.Context, log *slog.Logger) {
	if e == nil {
		return
	}
	e.close()
	if err := e.http.Shutdown(ctx); err != nil {
		log.Error("docker endpoint shutdown", "error", err)
		_ = e.http.Close()
	}
	if err := <-e.done; err != nil && !errors.Is(err, http.ErrServerClosed) {
		log.Error("docker endpoint", "error", err)
	}
}
