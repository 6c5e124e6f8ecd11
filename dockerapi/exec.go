package dockerapi

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/moby/moby/api/types/container"

	"github.com/berth-dev/berth/api"
	"github.com/berth-dev/berth/auth"
	"github.com/berth-dev/berth/control"
	"github.com/berth-dev/berth/driver"
)

// execRec is one exec made by POST /containers/{id}/exec, kept until
// maxNew newer ones push it out once it has ended.
type execRec struct {
	id, container, owner string
	opts                 driver.ExecOptions
	stdin, stdout        bool
	stderr               bool

	// Guarded by Server.mu.
	started, running bool
	exitCode         *int
	size             driver.TTYSize      // asked for before the start
	sizes            chan driver.TTYSize // while it runs (tty only)
	at               time.Time
}

// execCreate makes an exec in a running container (docker exec): the
// command is checked and the container's provider must be able to run
// it, or the exec is refused now, by name, rather than at its start.
func (s *Server) execCreate(w http.ResponseWriter, r *http.Request) error {
	body, err := api.ReadBody(w, r.Body)
	if err != nil {
		return err
	}
	var req container.ExecCreateRequest
	if err := json.Unmarshal(body, &req); err != nil {
		return badRequest("decode the exec: %v", err)
	}
	if req.Privileged {
		return unsupported("docker exec --privileged: Berth runs commands with the container's own privileges")
	}
	if req.DetachKeys != "" {
		return unsupported("--detach-keys: Berth detaches with the back-end's keys")
	}
	opts := driver.ExecOptions{Cmd: req.Cmd, Env: req.Env, User: req.User, WorkDir: req.WorkingDir, TTY: req.Tty}
	if req.ConsoleSize != nil && req.Tty {
		opts.Size = driver.TTYSize{Rows: uint16(min(req.ConsoleSize[0], 65535)), Cols: uint16(min(req.ConsoleSize[1], 65535))}
	}
	if err := control.CheckExecOptions(&opts); err != nil {
		return err
	}
	c, err := s.find(r, r.PathValue("id"))
	if err != nil {
		return err
	}
	if c.created != nil {
		return &httpError{http.StatusConflict, "container " + c.id + " is not running"}
	}
	if ended(c.in) {
		return &httpError{http.StatusConflict, "container " + c.id + " is not running"}
	}
	if err := s.plane.CanExec(c.id); err != nil {
		return err
	}
	if opts.User != "" {
		// Refused now, as the plane's exec would refuse it at start: the
		// namespace's run-as policy binds an exec's user too.
		user, group, _ := strings.Cut(opts.User, ":")
		if err := s.plane.CheckSubmitter(r.Context(), &driver.Spec{User: user, Group: group}, c.in.Owner); err != nil {
			return err
		}
	}
	var b [32]byte
	_, _ = rand.Read(b[:])
	x := &execRec{id: hex.EncodeToString(b[:]), container: c.id, owner: c.in.Owner, opts: opts,
		stdin: req.AttachStdin, stdout: req.AttachStdout, stderr: req.AttachStderr, at: time.Now()}
	if opts.TTY {
		x.sizes = make(chan driver.TTYSize, 1)
		x.opts.Resize = x.sizes
	}
	s.mu.Lock()
	if len(s.execs) >= s.maxNew {
		// The oldest exec that has ended makes room.
		var oldest *execRec
		for _, e := range s.execs {
			if e.exitCode != nil || !e.started && time.Since(e.at) > time.Hour {
				if oldest == nil || e.at.Before(oldest.at) {
					oldest = e
				}
			}
		}
		if oldest == nil {
			s.mu.Unlock()
			return &httpError{http.StatusServiceUnavailable, "too many execs (at most " + strconv.Itoa(s.maxNew) + "); try again when some have ended"}
		}
		delete(s.execs, oldest.id)
	}
	s.execs[x.id] = x
	s.mu.Unlock()
	return writeJSON(w, http.StatusCreated, container.ExecCreateResponse{ID: x.id})
}

// findExec returns the exec id when r's caller may act on its container.
func (s *Server) findExec(r *http.Request) (*execRec, error) {
	id := r.PathValue("id")
	s.mu.Lock()
	x, ok := s.execs[id]
	s.mu.Unlock()
	if !ok || !authorized(r, x.owner) {
		return nil, &httpError{http.StatusNotFound, "No such exec instance: " + id}
	}
	return x, nil
}

