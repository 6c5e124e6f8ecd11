package ssh

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/internal/procfs"
)

// SuperviseCommand is the hidden subcommand of Berth's binary that runs on
// a host: `berth ssh-supervise VERB ARGS...`. Supervise is its body.
const SuperviseCommand = "ssh-supervise"

// The supervisor's exit codes, read by the driver.
const (
	exitOK         = 0
	exitFailed     = 1 // anything else: the message is on stderr
	exitPermanent  = 2 // the instance cannot start as specified
	exitNotFound   = 3 // no such instance directory
	exitNotRunning = 4 // a signal for an instance that is not running
	exitUsage      = 5
	exitNotPaused  = 6 // a resume for an instance that is not suspended
	// exitUnsupported: the host cannot do it (no usable cgroup v2 for
	// limits); the message says why.
	exitUnsupported = 7
	exitInvalid     = 8 // a request that does not fit the instance (a terminal size without a terminal)
)

// The files of an instance directory.
const (
	fileRecord = "record.json" // what to run: written by the driver before anything else
	fileState  = "state.json"  // the running process: written by the supervisor once it started it
	fileExit   = "exit.json"   // how it ended: written by the supervisor when it ended
	fileStop   = "stopping"    // present when the end was asked for (stop, delete)
	fileStdout = "stdout.log"
	fileStderr = "stderr.log"
	fileSupLog = "supervisor.log"
	fileAttach = "attach.sock"  // the supervisor's socket for the instance's input and terminal
	fileReport = "start.report" // the start's outcome, from a supervisor in a systemd unit
	dirFiles   = "files"
	fileUData  = "user-data"
)

// record is what the driver writes in an instance directory (mode 0600)
// before the instance starts: everything the supervisor needs to run it
// and everything List shows of it.
type record struct {
	ID        string            `json:"id"`
	Name      string            `json:"name,omitempty"`
	Node      string            `json:"node"`
	Cluster   string            `json:"cluster"`
	Image     string            `json:"image,omitempty"`
	Tags      map[string]string `json:"tags"`
	Labels    map[string]string `json:"labels,omitempty"`
	Resources driver.Resources  `json:"resources"`
	Created   time.Time         `json:"created"`
	Argv      []string          `json:"argv"`
	Env       map[string]string `json:"env,omitempty"`
	Dir       string            `json:"dir,omitempty"`
	User      string            `json:"user,omitempty"`
	Group     string            `json:"group,omitempty"`
	// CgroupParent is where the instance's cgroup v2 is made
	// (<parent>/<cluster>/<id>); empty: none is made.
	CgroupParent string `json:"cgroup_parent,omitempty"`
	// Systemd runs the supervisor in a transient systemd unit
	// (unitName), which holds the limits as its properties; CgroupParent
	// is then empty.
	Systemd bool `json:"systemd,omitempty"`
	// CountLimits lets the instance run with its cpu and memory
	// unenforced where no cgroup can be made; without it such a start
	// fails.
	CountLimits bool `json:"count_limits,omitempty"`
	// Stdin keeps the instance's input open for attaches; TTY runs it on
	// a terminal.
	Stdin bool `json:"stdin,omitempty"`
	TTY   bool `json:"tty,omitempty"`
}

// runState is what the supervisor writes once the process runs.
type runState struct {
	PID        int       `json:"pid"`
	StartTicks uint64    `json:"start_ticks"`
	BootID     string    `json:"boot_id"`
	Supervisor int       `json:"supervisor"`
	Started    time.Time `json:"started"`
	Cgroup     string    `json:"cgroup,omitempty"`
	// NoCgroup says why the instance runs without a cgroup.
	NoCgroup string `json:"no_cgroup,omitempty"`
}

// exitState is what the supervisor writes when the process ended.
type exitState struct {
	Code     int       `json:"code"`
	Signal   string    `json:"signal,omitempty"`
	Finished time.Time `json:"finished"`
}

// status is one instance as the supervisor's status verb reports it.
type status struct {
	ID        string            `json:"id"`
	Name      string            `json:"name,omitempty"`
	Node      string            `json:"node"`
	Image     string            `json:"image,omitempty"`
	Tags      map[string]string `json:"tags"`
	Labels    map[string]string `json:"labels,omitempty"`
	Resources driver.Resources  `json:"resources"`
	Created   time.Time         `json:"created"`
	// Phase is creating, running, suspended, exited, stopped or failed.
	Phase    string    `json:"phase"`
	PID      int       `json:"pid,omitempty"`
	Started  time.Time `json:"started,omitzero"`
	Finished time.Time `json:"finished,omitzero"`
	ExitCode *int      `json:"exit_code,omitempty"`
	Message  string    `json:"message,omitempty"`
}

