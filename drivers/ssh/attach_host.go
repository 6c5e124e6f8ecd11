package ssh

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// The supervisor of an instance serves the unix socket attach.sock in the
// instance directory (mode 0600, the directory's owner only) while the
// process runs. For an instance made with Stdin or TTY it keeps the write
// end of the instance's input pipe, or its terminal's master. A
// connection starts with one line of JSON, an attachHeader; what follows
// depends on its op:
//
//	stdin   frames from the client (frameData: bytes for the input;
//	        frameEOF: close the input). A connection that ends without
//	        frameEOF is a detach: the input stays open. Without an input
//	        what is sent is dropped.
//	resize  the supervisor sets the terminal's size and answers one line,
//	        "ok" or "error: ...".
//	exec    a command run beside the instance's process, its streams in
//	        frames both ways (see exec_host.go).
//
// The output never goes through the socket: the process (or, on a
// terminal, the supervisor copying the master) appends it to stdout.log
// and stderr.log, and an attach follows those files, as a log follow does.
// That keeps every byte for a replay, and lets any number of attaches
// follow at once.

// attachHeader is the first line of a connection to the attach socket.
type attachHeader struct {
	Op   string `json:"op"`
	Rows uint16 `json:"rows,omitempty"`
	Cols uint16 `json:"cols,omitempty"`
}

// Frames of a stdin connection: a type byte, a 4-byte big-endian length,
// then that many bytes.
const (
	frameData = 'd'
	frameEOF  = 'e'
	maxFrame  = 32 << 10
	maxHeader = 4096
)

// writeFrame writes one frame of typ holding p, in one Write: frames
// written at once to a pipe or a connection never interleave.
func writeFrame(w io.Writer, typ byte, p []byte) error {
	b := make([]byte, 5+len(p))
	b[0] = typ
	binary.BigEndian.PutUint32(b[1:5], uint32(len(p)))
	copy(b[5:], p)
	_, err := w.Write(b)
	return err
}

// readFrame reads one frame into buf; a frame longer than buf is an
// error.
func readFrame(r io.Reader, buf []byte) (byte, []byte, error) {
	var h [5]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return 0, nil, err
	}
	n := binary.BigEndian.Uint32(h[1:])
	if n > uint32(len(buf)) {
		return 0, nil, fmt.Errorf("a frame of %d bytes: at most %d", n, len(buf))
	}
	if _, err := io.ReadFull(r, buf[:n]); err != nil {
		return 0, nil, err
	}
	return h[0], buf[:n], nil
}

// streams are an instance's input and terminal as its supervisor holds
// them, the socket it serves them on, and the execs under way.
type streams struct {
	dir    string
	rec    *record
	tty    bool
	ln     *net.UnixListener
	child  []*os.File // the process's ends, closed once it started
	copied chan struct{}
	execWG sync.WaitGroup // one for each exec under way

	mu     sync.Mutex
	input  *os.File // the input pipe's write end, or the master; nil once closed
	pty    *os.File // the master, with a terminal
	conns  map[net.Conn]bool
	execOK bool   // the process runs: execs may start
	cgroup string // the instance's cgroup, where execs are born ("" for none)
	execs  map[*execProc]bool
}

// openStreams prepares cmd's input and terminal as rec asks (none
// without Stdin or TTY) and listens on dir's attach socket. out is where
// the terminal's output goes.
func openStreams(dir string, cmd *exec.Cmd, rec *record, out *os.File) (*streams, error) {
	s := &streams{dir: dir, rec: rec, tty: rec.TTY, conns: map[net.Conn]bool{}, execs: map[*execProc]bool{}}
	switch {
	case rec.TTY:
		master, slave, err := openPTY()
		if err != nil {
			return nil, err
		}
		s.pty, s.input, s.child = master, master, []*os.File{slave}
		cmd.Stdin, cmd.Stdout, cmd.Stderr = slave, slave, slave
		// A session of its own with the terminal as its controlling
		// one; its id is the process group's, as with Setpgid.
		cmd.SysProcAttr.Setpgid = false
		cmd.SysProcAttr.Setsid, cmd.SysProcAttr.Setctty, cmd.SysProcAttr.Ctty = true, true, 0
		if rec.User != "" {
			if cred, _, err := credential(rec.User, rec.Group); err == nil {
				slave.Chown(int(cred.Uid), int(cred.Gid))
			}
		}
		s.copied = make(chan struct{})
		go func() {
			// Ends with EIO once the last holder of the slave is gone.
			io.Copy(out, master)
			close(s.copied)
		}()
	case rec.Stdin:
		r, w, err := os.Pipe()
		if err != nil {
			return nil, err
		}
		s.input, s.child = w, []*os.File{r}
		cmd.Stdin = r
	}
	sock := filepath.Join(dir, fileAttach)
	os.Remove(sock)
	ln, err := listenUnix(dir)
	if err != nil {
		s.close()
		return nil, fmt.Errorf("listen on %s: %w", sock, err)
	}
	os.Chmod(sock, 0o600)
	s.ln = ln
	go s.serve()
	return s, nil
}

