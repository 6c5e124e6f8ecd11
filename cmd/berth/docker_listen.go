package main

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/berth-dev/berth/api"
	"github.com/berth-dev/berth/control"
	"github.com/berth-dev/berth/dockerapi"
)

// dockerEndpoint is the Docker Engine API listener of berth server
// --docker-listen.
type dockerEndpoint struct {
	srv  *dockerapi.Server
	http *http.Server
	ln   net.Listener
	done chan error
}

// listenDocker listens on addr, a host:port or a unix socket path (made
// 0600: only this user reaches it). The endpoint refuses every request
// until auth is given.
func listenDocker(addr string, plane *control.Plane, auth dockerapi.Authenticator, maxBody int64, log *slog.Logger) (*dockerEndpoint, error) {
	network := "tcp"
	path, isUnix := strings.CutPrefix(addr, "unix://")
	if isUnix || strings.Contains(addr, "/") {
		network = "unix"
		if !isUnix {
			path = addr
		}
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
	srv := dockerapi.New(plane, dockerapi.Options{Authenticator: auth, MaxBodySize: maxBody, Logger: log, ServerVersion: api.BuildVersion()})
	e := &dockerEndpoint{srv: srv, ln: ln, done: make(chan error, 1),
		http: &http.Server{Handler: srv, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute, ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)}}
	go func() { e.done <- e.http.Serve(ln) }()
	if auth == nil {
		log.Warn("the Docker endpoint has no token authentication and refuses every request", "addr", ln.Addr().String())
	}
	log.Info("docker endpoint listening", "addr", ln.Addr().String())
	return e, nil
}

// shutdown ends the endpoint's streams, finishes its requests and waits
// for its background work.
func (e *dockerEndpoint) shutdown(ctx context.Context, log *slog.Logger) {
	if e == nil {
		return
	}
	e.srv.Close()
	if err := e.http.Shutdown(ctx); err != nil {
		log.Error("docker endpoint shutdown", "error", err)
		_ = e.http.Close()
	}
	if err := <-e.done; err != nil && !errors.Is(err, http.ErrServerClosed) {
		log.Error("docker endpoint", "error", err)
	}
}