// Supervise runs one verb of the supervisor on the host and returns its
// exit code:
//
//	start DIR              start the instance of DIR under a supervisor that outlives the session; print its status
//	status DIR...          print the status of each instance directory (JSON, one a line)
//	list ROOT              print the status of every instance directory under ROOT
//	signal DIR SIGNAL      signal the instance's process group
//	suspend DIR            STOP to the process group
//	resume DIR             CONT to the process group of a suspended instance
//	usage DIR              print the process group's cpu (over 200 ms) and resident memory (JSON)
//	stop DIR GRACE         TERM, then KILL after GRACE; wait for the end
//	delete DIR GRACE       stop, then remove DIR
//	logs DIR STREAMS TAIL FOLLOW   copy stdout.log to stdout and stderr.log to stderr
//	cgroup PARENT          make PARENT a cgroup v2 for instances, or say why it cannot be (exit 7)
//	systemd                say why instances cannot run in transient systemd units here (exit 7), else print why their limits cannot be held (nothing when they can)
//	resize DIR CPUS MEMORY set the instance's cpu (millicpus) and memory (bytes) limits; 0 leaves one as it is
//	attach DIR MODE        follow the output (MODE replay: from its start; new: from now) and relay stdin to the instance's input
//	resize-tty DIR ROWS COLS  set the size of the instance's terminal
//	exec DIR               run a command beside the instance's process: frames on stdin and stdout (exec_host.go)
//	run DIR                (internal) the supervisor itself
func Supervise(args []string, stdout, stderr io.Writer) int {
	fail := func(code int, format string, a ...any) int {
		fmt.Fprintf(stderr, format+"\n", a...)
		return code
	}
	if len(args) == 0 {
		return fail(exitUsage, "usage: %s VERB ARGS...", SuperviseCommand)
	}
	verb, args := args[0], args[1:]
	need := map[string]int{"start": 1, "list": 1, "signal": 2, "stop": 2, "delete": 2, "logs": 4, "run": 1, "suspend": 1, "resume": 1, "usage": 1,
		"cgroup": 1, "systemd": 0, "resize": 3, "attach": 2, "resize-tty": 3, "exec": 1}
	if n, ok := need[verb]; ok && len(args) != n {
		return fail(exitUsage, "%s %s: %d arguments, want %d", SuperviseCommand, verb, len(args), n)
	}
	var err error
	switch verb {
	case "start":
		// The instance as it now is, to spare the caller a status.
		if err = supStart(args[0]); err == nil {
			var st *status
			if st, err = readStatus(args[0]); err == nil {
				err = json.NewEncoder(stdout).Encode(st)
			}
		}
	case "run":
		return supRun(args[0])
	case "status":
		enc := json.NewEncoder(stdout)
		for _, dir := range args {
			st, serr := readStatus(dir)
			if serr != nil {
				st = &status{ID: filepath.Base(dir), Phase: "gone", Message: serr.Error()}
			}
			if err = enc.Encode(st); err != nil {
				break
			}
		}
	case "list":
		err = supList(args[0], stdout)
	case "signal":
		err = supSignal(args[0], args[1])
	case "suspend":
		err = supSignal(args[0], "STOP")
	case "resume":
		err = supResume(args[0])
	case "usage":
		err = supUsage(args[0], stdout)
	case "stop":
		err = supStop(args[0], args[1], false)
	case "delete":
		err = supStop(args[0], args[1], true)
	case "logs":
		// The instance's streams go framed on stdout (framedStream): the
		// session's own stderr also carries what the host's shell prints
		// as it starts (a login script's noise), which must not pass for
		// the instance's.
		fw := &frameWriter{w: stdout}
		err = supLogs(args[0], args[1], args[2], args[3], framedStream{fw, frameStdout}, framedStream{fw, frameStderr})
	case "cgroup":
		if cerr := checkCgroup(args[0]); cerr != nil {
			err = codedError{exitUnsupported, cerr}
		}
	case "systemd":
		if serr := checkSystemd(); serr != nil {
			err = codedError{exitUnsupported, serr}
		} else if lerr := checkSystemdLimits(); lerr != nil {
			fmt.Fprintln(stdout, lerr)
		}
	case "resize":
		err = supResize(args[0], args[1], args[2])
	case "attach":
		fw := &frameWriter{w: stdout}
		err = supAttach(args[0], args[1], os.Stdin, framedStream{fw, frameStdout}, framedStream{fw, frameStderr})
	case "resize-tty":
		err = supResizeTTY(args[0], args[1], args[2])
	case "exec":
		err = supExec(args[0], os.Stdin, stdout)
	default:
		return fail(exitUsage, "%s: unknown verb %q", SuperviseCommand, verb)
	}
	var ce codedError
	switch {
	case err == nil:
		return exitOK
	case errors.As(err, &ce):
		return fail(ce.code, "%v", err)
	case errors.Is(err, os.ErrNotExist):
		return fail(exitNotFound, "%v", err)
	}
	return fail(exitFailed, "%v", err)
}

