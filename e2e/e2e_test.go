// Package e2e tests the real berth binary: it is built once in TestMain,
// started as `berth server --dev` on a free port, and driven with its own CLI
// and the Go client. The local back-end runs real processes; the tests look
// for them in /proc. The tests run in parallel (four at once, or
// -test.parallel), but for TestPluginSurvivesKill9, which runs alone first: each has
// its own servers, data directories, cluster name and process marks, and
// the one launching hundreds of containers on the machine's Docker Engine
// takes it alone (engineFor).
package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/berth-dev/berth/control"
	"github.com/berth-dev/berth/driver"
)

var berthBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "berth-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	berthBin = filepath.Join(dir, "berth")
	build := exec.Command("go", "build", "-o", berthBin, "./cmd/berth")
	build.Dir = ".."
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "building berth:", err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	// Four tests at once unless -test.parallel says otherwise: the tests
	// mostly wait on their servers, and of the two on the machine's engine
	// one waits for the other (engineFor), holding its place meanwhile.
	flag.Parse()
	given := false
	flag.Visit(func(f *flag.Flag) { given = given || f.Name == "test.parallel" })
	if !given {
		_ = flag.Set("test.parallel", "4")
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// server is a running `berth server --dev`.
type server struct {
	cmd  *exec.Cmd
	addr string
	// home is $XDG_DATA_HOME of the server and of the verbs run against
	// it: a --dev server keeps its data (and the admin token the verbs
	// find by themselves) in home/berth, as in the README's quick start.
	home string
	// dataDir is where a server started from a config file keeps its
	// data; the verbs then read the admin token from it.
	dataDir string
	mu      sync.Mutex
	log     bytes.Buffer
	done    chan error
	addrCh  chan string
}

// startServer starts `berth server --dev` with $XDG_DATA_HOME home (its
// data in home/berth, as the quick start has it) and waits for the
// "listening" log line, which carries the bound address.
func startServer(t *testing.T, home string) *server {
	t.Helper()
	return startServerIn(t, home, "--dev", "--listen", "127.0.0.1:0")
}

// startServerWith starts `berth server` with args (and JSON logs).
func startServerWith(t *testing.T, args ...string) *server {
	t.Helper()
	return startServerIn(t, "", args...)
}

// env is the environment of the server's process and of the verbs run
// against it.
func (s *server) env() []string {
	env := append(os.Environ(), "BERTH_ADDR=http://"+s.addr)
	if s.home != "" {
		env = append(env, "XDG_DATA_HOME="+s.home)
	}
	return env
}

// token returns the admin token the server wrote.
func (s *server) token(t *testing.T) string {
	t.Helper()
	dir := s.dataDir
	if dir == "" {
		dir = filepath.Join(s.home, "berth")
	}
	b, err := os.ReadFile(filepath.Join(dir, "admin.token"))
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// get sends GET path with the admin token and returns the answer's body.
func (s *server) get(t *testing.T, path string) string {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, "http://"+s.addr+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+s.token(t))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s %v: %s", path, resp.Status, err, b)
	}
	return string(b)
}

// startServerIn starts `berth server` with args (and JSON logs) and
// $XDG_DATA_HOME home when it is set.
func startServerIn(t *testing.T, home string, args ...string) *server {
	t.Helper()
	cmd := exec.Command(berthBin, append(append([]string{"server"}, args...), "--log-format", "json")...)
	if home != "" {
		cmd.Env = append(os.Environ(), "XDG_DATA_HOME="+home)
	}
	return runServer(t, cmd, home)
}

// startServerAs starts the berth binary bin as `server` with args, as user
// uid (and group uid).
func startServerAs(t *testing.T, uid uint32, bin string, args ...string) *server {
	t.Helper()
	cmd := exec.Command(bin, append(append([]string{"server"}, args...), "--log-format", "json")...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: uid, Groups: []uint32{}}}
	cmd.Dir = "/"
	cmd.Env = append(os.Environ(), "HOME=/nonexistent")
	return runServer(t, cmd, "")
}

