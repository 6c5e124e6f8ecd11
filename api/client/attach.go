package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"sync"

	"github.com/berth-dev/berth/api"
	"github.com/berth-dev/berth/driver"
)

// AttachOptions qualify Client.Attach.
type AttachOptions struct {
	// Stdin is sent to the instance (made with stdin) until its end, which
	// ends the instance's input; nil sends nothing. It is read in a
	// goroutine that ends when a Read returns after the stream is over.
	Stdin io.Reader
	// Stdout and Stderr receive the instance's output (with a terminal,
	// all of it on Stdout); nil drops it.
	Stdout, Stderr io.Writer
	// Logs replays what the instance wrote before the attach.
	Logs bool
	// Resize delivers the sizes of the caller's terminal, the current one
	// first; nil sends none.
	Resize <-chan driver.TTYSize
}

// Attach connects to an instance's standard streams over one two-way
// stream (api.AttachProtocol) and returns when the instance's output ends,
// with the error the server reported if something else ended it, or ctx's
// error when ctx ends. An instance not running yet is waited for.
func (c *Client) Attach(ctx context.Context, r string, opts AttachOptions) error {
	q := url.Values{}
	if opts.Stdin != nil {
		q.Set("stdin", "true")
	}
	if opts.Logs {
		q.Set("logs", "true")
	}
	_, err := c.stream(ctx, "attach", ref(r)+"/attach", q, nil, streamOptions{opts.Stdin, opts.Stdout, opts.Stderr, opts.Resize})
	return err
}

// ExecOptions qualify Client.Exec.
type ExecOptions struct {
	// Cmd is the command and its arguments; Env, User and WorkDir as in
	// api.ExecRequest.
	Cmd     []string
	Env     []string
	User    string
	WorkDir string
	// TTY runs the command on a terminal, of Size at the start when not
	// zero.
	TTY  bool
	Size driver.TTYSize
	// Stdin, Stdout, Stderr and Resize as in AttachOptions.
	Stdin          io.Reader
	Stdout, Stderr io.Writer
	Resize         <-chan driver.TTYSize
}

// Exec runs a command in an instance over one two-way stream
// (api.ExecRequest) and returns its exit code once it has ended, the error
// the server reported if something else ended the stream, or ctx's error
// when ctx ends.
func (c *Client) Exec(ctx context.Context, r string, opts ExecOptions) (int, error) {
	req := api.ExecRequest{Cmd: opts.Cmd, Env: opts.Env, User: opts.User, WorkDir: opts.WorkDir, TTY: opts.TTY, Stdin: opts.Stdin != nil}
	if opts.Size != (driver.TTYSize{}) {
		req.Size = &opts.Size
	}
	exit, err := c.stream(ctx, "exec", ref(r)+"/exec", nil, req, streamOptions{opts.Stdin, opts.Stdout, opts.Stderr, opts.Resize})
	if err != nil {
		return -1, err
	}
	if exit == nil {
		return -1, fmt.Errorf("exec: %w: the stream ended without the command's exit code", driver.ErrRetryable)
	}
	return exit.ExitCode, nil
}

type streamOptions struct {
	stdin          io.Reader
	stdout, stderr io.Writer
	resize         <-chan driver.TTYSize
}

// stream opens the two-way stream of path (api.AttachProtocol) with body,
// and runs it until the server's side ends: it returns the exit status the
// server sent, if any.
func (c *Client) stream(ctx context.Context, what, path string, q url.Values, body any, opts streamOptions) (*api.ExitStatus, error) {
	req, err := c.newRequest(ctx, http.MethodPost, path, q, body)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", api.AttachProtocol)
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, transportError(http.MethodPost, path, err)
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		defer resp.Body.Close()
		if resp.StatusCode/100 == 2 {
			return nil, fmt.Errorf("%s: the server answered %s instead of switching to %s", what, resp.Status, api.AttachProtocol)
		}
		return nil, decodeError(resp)
	}
	conn, ok := resp.Body.(io.ReadWriteCloser)
	if !ok {
		resp.Body.Close()
		return nil, fmt.Errorf("%s: the connection cannot be written to", what)
	}
	var closeOnce sync.Once
	closeConn := func() { closeOnce.Do(func() { conn.Close() }) }
	defer closeConn()
	stop := context.AfterFunc(ctx, closeConn)
	defer stop()

	var wmu sync.Mutex
	write := func(kind byte, p []byte) error {
		wmu.Lock()
		defer wmu.Unlock()
		return api.WriteFrame(conn, kind, p)
	}
	done := make(chan struct{})
	defer close(done)
	if opts.stdin != nil {
		go func() {
			buf := make([]byte, api.MaxAttachFrame)
			for {
				n, err := opts.stdin.Read(buf)
				if n > 0 {
					if write(api.FrameStdin, buf[:n]) != nil {
						return
					}
				}
				if err != nil {
					if errors.Is(err, io.EOF) {
						_ = write(api.FrameStdinEnd, nil)
					}
					return
				}
			}
		}()
	}
	if opts.resize != nil {
		go func() {
			for {
				select {
				case <-done:
					return
				case size, ok := <-opts.resize:
					if !ok {
						return
					}
					b, _ := json.Marshal(size)
					if write(api.FrameResize, b) != nil {
						return
					}
				}
			}
		}()
	}
	var exit *api.ExitStatus
	for {
		kind, p, err := api.ReadFrame(conn)
		if err != nil {
			if ctx.Err() != nil {
				return exit, ctx.Err()
			}
			if errors.Is(err, io.EOF) {
				return exit, nil
			}
			return exit, fmt.Errorf("%s: %w: %w", what, driver.ErrRetryable, err)
		}
		var w io.Writer
		switch kind {
		case api.FrameStdout:
			w = opts.stdout
		case api.FrameStderr:
			w = opts.stderr
		case api.FrameExit:
			exit = new(api.ExitStatus)
			if err := json.Unmarshal(p, exit); err != nil {
				return nil, fmt.Errorf("%s: the server sent the exit status %q", what, p)
			}
		case api.FrameError:
			var e api.Error
			if err := json.Unmarshal(p, &e); err != nil {
				return exit, fmt.Errorf("%s: the server ended the stream with %q", what, p)
			}
			return exit, &e
		}
		if w != nil {
			if _, err := w.Write(p); err != nil {
				return exit, err
			}
		}
	}
}