// codedError carries the exit code the supervisor ends with.
type codedError struct {
	code int
	err  error
}

func (e codedError) Error() string { return e.err.Error() }
func (e codedError) Unwrap() error { return e.err }

func coded(code int, format string, a ...any) error {
	return codedError{code, fmt.Errorf(format, a...)}
}

func readJSON(path string, v any) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	return json.Unmarshal(b, v)
}

// writeJSON writes v to path atomically (a temporary file, fsync, rename).
func writeJSON(path string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	if _, err = f.Write(b); err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(tmp)
		return err
	}
	return os.Rename(tmp, path)
}

// supStart starts the supervisor of dir in a session of its own and waits
// until it reports the process started, or why it could not. An instance
// that runs already is left alone.
func supStart(dir string) error {
	var rec record
	if err := readJSON(filepath.Join(dir, fileRecord), &rec); err != nil {
		return err
	}
	if st, err := readStatus(dir); err == nil && (st.Phase == "running" || st.Phase == "suspended") {
		return nil
	}
	for _, f := range []string{fileState, fileExit, fileStop, fileAttach} {
		if err := os.Remove(filepath.Join(dir, f)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	if rec.Systemd {
		abs, err := filepath.Abs(dir)
		if err != nil {
			return err
		}
		report := filepath.Join(abs, fileReport)
		if err := os.Remove(report); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
		serr := startUnit(abs, &rec)
		line, _ := os.ReadFile(report)
		switch {
		case len(line) == 0 && serr != nil:
			return serr
		case len(line) == 0:
			unit, _ := unitName(rec.Cluster, rec.ID)
			return fmt.Errorf("the supervisor in %s ended before it started the process (see journalctl -u %s)", unit, unit)
		}
		return reported(string(line), dir)
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	r, w, err := os.Pipe()
	if err != nil {
		return err
	}
	defer r.Close()
	logf, err := os.OpenFile(filepath.Join(dir, fileSupLog), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		w.Close()
		return err
	}
	defer logf.Close()
	cmd := exec.Command(self, SuperviseCommand, "run", dir)
	cmd.Stdout, cmd.Stderr = logf, logf
	// NOTIFY_SOCKET would make it report to systemd (reporter), not here.
	cmd.Env = slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, "NOTIFY_SOCKET=") })
	cmd.ExtraFiles = []*os.File{w}
	// A session of its own: the ssh session ending (SIGHUP to its
	// process group) does not reach it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	err = cmd.Start()
	w.Close()
	if err != nil {
		return err
	}
	// Not waited for: the supervisor outlives this process, and init
	// reaps it.
	_ = cmd.Process.Release()
	line, _ := bufio.NewReader(io.LimitReader(r, 4096)).ReadString('\n')
	return reported(line, dir)
}

// reported is the error a supervisor's report line stands for (nil for
// ok); an empty line is a supervisor that ended before it reported.
func reported(line, dir string) error {
	switch {
	case line == "ok\n":
		return nil
	case strings.HasPrefix(line, "permanent: "):
		return coded(exitPermanent, "%s", strings.TrimSpace(strings.TrimPrefix(line, "permanent: ")))
	case strings.HasPrefix(line, "unsupported: "):
		return coded(exitUnsupported, "%s", strings.TrimSpace(strings.TrimPrefix(line, "unsupported: ")))
	case line == "":
		return fmt.Errorf("the supervisor ended before it started the process (see %s)", filepath.Join(dir, fileSupLog))
	}
	return errors.New(strings.TrimSpace(line))
}

const defaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// supRun is the supervisor: it starts the process of dir, reports on fd 3,
// serves attaches on dir's socket while the process runs, waits for it and
// records how it ended.
func supRun(dir string) int {
	if abs, err := filepath.Abs(dir); err == nil {
		dir = abs
	}
	say := reporter(dir)
	signalsCaught(syscall.SIGHUP, syscall.SIGPIPE)
	var rec record
	if err := readJSON(filepath.Join(dir, fileRecord), &rec); err != nil {
		say("error: " + err.Error())
		return exitFailed
	}
	cmd, err := command(dir, &rec)
	if err != nil {
		say("permanent: " + err.Error())
		return exitPermanent
	}
	outs := make([]*os.File, 2)
	for i, name := range []string{fileStdout, fileStderr} {
		f, err := os.OpenFile(filepath.Join(dir, name), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
		if err != nil {
			say("error: " + err.Error())
			return exitFailed
		}
		defer f.Close()
		outs[i] = f
	}
	cmd.Stdout, cmd.Stderr = outs[0], outs[1]
	ios, err := openStreams(dir, cmd, &rec, outs[0])
	if err != nil {
		say("error: " + err.Error())
		return exitFailed
	}
	defer ios.close()
	cg := cgroup{fd: -1}
	var noCgroup string
	if rec.CgroupParent != "" {
		if cg, err = makeCgroup(rec.CgroupParent, &rec); err != nil {
			if (rec.Resources.CPU > 0 || rec.Resources.Memory > 0) && !rec.CountLimits {
				say("unsupported: cpus and memory cannot be enforced on this host: " + err.Error())
				return exitUnsupported
			}
			noCgroup = err.Error()
		}
	}
	if cg.fd >= 0 {
		cmd.SysProcAttr.UseCgroupFD, cmd.SysProcAttr.CgroupFD = true, cg.fd
	}
	err = cmd.Start()
	cg.close()
	ios.started()
	if err != nil {
		removeCgroup(cg.dir)
		say("permanent: start " + rec.Argv[0] + ": " + err.Error())
		return exitPermanent
	}
	ios.serveExecs(cg.dir)
	rs := runState{PID: cmd.Process.Pid, BootID: procfs.BootID(), Supervisor: os.Getpid(), Started: time.Now().UTC(), Cgroup: cg.dir, NoCgroup: noCgroup}
	if t, err := startTicks(rs.PID); err == nil {
		rs.StartTicks = t
	}
	if err := writeJSON(filepath.Join(dir, fileState), rs); err != nil {
		syscall.Kill(-rs.PID, syscall.SIGKILL)
		cmd.Wait()
		removeCgroup(cg.dir)
		say("error: " + err.Error())
		return exitFailed
	}
	say("ok")
	ex := exitOf(cmd, cmd.Wait())
	// Members of the group (and of the cgroup) left behind by the leader
	// go with it, as do the execs.
	syscall.Kill(-rs.PID, syscall.SIGKILL)
	ios.endExecs()
	removeCgroup(cg.dir)
	// All the output is in the logs before the end is recorded: whoever
	// follows them stops at exit.json.
	ios.ended()
	if err := writeJSON(filepath.Join(dir, fileExit), ex); err != nil {
		fmt.Fprintln(os.Stderr, "record the exit:", err)
		return exitFailed
	}
	return exitOK
}

// reporter returns how the supervisor of dir reports, once, that the
// process started ("ok") or why not: on fd 3, the pipe supStart reads;
// in a systemd unit (NOTIFY_SOCKET is set) to dir's report file, then,
// on ok, to systemd as READY=1, which ends the wait of systemd-run.
func reporter(dir string) func(string) {
	done := false
	socket := os.Getenv("NOTIFY_SOCKET")
	if socket == "" {
		report := os.NewFile(3, "report")
		return func(s string) {
			if !done {
				done = true
				fmt.Fprintln(report, s)
				report.Close()
			}
		}
	}
	os.Unsetenv("NOTIFY_SOCKET")
	return func(s string) {
		if done {
			return
		}
		done = true
		if err := os.WriteFile(filepath.Join(dir, fileReport), []byte(s+"\n"), 0o600); err != nil {
			fmt.Fprintln(os.Stderr, "report:", err)
		}
		if s == "ok" {
			if err := notifyReady(socket); err != nil {
				fmt.Fprintln(os.Stderr, "notify systemd:", err)
			}
		}
	}
}

// instanceEnv is the environment of rec's process, whose directory is
// dir: PATH and HOME (the login user's), the spec's, then Berth's.
func instanceEnv(dir string, rec *record) map[string]string {
	env := map[string]string{"PATH": defaultPath, "HOME": "/"}
	if h, err := os.UserHomeDir(); err == nil {
		env["HOME"] = h
	}
	for k, v := range rec.Env {
		env[k] = v
	}
	env["BERTH_INSTANCE_ID"] = rec.ID
	env["BERTH_ROOT"] = dir
	if rec.Name != "" {
		env["BERTH_INSTANCE_NAME"] = rec.Name
	}
	if _, err := os.Stat(filepath.Join(dir, dirFiles)); err == nil {
		env["BERTH_CONFIG_DIR"] = filepath.Join(dir, dirFiles)
	}
	if _, err := os.Stat(filepath.Join(dir, fileUData)); err == nil {
		env["BERTH_USER_DATA_FILE"] = filepath.Join(dir, fileUData)
	}
	return env
}

// environ returns env as NAME=value entries, sorted.
func environ(env map[string]string) []string {
	keys := make([]string, 0, len(env))
	for k := range env {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	out := make([]string, 0, len(keys))
	for _, k := range keys {
		out = append(out, k+"="+env[k])
	}
	return out
}

// workDir is the working directory of rec's process: the spec's, else
// dir's work/.
func workDir(dir string, rec *record) string {
	if rec.Dir != "" {
		return rec.Dir
	}
	return filepath.Join(dir, "work")
}

// exitOf is how cmd ended, err being what its Wait returned.
func exitOf(cmd *exec.Cmd, err error) exitState {
	ex := exitState{Finished: time.Now().UTC()}
	if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); ok {
		switch {
		case ws.Exited():
			ex.Code = ws.ExitStatus()
		case ws.Signaled():
			ex.Code = 128 + int(ws.Signal())
			ex.Signal = signalName(int(ws.Signal()))
		}
	} else if err != nil {
		ex.Code = -1
	}
	return ex
}

// command builds the process of rec: its own process group, stdin from
// /dev/null, the environment, the working directory and the user.
func command(dir string, rec *record) (*exec.Cmd, error) {
	if len(rec.Argv) == 0 {
		return nil, errors.New("no command")
	}
	env := instanceEnv(dir, rec)
	work := workDir(dir, rec)
	if rec.Dir == "" {
		if err := os.MkdirAll(work, 0o755); err != nil {
			return nil, err
		}
	} else if fi, err := os.Stat(work); err != nil || !fi.IsDir() {
		return nil, fmt.Errorf("working_dir %q: not a directory", work)
	}
	exe := rec.Argv[0]
	if !strings.Contains(exe, "/") {
		p, err := lookPath(exe, env["PATH"])
		if err != nil {
			return nil, err
		}
		exe = p
	}
	cmd := &exec.Cmd{Path: exe, Args: rec.Argv, Env: environ(env), Dir: work}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if rec.User != "" {
		cred, home, err := credential(rec.User, rec.Group)
		if err != nil {
			return nil, err
		}
		if err := become(cmd, rec.User, cred); err != nil {
			return nil, err
		}
		if home != "" {
			cmd.Env = append(cmd.Env, "HOME="+home)
		}
		// The user's files are the user's: config files and user data.
		for _, p := range []string{filepath.Join(dir, dirFiles), filepath.Join(dir, fileUData)} {
			filepath.Walk(p, func(path string, _ os.FileInfo, err error) error {
				if err == nil {
					err = os.Lchown(path, int(cred.Uid), int(cred.Gid))
				}
				return err
			})
		}
		if rec.Dir == "" {
			os.Chown(work, int(cred.Uid), int(cred.Gid))
			// The instance directory is private; let the user through.
			os.Chmod(dir, 0o711)
		}
	}
	return cmd, nil
}

// become makes cmd run as cred, the user name, unless cred is the login
// user's own; only root can become another user.
func become(cmd *exec.Cmd, name string, cred *syscall.Credential) error {
	if cred.Uid == uint32(os.Geteuid()) && cred.Gid == uint32(os.Getegid()) {
		return nil
	}
	if os.Geteuid() != 0 {
		return fmt.Errorf("user %q: the ssh user is uid %d, not root, and cannot become another user", name, os.Geteuid())
	}
	cmd.SysProcAttr.Credential = cred
	return nil
}

// credential resolves a user (name or id) and group on this host.
func credential(name, group string) (*syscall.Credential, string, error) {
	var uid, gid uint64
	home := ""
	u, err := user.Lookup(name)
	if err != nil {
		u, err = user.LookupId(name)
	}
	switch {
	case err == nil:
		uid, _ = strconv.ParseUint(u.Uid, 10, 32)
		gid, _ = strconv.ParseUint(u.Gid, 10, 32)
		home = u.HomeDir
	default:
		n, perr := strconv.ParseUint(name, 10, 32)
		if perr != nil {
			return nil, "", fmt.Errorf("user %q: no such user on this host", name)
		}
		uid, gid = n, n
	}
	if group != "" {
		g, err := user.LookupGroup(group)
		if err != nil {
			g, err = user.LookupGroupId(group)
		}
		switch {
		case err == nil:
			gid, _ = strconv.ParseUint(g.Gid, 10, 32)
		default:
			n, perr := strconv.ParseUint(group, 10, 32)
			if perr != nil {
				return nil, "", fmt.Errorf("group %q: no such group on this host", group)
			}
			gid = n
		}
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), Groups: []uint32{}}, home, nil
}

