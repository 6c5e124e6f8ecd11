package vm_test

import (
	"context"
	"encoding/pem"
	"errors"
	"fmt"
	"maps"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/digitalocean/go-libvirt"
	"github.com/digitalocean/go-libvirt/socket/dialers"

	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/drivers/vm"
	"github.com/berth-dev/berth/internal/freeport"
	"github.com/berth-dev/berth/internal/pkitest"
	"github.com/berth-dev/berth/internal/testdeps"
)

// tlsDir writes a node's tls_dir: cacert.pem, clientcert.pem and
// clientkey.pem.
func tlsDir(t *testing.T, caPEM, certPEM, keyPEM []byte) string {
	t.Helper()
	dir := t.TempDir()
	if err := pkitest.WriteFiles(dir, map[string][]byte{"cacert.pem": caPEM, "clientcert.pem": certPEM, "clientkey.pem": keyPEM}); err != nil {
		t.Fatal(err)
	}
	return dir
}

// libvirtHost is a libvirtd of the test's own, listening with TLS and
// plain TCP on loopback ports, whose CA and client certificates the test
// made.
type libvirtHost struct {
	tlsAddr, tcpAddr string        // 127.0.0.1:port
	ca               *pkitest.CA   // signed the daemon's certificate and trusts its clients
	client           *pkitest.Cert // a client the daemon accepts
	clientDir        string        // client's tls_dir
}

// libvirtDirs are the directories where a libvirt daemon keeps its state
// and configuration, and the names under which the test's daemon has its
// own.
var libvirtDirs = [][2]string{
	{"/etc/libvirt", "etc"}, {"/run/libvirt", "run"}, {"/var/lib/libvirt", "lib"},
	{"/var/cache/libvirt", "cache"}, {"/var/log/libvirt", "log"},
}