// started closes the process's ends of the streams in the supervisor.
func (s *streams) started() {
	for _, f := range s.child {
		f.Close()
	}
	s.child = nil
}

// ended is called once the process ended and its group was killed: the
// terminal's output is copied to the end (a bounded wait: something that
// escaped the group may hold the terminal), and the socket closed.
func (s *streams) ended() {
	if s.copied != nil {
		select {
		case <-s.copied:
		case <-time.After(5 * time.Second):
		}
	}
	s.close()
}

// close stops serving and closes the input and the terminal.
func (s *streams) close() {
	s.started()
	if s.ln != nil {
		s.ln.Close()
	}
	s.mu.Lock()
	for c := range s.conns {
		c.Close()
	}
	if s.input != nil {
		s.input.Close()
	}
	if s.pty != nil && s.pty != s.input {
		s.pty.Close()
	}
	s.input, s.pty = nil, nil
	s.mu.Unlock()
}

func (s *streams) serve() {
	for {
		c, err := s.ln.Accept()
		if err != nil {
			return
		}
		s.mu.Lock()
		s.conns[c] = true
		s.mu.Unlock()
		go func() {
			s.handle(c)
			c.Close()
			s.mu.Lock()
			delete(s.conns, c)
			s.mu.Unlock()
		}()
	}
}

// handle serves one connection.
func (s *streams) handle(c net.Conn) {
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	line, err := readLine(c)
	if err != nil {
		return
	}
	c.SetReadDeadline(time.Time{})
	var h attachHeader
	if err := json.Unmarshal(line, &h); err != nil {
		fmt.Fprintf(c, "error: header: %v\n", err)
		return
	}
	switch h.Op {
	case "stdin":
		s.relay(c)
	case "resize":
		if err := s.resize(h.Rows, h.Cols); err != nil {
			fmt.Fprintf(c, "error: %v\n", err)
			return
		}
		fmt.Fprintln(c, "ok")
	case "exec":
		s.exec(c)
	default:
		fmt.Fprintf(c, "error: unknown op %q\n", h.Op)
	}
}

// readLine reads one line of at most maxHeader bytes, a byte at a time:
// nothing after it is consumed.
func readLine(r io.Reader) ([]byte, error) {
	var line []byte
	b := make([]byte, 1)
	for len(line) < maxHeader {
		if _, err := io.ReadFull(r, b); err != nil {
			return nil, err
		}
		if b[0] == '\n' {
			return line, nil
		}
		line = append(line, b[0])
	}
	return nil, errors.New("header line too long")
}

// relay copies the frames of c to the input until c ends or says EOF.
func (s *streams) relay(c net.Conn) {
	buf := make([]byte, maxFrame)
	for {
		typ, p, err := readFrame(c, buf)
		if err != nil {
			return // a detach: the input stays open
		}
		s.mu.Lock()
		in := s.input
		s.mu.Unlock()
		switch typ {
		case frameData:
			if in != nil {
				// Without the lock: a process that does not read blocks
				// this write, not the supervisor.
				in.Write(p)
			}
		case frameEOF:
			s.closeInput()
		}
	}
}

// closeInput ends the instance's input: the pipe is closed; a terminal
// gets its end-of-file character, the master staying open for the output.
func (s *streams) closeInput() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.input == nil {
		return
	}
	if s.tty {
		s.pty.Write([]byte{eofChar(s.pty)})
		return
	}
	s.input.Close()
	s.input = nil
}

// eofChar is the end-of-file character of the terminal of master: ^D
// unless it was changed.
func eofChar(master *os.File) byte {
	if t, err := unix.IoctlGetTermios(int(master.Fd()), unix.TCGETS); err == nil && t.Cc[unix.VEOF] != 0 {
		return t.Cc[unix.VEOF]
	}
	return 4
}

func (s *streams) resize(rows, cols uint16) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.pty == nil {
		return errors.New("the instance has no terminal")
	}
	return unix.IoctlSetWinsize(int(s.pty.Fd()), unix.TIOCSWINSZ, &unix.Winsize{Row: rows, Col: cols})
}