func lookPath(name, pathList string) (string, error) {
	for _, d := range filepath.SplitList(pathList) {
		p := filepath.Join(d, name)
		if fi, err := os.Stat(p); err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("executable %q not found in PATH %s", name, pathList)
}

// readStatus reads an instance directory and looks at its process.
func readStatus(dir string) (*status, error) {
	var rec record
	if err := readJSON(filepath.Join(dir, fileRecord), &rec); err != nil {
		return nil, err
	}
	st := &status{ID: rec.ID, Name: rec.Name, Node: rec.Node, Image: rec.Image, Tags: rec.Tags, Labels: rec.Labels,
		Resources: rec.Resources, Created: rec.Created, Phase: "creating"}
	var rs runState
	if err := readJSON(filepath.Join(dir, fileState), &rs); err != nil {
		// Never started: a create under way, or one whose Berth was
		// killed between writing the directory and the start.
		if fi, err := os.Stat(filepath.Join(dir, fileRecord)); err == nil && time.Since(fi.ModTime()) > interrupted {
			st.Phase, st.Message = "failed", "the create was interrupted before the process started"
		}
		return st, nil
	}
	st.PID, st.Started = rs.PID, rs.Started
	_, stopping := os.Stat(filepath.Join(dir, fileStop))
	var ex exitState
	if err := readJSON(filepath.Join(dir, fileExit), &ex); err == nil {
		st.Finished = ex.Finished
		st.ExitCode = &ex.Code
		st.Phase, st.Message = "exited", fmt.Sprintf("exit code %d", ex.Code)
		if ex.Signal != "" {
			st.Message = "killed by signal SIG" + ex.Signal
		}
		if stopping == nil {
			st.Phase = "stopped"
		}
		return st, nil
	}
	state, ok := procState(rs)
	switch {
	case !ok && supervisorAlive(rs):
		// Ended this moment: the supervisor is writing down how.
		if err := readJSON(filepath.Join(dir, fileExit), &ex); err != nil {
			st.Phase = "running"
			return st, nil
		}
		return readStatus(dir)
	case !ok:
		// The supervisor is gone too (killed, or the host rebooted):
		// nobody saw the end.
		st.Phase, st.Message = "exited", "the process ended while its supervisor was not running; exit code unknown"
		if stopping == nil {
			st.Phase = "stopped"
		}
	case state == 'T':
		st.Phase = "suspended"
	default:
		st.Phase = "running"
	}
	return st, nil
}

// procState returns the state letter of rs's process when it is still
// that process (same boot, same start time) and has not ended.
func procState(rs runState) (byte, bool) {
	if rs.PID <= 0 || rs.BootID != procfs.BootID() {
		return 0, false
	}
	st, err := procfs.ReadStat(rs.PID)
	if err != nil || st.Ended() || rs.StartTicks != 0 && st.StartTicks != rs.StartTicks {
		return 0, false
	}
	return st.State, true
}

func startTicks(pid int) (uint64, error) {
	st, err := procfs.ReadStat(pid)
	return st.StartTicks, err
}

// interrupted is how long after its record an instance that never
// started counts as a create that was interrupted, and how old a
// directory half made or half removed must be before a listing removes it:
// longer than a create may take (four call timeouts and a grace).
const interrupted = 5 * time.Minute

// supList prints the status of every instance directory under root. It
// removes what an interrupted create or delete left: directories never
// renamed into place, or renamed away and not removed, and units of the
// cluster without a directory (cleanUnits).
func supList(root string, stdout io.Writer) error {
	cleanUnits(root)
	ents, err := os.ReadDir(root)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	w := bufio.NewWriter(stdout)
	enc := json.NewEncoder(w)
	for _, e := range ents {
		if !e.IsDir() {
			continue
		}
		if strings.HasPrefix(e.Name(), ".new-") || strings.HasPrefix(e.Name(), ".gone-") {
			if fi, err := e.Info(); err == nil && time.Since(fi.ModTime()) > interrupted {
				os.RemoveAll(filepath.Join(root, e.Name()))
			}
			continue
		}
		if strings.HasPrefix(e.Name(), ".") {
			continue
		}
		st, err := readStatus(filepath.Join(root, e.Name()))
		if err != nil {
			continue // removed meanwhile, or not an instance
		}
		if err := enc.Encode(st); err != nil {
			return err
		}
	}
	return w.Flush()
}

// running returns the run state of dir's process while it runs.
func running(dir string) (runState, bool, error) {
	var rs runState
	if _, err := os.Stat(filepath.Join(dir, fileRecord)); err != nil {
		return rs, false, err
	}
	if err := readJSON(filepath.Join(dir, fileState), &rs); err != nil {
		return rs, false, nil
	}
	if _, err := os.Stat(filepath.Join(dir, fileExit)); err == nil {
		return rs, false, nil
	}
	_, ok := procState(rs)
	return rs, ok, nil
}

func supSignal(dir, sig string) error {
	name, num, err := driver.ParseSignal(sig)
	if err != nil {
		return coded(exitUsage, "%v", err)
	}
	rs, ok, err := running(dir)
	if err != nil {
		return err
	}
	if !ok {
		return coded(exitNotRunning, "the instance is not running")
	}
	if err := syscall.Kill(-rs.PID, syscall.Signal(num)); err != nil {
		return fmt.Errorf("signal %s to group %d: %w", name, rs.PID, err)
	}
	return nil
}

// usage is what the usage verb prints.
type usage struct {
	CPU    driver.MilliCPU `json:"cpus"`
	Memory driver.Bytes    `json:"memory"`
}

// supUsage measures dir's process group: its cpu time over 200 ms and its
// resident memory now, from /proc.
func supUsage(dir string, stdout io.Writer) error {
	rs, ok, err := running(dir)
	if err != nil {
		return err
	}
	if !ok {
		return coded(exitNotRunning, "the instance is not running")
	}
	const window = 200 * time.Millisecond
	t0, _ := groupTicks(rs.PID)
	time.Sleep(window)
	t1, rss := groupTicks(rs.PID)
	// Ticks are USER_HZ, 100 a second on every Linux Berth runs on.
	cpu := driver.MilliCPU(max(t1-t0, 0) * 10 * int64(time.Second) / int64(window))
	return json.NewEncoder(stdout).Encode(usage{CPU: cpu, Memory: driver.Bytes(rss * int64(os.Getpagesize()))})
}

// groupTicks sums the cpu ticks (user and system) and resident pages of
// the processes of group pgid.
func groupTicks(pgid int) (ticks, rss int64) {
	members, _ := procfs.Group(pgid)
	for _, st := range members {
		ticks, rss = ticks+int64(st.Ticks), rss+st.RSSPages
	}
	return ticks, rss
}

// supResume continues dir's process group when its leader is stopped.
func supResume(dir string) error {
	rs, ok, err := running(dir)
	if err != nil {
		return err
	}
	if state, alive := procState(rs); !ok || !alive || state != 'T' {
		return coded(exitNotPaused, "the instance is not suspended")
	}
	return syscall.Kill(-rs.PID, syscall.SIGCONT)
}

// supStop ends dir's process: TERM to its group, KILL after grace, then it
// waits (up to a bound) for the supervisor to record the end. With remove
// it then removes dir.
func supStop(dir, graceText string, remove bool) error {
	grace, err := time.ParseDuration(graceText)
	if err != nil {
		return coded(exitUsage, "grace %q: %v", graceText, err)
	}
	rs, ok, err := running(dir)
	if err != nil {
		return err
	}
	if ok {
		if err := os.WriteFile(filepath.Join(dir, fileStop), nil, 0o600); err != nil {
			return err
		}
		syscall.Kill(-rs.PID, syscall.SIGTERM)
		syscall.Kill(-rs.PID, syscall.SIGCONT)
		ended := func() bool {
			_, alive := procState(rs)
			_, err := os.Stat(filepath.Join(dir, fileExit))
			return !alive && (err == nil || !supervisorAlive(rs))
		}
		deadline := time.Now().Add(grace)
		for !ended() && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
		}
		if !ended() {
			syscall.Kill(-rs.PID, syscall.SIGKILL)
			deadline = time.Now().Add(10 * time.Second)
			for !ended() && time.Now().Before(deadline) {
				time.Sleep(20 * time.Millisecond)
			}
		}
	}
	if !remove {
		return nil
	}
	removeCgroup(rs.Cgroup)
	// The unit goes before the directory: a unit without one is a leak
	// (cleanUnits).
	var rec record
	if err := readJSON(filepath.Join(dir, fileRecord), &rec); err == nil && rec.Systemd {
		if unit, err := unitName(rec.Cluster, rec.ID); err == nil {
			stopUnit(unit)
		}
	}
	// A rename first: a listing never sees half a directory.
	gone := filepath.Join(filepath.Dir(dir), ".gone-"+filepath.Base(dir))
	if err := os.Rename(dir, gone); err != nil {
		return err
	}
	return os.RemoveAll(gone)
}

