package ssh_test

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	gossh "golang.org/x/crypto/ssh"

	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/driver/drivertest"
	"github.com/berth-dev/berth/drivers/ssh"
	"github.com/berth-dev/berth/internal/sshdtest"
)

// testTimeout bounds every wait in these tests; it is a liveness bound, not
// a performance assertion.
const testTimeout = time.Minute

// The test binary is the supervisor the driver copies to its hosts, as
// Berth's own binary is.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == ssh.SuperviseCommand {
		os.Exit(ssh.Supervise(os.Args[2:], os.Stdout, os.Stderr))
	}
	if file := os.Getenv(launcherEnv); file != "" {
		if err := launcher(file); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	// One root for every test's hosts: the binary is copied once, and each
	// test keeps to a cluster of its own.
	dir, err := os.MkdirTemp("", "berth-ssh-test-")
	if err != nil {
		panic(err)
	}
	// As /var/lib/berth-ssh would be: other users pass through.
	if err := os.Chmod(dir, 0o755); err != nil {
		panic(err)
	}
	sharedRoot = dir
	// The supervisor the hosts run: built without the race detector (a
	// binary built with it takes about a second to start on a loaded
	// machine, and every call runs it once).
	supervisor = filepath.Join(dir, "supervise")
	build := exec.Command("go", "build", "-o", supervisor, "./testdata/supervise")
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "build the supervisor: %v: %s\n", err, out)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

var sharedRoot, supervisor string

// serviceScript writes the two hello lines, then runs until SIGTERM, on
// which it exits 0.
const serviceScript = `trap 'exit 0' TERM; echo hello stdout; echo hello stderr >&2; sleep 1000 & wait $!`

func shSpec(script string) *driver.Spec {
	return &driver.Spec{Kind: driver.KindProcess, Entrypoint: []string{"/bin/sh", "-c", script}}
}

// fleet is test hosts: sshd servers, each in a network namespace of its
// own, sharing one client key and one known_hosts file.
type fleet struct {
	servers    []*sshdtest.Server
	knownHosts string
	key        string
	root       string
	cluster    string
}

func newFleet(t testing.TB, n int) *fleet {
	t.Helper()
	return newFleetOf(t, n, sshdtest.Options{})
}