// execStart runs an exec: detached, in the background with its output
// dropped (docker exec -d); else over a hijacked connection, as attach is
// served: raw with a terminal, the multiplexed framing otherwise, with the
// client's input when the exec takes it. The exit code is kept before the
// stream ends, for the inspect that follows.
func (s *Server) execStart(w http.ResponseWriter, r *http.Request) error {
	body, err := api.ReadBody(w, r.Body)
	if err != nil {
		return err
	}
	var req container.ExecStartRequest
	if len(body) > 0 {
		if err := json.Unmarshal(body, &req); err != nil {
			return badRequest("decode the exec start: %v", err)
		}
	}
	x, err := s.findExec(r)
	if err != nil {
		return err
	}
	s.mu.Lock()
	if x.started {
		s.mu.Unlock()
		return &httpError{http.StatusConflict, "exec " + x.id + " has already been started"}
	}
	x.started, x.running = true, true
	if x.size != (driver.TTYSize{}) {
		x.opts.Size = x.size
	}
	s.mu.Unlock()
	if req.Detach {
		ctx, cancel := s.until(auth.NewContext(context.Background(), identityOf(r)))
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			defer cancel()
			s.runExec(ctx, x, nil, io.Discard, io.Discard)
		}()
		w.WriteHeader(http.StatusOK)
		return nil
	}
	release, err := s.acquire(w, r)
	if err != nil {
		s.endExec(x, -1)
		return err
	}
	defer release()
	conn, in, err := takeOver(w, r)
	if err != nil {
		s.endExec(x, -1)
		return nil
	}
	defer conn.Close()
	ctx, cancel := s.until(auth.NewContext(context.Background(), identityOf(r)))
	defer cancel()
	stdin, closeIn := readInput(in, x.stdin, cancel)
	defer closeIn()
	out, errw := outputs(conn, x.opts.TTY, x.stdout, x.stderr)
	if code, err := s.runExec(ctx, x, stdin, out, errw); err != nil && ctx.Err() == nil && code < 0 {
		msg := []byte("berth: " + err.Error() + "\n")
		if x.opts.TTY {
			_, _ = out.Write(msg)
		} else {
			_, _ = muxStream{&muxWriter{w: conn}, streamStderr}.Write(msg)
		}
	}
	return nil
}

// runExec runs x through the plane and records its end.
func (s *Server) runExec(ctx context.Context, x *execRec, stdin io.Reader, stdout, stderr io.Writer) (int, error) {
	code, err := s.plane.Exec(ctx, x.container, x.opts, stdin, stdout, stderr)
	if err != nil {
		code = -1
		if ctx.Err() == nil {
			s.log.Warn("dockerapi: exec", "container", x.container, "exec", x.id, "error", err)
		}
	}
	s.endExec(x, code)
	return code, err
}

func (s *Server) endExec(x *execRec, code int) {
	s.mu.Lock()
	x.running = false
	if code < 0 {
		code = 126
	}
	x.exitCode = &code
	s.mu.Unlock()
}

// execInspect describes an exec; docker exec reads its exit code here once
// the stream has ended.
func (s *Server) execInspect(w http.ResponseWriter, r *http.Request) error {
	x, err := s.findExec(r)
	if err != nil {
		return err
	}
	s.mu.Lock()
	resp := container.ExecInspectResponse{
		ID: x.id, Running: x.running, ExitCode: x.exitCode, ContainerID: x.container,
		OpenStdin: x.stdin, OpenStdout: x.stdout, OpenStderr: x.stderr,
		ProcessConfig: &container.ExecProcessConfig{Tty: x.opts.TTY, Entrypoint: x.opts.Cmd[0], Arguments: x.opts.Cmd[1:], User: x.opts.User},
	}
	s.mu.Unlock()
	return writeJSON(w, http.StatusOK, resp)
}

// execResize sets the size of an exec's terminal; one asked for before the
// start is its size at the start.
func (s *Server) execResize(w http.ResponseWriter, r *http.Request) error {
	size, err := sizeParams(r)
	if err != nil {
		return err
	}
	x, err := s.findExec(r)
	if err != nil {
		return err
	}
	if !x.opts.TTY {
		return &httpError{http.StatusConflict, "exec " + x.id + " has no terminal (run it with -t)"}
	}
	if size.Rows == 0 || size.Cols == 0 {
		w.WriteHeader(http.StatusOK)
		return nil
	}
	s.mu.Lock()
	if !x.started {
		x.size = size
	} else if x.running {
		select {
		case <-x.sizes:
		default:
		}
		x.sizes <- size
	}
	s.mu.Unlock()
	w.WriteHeader(http.StatusOK)
	return nil
}
