package ssh

import (
	"bytes"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// supervised writes a record for script in a fresh instance directory and
// starts it with the supervisor, as the driver does over ssh.
func supervised(t *testing.T, script string) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "i1")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	rec := record{ID: "n.0123456789abcdef", Node: "n", Cluster: "c", Tags: map[string]string{"berth.managed": "true"},
		Created: time.Now(), Argv: []string{"/bin/sh", "-c", script}, Env: map[string]string{"GREETING": "hi"}}
	b, _ := json.Marshal(rec)
	if err := os.WriteFile(filepath.Join(dir, fileRecord), b, 0o600); err != nil {
		t.Fatal(err)
	}
	if code, out := sup(t, "start", dir); code != 0 {
		t.Fatalf("start: exit code %d: %s", code, out)
	}
	t.Cleanup(func() { sup(t, "delete", dir, "0s") })
	return dir
}

// sup runs a verb of the supervisor and returns its exit code and output.
func sup(t *testing.T, args ...string) (int, string) {
	t.Helper()
	var out bytes.Buffer
	code := Supervise(args, &out, &out)
	return code, out.String()
}

func statusOf(t *testing.T, dir string) *status {
	t.Helper()
	st, err := readStatus(dir)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// waitPhase waits for the instance of dir to reach phase.
func waitPhase(t *testing.T, dir, phase string) *status {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		st := statusOf(t, dir)
		if st.Phase == phase {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("never %s: %+v", phase, st)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestSupervisorExitCodes(t *testing.T) {
	dir := supervised(t, `echo "$GREETING $BERTH_INSTANCE_ID"; echo oops >&2; exit 3`)
	st := waitPhase(t, dir, "exited")
	if st.ExitCode == nil || *st.ExitCode != 3 {
		t.Errorf("exit code %v, want 3", st.ExitCode)
	}
	if out, errOut := supLogsOf(t, dir, "both"); out != "hi n.0123456789abcdef\n" || errOut != "oops\n" {
		t.Errorf("logs: stdout %q, stderr %q", out, errOut)
	}
	if code, _ := sup(t, "signal", dir, "TERM"); code != exitNotRunning {
		t.Errorf("signal to an ended instance: exit code %d, want %d", code, exitNotRunning)
	}
	// Started again, the output is kept and appended to.
	if code, out := sup(t, "start", dir); code != 0 {
		t.Fatalf("start again: %d %s", code, out)
	}
	waitPhase(t, dir, "exited")
	if out, _ := supLogsOf(t, dir, "out"); strings.Count(out, "hi ") != 2 {
		t.Errorf("logs after a second run: %q, want both runs' lines", out)
	}
}

// supLogsOf runs the logs verb on dir's streams ("out", "err" or "both")
// and returns them as its frames carry them; its own stderr must stay
// empty.
func supLogsOf(t *testing.T, dir, streams string) (string, string) {
	t.Helper()
	var framed, own, out, errOut bytes.Buffer
	if code := Supervise([]string{"logs", dir, streams, "0", "once"}, &framed, &own); code != 0 {
		t.Fatalf("logs: exit code %d: %s", code, own.String())
	}
	if own.Len() > 0 {
		t.Errorf("logs printed on its own stderr: %q", own.String())
	}
	if typ, _, err := readStreams(&framed, &out, &errOut); err != io.EOF {
		t.Fatalf("logs: a frame %q, or %v, after the streams", typ, err)
	}
	return out.String(), errOut.String()
}

func TestSupervisorSignals(t *testing.T) {
	dir := supervised(t, `trap 'exit 0' USR1; echo up; sleep 1000 & wait $!`)
	st := waitPhase(t, dir, "running")
	if code, out := sup(t, "signal", dir, "STOP"); code != 0 {
		t.Fatalf("signal STOP: %d %s", code, out)
	}
	waitPhase(t, dir, "suspended")
	sup(t, "signal", dir, "CONT")
	waitPhase(t, dir, "running")
	if code, out := sup(t, "signal", dir, "KILL"); code != 0 {
		t.Fatalf("signal KILL: %d %s", code, out)
	}
	st = waitPhase(t, dir, "exited")
	if st.ExitCode == nil || *st.ExitCode != 128+9 || !strings.Contains(st.Message, "SIGKILL") {
		t.Errorf("killed: exit code %v (%s), want 137 by SIGKILL", st.ExitCode, st.Message)
	}
	if code, _ := sup(t, "signal", dir, "NOPE"); code != exitUsage {
		t.Errorf("a bad signal: exit code %d", code)
	}
}

// TestSupervisorOutlivesItsCaller: the process runs on when the supervisor
// is killed; its state is then read from /proc, an exec is refused, and a
// stop still ends it.
func TestSupervisorOutlivesItsCaller(t *testing.T) {
	dir := supervised(t, `trap 'exit 0' TERM; sleep 1000 & wait $!`)
	waitPhase(t, dir, "running")
	var rs runState
	if err := readJSON(filepath.Join(dir, fileState), &rs); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(rs.Supervisor, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond)
	if st := statusOf(t, dir); st.Phase != "running" {
		t.Fatalf("with its supervisor killed: %+v, want running", st)
	}
	// Nobody runs execs for it any more.
	if err := supExec(dir, noInput(t), io.Discard); !isCoded(err, exitPermanent) {
		t.Errorf("exec with the supervisor killed: %v, want exit code %d", err, exitPermanent)
	}
	if code, out := sup(t, "stop", dir, "5s"); code != 0 {
		t.Fatalf("stop: %d %s", code, out)
	}
	st := statusOf(t, dir)
	if st.Phase != "stopped" || st.ExitCode != nil {
		t.Errorf("stopped with no supervisor to see the end: %+v, want stopped with no exit code", st)
	}
}

func TestSupervisorMissingExecutable(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "i2")
	os.Mkdir(dir, 0o700)
	b, _ := json.Marshal(record{ID: "n.0123456789abcdef", Node: "n", Argv: []string{"no-such-program-here"}})
	os.WriteFile(filepath.Join(dir, fileRecord), b, 0o600)
	code, out := sup(t, "start", dir)
	if code != exitPermanent || !strings.Contains(out, "no-such-program-here") {
		t.Errorf("start of a missing program: exit code %d, %q; want %d naming it", code, out, exitPermanent)
	}
	if code, _ := sup(t, "status", filepath.Join(t.TempDir(), "none")); code != 0 {
		t.Errorf("status of a missing directory: exit code %d, want 0 and phase gone", code)
	}
	if code, _ := sup(t, "delete", filepath.Join(t.TempDir(), "none"), "1s"); code != exitNotFound {
		t.Errorf("delete of a missing directory: exit code %d, want %d", code, exitNotFound)
	}
}

func TestTailOffset(t *testing.T) {
	f, err := os.CreateTemp(t.TempDir(), "log")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	f.WriteString("a\nb\nc\n")
	for n, want := range map[int]int64{1: 4, 2: 2, 3: 0, 9: 0} {
		if got, err := tailOffset(f, n); err != nil || got != want {
			t.Errorf("tailOffset(%d) = %d, %v; want %d", n, got, err, want)
		}
	}
}

func TestSupervisorUsage(t *testing.T) {
	dir := supervised(t, `sleep 1000`)
	waitPhase(t, dir, "running")
	var out bytes.Buffer
	if code := Supervise([]string{"usage", dir}, &out, &out); code != 0 {
		t.Fatalf("usage: exit code %d: %s", code, out.String())
	}
	var u usage
	if err := json.Unmarshal(out.Bytes(), &u); err != nil || u.Memory <= 0 || u.CPU < 0 {
		t.Errorf("usage: %q (%v), want resident memory", out.String(), err)
	}
	sup(t, "stop", dir, "1s")
	if code, _ := sup(t, "usage", dir); code != exitNotRunning {
		t.Errorf("usage of a stopped instance: exit code %d, want %d", code, exitNotRunning)
	}
}