// newFleetOf is newFleet with servers started with o (each in a network
// namespace, sharing the fleet's client key).
func newFleetOf(t testing.TB, n int, o sshdtest.Options) *fleet {
	t.Helper()
	f := &fleet{root: sharedRoot, cluster: fmt.Sprintf("c%d", time.Now().UnixNano())}
	var lines strings.Builder
	for i := range n {
		o.Netns, o.ClientKey = true, f.key
		s := sshdtest.Start(t, o)
		if i == 0 {
			f.key = s.Key
		}
		f.servers = append(f.servers, s)
		lines.WriteString(sshdtest.KnownHostsLine(s.Addr, s.HostKey))
	}
	// Whatever a failed test left running on the hosts goes with it: the
	// process group of every instance of this test's cluster.
	t.Cleanup(func() {
		states, _ := filepath.Glob(filepath.Join(f.root, "c", f.cluster, "*", "state.json"))
		for _, p := range states {
			var st struct {
				PID int `json:"pid"`
			}
			if b, err := os.ReadFile(p); err == nil && json.Unmarshal(b, &st) == nil && st.PID > 1 {
				syscall.Kill(-st.PID, syscall.SIGKILL)
			}
		}
	})
	f.knownHosts = filepath.Join(t.TempDir(), "known_hosts")
	if err := os.WriteFile(f.knownHosts, []byte(lines.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	return f
}

func nodeName(i int) string { return "h" + string(rune('0'+i)) }

// options are the driver's options for the fleet, with extra over them.
func (f *fleet) options(extra map[string]any) map[string]any {
	var hosts []any
	for i, s := range f.servers {
		hosts = append(hosts, map[string]any{"name": nodeName(i), "address": s.Host, "port": s.Port, "labels": map[string]any{"n": nodeName(i)}})
	}
	o := map[string]any{
		"hosts": hosts, "key_file": f.key, "known_hosts": f.knownHosts, "root": f.root,
		"supervisor_binary": supervisor, "probe_interval": "200ms", "dial_timeout": "20s", "stop_grace": "5s", "call_timeout": "30s",
	}
	for k, v := range extra {
		o[k] = v
	}
	return o
}

func (f *fleet) open(t testing.TB, extra map[string]any) driver.Driver {
	t.Helper()
	def, err := driver.Lookup("ssh")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	d, err := def.Open(ctx, f.options(extra), driver.Env{Cluster: f.cluster})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	return d
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	t.Cleanup(cancel)
	return ctx
}

func TestConformance(t *testing.T) {
	f := newFleet(t, 2)
	drivertest.Run(t, drivertest.Harness{
		Open: func(t *testing.T) driver.Driver { return f.open(t, nil) },
		Spec: func() *driver.Spec { return shSpec(serviceScript) },
		Echo: func() *driver.Spec { return shSpec("echo ready; exec cat") },
		// The hosts share this machine's files: the supervisor built for
		// them is the probe too.
		Exec: func(steps ...string) []string { return append([]string{supervisor, "probe"}, steps...) },
		// Each create is a few channels on a shared connection: eight at
		// once keep the suite's time modest on two cores.
		Parallel: 8,
		Timeout:  testTimeout,
		// A case mostly waits on round trips to the hosts.
		Concurrent: 3,
	})
}

// create makes an instance on node and drives it to its end; it is
// deleted when the test ends.
func create(t *testing.T, d driver.Driver, node string, sp *driver.Spec) *driver.Instance {
	t.Helper()
	ctx := ctxT(t)
	op, err := d.Create(ctx, node, sp)
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	in, err := driver.Drive(ctx, op)
	if err != nil {
		t.Fatalf("Create: operation: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
		defer cancel()
		if op, err := d.Delete(ctx, in.ID); err == nil {
			driver.Drive(ctx, op)
		}
	})
	return in
}

// waitFor polls Get until cond holds.
func waitFor(t *testing.T, d driver.Driver, id, what string, cond func(*driver.Instance) bool) *driver.Instance {
	t.Helper()
	ctx := ctxT(t)
	for {
		in, err := d.Get(ctx, id)
		if err == nil && cond(in) {
			return in
		}
		select {
		case <-ctx.Done():
			t.Fatalf("instance %s never became %s: last %+v, %v", id, what, in, err)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// nodeStatus returns node's status in State.
func nodeStatus(t *testing.T, d driver.Driver, node string) driver.Node {
	t.Helper()
	st, err := d.State(ctxT(t))
	if err != nil {
		t.Fatalf("State: %v", err)
	}
	for _, n := range st.Nodes {
		if n.Name == node {
			return n
		}
	}
	t.Fatalf("State: no node %s", node)
	return driver.Node{}
}

// waitNode waits until node has status want.
func waitNode(t *testing.T, d driver.Driver, node string, want driver.NodeStatus) driver.Node {
	t.Helper()
	ctx := ctxT(t)
	for {
		n := nodeStatus(t, d, node)
		if n.Status == want {
			return n
		}
		select {
		case <-ctx.Done():
			t.Fatalf("node %s never became %s: %s (%s)", node, want, n.Status, n.Reason)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func TestStateReadsTheHosts(t *testing.T) {
	t.Parallel()
	f := newFleet(t, 1)
	d := f.open(t, nil)
	defer d.Close(context.Background())
	n := nodeStatus(t, d, "h0")
	if n.Status != driver.NodeOnline || n.Capacity.CPU <= 0 || n.Capacity.Memory <= 0 || n.Capacity.Disk <= 0 {
		t.Fatalf("node h0: %+v, want online with cpus, memory and disk read from the host", n)
	}
	if n.Labels["n"] != "h0" || n.Address != f.servers[0].Host || n.Attributes["kernel"] == "" {
		t.Errorf("node h0: labels %v, address %q, attributes %v", n.Labels, n.Address, n.Attributes)
	}
}

// TestChangedHostKeyIsRefused: a host whose key is not the one known_hosts
// holds is offline, its reason naming the host; so is one known_hosts does
// not know at all, unless trust_on_first_use is set.
func TestChangedHostKeyIsRefused(t *testing.T) {
	t.Parallel()
	f := newFleet(t, 2)
	f.servers[1].NewHostKey()
	if err := f.servers[1].Restart(); err != nil {
		t.Fatal(err)
	}
	d := f.open(t, nil)
	defer d.Close(context.Background())
	if n := nodeStatus(t, d, "h0"); n.Status != driver.NodeOnline {
		t.Errorf("h0, whose key is known: %s (%s)", n.Status, n.Reason)
	}
	n := nodeStatus(t, d, "h1")
	if n.Status != driver.NodeOffline || !strings.Contains(n.Reason, "h1") || !strings.Contains(n.Reason, "differs") {
		t.Errorf("h1, whose key changed: %s (%s), want offline naming the host and the changed key", n.Status, n.Reason)
	}
	if _, err := d.Create(ctxT(t), "h1", shSpec(serviceScript)); !errors.Is(err, driver.ErrRetryable) {
		t.Errorf("Create on h1: %v, want ErrRetryable (the node is offline)", err)
	}
	d.Close(context.Background())

	// A host known_hosts does not know: refused, then trusted on first
	// use when the option says so, and written down.
	if err := os.WriteFile(f.knownHosts, []byte(sshdtest.KnownHostsLine(f.servers[0].Addr, f.servers[0].HostKey)), 0o600); err != nil {
		t.Fatal(err)
	}
	d = f.open(t, nil)
	if n := nodeStatus(t, d, "h1"); n.Status != driver.NodeOffline || !strings.Contains(n.Reason, "has no key for it") {
		t.Errorf("h1, unknown: %s (%s), want offline", n.Status, n.Reason)
	}
	d.Close(context.Background())
	d = f.open(t, map[string]any{"trust_on_first_use": true})
	defer d.Close(context.Background())
	if n := nodeStatus(t, d, "h1"); n.Status != driver.NodeOnline {
		t.Errorf("h1, unknown, trusted on first use: %s (%s)", n.Status, n.Reason)
	}
	b, _ := os.ReadFile(f.knownHosts)
	if !strings.Contains(string(b), strings.TrimSpace(sshdtest.KnownHostsLine(f.servers[1].Addr, f.servers[1].HostKey))[:20]) {
		t.Errorf("known_hosts after trust on first use: %s", b)
	}
}

// TestPinnedHostKey: host_key pins the key; another is refused.
func TestPinnedHostKey(t *testing.T) {
	t.Parallel()
	f := newFleet(t, 1)
	s := f.servers[0]
	pin := func(key string) map[string]any {
		return map[string]any{"known_hosts": filepath.Join(t.TempDir(), "none"), "hosts": []any{map[string]any{
			"name": "h0", "address": s.Host, "port": s.Port, "host_key": key}}}
	}
	d := f.open(t, pin(string(marshal(s.HostKey))))
	if n := nodeStatus(t, d, "h0"); n.Status != driver.NodeOnline {
		t.Errorf("pinned to its key: %s (%s)", n.Status, n.Reason)
	}
	d.Close(context.Background())
	pub, _, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	other, err := gossh.NewPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	d = f.open(t, pin(string(marshal(other))))
	defer d.Close(context.Background())
	if n := nodeStatus(t, d, "h0"); n.Status != driver.NodeOffline || !strings.Contains(n.Reason, "pinned") {
		t.Errorf("pinned to another key: %s (%s), want offline", n.Status, n.Reason)
	}
}

// TestHostGoesAwayAndComesBack: a host whose sshd dies goes offline and
// its instances are missing from listings (a partial list), while its
// supervised process keeps running; when sshd is back, the host is online
// again and the instance, its output and its end are all there.
func TestHostGoesAwayAndComesBack(t *testing.T) {
	t.Parallel()
	f := newFleet(t, 2)
	d := f.open(t, map[string]any{"dial_timeout": "3s"})
	defer d.Close(context.Background())
	sp := shSpec(`echo before; trap 'echo term; exit 7' TERM; sleep 1000 & wait $!`)
	sp.Name = "away"
	sp.Tags = map[string]string{driver.TagManaged: "true", driver.TagCluster: "c1"}
	in := create(t, d, "h1", sp)
	waitFor(t, d, in.ID, "running", func(in *driver.Instance) bool { return in.State == driver.StateRunning })
	pid := pidOf(t, f, in.ID)

	f.servers[1].Down()
	n := waitNode(t, d, "h1", driver.NodeOffline)
	t.Logf("h1 offline: %s", n.Reason)
	list, err := d.List(ctxT(t), map[string]string{driver.TagCluster: "c1"})
	var partial *driver.PartialListError
	if !errors.As(err, &partial) || !partial.Missing("h1") || len(list) != 0 {
		t.Errorf("List with h1 away: %d instances, %v; want a partial list missing h1", len(list), err)
	}
	if _, err := d.Get(ctxT(t), in.ID); !errors.Is(err, driver.ErrRetryable) {
		t.Errorf("Get on the host that is away: %v, want ErrRetryable", err)
	}
	if !processAlive(pid) {
		t.Fatalf("the supervised process %d died with the ssh server", pid)
	}

	// Back, and its ssh server killed and started again meanwhile: the
	// connection is new.
	f.servers[1].Kill()
	if err := f.servers[1].Restart(); err != nil {
		t.Fatal(err)
	}
	f.servers[1].Up()
	waitNode(t, d, "h1", driver.NodeOnline)
	got := waitFor(t, d, in.ID, "running", func(in *driver.Instance) bool { return in.State == driver.StateRunning })
	if got.Name != "away" {
		t.Errorf("after the host came back: %+v", got)
	}
	// A Berth started again finds it too; it keeps to the usual bounds (a
	// keepalive of three seconds may fail on a loaded machine).
	d.Close(context.Background())
	d = f.open(t, nil)
	defer d.Close(context.Background())
	got = waitFor(t, d, in.ID, "running", func(in *driver.Instance) bool { return in.State == driver.StateRunning })
	if got.Name != "away" {
		t.Errorf("after the host came back: %+v", got)
	}
	if err := d.(driver.Stopper).Stop(ctxT(t), in.ID, 5*time.Second); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	got = waitFor(t, d, in.ID, "stopped", func(in *driver.Instance) bool { return in.State == driver.StateStopped })
	if got.ExitCode == nil || *got.ExitCode != 7 {
		t.Errorf("stopped: exit code %v, want 7 (the trap's)", got.ExitCode)
	}
	var out, errOut drivertest.SyncBuffer
	if err := d.(driver.LogReader).Logs(ctxT(t), in.ID, driver.LogOptions{}, &out, &errOut); err != nil {
		t.Fatalf("Logs: %v", err)
	}
	if out.String() != "before\nterm\n" {
		t.Errorf("Logs across the reconnect: %q, want the lines before and after", out.String())
	}
}

func marshal(k gossh.PublicKey) []byte { return gossh.MarshalAuthorizedKey(k) }

// pidOf reads the pid the supervisor recorded for id.
func pidOf(t *testing.T, f *fleet, id string) int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(f.root, "c", f.cluster, id, "state.json"))
	if err != nil {
		t.Fatal(err)
	}
	var st struct {
		PID int `json:"pid"`
	}
	if err := json.Unmarshal(b, &st); err != nil || st.PID <= 0 {
		t.Fatalf("state.json %s: %v", b, err)
	}
	return st.PID
}

func processAlive(pid int) bool { return syscall.Kill(pid, 0) == nil }

// TestFilesAndUser: config files and user data reach the host over SFTP
// with the spec's modes, owned by the spec's user, whom the process runs
// as.
func TestFilesAndUser(t *testing.T) {
	t.Parallel()
	f := newFleet(t, 1)
	d := f.open(t, nil)
	defer d.Close(context.Background())
	sp := shSpec(`id -u; id -g; cat "$BERTH_CONFIG_DIR/etc/app.conf"; cat "$BERTH_USER_DATA_FILE"; echo "$APP"`)
	sp.User, sp.Group = "nobody", "nogroup"
	sp.Env = map[string]string{"APP": "env"}
	sp.ConfigFiles = []driver.ConfigFile{{Path: "/etc/app.conf", Content: "conf\n", Mode: 0o640}}
	sp.UserData = "data\n"
	in := create(t, d, "h0", sp)
	got := waitFor(t, d, in.ID, "exited", func(in *driver.Instance) bool { return in.State == driver.StateExited })
	var out, errOut drivertest.SyncBuffer
	if err := d.(driver.LogReader).Logs(ctxT(t), in.ID, driver.LogOptions{}, &out, &errOut); err != nil {
		t.Fatalf("Logs: %v", err)
	}
	if got.ExitCode == nil || *got.ExitCode != 0 || out.String() != "65534\n65534\nconf\ndata\nenv\n" {
		t.Errorf("as nobody: exit code %v, stdout %q, stderr %q", got.ExitCode, out.String(), errOut.String())
	}
	dir := filepath.Join(f.root, "c", f.cluster, in.ID)
	for p, mode := range map[string]os.FileMode{"files/etc/app.conf": 0o640, "user-data": 0o600} {
		fi, err := os.Stat(filepath.Join(dir, p))
		if err != nil {
			t.Fatal(err)
		}
		st := fi.Sys().(*syscall.Stat_t)
		if fi.Mode().Perm() != mode || st.Uid != 65534 || st.Gid != 65534 {
			t.Errorf("%s: mode %o, owner %d:%d; want %o, nobody:nogroup", p, fi.Mode().Perm(), st.Uid, st.Gid, mode)
		}
	}
	// A user the host does not have: the create fails for good, and
	// leaves nothing.
	bad := shSpec("true")
	bad.User = "no-such-user-here"
	ctx := ctxT(t)
	op, err := d.Create(ctx, "h0", bad)
	if err == nil {
		_, err = driver.Drive(ctx, op)
	}
	if !errors.Is(err, driver.ErrPermanent) || !strings.Contains(err.Error(), "no-such-user-here") {
		t.Errorf("Create as a user the host lacks: %v, want ErrPermanent naming the user", err)
	}
	list, err := d.List(ctx, nil)
	if err != nil || len(list) != 1 {
		t.Errorf("List after the failed create: %d instances, %v; want only the first", len(list), err)
	}
}

// TestShellNoise: on a host whose shell prints on stderr as it starts
// each session (a login script's noise), an instance's logs hold its
// streams as it wrote them and nothing of the noise.
func TestShellNoise(t *testing.T) {
	t.Parallel()
	const noise = "noise of the host's shell"
	f := newFleetOf(t, 1, sshdtest.Options{ShellNoise: noise})
	if errs := sessionStderr(t, f.servers[0], "true"); !strings.Contains(errs, noise) {
		t.Fatalf("a session on the host printed %q on stderr, without the noise the test is about", errs)
	}
	d := f.open(t, nil)
	defer d.Close(context.Background())
	in := create(t, d, "h0", shSpec(`echo out; echo err >&2`))
	waitFor(t, d, in.ID, "exited", func(in *driver.Instance) bool { return in.State == driver.StateExited })
	for _, o := range []driver.LogOptions{{}, {Stdout: true}, {Stderr: true}, {Tail: 1}} {
		var out, errOut drivertest.SyncBuffer
		if err := d.(driver.LogReader).Logs(ctxT(t), in.ID, o, &out, &errOut); err != nil {
			t.Fatalf("Logs %+v: %v", o, err)
		}
		wantOut, wantErr := "out\n", "err\n"
		if o.Stderr && !o.Stdout {
			wantOut = ""
		}
		if o.Stdout && !o.Stderr {
			wantErr = ""
		}
		if out.String() != wantOut || errOut.String() != wantErr {
			t.Errorf("Logs %+v: stdout %q, stderr %q; want %q, %q", o, out.String(), errOut.String(), wantOut, wantErr)
		}
	}
}

// sessionStderr runs cmd in a session on s, as root with the server's
// client key, and returns what the session printed on stderr.
func sessionStderr(t *testing.T, s *sshdtest.Server, cmd string) string {
	t.Helper()
	b, err := os.ReadFile(s.Key)
	if err != nil {
		t.Fatal(err)
	}
	signer, err := gossh.ParsePrivateKey(b)
	if err != nil {
		t.Fatal(err)
	}
	c, err := gossh.Dial("tcp", s.Addr, &gossh.ClientConfig{User: "root", Auth: []gossh.AuthMethod{gossh.PublicKeys(signer)},
		HostKeyCallback: gossh.FixedHostKey(s.HostKey), Timeout: testTimeout})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	sess, err := c.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close()
	var errs bytes.Buffer
	sess.Stderr = &errs
	if err := sess.Run(cmd); err != nil {
		t.Fatalf("%s on %s: %v: %s", cmd, s.Addr, err, errs.String())
	}
	return errs.String()
}

// TestKnownKeysAlgorithmsFirst: a host with an ECDSA and an ed25519 key,
// of which known_hosts holds only the ed25519 one, is accepted: the client
// asks for the algorithm of the key it knows (its defaults put ECDSA
// before ed25519, and the ECDSA key would be refused as unknown).
func TestKnownKeysAlgorithmsFirst(t *testing.T) {
	t.Parallel()
	s := sshdtest.Start(t, sshdtest.Options{Netns: true, ECDSAKey: true})
	f := &fleet{servers: []*sshdtest.Server{s}, knownHosts: s.KnownHosts, key: s.Key, root: sharedRoot, cluster: fmt.Sprintf("c%d", time.Now().UnixNano())}
	d := f.open(t, nil)
	defer d.Close(context.Background())
	if n := nodeStatus(t, d, "h0"); n.Status != driver.NodeOnline {
		t.Errorf("h0: %s (%s), want online through its known ed25519 key", n.Status, n.Reason)
	}
	// With only the ECDSA key known, that one is asked for and accepted.
	if err := os.WriteFile(f.knownHosts, []byte(sshdtest.KnownHostsLine(s.Addr, s.ECDSAKey)), 0o600); err != nil {
		t.Fatal(err)
	}
	d2 := f.open(t, nil)
	defer d2.Close(context.Background())
	if n := nodeStatus(t, d2, "h0"); n.Status != driver.NodeOnline {
		t.Errorf("h0: %s (%s), want online through its known ECDSA key", n.Status, n.Reason)
	}
}

// TestOptionsAreStrict: every bad option is refused naming its field.
func TestOptionsAreStrict(t *testing.T) {
	t.Parallel()
	def, err := driver.Lookup("ssh")
	if err != nil {
		t.Fatal(err)
	}
	host := func(kv ...any) map[string]any {
		h := map[string]any{"address": "10.0.0.1"}
		for i := 0; i < len(kv); i += 2 {
			h[kv[i].(string)] = kv[i+1]
		}
		return h
	}
	cases := []struct {
		field string
		raw   map[string]any
	}{
		{"hosts", map[string]any{}},
		{"hosts", map[string]any{"hosts": []any{map[string]any{"address": "10.0.0.1", "colour": "red"}}}},
		{"hosts[0].address", map[string]any{"hosts": []any{host("address", "not a host!")}}},
		{"hosts[0].port", map[string]any{"hosts": []any{host("port", 70000)}}},
		{"hosts[1].name", map[string]any{"hosts": []any{host("name", "a"), host("name", "a")}}},
		{"hosts[0].host_key", map[string]any{"hosts": []any{host("host_key", "ssh-ed25519 nonsense")}}},
		{"hosts[0].capacity.cpus", map[string]any{"hosts": []any{host("capacity", map[string]any{"cpus": -1})}}},
		{"hosts[0].max_instances", map[string]any{"hosts": []any{host("max_instances", -1)}}},
		{"max_channels", map[string]any{"hosts": []any{host()}, "max_channels": 0}},
		{"root", map[string]any{"hosts": []any{host()}, "root": "relative"}},
		{"probe_interval", map[string]any{"hosts": []any{host()}, "probe_interval": "1ns"}},
		{"colour", map[string]any{"hosts": []any{host()}, "colour": "red"}},
	}
	for _, c := range cases {
		_, err := def.Decode(c.raw)
		if !errors.Is(err, driver.ErrInvalid) || !strings.Contains(err.Error(), c.field) {
			t.Errorf("options %v: %v, want ErrInvalid naming %s", c.raw, err, c.field)
		}
	}
	// Neither a key file nor the agent: refused at Open, naming key_file.
	_, err = def.Open(ctxT(t), map[string]any{"hosts": []any{host()}}, driver.Env{})
	if !errors.Is(err, driver.ErrInvalid) || !strings.Contains(err.Error(), "key_file") {
		t.Errorf("Open with no way to log in: %v, want ErrInvalid naming key_file", err)
	}
}

// TestAgent logs in with the key an ssh-agent (OpenSSH's) holds, with no
// key file.
func TestAgent(t *testing.T) {
	f := newFleet(t, 1)
	sock := filepath.Join(t.TempDir(), "agent.sock")
	agent := exec.Command("ssh-agent", "-D", "-a", sock)
	if err := agent.Start(); err != nil {
		t.Fatalf("ssh-agent (openssh-client): %v", err)
	}
	defer func() {
		agent.Process.Kill()
		agent.Wait()
	}()
	for i := 0; ; i++ {
		if _, err := os.Stat(sock); err == nil {
			break
		}
		if i > 500 {
			t.Fatal("ssh-agent never made its socket")
		}
		time.Sleep(20 * time.Millisecond)
	}
	add := exec.Command("ssh-add", f.key)
	add.Env = append(os.Environ(), "SSH_AUTH_SOCK="+sock)
	if out, err := add.CombinedOutput(); err != nil {
		t.Fatalf("ssh-add: %v: %s", err, out)
	}
	t.Setenv("SSH_AUTH_SOCK", sock)
	d := f.open(t, map[string]any{"key_file": "", "agent": true})
	defer d.Close(context.Background())
	if n := nodeStatus(t, d, "h0"); n.Status != driver.NodeOnline {
		t.Fatalf("h0 through the agent's key: %s (%s)", n.Status, n.Reason)
	}
	in := create(t, d, "h0", shSpec("echo agent"))
	waitFor(t, d, in.ID, "exited", func(in *driver.Instance) bool { return in.State == driver.StateExited })
}

// TestCapacityAndMaxInstances: capacity set in the options overrides what
// is read, field by field; max_instances caps the running instances.
func TestCapacityAndMaxInstances(t *testing.T) {
	t.Parallel()
	f := newFleet(t, 1)
	s := f.servers[0]
	d := f.open(t, map[string]any{"hosts": []any{map[string]any{"name": "h0", "address": s.Host, "port": s.Port,
		"max_instances": 1, "capacity": map[string]any{"cpus": 64}}}})
	defer d.Close(context.Background())
	n := nodeStatus(t, d, "h0")
	if n.Capacity.CPU != 64000 || n.Capacity.Memory <= 0 || n.MaxInstances != 1 {
		t.Errorf("h0: capacity %+v, max_instances %d; want 64 cpus, the memory read, 1", n.Capacity, n.MaxInstances)
	}
	create(t, d, "h0", shSpec(serviceScript))
	ctx := ctxT(t)
	op, err := d.Create(ctx, "h0", shSpec(serviceScript))
	if err == nil {
		_, err = driver.Drive(ctx, op)
	}
	if !errors.Is(err, driver.ErrInsufficientCapacity) {
		t.Errorf("a second instance on a host of max_instances 1: %v, want ErrInsufficientCapacity", err)
	}
	big := shSpec("true")
	big.CPU = 65000
	if _, err := d.Create(ctx, "h0", big); !errors.Is(err, driver.ErrInsufficientCapacity) {
		t.Errorf("more cpus than the host has: %v, want ErrInsufficientCapacity", err)
	}
}

// TestCreatesTakeTurns: with one channel, creates asked for at once wait
// their turn on the host, reported Queued, and all run; one whose context
// ends while it waits makes nothing, and its name is free again.
func TestCreatesTakeTurns(t *testing.T) {
	t.Parallel()
	f := newFleet(t, 1)
	d := f.open(t, map[string]any{"max_channels": 1})
	defer d.Close(context.Background())
	ctx := ctxT(t)
	const n = 8
	ops := make([]driver.Operation, n)
	for i := range ops {
		op, err := d.Create(ctx, "h0", shSpec(serviceScript))
		if err != nil {
			t.Fatal(err)
		}
		ops[i] = op
	}
	// The one asked for last, by name, is given up while it waits.
	gctx, giveUp := context.WithCancel(ctx)
	named := shSpec(serviceScript)
	named.Name = "turns"
	last, err := d.Create(gctx, "h0", named)
	if err != nil {
		t.Fatal(err)
	}
	queued := 0
	for _, op := range ops {
		if p, err := op.Advance(ctx); err == nil && p.Queued {
			queued++
		}
	}
	p, err := last.Advance(ctx)
	if err != nil || !p.Queued {
		t.Fatalf("the create asked for after %d others on one channel: %+v, %v; want Queued", n, p, err)
	}
	giveUp()
	if _, err := driver.Drive(ctx, last); !errors.Is(err, driver.ErrRetryable) {
		t.Errorf("a create given up while it waited: %v, want ErrRetryable (nothing made)", err)
	}
	if queued == 0 {
		t.Errorf("none of %d creates on one channel was reported Queued at its first Advance", n)
	}
	for i, op := range ops {
		in, err := driver.Drive(ctx, op)
		if err != nil {
			t.Fatalf("create %d: %v", i, err)
		}
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
			defer cancel()
			if op, err := d.Delete(ctx, in.ID); err == nil {
				driver.Drive(ctx, op)
			}
		})
	}
	// Nothing was made under the name: it is free.
	create(t, d, "h0", named)
}