// runServer starts cmd (a berth server with JSON logs) and waits for its
// address.
func runServer(t *testing.T, cmd *exec.Cmd, home string) *server {
	t.Helper()
	s := launch(t, cmd, home)
	s.waitListening(t)
	return s
}

// launch starts cmd (a berth server with JSON logs) without waiting for
// it: servers that need each other to start (etcd members) are launched
// together, then waited for.
func launch(t *testing.T, cmd *exec.Cmd, home string) *server {
	t.Helper()
	// A server dies with the test binary (killed at its -timeout, say)
	// rather than go on loading the machine's engine for the packages
	// that come after.
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	s := &server{cmd: cmd, home: home, done: make(chan error, 1), addrCh: make(chan string, 1)}
	go func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 1<<20), 64<<20)
		for sc.Scan() {
			line := sc.Bytes()
			s.mu.Lock()
			s.log.Write(line)
			s.log.WriteByte('\n')
			s.mu.Unlock()
			var rec struct {
				Msg  string `json:"msg"`
				Addr string `json:"addr"`
			}
			if json.Unmarshal(line, &rec) == nil && rec.Msg == "listening" && rec.Addr != "" {
				select {
				case s.addrCh <- rec.Addr:
				default:
				}
			}
		}
		s.done <- cmd.Wait()
	}()
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Signal(syscall.SIGCONT) // in case a test froze it
			_ = cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-s.done:
			case <-time.After(30 * time.Second):
				_ = cmd.Process.Kill()
				<-s.done
			}
		}
	})
	return s
}

// waitListening waits for the server's "listening" log line and takes its
// address.
func (s *server) waitListening(t *testing.T) {
	t.Helper()
	select {
	case s.addr = <-s.addrCh:
	case err := <-s.done:
		s.done <- err
		t.Fatalf("server exited before listening: %v\n%s", err, s.logs())
	case <-time.After(60 * time.Second):
		_ = s.cmd.Process.Kill()
		t.Fatalf("server did not log its address\n%s", s.logs())
	}
}

func (s *server) logs() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.log.String()
}

// kill9 kills the server with SIGKILL and waits for it to be gone.
func (s *server) kill9(t *testing.T) {
	t.Helper()
	if err := s.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-s.done
}

// stop sends SIGTERM and returns the exit error.
func (s *server) stop(t *testing.T) error {
	t.Helper()
	if err := s.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-s.done:
		return err
	case <-time.After(60 * time.Second):
		_ = s.cmd.Process.Kill()
		t.Fatalf("server did not stop on SIGTERM\n%s", s.logs())
	}
	return nil
}

// dockerCLI runs the docker CLI with args and the environment env added
// to the test's, and returns its combined output. It is given two minutes:
// an engine or endpoint that does not answer fails the test step rather
// than hold the package until its -timeout.
func dockerCLI(env []string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "docker", args...)
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		err = fmt.Errorf("docker %s: no answer in two minutes: %w", strings.Join(args, " "), err)
	}
	return string(out), err
}

// berth runs the CLI against the server and returns stdout, stderr and the
// exit code.
func berth(t *testing.T, s *server, args ...string) (string, string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, berthBin, args...)
	cmd.Env = s.env()
	if s.home == "" {
		cmd.Env = append(cmd.Env, "BERTH_TOKEN="+s.token(t))
	}
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	if err != nil {
		var ee *exec.ExitError
		if !errors.As(err, &ee) {
			t.Fatalf("berth %v: %v", args, err)
		}
		code = ee.ExitCode()
	}
	return out.String(), errb.String(), code
}