// startLibvirtd starts a second libvirtd, with its QEMU and storage
// drivers only, that stays out of the machine's daemon's way: it runs in a
// mount namespace of its own where the test's directories stand over
// libvirt's (/etc/libvirt, /run/libvirt, /var/lib/libvirt,
// /var/cache/libvirt, /var/log/libvirt), so that neither daemon sees the
// other's domains, pools, pid files or sockets, and no other driver
// (network, nwfilter) touches the host's firewall. It starts no guest
// on its own and uses no cgroups; QEMU's output goes to files, not
// through virtlogd. TCP takes no authentication (auth_tcp "none"): the
// driver speaks no SASL. The daemon and any guest still running are
// ended when the test ends.
//
// It fails the test, saying why, when the daemon cannot start: it needs
// root (the mount namespace and binds need CAP_SYS_ADMIN) and the
// packages that the other tests need (libvirt-daemon-system,
// qemu-system-x86).
func startLibvirtd(t *testing.T) libvirtHost {
	t.Helper()
	libvirtd, err := exec.LookPath("libvirtd")
	if err != nil {
		libvirtd = "/usr/sbin/libvirtd"
		if _, serr := os.Stat(libvirtd); serr != nil {
			testdeps.Need(t, testdeps.Missing("libvirtd", "libvirt-daemon-system"))
		}
	}
	modules, _ := filepath.Glob("/usr/lib*/*/libvirt/connection-driver/libvirt_driver_qemu.so")
	if more, _ := filepath.Glob("/usr/lib*/libvirt/connection-driver/libvirt_driver_qemu.so"); len(more) > 0 {
		modules = append(modules, more...)
	}
	if len(modules) == 0 {
		testdeps.Need(t, testdeps.Missing("libvirt QEMU driver module (libvirt_driver_qemu.so)", "libvirt-daemon-driver-qemu"))
	}
	dir := t.TempDir()
	mk := func(parts ...string) string {
		p := filepath.Join(append([]string{dir}, parts...)...)
		if err := os.MkdirAll(p, 0o755); err != nil {
			t.Fatal(err)
		}
		// QEMU runs as the QEMU user and must reach the daemon's
		// per-domain directories; t.TempDir makes 0700 ones.
		if err := os.Chmod(p, 0o755); err != nil {
			t.Fatal(err)
		}
		return p
	}
	mk()
	for _, d := range libvirtDirs {
		mk(d[1])
	}
	drivers, pki, sock := mk("drivers"), mk("pki"), mk("sock")
	for _, m := range []string{"qemu", "storage"} {
		src := filepath.Join(filepath.Dir(modules[0]), "libvirt_driver_"+m+".so")
		if _, err := os.Stat(src); err != nil {
			t.Fatalf("libvirt's %s driver: %v (apt-get install libvirt-daemon-system; .ci/run does)", m, err)
		}
		if err := os.Symlink(src, filepath.Join(drivers, filepath.Base(src))); err != nil {
			t.Fatal(err)
		}
	}
	// The machine's daemon's QEMU capabilities, when it has probed them:
	// the copy spares the test's daemon seconds of probing (it probes
	// again if they do not fit).
	if caps, _ := filepath.Glob("/var/cache/libvirt/qemu/capabilities/*.xml"); len(caps) > 0 {
		to := mk("cache", "qemu", "capabilities")
		for _, c := range caps {
			copyFile(t, c, filepath.Join(to, filepath.Base(c)))
		}
	}

	ca := pkitest.NewCA("berth-test-ca")
	server := ca.Server("127.0.0.1", "localhost")
	if err := pkitest.WriteFiles(pki, map[string][]byte{"cacert.pem": ca.CertPEM, "servercert.pem": server.CertPEM, "serverkey.pem": server.KeyPEM}); err != nil {
		t.Fatal(err)
	}
	tlsAddr, tcpAddr := freeport.Addr(t), freeport.Addr(t)
	_, tlsPort, _ := net.SplitHostPort(tlsAddr)
	_, tcpPort, _ := net.SplitHostPort(tcpAddr)
	logFile := filepath.Join(dir, "libvirtd.log")
	conf := fmt.Sprintf(`listen_tls = 1
listen_tcp = 1
listen_addr = "127.0.0.1"
tls_port = %q
tcp_port = %q
auth_tls = "none"
auth_tcp = "none"
ca_file = "%s/cacert.pem"
cert_file = "%s/servercert.pem"
key_file = "%s/serverkey.pem"
unix_sock_dir = %q
log_outputs = "3:file:%s"
`, tlsPort, tcpPort, pki, pki, pki, sock, logFile)
	if err := os.WriteFile(filepath.Join(dir, "etc", "libvirtd.conf"), []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	qemuConf := "stdio_handler = \"file\"\ncgroup_controllers = [ ]\n"
	if err := os.WriteFile(filepath.Join(dir, "etc", "qemu.conf"), []byte(qemuConf), 0o600); err != nil {
		t.Fatal(err)
	}

	var script strings.Builder
	script.WriteString("set -e\n")
	for _, d := range libvirtDirs {
		fmt.Fprintf(&script, "mount --bind %q %q\n", filepath.Join(dir, d[1]), d[0])
	}
	fmt.Fprintf(&script, "exec %q --listen --config /etc/libvirt/libvirtd.conf --pid-file %q\n", libvirtd, filepath.Join(dir, "libvirtd.pid"))
	out, err := os.Create(filepath.Join(dir, "libvirtd.out"))
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	log := func() string {
		a, _ := os.ReadFile(out.Name())
		b, _ := os.ReadFile(logFile)
		return string(a) + string(b)
	}
	cmd := exec.Command("sh", "-c", script.String())
	cmd.Env = append(os.Environ(), "LIBVIRT_DRIVER_DIR="+drivers)
	cmd.Stdout, cmd.Stderr = out, out
	// A mount namespace (Go makes its mounts private, so that the binds
	// stay in it) and a process group of its own.
	cmd.SysProcAttr = &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNS, Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatalf("cannot start a libvirtd of the test's own in a mount namespace (it needs root with CAP_SYS_ADMIN): %v", err)
	}
	d := watch(cmd)
	run := filepath.Join(dir, "run")
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-d.exited:
		case <-time.After(30 * time.Second):
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-d.exited
		}
		if killed := killGuests(run); len(killed) > 0 {
			t.Errorf("the test's libvirtd left guests running, killed: %v", killed)
		}
		if t.Failed() {
			t.Logf("libvirtd: %s", log())
		}
	})
	if err := d.listening(tlsAddr, tcpAddr); err != nil {
		t.Fatalf("the test's libvirtd, or the binds of its directories before it: %v (its output follows)", err)
	}
	client := ca.Client("berth-test-client")
	return libvirtHost{
		tlsAddr: tlsAddr, tcpAddr: tcpAddr, ca: ca,
		client: client, clientDir: tlsDir(t, ca.CertPEM, client.CertPEM, client.KeyPEM),
	}
}

