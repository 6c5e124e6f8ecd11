package docker

import (
	"context"
	"io"
	"sync"

	"github.com/moby/moby/api/pkg/stdcopy"
	"github.com/moby/moby/client"

	"github.com/berth-dev/berth/driver"
)

// Attach connects to the container's streams (docker attach): the engine
// sends its output raw when it has a terminal, multiplexed otherwise, and
// takes stdin until stdin ends, when it closes the container's input
// (containers made with Spec.Stdin are StdinOnce, as docker run -i makes
// them). Replay asks the engine for the log first.
func (d *Driver) Attach(ctx context.Context, id string, opts driver.AttachOptions, stdin io.Reader, stdout, stderr io.Writer) error {
	e, cid, err := d.resolve(id)
	if err != nil {
		return err
	}
	if stdout == nil {
		stdout = io.Discard
	}
	if stderr == nil {
		stderr = io.Discard
	}
	cctx, cancel := d.callCtx(ctx)
	ci, err := e.cli.ContainerInspect(cctx, cid, client.ContainerInspectOptions{})
	cancel()
	if err != nil {
		return d.callErr(ctx, e, err, "inspect container "+cid)
	}
	tty := ci.Container.Config != nil && ci.Container.Config.Tty
	openStdin := ci.Container.Config != nil && ci.Container.Config.OpenStdin
	if stdin != nil && !openStdin {
		return &driver.FieldError{Path: "stdin", Reason: "container " + cid + " was made without stdin"}
	}
	running := func(ci client.ContainerInspectResult) bool {
		return ci.Container.State != nil && (ci.Container.State.Running || ci.Container.State.Paused || ci.Container.State.Restarting)
	}
	live := running(ci)
	if !live && !opts.Replay {
		return nil
	}
	res, err := d.attach(ctx, e, cid, stdin != nil, live, opts.Replay)
	if err != nil {
		return err
	}
	if live {
		// The engine streams from a container that is not running until
		// it runs again: one that ended before the attach is read from
		// its log instead.
		cctx, cancel := d.callCtx(ctx)
		again, err := e.cli.ContainerInspect(cctx, cid, client.ContainerInspectOptions{})
		cancel()
		if err == nil && !running(again) {
			res.Close()
			if !opts.Replay {
				return nil
			}
			if res, err = d.attach(ctx, e, cid, false, false, true); err != nil {
				return err
			}
			stdin = nil
		}
	}
	var once sync.Once
	closeConn := func() { once.Do(res.Close) }
	defer closeConn()
	stop := context.AfterFunc(ctx, closeConn)
	defer stop()
	if stdin != nil {
		go func() {
			_, _ = io.Copy(res.Conn, stdin)
			_ = res.CloseWrite()
		}()
	}
	if tty {
		_, err = io.Copy(stdout, res.Reader)
	} else {
		_, err = stdcopy.StdCopy(stdout, stderr, res.Reader)
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if err != nil {
		return classify(err, e, "read from container "+cid)
	}
	return nil
}

// attach opens the engine's attach stream; the dial is bounded by
// call_timeout, the stream by ctx only.
func (d *Driver) attach(ctx context.Context, e *engine, cid string, stdin, stream, logs bool) (client.ContainerAttachResult, error) {
	cctx, cancel := d.callCtx(ctx)
	defer cancel()
	res, err := e.cli.ContainerAttach(cctx, cid, client.ContainerAttachOptions{
		Stream: stream, Stdin: stdin, Stdout: true, Stderr: true, Logs: logs,
	})
	if err != nil {
		return res, d.callErr(ctx, e, err, "attach to container "+cid)
	}
	return res, nil
}

// ResizeTTY sets the size of the container's terminal (docker resize).
func (d *Driver) ResizeTTY(ctx context.Context, id string, size driver.TTYSize) error {
	e, cid, err := d.resolve(id)
	if err != nil {
		return err
	}
	cctx, cancel := d.callCtx(ctx)
	defer cancel()
	ci, err := e.cli.ContainerInspect(cctx, cid, client.ContainerInspectOptions{})
	if err != nil {
		return d.callErr(cctx, e, err, "inspect container "+cid)
	}
	if ci.Container.Config == nil || !ci.Container.Config.Tty {
		return &driver.FieldError{Path: "tty", Reason: "container " + cid + " has no terminal"}
	}
	_, err = e.cli.ContainerResize(cctx, cid, client.ContainerResizeOptions{Height: uint(size.Rows), Width: uint(size.Cols)})
	return d.act(e, err, "resize the terminal of container "+cid)
}

var _ driver.Attacher = (*Driver)(nil)
