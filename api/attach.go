package api

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/berth-dev/berth/control"
	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/reconciler"
)

// The attach stream, POST /v1/instances/{ref}/attach: the client asks for
// an upgrade (Connection: Upgrade, Upgrade: AttachProtocol), the server
// answers 101 Switching Protocols, and from then on both sides send
// frames on the connection: a byte of kind, three zero bytes, the length
// of the payload as a big-endian uint32, and the payload, at most
// MaxAttachFrame bytes. The server's stream ends when the instance's
// output ends, with a FrameError first when something else ended it.
const AttachProtocol = "berth-attach/1"

// MaxAttachFrame bounds the payload of one attach frame.
const MaxAttachFrame = 32 << 10

// Kinds of attach frames.
const (
	// FrameStdin (client): input for the instance.
	FrameStdin byte = 0
	// FrameStdout and FrameStderr (server): the instance's output; with a
	// terminal everything is FrameStdout.
	FrameStdout byte = 1
	FrameStderr byte = 2
	// FrameStdinEnd (client, no payload): the end of the input.
	FrameStdinEnd byte = 3
	// FrameResize (client): a driver.TTYSize in JSON, the terminal's size.
	FrameResize byte = 4
	// FrameError (server): an Error in JSON, what ended the stream.
	FrameError byte = 5
	// FrameExit (server, exec only): an ExitStatus in JSON, the command's
	// exit code; the last frame of an exec that ran to its end.
	FrameExit byte = 6
)

// WriteFrame writes p as frames of kind, each at most MaxAttachFrame
// bytes; an empty p makes one empty frame.
func WriteFrame(w io.Writer, kind byte, p []byte) error {
	for first := true; first || len(p) > 0; first = false {
		n := min(len(p), MaxAttachFrame)
		hdr := [8]byte{kind}
		binary.BigEndian.PutUint32(hdr[4:], uint32(n))
		if _, err := w.Write(append(hdr[:], p[:n]...)); err != nil {
			return err
		}
		p = p[n:]
	}
	return nil
}

// ReadFrame reads one frame; a payload over MaxAttachFrame is an error.
func ReadFrame(r io.Reader) (kind byte, payload []byte, err error) {
	var hdr [8]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return 0, nil, err
	}
	n := binary.BigEndian.Uint32(hdr[4:])
	if n > MaxAttachFrame {
		return 0, nil, fmt.Errorf("attach frame of %d bytes: at most %d", n, MaxAttachFrame)
	}
	payload = make([]byte, n)
	if _, err := io.ReadFull(r, payload); err != nil {
		return 0, nil, err
	}
	return hdr[0], payload, nil
}

// frameConn writes frames to a connection, one at a time.
type frameConn struct {
	mu sync.Mutex
	w  io.Writer
}

func (f *frameConn) write(kind byte, p []byte) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return WriteFrame(f.w, kind, p)
}

type frameStream struct {
	f    *frameConn
	kind byte
}

func (s frameStream) Write(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	if err := s.f.write(s.kind, p); err != nil {
		return 0, err
	}
	return len(p), nil
}

