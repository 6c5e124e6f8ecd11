package local

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unsafe"

	"github.com/berth-dev/berth/driver"
)

// execWaitDelay is how long an ended command's output is still read when
// something else (a process it left behind) holds its output open.
const execWaitDelay = time.Second

// Exec runs a command beside the instance's process, as docker exec does in
// a container: with the instance's environment and opts.Env over it, as the
// instance's user and group, or opts.User ("name", "uid", "name:group"),
// which the server must be able to become as for a spec's user, in the
// instance's working directory or opts.WorkDir, and in the instance's
// cgroup when it has one (born in it on cgroup v2; on v1 moved in just
// after the start, before its input is sent, as the instance's process
// is). The command leads a process group of its own (on
// a terminal, a session of its own whose controlling terminal is a
// pseudo-terminal the driver opens); it is killed with its group when ctx
// ends or the instance stops running. A missing executable ends with exit
// code 127, one that cannot be started with 126, the reason on stderr.
// The end of stdin on a terminal is sent as the terminal's end-of-file
// character (Ctrl-D).
func (d *Driver) Exec(parent context.Context, id string, opts driver.ExecOptions, stdin io.Reader, stdout, stderr io.Writer) (int, error) {
	if err := d.checkOpen(); err != nil {
		return -1, err
	}
	if err := opts.Check(); err != nil {
		return -1, err
	}
	if stdout == nil {
		stdout = io.Discard
	}
	if stderr == nil {
		stderr = io.Discard
	}
	unlock := d.locks.lock(id)
	rec, li, err := d.refresh(id)
	unlock()
	if err != nil {
		return -1, err
	}
	if !li.alive {
		return -1, driver.Errorf(driver.ErrPermanent, "instance %s is not running", id)
	}
	if li.state == 'T' {
		return -1, driver.Errorf(driver.ErrPermanent, "instance %s is suspended: resume it first", id)
	}
	sp := *rec.Spec
	if opts.User != "" {
		sp.User, sp.Group, _ = strings.Cut(opts.User, ":")
	}
	cred, err := d.credential(&sp)
	if err != nil {
		return -1, err
	}
	env := mergeEnv(d.environ(rec), opts.Env)
	dir := opts.WorkDir
	if dir == "" {
		dir = d.runDir(rec, cred)
	}
	pathList := defaultPath
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "PATH="); ok {
			pathList = v
		}
	}
	exe, err := lookPath(opts.Cmd[0], pathList, dir)
	if err != nil {
		code := 126
		if errors.Is(err, os.ErrNotExist) || !strings.Contains(opts.Cmd[0], "/") {
			code = 127
		}
		fmt.Fprintf(stderr, "berth: exec %s: %v\n", opts.Cmd[0], err)
		return code, nil
	}

	// The command ends when ctx ends or the instance stops running.
	ctx, cancel := context.WithCancel(parent)
	defer cancel()
	cmd := exec.CommandContext(ctx, exe)
	cmd.Args, cmd.Env, cmd.Dir = opts.Cmd, env, dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Credential: cred}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = execWaitDelay
	inCgroup := d.cg.usable() && exists(d.cg.dirs(id)[0])
	if inCgroup && d.cg.version == 2 {
		fd, err := syscall.Open(d.cg.dirs(id)[0], syscall.O_DIRECTORY|syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
		if err != nil {
			return -1, fmt.Errorf("%w: cgroup of %s: %w", driver.ErrRetryable, id, err)
		}
		defer syscall.Close(fd)
		cmd.SysProcAttr.UseCgroupFD, cmd.SysProcAttr.CgroupFD = true, fd
	}

	var t *execTerm
	if opts.TTY {
		if t, err = openTerm(opts.Size); err != nil {
			return -1, fmt.Errorf("%w: open a terminal: %w", driver.ErrRetryable, err)
		}
		defer t.master.Close()
		cmd.Stdin, cmd.Stdout, cmd.Stderr = t.slave, t.slave, t.slave
		cmd.SysProcAttr.Setpgid = false
		cmd.SysProcAttr.Setsid, cmd.SysProcAttr.Setctty, cmd.SysProcAttr.Ctty = true, true, 0
	} else {
		cmd.Stdout, cmd.Stderr = stdout, stderr
	}
	// Input goes through a pipe of the driver's own: os/exec would wait
	// for a reader that may never end.
	var inW *os.File
	if stdin != nil && !opts.TTY {
		var inR *os.File
		if inR, inW, err = os.Pipe(); err != nil {
			return -1, fmt.Errorf("%w: %w", driver.ErrRetryable, err)
		}
		defer inR.Close()
		defer inW.Close()
		cmd.Stdin = inR
	}
	if err := cmd.Start(); err != nil {
		if t != nil {
			t.slave.Close()
		}
		code := 126
		if errors.Is(err, os.ErrNotExist) {
			code = 127
		}
		fmt.Fprintf(stderr, "berth: exec %s: %v\n", opts.Cmd[0], err)
		return code, nil
	}
	if inCgroup && d.cg.version == 1 {
		if err := d.cg.apply(id, cmd.Process.Pid, driver.Resources{}); err != nil {
			d.log.Warn("local: exec: cannot move the command into the instance's cgroup", "id", id, "err", err)
		}
	}
	copied := make(chan struct{})
	switch {
	case t != nil:
		t.slave.Close()
		go func() {
			defer close(copied)
			_, _ = io.Copy(stdout, t.master)
		}()
		if stdin != nil {
			go func() {
				if _, err := io.Copy(t.master, stdin); err == nil {
					_, _ = t.master.Write([]byte{4}) // VEOF
				}
			}()
		}
		done := make(chan struct{})
		defer close(done)
		go t.follow(opts.Resize, done)
	default:
		close(copied)
		if inW != nil {
			go func() {
				_, _ = io.Copy(inW, stdin)
				inW.Close()
			}()
		}
	}
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		d.watchExec(ctx, id, cancel)
	}()
	werr := cmd.Wait()
	cancel()
	<-watched
	if t != nil {
		// The output ends when every copy of the terminal is closed; a
		// process left behind may hold one.
		select {
		case <-copied:
		case <-time.After(execWaitDelay):
			t.master.Close()
			<-copied
		}
	}
	if err := parent.Err(); err != nil {
		return -1, err
	}
	st := cmd.ProcessState
	if st == nil {
		return -1, fmt.Errorf("%w: exec in instance %s: %w", driver.ErrRetryable, id, werr)
	}
	if ws, ok := st.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal()), nil
	}
	return st.ExitCode(), nil
}

