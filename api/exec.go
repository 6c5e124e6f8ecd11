package api

import (
	"io"
	"net/http"
	"strings"

	"github.com/berth-dev/berth/control"
	"github.com/berth-dev/berth/driver"
)

// ExecRequest is the body of POST /v1/instances/{ref}/exec: the command to
// run in the instance and how. Its bounds are control's (MaxExecWords,
// MaxExecEnv, MaxExecBytes ...).
type ExecRequest struct {
	// Cmd is the command and its arguments; required.
	Cmd []string `json:"cmd"`
	// Env holds NAME=value entries set over the instance's environment.
	Env []string `json:"env,omitempty"`
	// User runs the command as another user than the instance's.
	User string `json:"user,omitempty"`
	// WorkDir is the working directory; empty means the instance's.
	WorkDir string `json:"workdir,omitempty"`
	// TTY runs the command on a terminal: its output all comes as
	// FrameStdout, and FrameResize sets the terminal's size.
	TTY bool `json:"tty,omitempty"`
	// Stdin forwards the caller's FrameStdin to the command's input; the
	// command's input is empty otherwise.
	Stdin bool `json:"stdin,omitempty"`
	// Size is the terminal's size at the start (TTY only).
	Size *driver.TTYSize `json:"size,omitempty"`
}

// ExitStatus is the payload of FrameExit.
type ExitStatus struct {
	ExitCode int `json:"exit_code"`
}

// exec runs a command in an instance over the attach stream's framing
// (AttachProtocol): the request's body is an ExecRequest, the caller's
// frames are the command's input and its terminal's sizes, the server's
// its output, then FrameExit with the exit code, or FrameError with what
// ended it otherwise. The command is refused before the upgrade when it is
// out of bounds or the instance's provider cannot exec.
func (s *Server) exec(w http.ResponseWriter, r *http.Request) error {
	if err := onlyParams(r.URL.Query()); err != nil {
		return err
	}
	if !headerHas(r.Header, "Connection", "upgrade") || !strings.EqualFold(r.Header.Get("Upgrade"), AttachProtocol) {
		return &Error{Code: CodeUpgradeRequired, Status: http.StatusUpgradeRequired, Message: "exec is a two-way stream: ask for it with Connection: Upgrade and Upgrade: " + AttachProtocol}
	}
	var req ExecRequest
	if err := decodeBody(w, r, s.maxBody, &req); err != nil {
		return err
	}
	opts := driver.ExecOptions{Cmd: req.Cmd, Env: req.Env, User: req.User, WorkDir: req.WorkDir, TTY: req.TTY}
	if req.Size != nil {
		opts.Size = *req.Size
	}
	if err := control.CheckExecOptions(&opts); err != nil {
		return err
	}
	in, err := s.visible(r)
	if err != nil {
		return err
	}
	if err := s.plane.CanExec(in.ID); err != nil {
		return err
	}
	ctx, cancel, err := s.streamContext(w, r)
	if err != nil {
		return err
	}
	defer cancel()
	conn, brw, err := upgrade(w)
	if err != nil {
		return err
	}
	defer conn.Close()
	if brw == nil {
		return nil // the client went away
	}
	fc := &frameConn{w: conn}
	pr, pw := io.Pipe()
	defer pr.Close()
	resized := make(chan driver.TTYSize, 1)
	go clientFrames(brw.Reader, req.Stdin, pw, resized, cancel)
	if opts.TTY {
		opts.Resize = resized
	}
	var stdin io.Reader
	if req.Stdin {
		stdin = pr
	}
	code, err := s.plane.Exec(ctx, in.ID, opts, stdin, frameStream{fc, FrameStdout}, frameStream{fc, FrameStderr})
	if err != nil {
		if ctx.Err() == nil {
			_ = fc.write(FrameError, mustJSON(toError(err)))
		}
		return nil
	}
	_ = fc.write(FrameExit, mustJSON(ExitStatus{ExitCode: code}))
	return nil
}