// mustBerth runs the CLI and fails the test unless it exits 0.
func mustBerth(t *testing.T, s *server, args ...string) string {
	t.Helper()
	out, errOut, code := berth(t, s, args...)
	if code != 0 {
		t.Fatalf("berth %v: exit %d\nstdout: %s\nstderr: %s\nserver log:\n%s", args, code, out, errOut, tail(s.logs(), 40))
	}
	return out
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// psJSON lists instances through `berth ps --json`.
func psJSON(t *testing.T, s *server, args ...string) []control.Instance {
	t.Helper()
	out := mustBerth(t, s, append([]string{"ps", "--json"}, args...)...)
	var list []control.Instance
	if err := driver.UnmarshalOutput([]byte(out), &list); err != nil {
		t.Fatalf("ps --json: %v: %q", err, out)
	}
	return list
}

// waitFor polls cond every 100 ms until it holds or 60 s pass.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// marked returns the pids of live processes whose environment holds
// key=value with value starting with prefix, keyed by the full value.
func marked(key, prefix string) map[string][]int {
	out := map[string][]int{}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		env, err := os.ReadFile(filepath.Join("/proc", e.Name(), "environ"))
		if err != nil {
			continue
		}
		if stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat")); err == nil && isZombie(stat) {
			continue
		}
		for kv := range bytes.SplitSeq(env, []byte{0}) {
			k, v, ok := strings.Cut(string(kv), "=")
			if ok && k == key && strings.HasPrefix(v, prefix) {
				out[v] = append(out[v], pid)
			}
		}
	}
	return out
}

func isZombie(stat []byte) bool {
	i := bytes.LastIndexByte(stat, ')')
	return i >= 0 && i+2 < len(stat) && stat[i+2] == 'Z'
}

