package ssh

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// An exec is a connection to the attach socket with the op "exec". The
// supervisor answers the header with a line, "ok"; then both sides send
// frames (writeFrame). The client sends
// frameRequest first (an execRequest, JSON), then frameData (bytes for the
// command's input), frameEOF (the end of its input: a pipe is closed, a
// terminal gets its end-of-file character) and frameSize (a terminal's new
// size), in any order. The supervisor answers with frameStdout and
// frameStderr (the command's output; on a terminal everything is
// stdout), then one last frame: frameExit (the exit code, 128+n for
// signal n) or frameFail (the command was not run: an execFailure). The
// end of the client's side of the connection is the caller leaving: the
// command's process group is killed.
//
// `ssh-supervise exec DIR` relays its stdin to such a connection and the
// connection to its stdout, byte for byte: the driver speaks the frames
// over an SSH session.
const (
	frameRequest = 'q'
	frameSize    = 'w' // rows and columns, 2 bytes each, big-endian
	frameStdout  = 'o'
	frameStderr  = 'r'
	frameExit    = 'x' // the exit code, 4 bytes, big-endian
	frameFail    = 'f'
	// maxRequest bounds the request frame: a command line and an
	// environment of 128 KiB each (control's bounds) after JSON's escapes.
	maxRequest = 1 << 20
)

// Exit codes of an exec whose command cannot start, as a shell's.
const (
	execCannotRun = 126
	execNotFound  = 127
)

// execWaitDelay is how long an ended command's output is still read while
// something it left behind holds its output open.
const execWaitDelay = time.Second

// execRequest is what an exec runs: the driver's ExecOptions, and whether
// the caller gives input.
type execRequest struct {
	Cmd     []string `json:"cmd"`
	Env     []string `json:"env,omitempty"`
	User    string   `json:"user,omitempty"`
	WorkDir string   `json:"workdir,omitempty"`
	TTY     bool     `json:"tty,omitempty"`
	Rows    uint16   `json:"rows,omitempty"`
	Cols    uint16   `json:"cols,omitempty"`
	Stdin   bool     `json:"stdin,omitempty"`
}

// execFailure is a frameFail: an exec the supervisor did not run, with the
// supervisor's exit code that classes it (exitPermanent, exitInvalid,
// exitNotRunning, exitFailed).
type execFailure struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

// framedStream writes what it is given as frames of typ through fw, at
// most maxFrame bytes each.
type framedStream struct {
	fw  *frameWriter
	typ byte
}

func (s framedStream) Write(p []byte) (int, error) {
	for n := 0; n < len(p); {
		k := min(len(p)-n, maxFrame)
		if err := s.fw.frame(s.typ, p[n:n+k]); err != nil {
			return n, err
		}
		n += k
	}
	return len(p), nil
}

// frameWriter writes whole frames to w, one at a time.
type frameWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (f *frameWriter) frame(typ byte, p []byte) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return writeFrame(f.w, typ, p)
}

func (f *frameWriter) exit(code int) error {
	var b [4]byte
	binary.BigEndian.PutUint32(b[:], uint32(int32(code)))
	return f.frame(frameExit, b[:])
}

func (f *frameWriter) fail(code int, format string, a ...any) error {
	b, _ := json.Marshal(execFailure{Code: code, Message: fmt.Sprintf(format, a...)})
	return f.frame(frameFail, b)
}

// execProc is one command an exec runs, as the instance's end and the
// caller's leaving see it.
type execProc struct {
	mu     sync.Mutex
	pid    int      // 0 until it started
	reaped bool     // its pid may be another process's now
	killed bool     // killed before it started: kill it once it has
	input  *os.File // its input pipe's write end, or its terminal's master; nil once closed
	pty    *os.File // its terminal's master
}

// kill kills the command's process group, unless it was reaped already.
func (x *execProc) kill() {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.killed = true
	if x.pid > 0 && !x.reaped {
		syscall.Kill(-x.pid, syscall.SIGKILL)
	}
}

// started records the command's pid, killing it when a kill came first.
func (x *execProc) started(pid int) {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.pid = pid
	if x.killed {
		syscall.Kill(-pid, syscall.SIGKILL)
	}
}

// wait waits for the command and returns its exit code (128+n for signal
// n). Its pid counts as reaped before it is: kill never reaches a
// process that took the pid over.
func (x *execProc) wait(cmd *exec.Cmd) int {
	var info unix.Siginfo
	for {
		err := unix.Waitid(unix.P_PID, cmd.Process.Pid, &info, unix.WEXITED|unix.WNOWAIT, nil)
		if err != unix.EINTR {
			break
		}
	}
	x.mu.Lock()
	x.reaped = true
	x.mu.Unlock()
	return exitOf(cmd, cmd.Wait()).Code
}

