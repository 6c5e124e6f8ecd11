package ssh

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/procfs"
)

// execing is an exec run through the supervisor's exec verb, as the
// driver runs it over a session: frames in, frames out.
type execing struct {
	in       *os.File
	out, err syncBuffer
	done     chan execEnd
}

// startExec sends req to the exec verb for dir; the caller sends more
// frames to in, and closing in is the caller leaving.
func startExec(t *testing.T, dir string, req execRequest) *execing {
	t.Helper()
	inR, inW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	outR, outW := io.Pipe()
	e := &execing{in: inW, done: make(chan execEnd, 1)}
	go func() {
		if err := supExec(dir, inR, outW); err != nil {
			outW.CloseWithError(err)
		}
		outW.Close()
		inR.Close()
	}()
	go func() {
		end := decodeExec(outR, &e.out, &e.err)
		io.Copy(io.Discard, outR)
		e.done <- end
	}()
	b, _ := json.Marshal(req)
	e.send(t, frameRequest, b)
	t.Cleanup(func() { inW.Close() })
	return e
}

func (e *execing) send(t *testing.T, typ byte, p []byte) {
	t.Helper()
	if err := writeFrame(e.in, typ, p); err != nil {
		t.Fatal(err)
	}
}

// wait waits for the exec to end.
func (e *execing) wait(t *testing.T) execEnd {
	t.Helper()
	select {
	case end := <-e.done:
		return end
	case <-time.After(time.Minute):
		t.Fatalf("the exec never ended; stdout %q, stderr %q", e.out.String(), e.err.String())
		return execEnd{}
	}
}

// execRun runs req to its end and returns how it ended and its output.
func execRun(t *testing.T, dir string, req execRequest, input string) (execEnd, string, string) {
	t.Helper()
	req.Stdin = input != ""
	e := startExec(t, dir, req)
	if input != "" {
		e.send(t, frameData, []byte(input))
		e.send(t, frameEOF, nil)
	}
	end := e.wait(t)
	return end, e.out.String(), e.err.String()
}