// killMarked kills (by pid) the processes this test started that are still
// alive, so that a failing test leaks nothing.
func killMarked(key, prefix string) {
	for _, pids := range marked(key, prefix) {
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

func TestRunPsLogsStopRm(t *testing.T) {
	t.Parallel()
	s := startServer(t, t.TempDir())
	mark := fmt.Sprintf("e2e-%d", time.Now().UnixNano())
	t.Cleanup(func() { killMarked("E2E_MARK", mark) })

	out := mustBerth(t, s, "run", "--name", "hello", "-e", "E2E_MARK="+mark,
		"--", "sh", "-c", "echo hello-from-berth; echo to-stderr >&2; exec sleep 300")
	if !strings.Contains(out, "hello") {
		t.Fatalf("run printed %q", out)
	}
	waitFor(t, "hello to run", func() bool {
		for _, in := range psJSON(t, s) {
			if in.Name == "hello" && in.Phase == "running" {
				return true
			}
		}
		return false
	})
	if pids := marked("E2E_MARK", mark)[mark]; len(pids) != 1 {
		t.Fatalf("want one process for the instance, found %v", pids)
	}
	if table := mustBerth(t, s, "ps"); !strings.Contains(table, "hello") || !strings.Contains(table, "running") {
		t.Fatalf("ps table: %q", table)
	}
	var inspected []control.Instance
	if err := driver.UnmarshalOutput([]byte(mustBerth(t, s, "inspect", "hello")), &inspected); err != nil || len(inspected) != 1 || inspected[0].Name != "hello" {
		t.Fatalf("inspect: %v %+v", err, inspected)
	}
	waitFor(t, "the output in logs", func() bool {
		stdout, stderr, code := berth(t, s, "logs", "hello")
		return code == 0 && strings.Contains(stdout, "hello-from-berth") && strings.Contains(stderr, "to-stderr") && !strings.Contains(stdout, "to-stderr")
	})
	var nodes []control.NodeView
	if err := driver.UnmarshalOutput([]byte(mustBerth(t, s, "nodes", "--json")), &nodes); err != nil || len(nodes) != 1 || nodes[0].Provider != "local" {
		t.Fatalf("nodes: %v %+v", err, nodes)
	}
	if drv := mustBerth(t, s, "drivers"); !strings.Contains(drv, "--local-stop-grace") {
		t.Fatalf("drivers: %q", drv)
	}

	mustBerth(t, s, "stop", "hello")
	waitFor(t, "hello to stop", func() bool {
		in := psJSON(t, s, "--name", "hello")
		return len(in) == 1 && (in[0].Phase == "stopped" || in[0].Phase == "exited")
	})
	waitFor(t, "the process to end", func() bool { return len(marked("E2E_MARK", mark)) == 0 })

	mustBerth(t, s, "rm", "hello")
	waitFor(t, "hello to be deleted", func() bool {
		for _, in := range psJSON(t, s, "--all") {
			if in.Name == "hello" {
				return in.Phase == "deleted"
			}
		}
		return false
	})
	if in := psJSON(t, s); len(in) != 0 {
		t.Fatalf("ps still shows %+v", in)
	}

	// Exit codes.
	for _, c := range []struct {
		args []string
		code int
	}{
		{[]string{"inspect", "no-such-instance"}, 3},
		{[]string{"run", "--cpus", "-1", "--", "true"}, 4},
		{[]string{"run", "--cpus", "lots", "--", "true"}, 2},
		{[]string{"no-such-verb"}, 2},
		{[]string{"logs"}, 2},
	} {
		if _, stderr, code := berth(t, s, c.args...); code != c.code {
			t.Errorf("berth %v: exit %d, want %d (%s)", c.args, code, c.code, stderr)
		}
	}
	if err := s.stop(t); err != nil {
		t.Fatalf("SIGTERM: %v\n%s", err, tail(s.logs(), 20))
	}
}

func TestLogsFollow(t *testing.T) {
	t.Parallel()
	s := startServer(t, t.TempDir())
	mark := fmt.Sprintf("e2e-follow-%d", time.Now().UnixNano())
	t.Cleanup(func() { killMarked("E2E_MARK", mark) })
	mustBerth(t, s, "run", "--name", "ticker", "-e", "E2E_MARK="+mark,
		"--", "sh", "-c", "for i in 1 2 3 4 5; do echo tick-$i; sleep 0.3; done")
	// logs -f returns when the instance ends, having printed every line.
	waitFor(t, "ticker to have started", func() bool {
		in := psJSON(t, s, "--all", "--name", "ticker")
		return len(in) == 1 && in[0].Phase != "pending" && in[0].Phase != "scheduled" && in[0].Phase != "creating"
	})
	out := mustBerth(t, s, "logs", "-f", "ticker")
	for i := 1; i <= 5; i++ {
		if !strings.Contains(out, fmt.Sprintf("tick-%d", i)) {
			t.Fatalf("logs -f printed %q, missing tick-%d", out, i)
		}
	}
	waitFor(t, "ticker to exit", func() bool {
		in := psJSON(t, s, "--all", "--name", "ticker")
		return len(in) == 1 && in[0].Phase == "exited"
	})
}

func itoa(n int) string { return strconv.Itoa(n) }

// TestRename: berth rename renames a running process of the local
// back-end; ps, logs and stop find it by its new name, its old name is
// free for a new instance, and a name in use is refused.
func TestRename(t *testing.T) {
	t.Parallel()
	s := startServer(t, t.TempDir())
	mark := fmt.Sprintf("e2e-rename-%d", time.Now().UnixNano())
	t.Cleanup(func() { killMarked("E2E_MARK", mark) })
	mustBerth(t, s, "run", "--name", "old", "-e", "E2E_MARK="+mark, "--", "sh", "-c", "echo hi; exec sleep 1000")
	waitFor(t, "old to run", func() bool {
		in := psJSON(t, s, "--name", "old")
		return len(in) == 1 && in[0].Phase == "running"
	})
	mustBerth(t, s, "rename", "old", "new")
	if in := psJSON(t, s, "--name", "new"); len(in) != 1 || in[0].Phase != "running" {
		t.Fatalf("ps --name new after the rename: %+v", in)
	}
	if in := psJSON(t, s, "--all", "--name", "old"); len(in) != 0 {
		t.Errorf("ps --name old after the rename: %+v", in)
	}
	// Running is not yet printed: on a loaded machine the shell may write
	// its line a while after it started.
	waitFor(t, `"hi" in logs new`, func() bool {
		return strings.Contains(mustBerth(t, s, "logs", "new"), "hi")
	})
	mustBerth(t, s, "run", "--name", "old", "-e", "E2E_MARK="+mark, "--", "sh", "-c", "exec sleep 1000")
	if _, stderr, code := berth(t, s, "rename", "new", "old"); code == 0 || !strings.Contains(stderr, "in use") {
		t.Errorf("rename to a name in use: exit %d, %q", code, stderr)
	}
	mustBerth(t, s, "stop", "new")
	mustBerth(t, s, "rm", "new", "old")
}