// attach connects the caller to an instance's streams (see
// AttachProtocol). stdin=true forwards the caller's input (the instance
// must have been made with stdin); logs=true replays what the instance
// wrote before. An instance not running yet is waited for.
func (s *Server) attach(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	if err := onlyParams(q, "stdin", "logs"); err != nil {
		return err
	}
	withStdin, err := boolParam(q.Get("stdin"), "stdin")
	if err != nil {
		return err
	}
	logs, err := boolParam(q.Get("logs"), "logs")
	if err != nil {
		return err
	}
	if !headerHas(r.Header, "Connection", "upgrade") || !strings.EqualFold(r.Header.Get("Upgrade"), AttachProtocol) {
		return &Error{Code: CodeUpgradeRequired, Status: http.StatusUpgradeRequired, Message: "attach is a two-way stream: ask for it with Connection: Upgrade and Upgrade: " + AttachProtocol}
	}
	in, err := s.visible(r)
	if err != nil {
		return err
	}
	if withStdin && (in.Spec == nil || !in.Spec.Stdin) {
		return &driver.FieldError{Path: "stdin", Reason: "instance " + in.ID + " was made without stdin: run it with stdin (-i) to send it input"}
	}
	if can, err := s.plane.CanAttach(in.ID); err != nil {
		return err
	} else if !can && in.Provider != "" {
		return driver.Errorf(driver.ErrUnsupported, "provider %q cannot attach to instances: follow the output with logs", in.Provider)
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
	fail := func(err error) { _ = fc.write(FrameError, mustJSON(toError(err))) }

	// The caller's frames: input, its end, terminal sizes.
	pr, pw := io.Pipe()
	defer pr.Close()
	resized := make(chan driver.TTYSize, 1)
	go clientFrames(brw.Reader, withStdin, pw, resized, cancel)

	in, err = s.waitLive(ctx, in.ID)
	if err != nil {
		if ctx.Err() == nil {
			fail(err)
		}
		return nil
	}
	if in.Spec != nil && in.Spec.TTY {
		go func() {
			for {
				select {
				case <-ctx.Done():
					return
				case size := <-resized:
					if err := s.plane.ResizeTTY(ctx, in.ID, size); err != nil && ctx.Err() == nil {
						s.log.Debug("api: attach: resize", "instance", in.ID, "error", err)
					}
				}
			}
		}()
	}
	var stdin io.Reader
	if withStdin {
		stdin = pr
	}
	err = s.plane.Attach(ctx, in.ID, driver.AttachOptions{Replay: logs}, stdin, frameStream{fc, FrameStdout}, frameStream{fc, FrameStderr})
	if err != nil && ctx.Err() == nil {
		fail(err)
	}
	return nil
}

// clientFrames reads the caller's frames of an attach or exec stream:
// input into pw (when withStdin), its end closing pw, terminal sizes into
// resized, where only the latest waits. A read error means the caller
// went away: pw is closed with it and gone is called.
func clientFrames(r io.Reader, withStdin bool, pw *io.PipeWriter, resized chan driver.TTYSize, gone func()) {
	var err error
	for {
		var kind byte
		var p []byte
		if kind, p, err = ReadFrame(r); err != nil {
			break
		}
		switch kind {
		case FrameStdin:
			if !withStdin {
				continue
			}
			if _, err = pw.Write(p); err != nil {
				err = nil // the stream is over and no longer reads
			}
		case FrameStdinEnd:
			pw.Close()
		case FrameResize:
			var size driver.TTYSize
			if json.Unmarshal(p, &size) == nil {
				select {
				case <-resized:
				default:
				}
				resized <- size
			}
		}
	}
	if errors.Is(err, io.EOF) {
		err = io.ErrUnexpectedEOF
	}
	pw.CloseWithError(err)
	gone()
}

// waitLive waits until the instance id has its back-end resource and has
// started, or fails when it never will.
func (s *Server) waitLive(ctx context.Context, id string) (control.Instance, error) {
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for {
		in, err := s.plane.Instance(ctx, id)
		if err != nil {
			return in, err
		}
		switch in.Phase {
		case reconciler.Failed:
			return in, driver.Errorf(driver.ErrPermanent, "instance %s failed: %s", in.ID, in.Message)
		case reconciler.Deleting, reconciler.Deleted:
			return in, driver.Errorf(driver.ErrNotFound, "instance %s was deleted", in.ID)
		case reconciler.Pending, reconciler.Scheduled, reconciler.Creating:
		default:
			if in.BackendID != "" {
				return in, nil
			}
		}
		select {
		case <-ctx.Done():
			return in, ctx.Err()
		case <-t.C:
		}
	}
}

// headerHas reports whether the comma-separated header key holds token,
// in any case.
func headerHas(h http.Header, key, token string) bool {
	for _, v := range h.Values(key) {
		for _, t := range strings.Split(v, ",") {
			if strings.EqualFold(strings.TrimSpace(t), token) {
				return true
			}
		}
	}
	return false
}

func mustJSON(v any) []byte {
	b, _ := driver.MarshalOutput(v)
	return b
}

// upgrade takes w's connection over for a stream of AttachProtocol
// frames (attach, exec): the 101 answer written, no deadline. A nil
// reader with a nil error is a client that went away before the answer
// reached it: the caller closes conn and returns.
func upgrade(w http.ResponseWriter) (net.Conn, *bufio.ReadWriter, error) {
	conn, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		return nil, nil, err
	}
	if cw, ok := w.(*committedWriter); ok {
		cw.committed, cw.code = true, http.StatusSwitchingProtocols
	}
	_ = conn.SetDeadline(time.Time{})
	_, _ = brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: " + AttachProtocol + "\r\n\r\n")
	if err := brw.Flush(); err != nil {
		return conn, nil, nil
	}
	return conn, brw, nil
}