// supervisorAlive reports whether rs's supervisor still runs: its pid
// runs this program's supervisor, on the same boot.
func supervisorAlive(rs runState) bool {
	if rs.Supervisor <= 0 || rs.BootID != procfs.BootID() {
		return false
	}
	if !procfs.Running(rs.Supervisor) {
		return false
	}
	cmdline, _ := os.ReadFile("/proc/" + strconv.Itoa(rs.Supervisor) + "/cmdline")
	return bytes.Contains(cmdline, []byte("\x00"+SuperviseCommand+"\x00run\x00"))
}

// logStream is one log file being copied to w.
type logStream struct {
	path string
	w    io.Writer
	f    *os.File // nil until the file exists
}

// open opens the file when it exists.
func (s *logStream) open() error {
	if s.f != nil {
		return nil
	}
	f, err := os.Open(s.path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	s.f = f
	return err
}

func (s *logStream) close() {
	if s.f != nil {
		s.f.Close()
	}
}

// copyAll copies what the files hold past where each stream is.
func copyAll(ss []*logStream) error {
	for _, s := range ss {
		if err := s.open(); err != nil || s.f == nil {
			continue
		}
		if _, err := io.Copy(s.w, s.f); err != nil {
			return err
		}
	}
	return nil
}

// follow copies ss until the output of dir ended (outputEnded) and all of
// it was copied, or stop is closed.
func follow(dir string, ss []*logStream, stop <-chan struct{}) error {
	for {
		ended, err := outputEnded(dir)
		if err != nil {
			return err
		}
		if err := copyAll(ss); err != nil || ended {
			return err
		}
		select {
		case <-stop:
			return nil
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// outputEnded reports whether dir's process will write no more: its end
// is recorded, or it is gone and its supervisor too (or it never started).
// While the supervisor lives the end is not taken before exit.json: it
// copies a terminal's last output first.
func outputEnded(dir string) (bool, error) {
	if _, err := os.Stat(filepath.Join(dir, fileRecord)); err != nil {
		return false, err
	}
	if _, err := os.Stat(filepath.Join(dir, fileExit)); err == nil {
		return true, nil
	}
	var rs runState
	if err := readJSON(filepath.Join(dir, fileState), &rs); err != nil {
		return true, nil
	}
	_, alive := procState(rs)
	return !alive && !supervisorAlive(rs), nil
}

// supLogs copies the log files: streams is "out", "err" or "both"; tail
// keeps the last lines of each (0: all); follow keeps copying until the
// process ends (or the session does).
func supLogs(dir, streams, tailText, followText string, stdout, stderr io.Writer) error {
	tail, err := strconv.Atoi(tailText)
	if err != nil || tail < 0 {
		return coded(exitUsage, "tail %q: want a count", tailText)
	}
	if _, err := os.Stat(filepath.Join(dir, fileRecord)); err != nil {
		return err
	}
	var ss []*logStream
	if streams != "err" {
		ss = append(ss, &logStream{path: filepath.Join(dir, fileStdout), w: stdout})
	}
	if streams != "out" {
		ss = append(ss, &logStream{path: filepath.Join(dir, fileStderr), w: stderr})
	}
	for _, s := range ss {
		if err := s.open(); err != nil {
			return err
		}
		defer s.close()
		if tail > 0 && s.f != nil {
			off, err := tailOffset(s.f, tail)
			if err != nil {
				return err
			}
			s.f.Seek(off, io.SeekStart)
		}
	}
	if followText != "follow" {
		return copyAll(ss)
	}
	// The driver closes this command's input when it stops following.
	eof := make(chan struct{})
	go func() {
		io.Copy(io.Discard, os.Stdin)
		close(eof)
	}()
	return follow(dir, ss, eof)
}

// tailOffset returns the offset at which the last n lines of f start.
func tailOffset(f *os.File, n int) (int64, error) {
	fi, err := f.Stat()
	if err != nil {
		return 0, err
	}
	end := fi.Size()
	buf := make([]byte, 32*1024)
	pos, count := end, 0
	for pos > 0 {
		size := min(int64(len(buf)), pos)
		pos -= size
		if _, err := f.ReadAt(buf[:size], pos); err != nil && !errors.Is(err, io.EOF) {
			return 0, err
		}
		for i := size - 1; i >= 0; i-- {
			if buf[i] != '\n' || pos+i == end-1 {
				continue
			}
			if count++; count == n {
				return pos + i + 1, nil
			}
		}
	}
	return 0, nil
}

func signalName(n int) string {
	for name := range strings.FieldsSeq("HUP INT QUIT ILL TRAP ABRT BUS FPE KILL USR1 SEGV USR2 PIPE ALRM TERM") {
		if got, num, err := driver.ParseSignal(name); err == nil && num == n {
			return got
		}
	}
	return strconv.Itoa(n)
}
