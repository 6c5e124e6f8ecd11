package local

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/driver/drivertest"
	"github.com/berth-dev/berth/driver/drivertest/probe"
	"github.com/berth-dev/berth/internal/procfs"
)

// testTimeout bounds every wait in these tests; it is a liveness bound, not
// a performance assertion.
const testTimeout = 30 * time.Second

// serviceScript writes the two hello lines, then runs until SIGTERM, on
// which it exits 0.
const serviceScript = `trap 'exit 0' TERM; echo hello stdout; echo hello stderr >&2; sleep 1000 & wait $!`

func serviceSpec() *driver.Spec {
	return &driver.Spec{Kind: driver.KindProcess, Entrypoint: []string{"/bin/sh", "-c", serviceScript}}
}

func shSpec(script string) *driver.Spec {
	return &driver.Spec{Kind: driver.KindProcess, Entrypoint: []string{"/bin/sh", "-c", script}}
}

// open opens a driver on dir through the registry, as Berth does.
func open(t *testing.T, dir string, raw map[string]any) *Driver {
	t.Helper()
	def, err := driver.Lookup("local")
	if err != nil {
		t.Fatal(err)
	}
	opts := map[string]any{"data_dir": dir, "stop_grace": "5s", "poll_interval": "20ms", "allow_root": true}
	for k, v := range raw {
		opts[k] = v
	}
	d, err := def.Open(context.Background(), opts, driver.Env{})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	return d.(*Driver)
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	t.Cleanup(cancel)
	return ctx
}

func create(t *testing.T, d *Driver, sp *driver.Spec) *driver.Instance {
	t.Helper()
	ctx := ctxT(t)
	op, err := d.Create(ctx, "", sp)
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	in, err := driver.Drive(ctx, op)
	if err != nil {
		t.Fatalf("Create: operation: %v", err)
	}
	t.Cleanup(func() { remove(t, d, in.ID) })
	return in
}

// remove deletes id through a driver of its own (d may be closed by then)
// and accepts ErrNotFound.
func remove(t *testing.T, d *Driver, id string) {
	dd := d
	if d.closed.Load() {
		dd = open(t, d.dir, nil)
		defer dd.Close(context.Background())
	}
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	op, err := dd.Delete(ctx, id)
	if err == nil {
		_, err = driver.Drive(ctx, op)
	}
	if err != nil && !errors.Is(err, driver.ErrNotFound) {
		t.Errorf("cleanup: Delete %s: %v", id, err)
	}
}

func waitFor(t *testing.T, d *Driver, id, what string, cond func(*driver.Instance) bool) *driver.Instance {
	t.Helper()
	ctx := ctxT(t)
	for {
		in, err := d.Get(ctx, id)
		if err != nil {
			t.Fatalf("Get %s: %v", id, err)
		}
		if cond(in) {
			return in
		}
		if sleep(ctx, 10*time.Millisecond) != nil {
			t.Fatalf("instance %s never became %s: state %s (%s)", id, what, in.State, in.Message)
		}
	}
}

func hasState(s driver.State) func(*driver.Instance) bool {
	return func(in *driver.Instance) bool { return in.State == s }
}

func pidOf(t *testing.T, d *Driver, id string) int {
	t.Helper()
	rec, err := d.load(id)
	if err != nil {
		t.Fatal(err)
	}
	return rec.Run.PID
}

// alive reports whether pid exists and is not a zombie.
func alive(pid int) bool {
	st, err := procfs.ReadStat(pid)
	return err == nil && st.State != 'Z'
}

// waitMembers waits until process group pgid has n live members.
func waitMembers(t *testing.T, pgid, n int) {
	t.Helper()
	ctx := ctxT(t)
	for {
		m, err := groupMembers(pgid)
		if err == nil && len(m) == n {
			return
		}
		if sleep(ctx, 5*time.Millisecond) != nil {
			t.Fatalf("group %d never had %d members (has %d)", pgid, n, len(m))
		}
	}
}

func TestConformance(t *testing.T) {
	drivertest.Run(t, drivertest.Harness{
		Open: func(t *testing.T) driver.Driver { return open(t, t.TempDir(), nil) },
		Spec: serviceSpec,
		Exec: func(steps ...string) []string {
			exe, err := os.Executable()
			if err != nil {
				t.Fatal(err)
			}
			return append([]string{exe, probeArg}, steps...)
		},
		MissingImage: func() *driver.Spec {
			return &driver.Spec{Kind: driver.KindProcess, Image: "/nonexistent/berth-no-such-program"}
		},
		Timeout: testTimeout,
	})
}

