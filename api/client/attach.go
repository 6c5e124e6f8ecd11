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
	path := ref(r) + "/attach"
	req, err := c.newRequest(ctx, http.MethodPost, path, q, nil)
	if err != nil {
		return err
	}
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", api.AttachProtocol)
	resp, err := c.http.Do(req)
	if err != nil {
		return transportError(http.MethodPost, path, err)
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		defer resp.Body.Close()
		if resp.StatusCode/100 == 2 {
			return fmt.Errorf("attach: the server answered %s instead of switching to %s", resp.Status, api.AttachProtocol)
		}
		return decodeError(resp)
	}
	conn, ok := resp.Body.(io.ReadWriteCloser)
	if !ok {
		resp.Body.Close()
		return fmt.Errorf("attach: the connection cannot be written to")
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
	if opts.Stdin != nil {
		go func() {
			buf := make([]byte, api.MaxAttachFrame)
			for {
				n, err := opts.Stdin.Read(buf)
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
	if opts.Resize != nil {
		go func() {
			for {
				select {
				case <-done:
					return
				case size, ok := <-opts.Resize:
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
	for {
		kind, p, err := api.ReadFrame(conn)
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if errors.Is(err, io.EOF) {
				return nil
			}
			return fmt.Errorf("attach: %w: %w", driver.ErrRetryable, err)
		}
		var w io.Writer
		switch kind {
		case api.FrameStdout:
			w = opts.Stdout
		case api.FrameStderr:
			w = opts.Stderr
		case api.FrameError:
			var e api.Error
			if err := json.Unmarshal(p, &e); err != nil {
				return fmt.Errorf("attach: the server ended the stream with %q", p)
			}
			return &e
		}
		if w != nil {
			if _, err := w.Write(p); err != nil {
				return err
			}
		}
	}
}