// openPTY opens a new terminal: its master and its slave, 24 by 80.
func openPTY() (master, slave *os.File, err error) {
	m, err := os.OpenFile("/dev/ptmx", os.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, nil, err
	}
	fd := int(m.Fd())
	if err := unix.IoctlSetPointerInt(fd, unix.TIOCSPTLCK, 0); err != nil {
		m.Close()
		return nil, nil, fmt.Errorf("unlock the terminal: %w", err)
	}
	n, err := unix.IoctlGetUint32(fd, unix.TIOCGPTN)
	if err != nil {
		m.Close()
		return nil, nil, fmt.Errorf("the terminal's number: %w", err)
	}
	sl, err := os.OpenFile("/dev/pts/"+strconv.FormatUint(uint64(n), 10), os.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		m.Close()
		return nil, nil, err
	}
	unix.IoctlSetWinsize(int(sl.Fd()), unix.TIOCSWINSZ, &unix.Winsize{Row: 24, Col: 80})
	return m, sl, nil
}

// listenUnix listens on dir's attach socket. The path of a socket is at
// most 107 bytes: a longer one is reached relative to dir, this process's
// working directory meanwhile.
func listenUnix(dir string) (*net.UnixListener, error) {
	p := filepath.Join(dir, fileAttach)
	if len(p) >= 100 {
		if err := os.Chdir(dir); err != nil {
			return nil, err
		}
		p = fileAttach
	}
	return net.ListenUnix("unix", &net.UnixAddr{Name: p, Net: "unix"})
}

// dialAttach connects to dir's attach socket and sends h.
func dialAttach(dir string, h attachHeader) (net.Conn, error) {
	p := filepath.Join(dir, fileAttach)
	if len(p) >= 100 {
		if err := os.Chdir(dir); err != nil {
			return nil, err
		}
		p = fileAttach
	}
	c, err := net.DialTimeout("unix", p, 10*time.Second)
	if err != nil {
		return nil, err
	}
	b, _ := json.Marshal(h)
	if _, err := c.Write(append(b, '\n')); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// supAttach follows dir's output to stdout and stderr (mode replay: from
// the start of the logs; new: from now) and relays stdin, frames as the
// socket takes them, to the instance's input. It returns when the output
// ended (the process ended and all it wrote was copied) or stdin did (the
// caller detached).
func supAttach(dir, mode string, stdin io.Reader, stdout, stderr io.Writer) error {
	if mode != "replay" && mode != "new" {
		return coded(exitUsage, "mode %q: want replay or new", mode)
	}
	var rec record
	if err := readJSON(filepath.Join(dir, fileRecord), &rec); err != nil {
		return err
	}
	ss := []*logStream{{path: filepath.Join(dir, fileStdout), w: stdout}, {path: filepath.Join(dir, fileStderr), w: stderr}}
	for _, s := range ss {
		if err := s.open(); err != nil {
			return err
		}
		defer s.close()
		if mode == "new" && s.f != nil {
			if _, err := s.f.Seek(0, io.SeekEnd); err != nil {
				return err
			}
		}
	}
	detached := make(chan struct{})
	go func() {
		defer close(detached)
		if c, err := dialAttach(dir, attachHeader{Op: "stdin"}); err == nil {
			io.Copy(c, stdin)
			c.Close()
		}
		// No socket: an instance without input, or one that ended.
		io.Copy(io.Discard, stdin)
	}()
	return follow(dir, ss, detached)
}

// supResizeTTY sets the size of the terminal of dir's instance.
func supResizeTTY(dir, rowsText, colsText string) error {
	rows, err1 := strconv.ParseUint(rowsText, 10, 16)
	cols, err2 := strconv.ParseUint(colsText, 10, 16)
	if err1 != nil || err2 != nil || rows == 0 || cols == 0 {
		return coded(exitInvalid, "terminal size %sx%s: want rows and columns from 1 to 65535", rowsText, colsText)
	}
	var rec record
	if err := readJSON(filepath.Join(dir, fileRecord), &rec); err != nil {
		return err
	}
	if !rec.TTY {
		return coded(exitInvalid, "the instance was made without a terminal (tty)")
	}
	c, err := dialAttach(dir, attachHeader{Op: "resize", Rows: uint16(rows), Cols: uint16(cols)})
	if err != nil {
		return coded(exitNotRunning, "the instance is not running: %v", err)
	}
	defer c.Close()
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	line, err := bufio.NewReader(io.LimitReader(c, maxHeader)).ReadString('\n')
	if err != nil {
		return fmt.Errorf("resize the terminal: %w", err)
	}
	if line != "ok\n" {
		return errors.New(line)
	}
	return nil
}
