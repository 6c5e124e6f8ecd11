package ssh

import (
	"context"
	"io"
	"strconv"

	"github.com/berth-dev/berth/driver"
)

// Attach follows the instance's output and forwards stdin to its input, by
// way of the supervisor on its host (`ssh-supervise attach`, one session
// on the host's connection for as long as the attach lasts). stdin is
// sent to the session as frames: its end is a frame of its own, which
// closes the instance's input, while the session's end (ctx's) is a detach
// that leaves it open. The output comes from the instance's log files, so
// Replay gives everything they hold, earlier runs included.
func (d *Driver) Attach(ctx context.Context, id string, opts driver.AttachOptions, stdin io.Reader, stdout, stderr io.Writer) error {
	if err := d.checkOpen(); err != nil {
		return err
	}
	h, err := d.hostOf(id)
	if err != nil {
		return err
	}
	if stdout == nil {
		stdout = io.Discard
	}
	if stderr == nil {
		stderr = io.Discard
	}
	mode := "new"
	if opts.Replay {
		mode = "replay"
	}
	// The session's input stays open until the attach is over, whatever
	// stdin does.
	in, frames := io.Pipe()
	defer frames.Close()
	if stdin != nil {
		go sendFrames(stdin, frames)
	}
	code, _, err := h.superviseStreams(ctx, in, stdout, stderr, "attach", d.instDir(id), mode)
	switch {
	case err != nil && ctx.Err() != nil:
		return ctx.Err()
	case err != nil:
		return err
	case code == exitNotFound:
		return driver.Errorf(driver.ErrNotFound, "no instance %q", id)
	case code != 0:
		return driver.Errorf(driver.ErrRetryable, "host %s: attach to %s: exit code %d", h.name, id, code)
	}
	return nil
}

// sendFrames reads stdin until it ends and writes it to w as data frames,
// then an end-of-file frame. It returns early when w is closed (the attach
// is over); it may outlive the attach until stdin's Read returns.
func sendFrames(stdin io.Reader, w io.Writer) {
	buf := make([]byte, maxFrame)
	for {
		n, err := stdin.Read(buf)
		if n > 0 {
			if writeFrame(w, frameData, buf[:n]) != nil {
				return
			}
		}
		if err == io.EOF {
			writeFrame(w, frameEOF, nil)
			return
		}
		if err != nil {
			return
		}
	}
}

// ResizeTTY sets the size of the instance's terminal; an instance made
// without one is ErrInvalid, one that is not running ErrPermanent.
func (d *Driver) ResizeTTY(ctx context.Context, id string, size driver.TTYSize) error {
	if size.Rows == 0 || size.Cols == 0 {
		return &driver.FieldError{Path: "size", Reason: "rows and cols must be at least 1"}
	}
	h, err := d.hostOf(id)
	if err != nil {
		return err
	}
	return d.simple(ctx, h, id, "resize-tty", d.instDir(id), strconv.Itoa(int(size.Rows)), strconv.Itoa(int(size.Cols)))
}
