package ssh

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"

	"github.com/berth-dev/berth/driver"
)

// Exec runs a command beside the instance's process, by way of its
// supervisor (`ssh-supervise exec`, one session on the host's connection
// for as long as the command runs): with the instance's environment and
// opts.Env over it, as the instance's user or opts.User ("name", "uid",
// "name:group"; another user than the login user needs it to be root), in
// the instance's working directory or opts.WorkDir, in the instance's
// cgroup when it has one, leading a process group of its own (on a
// terminal, a session of its own on a new pseudo-terminal). When ctx ends
// the session is closed and the command's process group killed; so it is
// when the instance stops. A missing executable ends with exit code 127,
// one that cannot be started (or a working directory that is not one)
// with 126, the reason on stderr. A user the host lacks, an instance made
// by a supervisor without exec (an older Berth's: restart it) and a
// suspended instance are ErrPermanent, as is one that is not running.
func (d *Driver) Exec(ctx context.Context, id string, opts driver.ExecOptions, stdin io.Reader, stdout, stderr io.Writer) (int, error) {
	if err := d.checkOpen(); err != nil {
		return -1, err
	}
	if err := opts.Check(); err != nil {
		return -1, err
	}
	h, err := d.hostOf(id)
	if err != nil {
		return -1, err
	}
	req, err := json.Marshal(execRequest{Cmd: opts.Cmd, Env: opts.Env, User: opts.User, WorkDir: opts.WorkDir,
		TTY: opts.TTY, Rows: opts.Size.Rows, Cols: opts.Size.Cols, Stdin: stdin != nil})
	if err != nil {
		return -1, err
	}
	if len(req) > maxRequest {
		return -1, &driver.FieldError{Path: "cmd", Reason: fmt.Sprintf("the command, environment, user and working directory take %d bytes: at most %d", len(req), maxRequest)}
	}
	if stdout == nil {
		stdout = io.Discard
	}
	if stderr == nil {
		stderr = io.Discard
	}
	// The session's input: the request, then stdin and the terminal's
	// sizes as frames, each written whole.
	in, frames := io.Pipe()
	defer frames.Close()
	go func() {
		if writeFrame(frames, frameRequest, req) == nil && stdin != nil {
			sendFrames(stdin, frames)
		}
	}()
	if opts.Resize != nil {
		done := make(chan struct{})
		defer close(done)
		go sendSizes(opts.Resize, frames, done)
	}
	// The session's output: the command's streams and its end, as frames.
	out, outW := io.Pipe()
	decoded := make(chan execEnd, 1)
	go func() {
		end := decodeExec(out, stdout, stderr)
		io.Copy(io.Discard, out)
		decoded <- end
	}()
	code, msg, err := h.superviseIn(ctx, in, outW, nil, "exec", d.instDir(id))
	outW.Close()
	end := <-decoded
	switch {
	case err != nil && ctx.Err() != nil:
		return -1, ctx.Err()
	case err != nil:
		return -1, err
	case code == exitNotFound:
		return -1, driver.Errorf(driver.ErrNotFound, "no instance %q", id)
	case code == exitNotRunning:
		return -1, driver.Errorf(driver.ErrPermanent, "instance %s is not running", id)
	case code == exitPermanent:
		return -1, driver.Errorf(driver.ErrPermanent, "host %s: exec in %s: %s", h.name, id, msg)
	case code != 0:
		// Refused before the command was sent to the supervisor.
		return -1, driver.Errorf(driver.ErrRetryable, "host %s: exec in %s: exit code %d: %s", h.name, id, code, msg)
	case end.fail != nil && end.fail.Code == exitNotRunning:
		return -1, driver.Errorf(driver.ErrPermanent, "instance %s is not running", id)
	case end.fail != nil && (end.fail.Code == exitPermanent || end.fail.Code == exitInvalid):
		return -1, driver.Errorf(driver.ErrPermanent, "host %s: exec in %s: %s", h.name, id, end.fail.Message)
	case end.fail != nil:
		// The command was not run.
		return -1, driver.Errorf(driver.ErrRetryable, "host %s: exec in %s: %s", h.name, id, end.fail.Message)
	case !end.exited:
		return -1, driver.Errorf(driver.ErrTimeout, "host %s: exec in %s: the supervisor ended the exec without the command's exit code (killed?): %v", h.name, id, end.err)
	}
	return end.code, nil
}

// sendSizes writes each size of sizes to w as a frameSize until done.
func sendSizes(sizes <-chan driver.TTYSize, w io.Writer, done <-chan struct{}) {
	for {
		select {
		case <-done:
			return
		case size, ok := <-sizes:
			if !ok {
				return
			}
			if size.Rows == 0 || size.Cols == 0 {
				continue
			}
			var b [4]byte
			binary.BigEndian.PutUint16(b[:], size.Rows)
			binary.BigEndian.PutUint16(b[2:], size.Cols)
			if writeFrame(w, frameSize, b[:]) != nil {
				return
			}
		}
	}
}

// execEnd is how an exec ended, as its frames say.
type execEnd struct {
	exited bool
	code   int
	fail   *execFailure
	err    error // what broke the frames, when neither came
}

// decodeExec copies the output frames of r to stdout and stderr until the
// exec's last frame (frameExit or frameFail) or r's end.
func decodeExec(r io.Reader, stdout, stderr io.Writer) execEnd {
	typ, p, err := readStreams(r, stdout, stderr)
	if err != nil {
		return execEnd{err: err}
	}
	switch typ {
	case frameExit:
		if len(p) != 4 {
			return execEnd{err: fmt.Errorf("an exit frame of %d bytes", len(p))}
		}
		return execEnd{exited: true, code: int(int32(binary.BigEndian.Uint32(p)))}
	case frameFail:
		var f execFailure
		if err := json.Unmarshal(p, &f); err != nil {
			return execEnd{err: fmt.Errorf("a failure frame: %w", err)}
		}
		return execEnd{fail: &f}
	}
	return execEnd{err: fmt.Errorf("a frame of unknown type %q", typ)}
}

// readStreams copies the frameStdout and frameStderr frames of r to stdout
// and stderr until another frame, which it returns, or an error (io.EOF
// at the end of r).
func readStreams(r io.Reader, stdout, stderr io.Writer) (byte, []byte, error) {
	buf := make([]byte, maxFrame)
	for {
		typ, p, err := readFrame(r, buf)
		if err != nil {
			return 0, nil, err
		}
		switch typ {
		case frameStdout:
			stdout.Write(p)
		case frameStderr:
			stderr.Write(p)
		default:
			return typ, p, nil
		}
	}
}