// TestSupervisorExec runs commands beside an instance's process: exit
// codes, stdout and stderr apart, the instance's environment with the
// request's over it, its working directory, input to its end, and the
// exit codes of what cannot start.
func TestSupervisorExec(t *testing.T) {
	dir := supervised(t, `sleep 1000`)
	waitPhase(t, dir, "running")
	for _, c := range []struct {
		name     string
		req      execRequest
		input    string
		code     int
		out, err string
	}{
		{"streams", execRequest{Cmd: []string{"/bin/sh", "-c", "echo out; echo err >&2; echo more; exit 7"}}, "", 7, "out\nmore\n", "err\n"},
		{"env", execRequest{Cmd: []string{"sh", "-c", `echo "$GREETING $BERTH_INSTANCE_ID $EXTRA"`}, Env: []string{"EXTRA=x=y", "GREETING=hello"}}, "", 0, "hello n.0123456789abcdef x=y\n", ""},
		{"workdir", execRequest{Cmd: []string{"pwd"}}, "", 0, filepath.Join(dir, "work") + "\n", ""},
		{"workdir given", execRequest{Cmd: []string{"pwd"}, WorkDir: "/proc"}, "", 0, "/proc\n", ""},
		{"stdin", execRequest{Cmd: []string{"sh", "-c", "cat; echo end"}}, "one\ntwo\n", 0, "one\ntwo\nend\n", ""},
		{"no stdin", execRequest{Cmd: []string{"cat"}}, "", 0, "", ""},
		{"signal", execRequest{Cmd: []string{"sh", "-c", "kill -TERM $$"}}, "", 128 + 15, "", ""},
		// The supervisor catches SIGHUP and SIGPIPE (it survives them),
		// so the command has them as they are by default, even when this
		// test runs with them ignored (nohup); it ignores no other signal
		// than this test does.
		{"signals ignored", execRequest{Cmd: []string{"grep", "SigIgn", "/proc/self/status"}}, "", 0, fmt.Sprintf("SigIgn:\t%016x\n", sigIgn(t)&^(1<<(syscall.SIGHUP-1)|1<<(syscall.SIGPIPE-1))), ""},
		{"missing", execRequest{Cmd: []string{"berth-no-such-program"}}, "", 127, "", "*"},
		{"missing path", execRequest{Cmd: []string{"/berth/no-such-program"}}, "", 127, "", "*"},
		{"not executable", execRequest{Cmd: []string{filepath.Join(dir, fileRecord)}}, "", 126, "", "*"},
		{"no workdir", execRequest{Cmd: []string{"pwd"}, WorkDir: "/berth-no-such-dir"}, "", 126, "", "*"},
	} {
		end, out, errs := execRun(t, dir, c.req, c.input)
		errOK := errs == c.err || c.err == "*" && errs != ""
		if !end.exited || end.code != c.code || out != c.out || !errOK {
			t.Errorf("%s: %+v, stdout %q, stderr %q; want exit code %d, stdout %q, stderr %q", c.name, end, out, errs, c.code, c.out, c.err)
		}
	}
	if end, _, _ := execRun(t, dir, execRequest{Cmd: []string{"true"}, User: "berth-no-such-user"}, ""); end.fail == nil || end.fail.Code != exitPermanent {
		t.Errorf("exec as a missing user: %+v, want a permanent failure", end)
	}
	if end, _, _ := execRun(t, dir, execRequest{Cmd: []string{""}}, ""); end.fail == nil || end.fail.Code != exitInvalid {
		t.Errorf("exec of no command: %+v, want an invalid request", end)
	}
	if st := statusOf(t, dir); st.Phase != "running" {
		t.Errorf("after the execs the instance is %s, want running", st.Phase)
	}

	sup(t, "suspend", dir)
	waitPhase(t, dir, "suspended")
	if err := supExec(dir, noInput(t), io.Discard); !isCoded(err, exitPermanent) {
		t.Errorf("exec in a suspended instance: %v, want exit code %d", err, exitPermanent)
	}
	sup(t, "resume", dir)
	sup(t, "stop", dir, "1s")
	if err := supExec(dir, noInput(t), io.Discard); !isCoded(err, exitNotRunning) {
		t.Errorf("exec in a stopped instance: %v, want exit code %d", err, exitNotRunning)
	}
	if err := supExec(filepath.Join(t.TempDir(), "none"), noInput(t), io.Discard); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("exec in a missing directory: %v, want not found", err)
	}
}

// sigIgn is the set of signals this process ignores, from the line
// SigIgn of /proc/self/status (bit n-1 for signal n).
func sigIgn(t *testing.T) uint64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for l := range strings.Lines(string(b)) {
		if hex, ok := strings.CutPrefix(l, "SigIgn:"); ok {
			set, err := strconv.ParseUint(strings.TrimSpace(hex), 16, 64)
			if err != nil {
				t.Fatalf("/proc/self/status: %q: %v", l, err)
			}
			return set
		}
	}
	t.Fatal("no SigIgn in /proc/self/status")
	return 0
}

// noInput is an input that ends at once.
func noInput(t *testing.T) *os.File {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	w.Close()
	t.Cleanup(func() { r.Close() })
	return r
}

func isCoded(err error, code int) bool {
	var ce codedError
	return errors.As(err, &ce) && ce.code == code
}