func TestReopenFindsInstances(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	dir := t.TempDir()
	d1 := open(t, dir, nil)
	running := create(t, d1, serviceSpec())
	exited := create(t, d1, shSpec("echo bye; exit 3"))
	tagged := shSpec("exit 0")
	tagged.Tags = map[string]string{"team": "a"}
	create(t, d1, tagged)
	exitedPID := pidOf(t, d1, exited.ID)
	if err := d1.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	// Let the short process end while no driver looks at it.
	ctx := ctxT(t)
	for alive(exitedPID) {
		if sleep(ctx, 10*time.Millisecond) != nil {
			t.Fatal("the short process never ended")
		}
	}

	d2 := open(t, dir, nil)
	defer d2.Close(context.Background())
	list, err := d2.List(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 3 {
		t.Fatalf("List after reopen: %d instances, want 3", len(list))
	}
	byID := map[string]*driver.Instance{}
	for _, in := range list {
		byID[in.ID] = in
		if in.Tags[driver.TagManaged] != "true" {
			t.Errorf("instance %s lacks %s", in.ID, driver.TagManaged)
		}
	}
	if in := byID[running.ID]; in == nil || in.State != driver.StateRunning {
		t.Errorf("running instance after reopen: %+v", in)
	}
	in := byID[exited.ID]
	if in == nil || in.State != driver.StateExited || in.ExitCode == nil || *in.ExitCode != 3 {
		t.Fatalf("exited instance after reopen: %+v, want exited with code 3", in)
	}
	// The exit code is recorded: a third driver reads it from the record.
	d3 := open(t, dir, nil)
	defer d3.Close(context.Background())
	again, err := d3.Get(ctx, exited.ID)
	if err != nil || again.ExitCode == nil || *again.ExitCode != 3 {
		t.Errorf("Get from a third driver: %+v %v, want exit code 3", again, err)
	}
	list, err = d3.List(ctx, map[string]string{"team": "a"})
	if err != nil || len(list) != 1 {
		t.Errorf("List by tag after reopen: %d instances (%v), want 1", len(list), err)
	}
}

func TestKilledBehindBerthsBack(t *testing.T) {
	d := open(t, t.TempDir(), nil)
	defer d.Close(context.Background())
	in := create(t, d, serviceSpec())
	waitMembers(t, pidOf(t, d, in.ID), 2) // the shell and its sleep
	if err := syscall.Kill(pidOf(t, d, in.ID), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	got := waitFor(t, d, in.ID, "exited", hasState(driver.StateExited))
	if got.ExitCode == nil || *got.ExitCode != 128+int(syscall.SIGKILL) {
		t.Errorf("exit code %v, want %d", got.ExitCode, 128+int(syscall.SIGKILL))
	}
	if got.Finished.IsZero() {
		t.Error("Finished is not set")
	}
	// The shell's child lives on in the group; Delete ends it too.
	pid := pidOf(t, d, in.ID)
	if left, _ := stragglers(pid, envInstanceID+"="+in.ID); len(left) != 1 {
		t.Fatalf("%d processes left in the group, want the shell's sleep", len(left))
	}
	remove(t, d, in.ID)
	if left, _ := stragglers(pid, envInstanceID+"="+in.ID); len(left) != 0 {
		t.Errorf("after Delete, %d processes of the instance remain", len(left))
	}
}

func TestPIDReuseDefence(t *testing.T) {
	d := open(t, t.TempDir(), nil)
	defer d.Close(context.Background())
	in := create(t, d, serviceSpec())
	ctx := ctxT(t)
	// The instance's process ends and its pid goes to another program: a
	// process of its own group, started later, without Berth's variables.
	old := pidOf(t, d, in.ID)
	syscall.Kill(-old, syscall.SIGKILL)
	var ws syscall.WaitStatus
	if _, err := syscall.Wait4(old, &ws, 0, nil); err != nil {
		t.Fatal(err)
	}
	stranger := exec.Command("/bin/sh", "-c", "sleep 1000 & wait")
	stranger.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := stranger.Start(); err != nil {
		t.Fatal(err)
	}
	pid := stranger.Process.Pid
	t.Cleanup(func() {
		syscall.Kill(-pid, syscall.SIGKILL)
		stranger.Wait()
	})
	waitMembers(t, pid, 2)
	st, err := procfs.ReadStat(pid)
	if err != nil {
		t.Fatal(err)
	}
	unlock := d.locks.lock(in.ID)
	rec, err := d.load(in.ID)
	if err == nil {
		rec.Run.PID = pid
		rec.Run.StartTicks = st.StartTicks - 1 // the old process started earlier
		err = d.save(rec)
	}
	unlock()
	if err != nil {
		t.Fatal(err)
	}
	got, err := d.Get(ctx, in.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.State != driver.StateExited || got.ExitCode != nil {
		t.Errorf("instance whose pid belongs to another process: state %s exit code %v, want exited with no code", got.State, got.ExitCode)
	}
	if err := d.Kill(ctx, in.ID, "KILL"); !errors.Is(err, driver.ErrPermanent) {
		t.Errorf("Kill: %v, want ErrPermanent (not running)", err)
	}
	if err := d.Stop(ctx, in.ID, 0); err != nil {
		t.Errorf("Stop: %v", err)
	}
	remove(t, d, in.ID)
	if members, _ := groupMembers(pid); !alive(pid) || len(members) != 2 {
		t.Fatalf("the process group that reused the pid was signalled: %d members left", len(members))
	}
	if _, err := d.Get(ctx, in.ID); !errors.Is(err, driver.ErrNotFound) {
		t.Errorf("Get after delete: %v, want ErrNotFound", err)
	}
}

func TestStopGraceThenKill(t *testing.T) {
	d := open(t, t.TempDir(), map[string]any{"stop_grace": "200ms"})
	defer d.Close(context.Background())
	stubborn := shSpec(`trap '' TERM; echo ready; while :; do sleep 0.05; done`)
	ctx := ctxT(t)

	a := create(t, d, stubborn)
	waitFor(t, d, a.ID, "ready", func(*driver.Instance) bool { return logsOf(t, d, a.ID, false) == "ready\n" })
	if err := d.Stop(ctx, a.ID, 200*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	got, _ := d.Get(ctx, a.ID)
	if got.State != driver.StateStopped || got.ExitCode == nil || *got.ExitCode != 128+int(syscall.SIGKILL) {
		t.Errorf("process ignoring SIGTERM after Stop: state %s code %v, want stopped by SIGKILL", got.State, got.ExitCode)
	}

	b := create(t, d, serviceSpec())
	waitHello(t, d, b.ID) // the TERM trap is set
	if err := d.Stop(ctx, b.ID, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	got, _ = d.Get(ctx, b.ID)
	if got.State != driver.StateStopped || got.ExitCode == nil || *got.ExitCode != 0 {
		t.Errorf("process handling SIGTERM after Stop: state %s code %v, want stopped with code 0", got.State, got.ExitCode)
	}

	// Delete uses stop_grace; the whole group goes, including the children.
	c := create(t, d, stubborn)
	pid := pidOf(t, d, c.ID)
	waitFor(t, d, c.ID, "ready", func(*driver.Instance) bool { return logsOf(t, d, c.ID, false) == "ready\n" })
	remove(t, d, c.ID)
	if members, _ := groupMembers(pid); len(members) != 0 {
		t.Errorf("after Delete, %d processes of the group remain", len(members))
	}
	if _, err := os.Stat(d.instDir(c.ID)); !os.IsNotExist(err) {
		t.Errorf("instance directory after Delete: %v", err)
	}
}

// waitHello waits until a service spec instance has written its first
// line, after setting its TERM trap.
func waitHello(t *testing.T, d *Driver, id string) {
	t.Helper()
	waitFor(t, d, id, "ready", func(*driver.Instance) bool { return strings.HasPrefix(logsOf(t, d, id, false), "hello stdout") })
}

func logsOf(t *testing.T, d *Driver, id string, stderr bool) string {
	t.Helper()
	var o, e bytes.Buffer
	if err := d.Logs(ctxT(t), id, driver.LogOptions{}, &o, &e); err != nil {
		t.Fatal(err)
	}
	if stderr {
		return e.String()
	}
	return o.String()
}

func TestLogsFollowTailAndRestart(t *testing.T) {
	d := open(t, t.TempDir(), nil)
	defer d.Close(context.Background())
	in := create(t, d, shSpec(`for i in 1 2 3; do echo line $i; sleep 0.05; done; echo oops >&2; exit 2`))
	var o, e bytes.Buffer
	// Follow returns by itself once the process has ended.
	if err := d.Logs(ctxT(t), in.ID, driver.LogOptions{Follow: true}, &o, &e); err != nil {
		t.Fatalf("Logs follow: %v", err)
	}
	if o.String() != "line 1\nline 2\nline 3\n" || e.String() != "oops\n" {
		t.Errorf("followed stdout %q stderr %q", o.String(), e.String())
	}
	got := waitFor(t, d, in.ID, "exited", hasState(driver.StateExited))
	if got.ExitCode == nil || *got.ExitCode != 2 {
		t.Errorf("exit code %v, want 2", got.ExitCode)
	}
	o.Reset()
	if err := d.Logs(ctxT(t), in.ID, driver.LogOptions{Stdout: true, Tail: 2}, &o, nil); err != nil {
		t.Fatal(err)
	}
	if o.String() != "line 2\nline 3\n" {
		t.Errorf("tail 2: %q", o.String())
	}
	// Start runs the same record again; the logs are appended to.
	if err := d.Start(ctxT(t), in.ID); err != nil {
		t.Fatal(err)
	}
	o.Reset()
	e.Reset()
	if err := d.Logs(ctxT(t), in.ID, driver.LogOptions{Follow: true}, &o, &e); err != nil {
		t.Fatal(err)
	}
	if strings.Count(o.String(), "line 3\n") != 2 {
		t.Errorf("stdout after a second run: %q", o.String())
	}
}

func TestTailOffset(t *testing.T) {
	cases := []struct {
		text string
		n    int
		want string
	}{
		{"a\nb\nc\n", 1, "c\n"},
		{"a\nb\nc\n", 2, "b\nc\n"},
		{"a\nb\nc\n", 5, "a\nb\nc\n"},
		{"a\nb\nc", 1, "c"},
		{"a\nb\nc", 2, "b\nc"},
		{"", 3, ""},
		{"\n\n", 1, "\n"},
		{strings.Repeat("x", 70000) + "\nlast\n", 1, "last\n"},
	}
	for _, c := range cases {
		p := filepath.Join(t.TempDir(), "log")
		if err := os.WriteFile(p, []byte(c.text), 0o600); err != nil {
			t.Fatal(err)
		}
		f, err := os.Open(p)
		if err != nil {
			t.Fatal(err)
		}
		off, err := tailOffset(f, c.n)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		if got := c.text[off:]; got != c.want {
			t.Errorf("tail %d of %.20q: %.20q, want %.20q", c.n, c.text, got, c.want)
		}
	}
}

func TestBadOptions(t *testing.T) {
	def, err := driver.Lookup("local")
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		raw  map[string]any
		path string
	}{
		{map[string]any{"no_such_option": "x"}, "no_such_option"},
		{map[string]any{"stop_grace": 5}, "stop_grace"},
		{map[string]any{"stop_grace": "soon"}, "stop_grace"},
		{map[string]any{"stop_grace": "-1s"}, "stop_grace"},
		{map[string]any{"labels": []any{"a"}}, "labels"},
		{map[string]any{"poll_interval": "0s"}, "poll_interval"},
	}
	for _, c := range cases {
		_, err := def.Open(context.Background(), c.raw, driver.Env{DataDir: t.TempDir()})
		var fe *driver.FieldError
		if !errors.Is(err, driver.ErrInvalid) || !errors.As(err, &fe) || fe.Path != c.path {
			t.Errorf("options %v: %v, want an invalid-field error naming %q", c.raw, err, c.path)
		}
	}
}

func TestDefaultDataDir(t *testing.T) {
	def, _ := driver.Lookup("local")
	base := t.TempDir()
	d, err := def.Open(context.Background(), nil, driver.Env{DataDir: base})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close(context.Background())
	if got := d.(*Driver).DataDir(); got != filepath.Join(base, "local") {
		t.Errorf("data dir %s, want %s", got, filepath.Join(base, "local"))
	}
}

func TestUnsupportedSpecs(t *testing.T) {
	d := open(t, t.TempDir(), nil)
	defer d.Close(context.Background())
	ctx := ctxT(t)
	cases := []struct {
		name   string
		node   string
		mutate func(*driver.Spec)
		want   error
	}{
		{"container", "", func(sp *driver.Spec) { sp.Kind = driver.KindContainer; sp.Image = "busybox" }, driver.ErrUnsupported},
		{"empty-kind", "", func(sp *driver.Spec) { sp.Kind = "" }, driver.ErrUnsupported}, // container, the contract's default
		{"empty-kind-image", "", func(sp *driver.Spec) { sp.Kind = ""; sp.Image = "/bin/sh" }, driver.ErrUnsupported},
		{"bad-kind", "", func(sp *driver.Spec) { sp.Kind = "submarine" }, driver.ErrInvalid},
		{"vm", "", func(sp *driver.Spec) { sp.Kind = driver.KindVM; sp.Image = "debian" }, driver.ErrUnsupported},
		{"volumes", "", func(sp *driver.Spec) { sp.Volumes = []driver.Volume{{Source: "/tmp", Target: "/data"}} }, driver.ErrUnsupported},
		{"restart-always", "", func(sp *driver.Spec) { sp.RestartPolicy.Name = "always" }, driver.ErrUnsupported},
		{"unknown-node", "elsewhere", func(*driver.Spec) {}, driver.ErrNotFound},
		{"too-big", "", func(sp *driver.Spec) { sp.Memory = d.cap.Memory * 2 }, driver.ErrInsufficientCapacity},
		{"gpus", "", func(sp *driver.Spec) { sp.GPUs = 1 }, driver.ErrInsufficientCapacity},
		{"bad-env", "", func(sp *driver.Spec) { sp.Env = map[string]string{"1X": "y"} }, driver.ErrInvalid},
	}
	for _, c := range cases {
		sp := serviceSpec()
		c.mutate(sp)
		op, err := d.Create(ctx, c.node, sp)
		if op != nil || !errors.Is(err, c.want) {
			t.Errorf("%s: Create gave %v, want %v", c.name, err, c.want)
		}
	}
	ids, _ := d.ids()
	if len(ids) != 0 {
		t.Errorf("refused creates left %d instance directories", len(ids))
	}
}

func TestEnvFilesUserDataPorts(t *testing.T) {
	d := open(t, t.TempDir(), nil)
	defer d.Close(context.Background())
	sp := shSpec(`echo "$FOO|$(cat "$BERTH_CONFIG_DIR/etc/app.conf")|$(cat "$BERTH_USER_DATA_FILE")|$BERTH_PORT_8080|$PORT|$BERTH_PORT_53_UDP|$(pwd)|$BERTH_INSTANCE_NAME"`)
	sp.Name = "envtest"
	sp.Env = map[string]string{"FOO": "bar", "PATH": "/bin:/usr/bin"}
	sp.ConfigFiles = []driver.ConfigFile{{Path: "/etc/app.conf", Content: "setting=1", Mode: 0o600}}
	sp.UserData = "#cloud-config"
	sp.Ports = []driver.Port{{ContainerPort: 8080}, {ContainerPort: 53, Protocol: "udp"}}
	in := create(t, d, sp)
	if len(in.Ports) != 2 || in.Ports[0].HostPort == 0 || in.Ports[1].Protocol != "udp" {
		t.Fatalf("ports: %+v", in.Ports)
	}
	waitFor(t, d, in.ID, "exited", hasState(driver.StateExited))
	want := strings.Join([]string{"bar", "setting=1", "#cloud-config",
		strconv.Itoa(in.Ports[0].HostPort), strconv.Itoa(in.Ports[0].HostPort),
		strconv.Itoa(in.Ports[1].HostPort), d.workDir(in.ID), "envtest"}, "|") + "\n"
	if got := logsOf(t, d, in.ID, false); got != want {
		t.Errorf("process saw %q, want %q", got, want)
	}
	fi, err := os.Stat(filepath.Join(d.filesDir(in.ID), "etc", "app.conf"))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("config file: %v %v, want mode 0600", fi, err)
	}
	if _, err := os.Stat("/etc/app.conf"); err == nil {
		t.Error("a config file was written outside the instance directory")
	}

	// A name already taken.
	op, err := d.Create(ctxT(t), "", sp)
	if op != nil || !errors.Is(err, driver.ErrAlreadyExists) {
		t.Errorf("second create named envtest: %v, want ErrAlreadyExists", err)
	}
	if found, err := d.Find(ctxT(t), "envtest"); err != nil || found.ID != in.ID {
		t.Errorf("Find envtest: %v %v", found, err)
	}
}

func TestFixedPortBusy(t *testing.T) {
	d := open(t, t.TempDir(), nil)
	defer d.Close(context.Background())
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	port := l.Addr().(*net.TCPAddr).Port
	sp := serviceSpec()
	sp.Ports = []driver.Port{{ContainerPort: 80, HostPort: port, HostIP: "127.0.0.1"}}
	ctx := ctxT(t)
	op, err := d.Create(ctx, "", sp)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := driver.Drive(ctx, op); !errors.Is(err, driver.ErrInsufficientCapacity) {
		t.Fatalf("create on a busy port: %v, want ErrInsufficientCapacity", err)
	}
	if list, _ := d.List(ctx, nil); len(list) != 0 {
		t.Errorf("failed create left %d instances", len(list))
	}
}

func TestMissingExecutable(t *testing.T) {
	d := open(t, t.TempDir(), nil)
	defer d.Close(context.Background())
	ctx := ctxT(t)
	for _, sp := range []*driver.Spec{
		{Kind: driver.KindProcess, Command: []string{"berth-no-such-command"}},
		{Kind: driver.KindProcess, Command: []string{"/etc/hostname"}}, // not executable
		{Kind: driver.KindProcess, Command: []string{"/bin/true"}, WorkingDir: "/nonexistent"},
	} {
		op, err := d.Create(ctx, "", sp)
		if err == nil {
			_, err = driver.Drive(ctx, op)
		}
		if !errors.Is(err, driver.ErrPermanent) {
			t.Errorf("%v: %v, want ErrPermanent", sp.Command, err)
		}
	}
	if ids, _ := d.ids(); len(ids) != 0 {
		t.Errorf("failed creates left %d instance directories", len(ids))
	}
}

func TestKillSuspendResume(t *testing.T) {
	d := open(t, t.TempDir(), nil)
	defer d.Close(context.Background())
	ctx := ctxT(t)
	in := create(t, d, serviceSpec())
	var fe *driver.FieldError
	if err := d.Kill(ctx, in.ID, "SIGNOPE"); !errors.As(err, &fe) || fe.Path != "signal" {
		t.Errorf("Kill with a bad signal: %v, want a field error naming signal", err)
	}
	if err := d.Resume(ctx, in.ID); !errors.Is(err, driver.ErrNotSuspended) {
		t.Errorf("Resume of a running instance: %v", err)
	}
	if err := d.Suspend(ctx, in.ID); err != nil {
		t.Fatal(err)
	}
	if got, _ := d.Get(ctx, in.ID); got.State != driver.StateSuspended {
		t.Errorf("after Suspend: %s", got.State)
	}
	if err := d.Resume(ctx, in.ID); err != nil {
		t.Fatal(err)
	}
	if got, _ := d.Get(ctx, in.ID); got.State != driver.StateRunning {
		t.Errorf("after Resume: %s", got.State)
	}
	// USR1 is not trapped: it ends the shell.
	if err := d.Kill(ctx, in.ID, "usr1"); err != nil {
		t.Fatal(err)
	}
	got := waitFor(t, d, in.ID, "exited", hasState(driver.StateExited))
	if got.ExitCode == nil || *got.ExitCode != 128+int(syscall.SIGUSR1) {
		t.Errorf("after Kill usr1: exit code %v", got.ExitCode)
	}
	if pid := pidOf(t, d, in.ID); syscall.Kill(-pid, 0) == nil {
		if m, _ := groupMembers(pid); len(m) > 0 {
			t.Errorf("Kill left %d members of the group", len(m))
		}
	}
}

func TestParseSignal(t *testing.T) {
	for in, want := range map[string]syscall.Signal{"TERM": syscall.SIGTERM, "SIGKILL": syscall.SIGKILL, "9": syscall.SIGKILL, "sigstop": syscall.SIGSTOP, " hup ": syscall.SIGHUP} {
		if got, ok := parseSignal(in); !ok || got != want {
			t.Errorf("parseSignal(%q) = %v %v, want %v", in, got, ok, want)
		}
	}
	for _, in := range []string{"", "0", "65", "NOPE", "SIG"} {
		if _, ok := parseSignal(in); ok {
			t.Errorf("parseSignal(%q) accepted", in)
		}
	}
}

func TestResizeCgroups(t *testing.T) {
	d := open(t, t.TempDir(), nil)
	defer d.Close(context.Background())
	if !d.cg.usable() {
		t.Skipf("no usable cgroups on this host: %s", d.cg.reason)
	}
	ctx := ctxT(t)
	sp := shSpec(`sleep 1000 & wait`)
	sp.CPU, sp.Memory = 200, 64*driver.MiB
	in := create(t, d, sp)
	pid := pidOf(t, d, in.ID)
	if !d.cg.contains(in.ID, pid) {
		t.Error("the process is not in its cgroup")
	}
	check := func(cpu driver.MilliCPU, mem driver.Bytes) {
		t.Helper()
		c, m, err := d.cg.limits(in.ID)
		if err != nil || c != cpu || m != mem {
			t.Errorf("limits cpus %s memory %s (%v), want %s and %s", c, m, err, cpu, mem)
		}
	}
	check(200, 64*driver.MiB)
	if err := d.Resize(ctx, in.ID, driver.Resources{CPU: 1500}); err != nil {
		t.Fatal(err)
	}
	check(1500, 64*driver.MiB)
	if err := d.Resize(ctx, in.ID, driver.Resources{Memory: 128 * driver.MiB}); err != nil {
		t.Fatal(err)
	}
	check(1500, 128*driver.MiB)
	got, _ := d.Get(ctx, in.ID)
	if got.Resources.CPU != 1500 || got.Resources.Memory != 128*driver.MiB {
		t.Errorf("instance resources after resize: %+v", got.Resources)
	}
	if err := d.Resize(ctx, in.ID, driver.Resources{GPUs: 1}); !errors.Is(err, driver.ErrUnsupported) {
		t.Errorf("resize gpus: %v, want ErrUnsupported", err)
	}
	dirs := d.cg.dirs(in.ID)
	remove(t, d, in.ID)
	for _, dir := range dirs {
		if _, err := os.Stat(dir); !os.IsNotExist(err) {
			t.Errorf("cgroup %s after Delete: %v", dir, err)
		}
	}
}

func TestResizeWithoutCgroups(t *testing.T) {
	d := open(t, t.TempDir(), map[string]any{"cgroup_root": ""})
	defer d.Close(context.Background())
	in := create(t, d, serviceSpec())
	if err := d.Resize(ctxT(t), in.ID, driver.Resources{CPU: 500}); !errors.Is(err, driver.ErrUnsupported) {
		t.Errorf("Resize without cgroups: %v, want ErrUnsupported", err)
	}
}

func TestUsage(t *testing.T) {
	d := open(t, t.TempDir(), nil)
	defer d.Close(context.Background())
	in := create(t, d, shSpec(`while :; do :; done`))
	ctx := ctxT(t)
	u, err := d.Usage(ctx, in.ID)
	if err != nil {
		t.Fatal(err)
	}
	if u.CPU <= 0 || u.Memory <= 0 {
		t.Errorf("usage of a busy loop: %+v, want cpu and memory above zero", u)
	}
	st, err := d.State(ctx)
	if err != nil {
		t.Fatal(err)
	}
	n := st.Nodes[0]
	if n.Instances != 1 || n.InUse == nil || n.InUse.Memory <= 0 || n.Capacity.CPU <= 0 {
		t.Errorf("node: %+v", n)
	}
}

// TestAdoptUnrecordedProcess covers a Berth that stopped after starting a
// process but before recording its pid.
func TestAdoptUnrecordedProcess(t *testing.T) {
	dir := t.TempDir()
	d := open(t, dir, nil)
	defer d.Close(context.Background())
	rec := &record{ID: newID(), Node: d.node, Spec: serviceSpec(), Tags: map[string]string{driver.TagManaged: "true"}, Created: time.Now(), Phase: phaseCreating}
	if err := os.MkdirAll(d.instDir(rec.ID), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := d.save(rec); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("/bin/sh", "-c", serviceScript)
	cmd.Env = []string{envInstanceID + "=" + rec.ID, "PATH=" + defaultPath}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid := cmd.Process.Pid
	cmd.Process.Release()
	t.Cleanup(func() {
		syscall.Kill(-pid, syscall.SIGKILL)
		var ws syscall.WaitStatus
		syscall.Wait4(pid, &ws, 0, nil)
	})
	got, err := d.Get(ctxT(t), rec.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.State != driver.StateRunning || pidOf(t, d, rec.ID) != pid {
		t.Fatalf("unrecorded process: state %s, pid %d, want running with pid %d", got.State, pidOf(t, d, rec.ID), pid)
	}
	remove(t, d, rec.ID)
	if alive(pid) {
		t.Error("Delete left the adopted process running")
	}

	// A create interrupted before the start: no process has the id. The
	// instance shows as failed; Start runs it.
	rec = &record{ID: newID(), Node: d.node, Spec: serviceSpec(), Tags: map[string]string{driver.TagManaged: "true"}, Created: time.Now(), Phase: phaseCreating}
	if err := os.MkdirAll(d.instDir(rec.ID), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := d.save(rec); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { remove(t, d, rec.ID) })
	got, err = d.Get(ctxT(t), rec.ID)
	if err != nil || got.State != driver.StateFailed {
		t.Fatalf("interrupted create: %+v %v, want failed", got, err)
	}
	if err := d.Start(ctxT(t), rec.ID); err != nil {
		t.Fatal(err)
	}
	if got, _ := d.Get(ctxT(t), rec.ID); got.State != driver.StateRunning {
		t.Errorf("after Start: %s", got.State)
	}
}

func TestWatch(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	d := open(t, t.TempDir(), nil)
	defer d.Close(context.Background())
	ctx, cancel := context.WithCancel(ctxT(t))
	events := make(chan driver.Event, 100)
	done := make(chan error, 1)
	go func() { done <- d.Watch(ctx, func(e driver.Event) { events <- e }) }()
	in := create(t, d, serviceSpec())
	next := func(want driver.EventType, wait time.Duration) (driver.Event, bool) {
		t.Helper()
		timeout := time.After(wait)
		for {
			select {
			case e := <-events:
				if e.Instance == in.ID && e.Type == want {
					return e, true
				}
			case <-timeout:
				return driver.Event{}, false
			}
		}
	}
	// Watch gives no sign of when it has taken its baseline; an instance
	// created before then starts unseen. Create again until a start is seen.
	for try := 0; ; try++ {
		if _, ok := next(driver.EventStart, time.Second); ok {
			break
		}
		if try == 10 {
			t.Fatal("no start event")
		}
		remove(t, d, in.ID)
		in = create(t, d, serviceSpec())
	}
	must := func(want driver.EventType) driver.Event {
		t.Helper()
		e, ok := next(want, testTimeout)
		if !ok {
			t.Fatalf("no %s event", want)
		}
		return e
	}
	waitHello(t, d, in.ID) // the TERM trap is set
	if err := d.Stop(ctx, in.ID, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if e := must(driver.EventDie); e.Message != "exit code 0" {
		t.Errorf("die event message %q", e.Message)
	}
	if e := must(driver.EventStop); e.State != driver.StateStopped {
		t.Errorf("stop event state %s", e.State)
	}
	remove(t, d, in.ID)
	must(driver.EventDelete)
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("Watch returned %v", err)
	}
}

func TestDeleteDuringCreate(t *testing.T) {
	d := open(t, t.TempDir(), nil)
	defer d.Close(context.Background())
	ctx := ctxT(t)
	op, err := d.Create(ctx, "", serviceSpec())
	if err != nil {
		t.Fatal(err)
	}
	p, err := op.Advance(ctx) // files and ports only
	if err != nil || p.Done || p.Instance == nil {
		t.Fatalf("first step: %+v %v", p, err)
	}
	id := p.Instance.ID
	if got, _ := d.Get(ctx, id); got.State != driver.StateCreating {
		t.Errorf("state during create: %s", got.State)
	}
	del, err := d.Delete(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := driver.Drive(ctx, del); err != nil {
		t.Fatal(err)
	}
	if _, err := driver.Drive(ctx, op); !errors.Is(err, driver.ErrNotFound) {
		t.Errorf("create after its instance was deleted: %v, want ErrNotFound", err)
	}
	if ids, _ := d.ids(); len(ids) != 0 {
		t.Errorf("%d instance directories left", len(ids))
	}
}

func TestAbandonedCreate(t *testing.T) {
	d := open(t, t.TempDir(), nil)
	defer d.Close(context.Background())
	ctx, cancel := context.WithCancel(context.Background())
	op, err := d.Create(ctx, "", serviceSpec())
	if err != nil {
		t.Fatal(err)
	}
	cancel()
	if _, err := driver.Drive(context.Background(), op); !errors.Is(err, driver.ErrTimeout) {
		t.Errorf("abandoned create: %v, want ErrTimeout", err)
	}
	if ids, _ := d.ids(); len(ids) != 0 {
		t.Errorf("abandoned create left %d instance directories", len(ids))
	}
}

// helperEnv names the data dir in which the test binary, started again as
// a separate process, creates instances and then exits without deleting
// them: a Berth that stops while its processes run.
const helperEnv = "BERTH_LOCAL_TEST_HELPER_DIR"

// probeArg as the first argument makes the test binary the conformance
// suite's probe (package probe), which the exec case runs.
const probeArg = "-berth-probe"

func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == probeArg {
		os.Exit(probe.Main(os.Args[2:]))
	}
	if dir := os.Getenv(churnEnv); dir != "" {
		err := churnBerth(dir) // returns only on an error: the test kills it
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	if dir := os.Getenv(helperEnv); dir != "" {
		if err := helperBerth(dir); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0) // no Close, no Delete: the processes outlive this Berth
	}
	os.Exit(m.Run())
}

func helperBerth(dir string) error {
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	def, err := driver.Lookup("local")
	if err != nil {
		return err
	}
	d, err := def.Open(ctx, map[string]any{"data_dir": dir, "allow_root": true}, driver.Env{})
	if err != nil {
		return err
	}
	for _, sp := range []*driver.Spec{serviceSpec(), shSpec("sleep 0.2; exit 5")} {
		op, err := d.Create(ctx, "", sp)
		if err != nil {
			return err
		}
		if _, err := driver.Drive(ctx, op); err != nil {
			return err
		}
	}
	return nil
}

func TestRestartAcrossProcesses(t *testing.T) {
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"="+dir)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("helper Berth: %v\n%s", err, out)
	}
	d := open(t, dir, nil)
	defer d.Close(context.Background())
	ctx := ctxT(t)
	list, err := d.List(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 2 {
		t.Fatalf("after the helper Berth exited: %d instances, want 2", len(list))
	}
	svc, quick := list[0], list[1]
	for _, in := range list {
		t.Cleanup(func() { remove(t, d, in.ID) })
	}
	if svc.State != driver.StateRunning {
		t.Errorf("service started by the previous Berth: %s (%s)", svc.State, svc.Message)
	}
	// The short process ends with no Berth as its parent: it shows as
	// exited, its exit code unknown.
	got := waitFor(t, d, quick.ID, "exited", hasState(driver.StateExited))
	if got.ExitCode != nil {
		t.Errorf("exit code %d, but no Berth could have reaped it", *got.ExitCode)
	}
	if got.Message == "" {
		t.Error("no message saying the exit code is unknown")
	}
	// Stop still works on a process this Berth did not start.
	pid := pidOf(t, d, svc.ID)
	if err := d.Stop(ctx, svc.ID, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	if got, _ := d.Get(ctx, svc.ID); got.State != driver.StateStopped {
		t.Errorf("after Stop: %s", got.State)
	}
	if m, _ := groupMembers(pid); len(m) != 0 {
		t.Errorf("after Stop, %d processes of the group remain", len(m))
	}
}

// BenchmarkCreateDelete measures one create (to a running process) and one
// delete (SIGTERM, wait, remove) of the service spec.
func BenchmarkCreateDelete(b *testing.B) {
	def, err := driver.Lookup("local")
	if err != nil {
		b.Fatal(err)
	}
	drv, err := def.Open(context.Background(), map[string]any{"data_dir": b.TempDir(), "allow_root": true}, driver.Env{})
	if err != nil {
		b.Fatal(err)
	}
	defer drv.Close(context.Background())
	ctx := context.Background()
	for b.Loop() {
		op, err := drv.Create(ctx, "", serviceSpec())
		if err != nil {
			b.Fatal(err)
		}
		in, err := driver.Drive(ctx, op)
		if err != nil {
			b.Fatal(err)
		}
		del, err := drv.Delete(ctx, in.ID)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := driver.Drive(ctx, del); err != nil {
			b.Fatal(err)
		}
	}
}

// TestCgroupV2WithoutControllers opens the driver on this host's cgroup v2
// mount, which lacks the cpu and memory controllers when they are bound to
// cgroup v1: limits are then off, with the reason.
func TestCgroupV2WithoutControllers(t *testing.T) {
	const root = "/sys/fs/cgroup/unified"
	b, err := os.ReadFile(filepath.Join(root, "cgroup.controllers"))
	if err != nil {
		t.Skipf("no cgroup v2 mount at %s", root)
	}
	if f := strings.Fields(string(b)); slices.Contains(f, "cpu") && slices.Contains(f, "memory") {
		t.Skipf("%s has the cpu and memory controllers; TestResizeCgroups covers it", root)
	}
	d := open(t, t.TempDir(), map[string]any{"cgroup_root": root})
	defer d.Close(context.Background())
	if d.cg.usable() || !strings.Contains(d.cg.reason, root) {
		t.Fatalf("cgroups %+v, want unusable with a reason naming %s", d.cg, root)
	}
	in := create(t, d, serviceSpec())
	if err := d.Resize(ctxT(t), in.ID, driver.Resources{Memory: 64 * driver.MiB}); !errors.Is(err, driver.ErrUnsupported) {
		t.Errorf("Resize: %v, want ErrUnsupported", err)
	}
}

// TestDefaultUser: a server running as root runs a spec naming no user as
// default_user, not as root, and refuses root itself without allow_root;
// a default user that is root or unknown is refused when the driver opens.
func TestDefaultUser(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("runs processes as another user: run as root (CI does)")
	}
	d := open(t, t.TempDir(), map[string]any{"allow_root": false, "default_user": "nobody"})
	defer d.Close(context.Background())
	in := create(t, d, shSpec(`id -u; id -g`))
	waitFor(t, d, in.ID, "exited", hasState(driver.StateExited))
	nobody, err := user.Lookup("nobody")
	if err != nil {
		t.Fatal(err)
	}
	if got, want := logsOf(t, d, in.ID, false), nobody.Uid+"\n"+nobody.Gid+"\n"; got != want {
		t.Errorf("a spec naming no user ran as %q, want nobody (%q)", got, want)
	}
	for _, u := range []string{"root", "0"} {
		sp := shSpec("true")
		sp.User = u
		var fe *driver.FieldError
		if err := d.CheckSpec(sp); !errors.As(err, &fe) || fe.Path != "user" {
			t.Errorf("user %q without allow_root: %v, want refused naming user", u, err)
		}
	}
	def, _ := driver.Lookup("local")
	for _, u := range []string{"root", "no-such-user-here"} {
		_, err := def.Open(context.Background(), map[string]any{"data_dir": t.TempDir(), "default_user": u}, driver.Env{})
		var fe *driver.FieldError
		if !errors.As(err, &fe) || fe.Path != "default_user" {
			t.Errorf("default_user %q: %v, want refused naming default_user", u, err)
		}
	}
}

// TestExecUserCgroupAndEnd: an exec runs as the instance's user (or the
// one it names), in the instance's cgroup when it has one, and is killed
// when the instance stops.
func TestExecUserCgroupAndEnd(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("runs processes as another user: run as root (CI does)")
	}
	d := open(t, t.TempDir(), nil)
	defer d.Close(context.Background())
	ctx := ctxT(t)
	sp := shSpec(`sleep 1000 & wait`)
	sp.User = "nobody"
	if d.cg.usable() {
		sp.Memory = 256 * driver.MiB
	}
	in := create(t, d, sp)
	waitFor(t, d, in.ID, "running", hasState(driver.StateRunning))
	nobody, err := user.Lookup("nobody")
	if err != nil {
		t.Fatal(err)
	}
	run := func(opts driver.ExecOptions) string {
		t.Helper()
		var out, errb bytes.Buffer
		code, err := d.Exec(ctx, in.ID, opts, strings.NewReader("go\n"), &out, &errb)
		if err != nil || code != 0 {
			t.Fatalf("Exec %q: %d, %v, stderr %q", opts.Cmd, code, err, errb.String())
		}
		return out.String()
	}
	if got := run(driver.ExecOptions{Cmd: []string{"/bin/sh", "-c", "id -u; pwd"}}); got != nobody.Uid+"\n/\n" {
		t.Errorf("an exec in an instance of nobody ran as, in %q; want nobody's uid %s in /", got, nobody.Uid)
	}
	if got := run(driver.ExecOptions{Cmd: []string{"id", "-u"}, User: "root"}); got != "0\n" {
		t.Errorf("an exec as root ran as %q", got)
	}
	if d.cg.usable() {
		// Read once the input comes, which the driver sends only after it
		// has placed the command (on cgroup v1 just after its start).
		got := run(driver.ExecOptions{Cmd: []string{"/bin/sh", "-c", "read go; cat /proc/self/cgroup"}})
		if !strings.Contains(got, cgroupParent+"/"+in.ID) {
			t.Errorf("an exec is not in the instance's cgroup: %q", got)
		}
	} else {
		t.Logf("the cgroup is not checked: no usable cgroups on this host: %s", d.cg.reason)
	}

	// A command still running when the instance stops is killed.
	type result struct {
		code int
		err  error
	}
	done := make(chan result, 1)
	var started drivertest.SyncBuffer
	go func() {
		code, err := d.Exec(ctx, in.ID, driver.ExecOptions{Cmd: []string{"/bin/sh", "-c", "echo started; exec sleep 1000"}}, nil, &started, io.Discard)
		done <- result{code, err}
	}()
	for started.String() == "" {
		select {
		case r := <-done:
			t.Fatalf("the exec ended before it started: %d, %v", r.code, r.err)
		case <-time.After(10 * time.Millisecond):
		}
	}
	if err := d.Stop(ctx, in.ID, time.Second); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-done:
		if r.err != nil || r.code != 128+int(syscall.SIGKILL) {
			t.Errorf("an exec when its instance stopped: %d, %v; want killed (%d)", r.code, r.err, 128+int(syscall.SIGKILL))
		}
	case <-ctx.Done():
		t.Fatal("an exec outlived its stopped instance")
	}
}

// TestRename: a running instance renamed is found by its new name and no
// longer by its old one, which a new instance may take; a name another
// instance holds is refused; a claim a rename left half done (the old
// name's file still naming the renamed instance) is taken over.
func TestRename(t *testing.T) {
	d := open(t, t.TempDir(), nil)
	defer d.Close(context.Background())
	ctx := ctxT(t)
	sp := serviceSpec()
	sp.Name = "before"
	in := create(t, d, sp)
	if err := d.Rename(ctx, in.ID, "after"); err != nil {
		t.Fatalf("Rename: %v", err)
	}
	if got, err := d.Find(ctx, "after"); err != nil || got.ID != in.ID || got.Name != "after" || got.State != driver.StateRunning {
		t.Errorf("Find after: %+v, %v; want the running instance, named after", got, err)
	}
	if _, err := d.Find(ctx, "before"); !errors.Is(err, driver.ErrNotFound) {
		t.Errorf("Find of the old name: %v, want ErrNotFound", err)
	}
	other := serviceSpec()
	other.Name = "before"
	second := create(t, d, other)
	if err := d.Rename(ctx, second.ID, "after"); !errors.Is(err, driver.ErrAlreadyExists) {
		t.Errorf("Rename to a name held: %v, want ErrAlreadyExists", err)
	}
	if err := d.Rename(ctx, second.ID, "bad/name"); !errors.Is(err, driver.ErrInvalid) {
		t.Errorf("Rename to a bad name: %v, want ErrInvalid", err)
	}
	// A rename cut short after its record was written: the old name's
	// claim still names the instance, whose record has another name.
	if err := os.WriteFile(d.namePath("left"), []byte(in.ID), 0o644); err != nil {
		t.Fatal(err)
	}
	third := serviceSpec()
	third.Name = "left"
	if got := create(t, d, third); got.Name != "left" {
		t.Errorf("create over a half-done rename's claim: named %q", got.Name)
	}
	// A rename cut short before its record was written, tried again.
	if err := os.WriteFile(d.namePath("again"), []byte(in.ID), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := d.Rename(ctx, in.ID, "again"); err != nil {
		t.Errorf("Rename to a name whose claim it holds already: %v", err)
	}
	if got, err := d.Find(ctx, "again"); err != nil || got.ID != in.ID {
		t.Errorf("Find again: %+v, %v", got, err)
	}
}