// closeInput ends the command's input: the pipe is closed; a terminal
// gets its end-of-file character, written as input is (writeWatching,
// watching c).
func (x *execProc) closeInput(c net.Conn) error {
	x.mu.Lock()
	pty := x.pty
	if pty == nil && x.input != nil {
		x.input.Close()
		x.input = nil
	}
	x.mu.Unlock()
	if pty == nil {
		return nil
	}
	return writeWatching(pty, []byte{eofChar(pty)}, c)
}

// in returns the command's input, nil when it has none.
func (x *execProc) in() *os.File {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.input
}

// maxExecs bounds the execs under way in one instance.
const maxExecs = 64

// addExec counts x among the instance's execs, or says why it cannot (a
// codedError): the instance is not running (or no longer), or runs
// maxExecs already.
func (s *streams) addExec(x *execProc) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case !s.execOK:
		return coded(exitNotRunning, "the instance is not running")
	case len(s.execs) >= maxExecs:
		return coded(exitFailed, "the instance runs %d execs, the most it may", maxExecs)
	}
	s.execs[x] = true
	s.execWG.Add(1)
	return nil
}

func (s *streams) doneExec(x *execProc) {
	s.mu.Lock()
	delete(s.execs, x)
	s.mu.Unlock()
	s.execWG.Done()
}

// serveExecs lets execs run beside the instance's process, in cgroup (""
// for none).
func (s *streams) serveExecs(cgroup string) {
	s.mu.Lock()
	s.execOK, s.cgroup = true, cgroup
	s.mu.Unlock()
}

// endExecs kills the command of every exec under way and waits (a bounded
// while) for each to send its exit code: the instance ended.
func (s *streams) endExecs() {
	s.mu.Lock()
	s.execOK = false
	for x := range s.execs {
		x.kill()
	}
	s.mu.Unlock()
	done := make(chan struct{})
	go func() {
		s.execWG.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
	}
}

// exec serves an exec connection c: it answers the header with a line
// "ok", reads the request, runs the command beside the instance's process
// and relays its streams until it ends, then sends its exit code.
func (s *streams) exec(c net.Conn) {
	if _, err := io.WriteString(c, "ok\n"); err != nil {
		return
	}
	fw := &frameWriter{w: c}
	req, err := readRequest(c)
	if err != nil {
		fw.fail(exitInvalid, "%v", err)
		return
	}
	x := &execProc{}
	var ce codedError
	if err := s.addExec(x); errors.As(err, &ce) {
		fw.fail(ce.code, "%v", err)
		return
	}
	defer s.doneExec(x)
	s.runExec(x, req, c, fw)
}

// readRequest reads and checks an exec's request, the first frame of c.
func readRequest(c net.Conn) (*execRequest, error) {
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	defer c.SetReadDeadline(time.Time{})
	typ, p, err := readFrame(c, make([]byte, maxRequest))
	if err != nil {
		return nil, fmt.Errorf("exec request: %w", err)
	}
	if typ != frameRequest {
		return nil, fmt.Errorf("exec: the first frame is %q, not a request", typ)
	}
	var req execRequest
	if err := json.Unmarshal(p, &req); err != nil {
		return nil, fmt.Errorf("exec request: %w", err)
	}
	if len(req.Cmd) == 0 || req.Cmd[0] == "" {
		return nil, errors.New("exec request: no command")
	}
	for i, kv := range req.Env {
		if k, _, ok := strings.Cut(kv, "="); !ok || k == "" {
			return nil, fmt.Errorf("exec request: env[%d]: want NAME=value", i)
		}
	}
	return &req, nil
}