// killGuests ends the QEMU processes whose pid files are in the daemon's
// run directory (driver.pid, the daemon's own, names no QEMU) and returns
// their pids.
func killGuests(run string) []int {
	files, _ := filepath.Glob(filepath.Join(run, "qemu", "*.pid"))
	var killed []int
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil || pid <= 1 {
			continue
		}
		exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
		if err != nil || !strings.Contains(filepath.Base(exe), "qemu") {
			continue // gone, or the pid is another process's now
		}
		if err := syscall.Kill(pid, syscall.SIGKILL); err == nil {
			killed = append(killed, pid)
		}
	}
	return killed
}

// TestTLSAndTCP drives the driver over qemu+tls and qemu+tcp against a
// real libvirtd of the test's own: both nodes online with the host's
// capacity and the images, then on each a guest created, running, its
// logs read and deleted (the two boots at once: TCG is slow), and the
// machine's daemon never told of them.
func TestTLSAndTCP(t *testing.T) {
	t.Parallel()
	o := options(t)
	h := startLibvirtd(t)
	nodes := []string{"tls", "tcp"}
	o.Nodes = []vm.NodeConfig{
		{Name: "tls", URI: "qemu+tls://" + h.tlsAddr + "/system", TLSDir: h.clientDir},
		{Name: "tcp", URI: "qemu+tcp://" + h.tcpAddr + "/system"},
	}
	d := open(t, o)
	ctx := context.Background()
	st, err := d.State(ctx)
	if err != nil || len(st.Nodes) != 2 {
		t.Fatalf("State: %+v %v", st, err)
	}
	for _, n := range st.Nodes {
		if n.Status != driver.NodeOnline || n.Capacity.CPU == 0 || n.Capacity.Memory == 0 {
			t.Fatalf("node %s: %s (%s), capacity %+v; want online with the host's capacity", n.Name, n.Status, n.Reason, n.Capacity)
		}
		if len(n.Images) != 1 || n.Images[0] != "guest" {
			t.Errorf("node %s has images %v, want [guest]", n.Name, n.Images)
		}
	}
	for _, node := range nodes {
		ims, err := d.Images(ctx, node)
		if err != nil || len(ims) != 1 || ims[0].Name != "guest" {
			t.Errorf("Images(%s): %+v %v, want the guest image", node, ims, err)
		}
	}

	tag := uniq("case")
	type created struct {
		inst *driver.Instance
		err  error
	}
	results := map[string]chan created{}
	names := map[string]string{}
	cctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	for _, node := range nodes {
		names[node] = uniq("vm-" + node)
		op := beginCreate(cctx, t, d, node, &driver.Spec{Name: names[node], Kind: driver.KindVM, Image: "guest", Flavor: "tiny",
			Tags: testTags(map[string]string{"case": tag}), UserData: "echo over " + node + "\n"})
		ch := make(chan created, 1)
		results[node] = ch
		go func() {
			inst, err := driver.Drive(cctx, op)
			ch <- created{inst, err}
		}()
	}
	insts := map[string]*driver.Instance{}
	for _, node := range nodes {
		r := <-results[node]
		if r.err != nil {
			t.Fatalf("Create over %s: %v", node, r.err)
		}
		if r.inst.Node != node || r.inst.State != driver.StateRunning {
			t.Fatalf("created %+v, want running on node %s", r.inst, node)
		}
		insts[node] = r.inst
	}
	for _, node := range nodes {
		waitLogs(t, d, insts[node].ID, "over "+node)
		if systemKnows(t, names[node]) {
			t.Errorf("the machine's daemon has a domain %s: the test's daemon should have made it alone", names[node])
		}
	}

	list, err := d.List(ctx, map[string]string{"case": tag})
	if err != nil || len(list) != 2 {
		t.Fatalf("List: %+v %v, want the two guests", list, err)
	}
	_, uuid, _ := strings.Cut(insts["tls"].ID, "/")
	if _, err := d.Get(ctx, "tcp/"+uuid); !errors.Is(err, driver.ErrNotFound) {
		t.Errorf("Get of the tls node's guest through the tcp node: %v, want ErrNotFound", err)
	}
	st, err = d.State(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range st.Nodes {
		if n.Instances != 1 || n.Reserved.Memory < 2*96*driver.MiB {
			t.Errorf("node %s: %d instances reserving %s, want 1 and both guests' memory", n.Name, n.Instances, n.Reserved.Memory)
		}
	}

	for _, node := range nodes {
		op, err := d.Delete(ctx, insts[node].ID)
		if err == nil {
			_, err = driver.Drive(ctx, op)
		}
		if err != nil {
			t.Errorf("Delete over %s: %v", node, err)
		}
	}
	if list, err := d.List(ctx, map[string]string{"case": tag}); err != nil || len(list) != 0 {
		t.Errorf("List after Delete: %+v %v", list, err)
	}
}

// systemKnows reports whether the machine's daemon has a domain named
// name.
func systemKnows(t *testing.T, name string) bool {
	t.Helper()
	c, err := net.Dial("unix", vm.DefaultSocket)
	if err != nil {
		t.Fatalf("the machine's daemon: %v", err)
	}
	lv := libvirt.NewWithDialer(dialers.NewAlreadyConnected(c))
	if err := lv.ConnectToURI(libvirt.QEMUSystem); err != nil {
		c.Close()
		t.Fatalf("the machine's daemon: %v", err)
	}
	defer lv.Disconnect()
	_, err = lv.DomainLookupByName(name)
	return err == nil
}

// TestTLSRefused checks that qemu+tls refuses, with a clear ErrRetryable
// naming the file or the reason and never a key, a client certificate
// that the daemon's CA did not sign, a daemon whose certificate the
// node's CA did not sign, and a tls_dir whose files are missing or do not
// match; a node with the right files reaches the same daemon.
func TestTLSRefused(t *testing.T) {
	t.Parallel()
	h := startLibvirtd(t)
	// A CA of the same name as the daemon's but another key: a client
	// sends a certificate it signed (its issuer is one the daemon names),
	// and the daemon must find the signature wrong.
	other := pkitest.NewCA("berth-test-ca")
	otherClient := other.Client("berth-test-client")
	dirs := map[string]string{
		"good":           h.clientDir,
		"untrusted-cert": tlsDir(t, h.ca.CertPEM, otherClient.CertPEM, otherClient.KeyPEM),
		"unknown-server": tlsDir(t, other.CertPEM, h.client.CertPEM, h.client.KeyPEM),
		"mismatched-key": tlsDir(t, h.ca.CertPEM, h.client.CertPEM, otherClient.KeyPEM),
		"empty":          t.TempDir(),
	}
	want := map[string]string{
		"untrusted-cert": "refused the client certificate " + filepath.Join(dirs["untrusted-cert"], "clientcert.pem"),
		"unknown-server": "certificate signed by unknown authority",
		"mismatched-key": "private key does not match public key",
		"empty":          filepath.Join(dirs["empty"], "cacert.pem"),
	}
	o := *vm.DefaultOptions()
	o.StorageDir = t.TempDir()
	o.Images = map[string]vm.Image{"guest": {ImageFiles: vm.ImageFiles{Kernel: "/dev/null"}}}
	o.Nodes = nil
	for _, name := range slices.Sorted(maps.Keys(dirs)) {
		o.Nodes = append(o.Nodes, vm.NodeConfig{Name: name, URI: "qemu+tls://" + h.tlsAddr + "/system", TLSDir: dirs[name]})
	}
	d := open(t, o)
	ctx := context.Background()
	if _, err := d.Images(ctx, "good"); err != nil {
		t.Fatalf("Images over TLS with the daemon's CA's client certificate: %v", err)
	}
	keys := [][]byte{h.client.KeyPEM, otherClient.KeyPEM}
	for _, name := range slices.Sorted(maps.Keys(want)) {
		_, err := d.Images(ctx, name)
		t.Logf("node %s: %v", name, err)
		if !errors.Is(err, driver.ErrRetryable) || !strings.Contains(err.Error(), want[name]) {
			t.Errorf("Images on node %s: %v; want ErrRetryable saying %q", name, err, want[name])
		}
		if err != nil {
			for _, k := range keys {
				if leaks(err.Error(), k) {
					t.Errorf("node %s: the error shows key material: %v", name, err)
				}
			}
		}
	}
	st, err := d.State(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range st.Nodes {
		if wantOnline := n.Name == "good"; (n.Status == driver.NodeOnline) != wantOnline {
			t.Errorf("node %s: %s (%s); want online only for the node with the right files", n.Name, n.Status, n.Reason)
		}
	}
}

// leaks reports whether s holds any 16 characters of the base64 body of
// the PEM key.
func leaks(s string, keyPEM []byte) bool {
	if strings.Contains(s, "PRIVATE KEY") {
		return true
	}
	block, _ := pem.Decode(keyPEM)
	body := string(pem.EncodeToMemory(&pem.Block{Type: "K", Bytes: block.Bytes}))
	for _, line := range strings.Split(body, "\n") {
		for i := 0; i+16 <= len(line) && !strings.HasPrefix(line, "-----"); i += 16 {
			if strings.Contains(s, line[i:i+16]) {
				return true
			}
		}
	}
	return false
}
