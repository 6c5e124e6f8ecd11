package docker

import (
	"context"
	"io"
	"sync"
	"time"

	"github.com/moby/moby/api/pkg/stdcopy"
	"github.com/moby/moby/client"

	"github.com/berth-dev/berth/driver"
)

// Exec runs a command in the container (docker exec): the engine's exec is
// created, then started over a hijacked connection that carries the
// command's output (raw with a terminal, multiplexed otherwise) and its
// input; the exit code is the exec's once the output has ended. Terminal
// sizes are the exec's resizes: the first once the command has started (an
// engine before API 1.42 cannot take it at the start). When ctx ends, the
// connection is closed and the command runs on: the engine cannot end an
// exec. A container that is not running is ErrPermanent.
func (d *Driver) Exec(ctx context.Context, id string, opts driver.ExecOptions, stdin io.Reader, stdout, stderr io.Writer) (int, error) {
	if err := opts.Check(); err != nil {
		return -1, err
	}
	e, cid, err := d.resolve(id)
	if err != nil {
		return -1, err
	}
	if stdout == nil {
		stdout = io.Discard
	}
	if stderr == nil {
		stderr = io.Discard
	}
	cctx, cancel := d.callCtx(ctx)
	cr, err := e.cli.ExecCreate(cctx, cid, client.ExecCreateOptions{
		User: opts.User, TTY: opts.TTY, AttachStdin: stdin != nil, AttachStdout: true, AttachStderr: true,
		Env: opts.Env, WorkingDir: opts.WorkDir, Cmd: opts.Cmd,
	})
	cancel()
	if err != nil {
		return -1, d.act(e, err, "exec in container "+cid)
	}
	cctx, cancel = d.callCtx(ctx)
	res, err := e.cli.ExecAttach(cctx, cr.ID, client.ExecAttachOptions{TTY: opts.TTY})
	cancel()
	if err != nil {
		return -1, d.callErr(ctx, e, err, "start exec in container "+cid)
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
	if opts.TTY {
		done := make(chan struct{})
		defer close(done)
		go d.execSizes(ctx, e, cr.ID, opts, done)
		_, err = io.Copy(stdout, res.Reader)
	} else {
		_, err = stdcopy.StdCopy(stdout, stderr, res.Reader)
	}
	if ctx.Err() != nil {
		return -1, ctx.Err()
	}
	if err != nil {
		return -1, classify(err, e, "read from exec in container "+cid)
	}
	return d.execExit(ctx, e, cid, cr.ID)
}

// execSizes applies opts.Size, then every size from opts.Resize, to the
// exec's terminal until done. The first resize may come before the engine
// has started the command, which it refuses: it is tried again a few times.
func (d *Driver) execSizes(ctx context.Context, e *engine, execID string, opts driver.ExecOptions, done <-chan struct{}) {
	resize := func(size driver.TTYSize) {
		for try := 0; try < 50; try++ {
			cctx, cancel := d.callCtx(ctx)
			_, err := e.cli.ExecResize(cctx, execID, client.ExecResizeOptions{Height: uint(size.Rows), Width: uint(size.Cols)})
			cancel()
			if err == nil {
				return
			}
			select {
			case <-done:
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	}
	if opts.Size != (driver.TTYSize{}) {
		resize(opts.Size)
	}
	for {
		select {
		case <-done:
			return
		case size, ok := <-opts.Resize:
			if !ok {
				return
			}
			if size.Rows > 0 && size.Cols > 0 {
				resize(size)
			}
		}
	}
}

// execExit reads the exit code of an exec whose output has ended; the
// engine may show it running a moment longer.
func (d *Driver) execExit(ctx context.Context, e *engine, cid, execID string) (int, error) {
	for {
		cctx, cancel := d.callCtx(ctx)
		ins, err := e.cli.ExecInspect(cctx, execID, client.ExecInspectOptions{})
		cancel()
		if err != nil {
			return -1, d.callErr(ctx, e, err, "inspect exec in container "+cid)
		}
		if !ins.Running {
			return ins.ExitCode, nil
		}
		select {
		case <-ctx.Done():
			return -1, ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
}

var _ driver.Execer = (*Driver)(nil)