// runExec runs the command of req as x and relays its streams on c.
func (s *streams) runExec(x *execProc, req *execRequest, c net.Conn, fw *frameWriter) {
	cmd, err := s.execCommand(req)
	var ce codedError
	switch {
	case errors.As(err, &ce) && (ce.code == execCannotRun || ce.code == execNotFound):
		fw.frame(frameStderr, fmt.Appendf(nil, "berth: exec %s: %v\n", req.Cmd[0], err))
		fw.exit(ce.code)
		return
	case err != nil:
		fw.fail(exitPermanent, "%v", err)
		return
	}
	s.mu.Lock()
	cgroup := s.cgroup
	s.mu.Unlock()
	if cgroup != "" {
		fd, err := syscall.Open(cgroup, syscall.O_DIRECTORY|syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
		if err != nil {
			fw.fail(exitFailed, "open the instance's cgroup %s: %v", cgroup, err)
			return
		}
		defer syscall.Close(fd)
		cmd.SysProcAttr.UseCgroupFD, cmd.SysProcAttr.CgroupFD = true, fd
	}
	outs, child, err := x.streams(cmd, req)
	if err != nil {
		fw.fail(exitFailed, "%v", err)
		return
	}
	err = cmd.Start()
	for _, f := range child {
		f.Close()
	}
	if err != nil {
		for _, f := range outs {
			f.Close()
		}
		x.closeAll()
		code := execCannotRun
		if errors.Is(err, os.ErrNotExist) {
			code = execNotFound
		}
		fw.frame(frameStderr, fmt.Appendf(nil, "berth: exec %s: %v\n", req.Cmd[0], err))
		fw.exit(code)
		return
	}
	x.started(cmd.Process.Pid)
	var copied sync.WaitGroup
	for i, f := range outs {
		typ := byte(frameStdout)
		if i == 1 {
			typ = frameStderr
		}
		copied.Go(func() { copyFrames(f, typ, fw) })
	}
	go x.relayInput(c)
	code := x.wait(cmd)
	// Something the command left behind may hold its output open.
	done := make(chan struct{})
	go func() {
		copied.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(execWaitDelay):
		for _, f := range outs {
			f.Close()
		}
		<-done
	}
	for _, f := range outs {
		f.Close()
	}
	x.closeAll()
	fw.exit(code)
}

// streams makes the command's input, output and terminal as req asks. It
// returns what the supervisor reads (stdout then stderr, or the master)
// and the command's ends, to close once it started.
func (x *execProc) streams(cmd *exec.Cmd, req *execRequest) (outs, child []*os.File, err error) {
	if req.TTY {
		master, slave, err := openPTY()
		if err != nil {
			return nil, nil, err
		}
		if req.Rows > 0 && req.Cols > 0 {
			unix.IoctlSetWinsize(int(master.Fd()), unix.TIOCSWINSZ, &unix.Winsize{Row: req.Rows, Col: req.Cols})
		}
		if cred := cmd.SysProcAttr.Credential; cred != nil {
			slave.Chown(int(cred.Uid), int(cred.Gid))
		}
		cmd.Stdin, cmd.Stdout, cmd.Stderr = slave, slave, slave
		cmd.SysProcAttr.Setpgid = false
		cmd.SysProcAttr.Setsid, cmd.SysProcAttr.Setctty, cmd.SysProcAttr.Ctty = true, true, 0
		x.input, x.pty = master, master
		return []*os.File{master}, []*os.File{slave}, nil
	}
	var ends [6]*os.File
	for i := 0; i < len(ends); i += 2 {
		if i == 4 && !req.Stdin {
			break
		}
		if ends[i], ends[i+1], err = os.Pipe(); err != nil {
			for _, f := range ends {
				if f != nil {
					f.Close()
				}
			}
			return nil, nil, err
		}
	}
	cmd.Stdout, cmd.Stderr = ends[1], ends[3]
	outs, child = []*os.File{ends[0], ends[2]}, []*os.File{ends[1], ends[3]}
	if req.Stdin {
		cmd.Stdin, x.input = ends[4], ends[5]
		child = append(child, ends[4])
	}
	return outs, child, nil
}

// closeAll closes the command's input and terminal.
func (x *execProc) closeAll() {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.input != nil {
		x.input.Close()
	}
	if x.pty != nil && x.pty != x.input {
		x.pty.Close()
	}
	x.input, x.pty = nil, nil
}

// execCommand builds the command of req as the instance's process is
// built: the instance's environment with req's over it, as the instance's
// user or req's, in the instance's working directory or req's, leading a
// process group of its own. A command that cannot start is a codedError
// of execNotFound or execCannotRun.
func (s *streams) execCommand(req *execRequest) (*exec.Cmd, error) {
	env := instanceEnv(s.dir, s.rec)
	name, group := s.rec.User, s.rec.Group
	if req.User != "" {
		name, group, _ = strings.Cut(req.User, ":")
	}
	cmd := &exec.Cmd{Args: req.Cmd, Dir: req.WorkDir}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if name != "" {
		cred, home, err := credential(name, group)
		if err != nil {
			return nil, err
		}
		if err := become(cmd, name, cred); err != nil {
			return nil, err
		}
		if home != "" {
			env["HOME"] = home
		}
	}
	for _, kv := range req.Env {
		k, v, _ := strings.Cut(kv, "=")
		env[k] = v
	}
	cmd.Env = environ(env)
	if cmd.Dir == "" {
		cmd.Dir = workDir(s.dir, s.rec)
	}
	if fi, err := os.Stat(cmd.Dir); err != nil || !fi.IsDir() {
		return nil, coded(execCannotRun, "working directory %q: not a directory", cmd.Dir)
	}
	cmd.Path = req.Cmd[0]
	if !strings.Contains(cmd.Path, "/") {
		p, err := lookPath(cmd.Path, env["PATH"])
		if err != nil {
			return nil, codedError{execNotFound, err}
		}
		cmd.Path = p
	} else if !filepath.IsAbs(cmd.Path) {
		cmd.Path = filepath.Join(cmd.Dir, cmd.Path)
	}
	return cmd, nil
}

// copyFrames sends what r gives as frames of typ until r ends; once the
// connection fails it reads r to its end, so that the command never
// blocks on its output.
func copyFrames(r *os.File, typ byte, fw *frameWriter) {
	buf := make([]byte, maxFrame)
	for {
		n, err := r.Read(buf)
		if n > 0 && fw.frame(typ, buf[:n]) != nil {
			io.Copy(io.Discard, r)
			return
		}
		if err != nil {
			return
		}
	}
}

// errCallerGone is the caller leaving while its input was being written.
var errCallerGone = errors.New("the caller went away")

// relayInput reads c's frames until c ends, which kills the command: the
// caller went away.
func (x *execProc) relayInput(c net.Conn) {
	buf := make([]byte, maxFrame)
	for {
		typ, p, err := readFrame(c, buf)
		if err != nil {
			x.kill()
			return
		}
		switch typ {
		case frameData:
			if in := x.in(); in != nil && writeWatching(in, p, c) == errCallerGone {
				x.kill()
				return
			}
		case frameEOF:
			if x.closeInput(c) == errCallerGone {
				x.kill()
				return
			}
		case frameSize:
			if len(p) == 4 {
				x.mu.Lock()
				if x.pty != nil {
					unix.IoctlSetWinsize(int(x.pty.Fd()), unix.TIOCSWINSZ,
						&unix.Winsize{Row: binary.BigEndian.Uint16(p), Col: binary.BigEndian.Uint16(p[2:])})
				}
				x.mu.Unlock()
			}
		}
	}
}

// deadliner is a stream whose writes can be bounded in time: a pipe, a
// terminal, a connection.
type deadliner interface {
	io.Writer
	SetWriteDeadline(time.Time) error
}

// writeWatching writes p to w; while the write waits, the other end of
// watched (the caller's side of an exec) is looked at every second, and
// the write given up (errCallerGone) once it hung up: a command that does
// not read its input must not keep a caller that left.
func writeWatching(w deadliner, p []byte, watched any) error {
	defer w.SetWriteDeadline(time.Time{})
	for len(p) > 0 {
		w.SetWriteDeadline(time.Now().Add(time.Second))
		n, err := w.Write(p)
		p = p[n:]
		switch {
		case errors.Is(err, os.ErrDeadlineExceeded):
			if hungUp(watched) {
				return errCallerGone
			}
		case err != nil:
			return err
		}
	}
	return nil
}

// hungUp reports whether the other end of c, a connection or a pipe's
// read end, closed it (or shut its writing down), without reading. What
// has no file descriptor never hangs up.
func hungUp(c any) bool {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return true
	}
	gone := false
	rc.Control(func(fd uintptr) {
		p := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLRDHUP}}
		if n, err := unix.Poll(p, 0); err == nil && n > 0 {
			gone = p[0].Revents&(unix.POLLRDHUP|unix.POLLHUP|unix.POLLERR) != 0
		}
	})
	return gone
}