// pids waits for the exec's first line of stdout, pids, and returns
// them.
func (e *execing) pids(t *testing.T) []int {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !strings.Contains(e.out.String(), "\n") {
		select {
		case end := <-e.done:
			if !strings.Contains(e.out.String(), "\n") {
				t.Fatalf("the exec ended before it printed its pids: exited %v, code %d, failure %+v, error %v; stdout %q, stderr %q",
					end.exited, end.code, end.fail, end.err, e.out.String(), e.err.String())
			}
			e.done <- end
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("the exec never printed its pids: stdout %q, stderr %q", e.out.String(), e.err.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	var pids []int
	for f := range strings.FieldsSeq(e.out.String()) {
		n, err := strconv.Atoi(f)
		if err != nil {
			t.Fatalf("pids %q: %v", e.out.String(), err)
		}
		pids = append(pids, n)
	}
	return pids
}

// waitGone waits until none of pids runs (a zombie counts as gone).
func waitGone(t *testing.T, pids []int, what string) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		alive := 0
		for _, pid := range pids {
			if procfs.Running(pid) {
				alive++
			}
		}
		if alive == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %d of the processes %v still run", what, alive, pids)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestSupervisorExecCallerGoes ends execs from the caller's side: the
// command's process group is killed when the caller leaves, whether the
// command waits or blocks on an input it does not read; the instance runs
// on. An exec under way when the instance stops ends killed, with its
// exit code.
func TestSupervisorExecCallerGoes(t *testing.T) {
	dir := supervised(t, `sleep 1000`)
	waitPhase(t, dir, "running")

	e := startExec(t, dir, execRequest{Cmd: []string{"sh", "-c", "sleep 1000 & echo $$ $!; wait"}})
	pids := e.pids(t)
	e.in.Close()
	waitGone(t, pids, "the caller left")
	e.wait(t)

	// A command that never reads, on a pipe and on a terminal: the
	// caller's input fills what holds it, then the caller leaves.
	for _, tty := range []bool{false, true} {
		e = startExec(t, dir, execRequest{Cmd: []string{"sh", "-c", "echo $$; exec sleep 1000"}, Stdin: true, TTY: tty})
		pids = e.pids(t)
		flood(t, e)
		e.in.Close()
		waitGone(t, pids, "the caller left while its input was blocked")
		e.wait(t)
	}
	if st := statusOf(t, dir); st.Phase != "running" {
		t.Fatalf("after the callers left the instance is %s, want running", st.Phase)
	}

	e = startExec(t, dir, execRequest{Cmd: []string{"sh", "-c", "echo $$; exec sleep 1000"}})
	pids = e.pids(t)
	sup(t, "stop", dir, "1s")
	if end := e.wait(t); !end.exited || end.code != 128+9 {
		t.Errorf("an exec when its instance stopped: %+v, want exit code %d", end, 128+9)
	}
	waitGone(t, pids, "the instance stopped")
}

// flood sends input frames until more went than the command's pipe or
// terminal (64 KiB at most) and the frame in the supervisor's hands hold:
// the supervisor then waits to write. The frames go on until the input
// closes.
func flood(t *testing.T, e *execing) {
	t.Helper()
	var sent atomic.Int64
	go func() {
		chunk := bytes.Repeat([]byte("x"), maxFrame)
		for writeFrame(e.in, frameData, chunk) == nil {
			sent.Add(1)
		}
	}()
	for deadline := time.Now().Add(time.Minute); sent.Load() < 6; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("only %d frames of input went", sent.Load())
		}
	}
}

// TestSupervisorExecTTY runs a command on a terminal of the size asked
// for, resizes it, and ends its input with the terminal's end of file.
func TestSupervisorExecTTY(t *testing.T) {
	dir := supervised(t, `sleep 1000`)
	waitPhase(t, dir, "running")
	e := startExec(t, dir, execRequest{Cmd: []string{"sh", "-c", "test -t 0 && echo tty; stty size; read l; stty size; cat; echo err >&2"},
		TTY: true, Rows: 33, Cols: 101, Stdin: true})
	deadline := time.Now().Add(time.Minute)
	for !strings.Contains(e.out.String(), "33 101") && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	var size [4]byte
	binary.BigEndian.PutUint16(size[:], 40)
	binary.BigEndian.PutUint16(size[2:], 120)
	e.send(t, frameSize, size[:])
	e.send(t, frameData, []byte("\n"))
	e.send(t, frameEOF, nil)
	end := e.wait(t)
	out := strings.ReplaceAll(e.out.String(), "\r\n", "\n")
	if !end.exited || end.code != 0 || !strings.Contains(out, "tty\n33 101\n") || !strings.Contains(out, "40 120\n") || !strings.Contains(out, "err\n") || e.err.String() != "" {
		t.Errorf("exec on a terminal: %+v, stdout %q, stderr %q; want tty, 33 101, 40 120 and err on stdout", end, out, e.err.String())
	}
}