// watchExec calls end once the instance id no longer runs, looking every
// poll interval until ctx ends.
func (d *Driver) watchExec(ctx context.Context, id string, end func()) {
	for sleep(ctx, d.opts.PollInterval) == nil {
		unlock := d.locks.lock(id)
		_, li, err := d.refresh(id)
		unlock()
		if err != nil || !li.alive {
			end()
			return
		}
	}
}

// runDir is the working directory of rec's process running as cred: the
// spec's, else the instance's own directory, which a process of another
// user than the server's cannot reach: that one starts in /, as a
// container does.
func (d *Driver) runDir(rec *record, cred *syscall.Credential) string {
	switch {
	case rec.Spec.WorkingDir != "":
		return rec.Spec.WorkingDir
	case cred != nil:
		return "/"
	}
	return d.workDir(rec.ID)
}

// mergeEnv returns env with each NAME=value of over set in it.
func mergeEnv(env, over []string) []string {
	out := append([]string(nil), env...)
	for _, kv := range over {
		name, _, _ := strings.Cut(kv, "=")
		i := 0
		for ; i < len(out); i++ {
			if strings.HasPrefix(out[i], name+"=") {
				break
			}
		}
		if i < len(out) {
			out[i] = kv
		} else {
			out = append(out, kv)
		}
	}
	return out
}

// execTerm is a pseudo-terminal: the driver reads and writes master, the
// command gets slave.
type execTerm struct {
	master, slave *os.File
}

// winsize is struct winsize of TIOCSWINSZ.
type winsize struct{ rows, cols, x, y uint16 }

func ioctl(f *os.File, req uintptr, arg unsafe.Pointer) error {
	sc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var errno syscall.Errno
	if err := sc.Control(func(fd uintptr) {
		_, _, errno = syscall.Syscall(syscall.SYS_IOCTL, fd, req, uintptr(arg))
	}); err != nil {
		return err
	}
	if errno != 0 {
		return errno
	}
	return nil
}

// openTerm opens a pseudo-terminal of size (the kernel's default when
// zero).
func openTerm(size driver.TTYSize) (*execTerm, error) {
	master, err := os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY|syscall.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	var unlock int32
	var n uint32
	if err := ioctl(master, syscall.TIOCSPTLCK, unsafe.Pointer(&unlock)); err != nil {
		master.Close()
		return nil, fmt.Errorf("unlock: %w", err)
	}
	if err := ioctl(master, syscall.TIOCGPTN, unsafe.Pointer(&n)); err != nil {
		master.Close()
		return nil, fmt.Errorf("number: %w", err)
	}
	slave, err := os.OpenFile("/dev/pts/"+strconv.FormatUint(uint64(n), 10), os.O_RDWR|syscall.O_NOCTTY|syscall.O_CLOEXEC, 0)
	if err != nil {
		master.Close()
		return nil, err
	}
	t := &execTerm{master: master, slave: slave}
	if size != (driver.TTYSize{}) {
		if err := t.resize(size); err != nil {
			t.master.Close()
			t.slave.Close()
			return nil, err
		}
	}
	return t, nil
}

func (t *execTerm) resize(size driver.TTYSize) error {
	ws := winsize{rows: size.Rows, cols: size.Cols}
	return ioctl(t.master, syscall.TIOCSWINSZ, unsafe.Pointer(&ws))
}

// follow applies each size of sizes until done.
func (t *execTerm) follow(sizes <-chan driver.TTYSize, done <-chan struct{}) {
	for {
		select {
		case <-done:
			return
		case size, ok := <-sizes:
			if !ok {
				return
			}
			if size.Rows > 0 && size.Cols > 0 {
				_ = t.resize(size)
			}
		}
	}
}

var _ driver.Execer = (*Driver)(nil)