// supExec relays an exec between the caller (stdin and stdout, frames)
// and the supervisor of dir. The end of stdin is the caller leaving: the
// connection is closed then, even while the supervisor does not read it.
// An instance that is not running, or suspended, is refused before
// anything is sent.
func supExec(dir string, stdin *os.File, stdout io.Writer) error {
	rs, ok, err := running(dir)
	if err != nil {
		return err
	}
	if !ok {
		return coded(exitNotRunning, "the instance is not running")
	}
	if state, _ := procState(rs); state == 'T' {
		return coded(exitPermanent, "the instance is suspended: resume it first")
	}
	c, err := dialAttach(dir, attachHeader{Op: "exec"})
	if err != nil {
		if _, ok, _ := running(dir); !ok {
			return coded(exitNotRunning, "the instance is not running")
		}
		return coded(exitPermanent, "the instance's supervisor does not answer (killed, or started by a Berth without exec: restart the instance): %v", err)
	}
	defer c.Close()
	// A supervisor without execs answers otherwise.
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if line, err := readLine(c); err != nil || string(line) != "ok" {
		return coded(exitPermanent, "the instance's supervisor runs no execs (%q, %v): it was started by an older Berth; restart the instance", line, err)
	}
	c.SetReadDeadline(time.Time{})
	go func() {
		defer c.Close()
		buf := make([]byte, maxFrame)
		for {
			n, err := stdin.Read(buf)
			if n > 0 && writeWatching(c, buf[:n], stdin) != nil {
				return
			}
			if err != nil {
				return
			}
		}
	}()
	io.Copy(stdout, c)
	return nil
}
