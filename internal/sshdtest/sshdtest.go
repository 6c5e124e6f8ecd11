// Package sshdtest runs real OpenSSH servers (sshd, from openssh-server)
// for tests: on a loopback port, or alone in a network namespace the test
// makes (as root), reachable only at that namespace's address. Each server
// has a fresh host key and lets in one fresh client key.
package sshdtest

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/pem"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/netnstest"
	"github.com/berth-dev/berth/internal/testdeps"
	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/knownhosts"
)

// Options choose where a server listens.
type Options struct {
	// Netns puts the server in a network namespace of its own, joined to
	// this one by a veth pair; it listens on the namespace's address only.
	// It needs root and ip(8).
	Netns bool
	// ClientKey is the private key file to let in instead of a fresh one
	// (several servers sharing one client key).
	ClientKey string
	// ECDSAKey gives the server an ECDSA host key besides its ed25519 one
	// (Server.ECDSAKey); KnownHosts holds only the ed25519 key.
	ECDSAKey bool
	// ShellNoise is printed on stderr by the user's shell as it starts
	// every session's command, as a host's login scripts may: the
	// sessions get BASH_ENV (SetEnv) naming a script that prints it, which
	// bash, the shell of root, reads before running a command.
	ShellNoise string
}

// Server is a running sshd.
type Server struct {
	Addr       string        // host:port the server listens on
	Host       string        // the address alone
	Port       int           // the port alone
	Key        string        // the client's private key file
	KnownHosts string        // a known_hosts file holding the server's key
	HostKey    ssh.PublicKey // the server's public host key
	ECDSAKey   ssh.PublicKey // its second host key, with Options.ECDSAKey
	Dir        string        // the server's files: keys, config, log
	Netns      string        // the namespace's name, "" on loopback
	ns         *netnstest.NS // the namespace, nil on loopback

	t    testing.TB
	sshd string
	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
}

// Start starts a server that is stopped (with every session's processes)
// when the test ends.
func Start(t testing.TB, o Options) *Server {
	t.Helper()
	sshd, err := exec.LookPath("sshd")
	if err != nil {
		if _, serr := os.Stat("/usr/sbin/sshd"); serr != nil {
			testdeps.Need(t, testdeps.Missing("sshd", "openssh-server"))
		}
		sshd = "/usr/sbin/sshd"
	}
	s := &Server{t: t, sshd: sshd, Dir: t.TempDir()}
	s.HostKey = writeKey(t, filepath.Join(s.Dir, "host_key"))
	s.Key = o.ClientKey
	if s.Key == "" {
		s.Key = filepath.Join(s.Dir, "client_key")
		writeKey(t, s.Key)
	}
	b, err := os.ReadFile(s.Key)
	if err != nil {
		t.Fatal(err)
	}
	signer, err := ssh.ParsePrivateKey(b)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(s.Dir, "authorized_keys"), ssh.MarshalAuthorizedKey(signer.PublicKey()), 0o600); err != nil {
		t.Fatal(err)
	}
	if o.Netns {
		s.ns = netnstest.Pair(t)
		s.Netns, s.Host = s.ns.Name, s.ns.Addr
		s.Port = 22
	} else {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		s.Host, s.Port = "127.0.0.1", l.Addr().(*net.TCPAddr).Port
		l.Close()
	}
	s.Addr = net.JoinHostPort(s.Host, fmt.Sprint(s.Port))
	extra := ""
	if o.ECDSAKey {
		priv, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		block, err := ssh.MarshalPrivateKey(priv, "")
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(s.Dir, "host_key_ecdsa"), pem.EncodeToMemory(block), 0o600); err != nil {
			t.Fatal(err)
		}
		if s.ECDSAKey, err = ssh.NewPublicKey(&priv.PublicKey); err != nil {
			t.Fatal(err)
		}
		extra = "HostKey " + filepath.Join(s.Dir, "host_key_ecdsa") + "\n"
	}
	// The sessions' shell is root's bash, which sources root's ~/.bashrc
	// before every command sshd runs, unless it is not the first shell
	// (SHLVL): this machine's may be slow (a version manager's set-up
	// costs a second of CPU per command), and it is not the host's under
	// test. A host's own start-up scripts are ShellNoise's.
	env := "SHLVL=1"
	if o.ShellNoise != "" {
		script := filepath.Join(s.Dir, "noise.sh")
		if err := os.WriteFile(script, []byte("printf '%s\\n' "+shellQuote(o.ShellNoise)+" >&2\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		env += " BASH_ENV=" + script
	}
	extra += "SetEnv " + env + "\n"
	cfg := extra + fmt.Sprintf(`ListenAddress %s
HostKey %s/host_key
AuthorizedKeysFile %s/authorized_keys
PidFile %s/sshd.pid
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
MaxSessions 64
MaxStartups 64
AllowTcpForwarding local
AllowStreamLocalForwarding yes
Subsystem sftp internal-sftp
`, s.Addr, s.Dir, s.Dir, s.Dir)
	if err := os.WriteFile(filepath.Join(s.Dir, "sshd_config"), []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	// sshd wants its privilege separation directory.
	if err := os.MkdirAll("/run/sshd", 0o755); err != nil {
		t.Fatal(err)
	}
	s.writeKnownHosts(s.HostKey)
	if err := s.Restart(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		s.Kill()
		if t.Failed() {
			t.Logf("sshd %s: %s", s.Addr, s.Log())
		}
	})
	return s
}

// writeKey writes a fresh ed25519 private key to file and returns its
// public key.
func writeKey(t testing.TB, file string) ssh.PublicKey {
	t.Helper()
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	block, err := ssh.MarshalPrivateKey(priv, "")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(file, pem.EncodeToMemory(block), 0o600); err != nil {
		t.Fatal(err)
	}
	sp, err := ssh.NewPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	return sp
}

func (s *Server) writeKnownHosts(key ssh.PublicKey) {
	s.KnownHosts = filepath.Join(s.Dir, "known_hosts")
	if err := os.WriteFile(s.KnownHosts, []byte(KnownHostsLine(s.Addr, key)), 0o600); err != nil {
		s.t.Fatal(err)
	}
}

// KnownHostsLine is the known_hosts line of key at addr.
func KnownHostsLine(addr string, key ssh.PublicKey) string {
	return knownhosts.Line([]string{knownhosts.Normalize(addr)}, key) + "\n"
}

// Log returns what the server wrote.
func (s *Server) Log() string {
	b, _ := os.ReadFile(filepath.Join(s.Dir, "sshd.log"))
	return string(b)
}

// Kill kills the server with SIGKILL, with its connections and every
// process of its sessions (every process descending from it); processes
// that left the tree (daemons whose parent ended) keep running. Killing a
// stopped server does nothing.
func (s *Server) Kill() {
	s.mu.Lock()
	cmd, done := s.cmd, s.done
	s.cmd = nil
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	tree := descendants(cmd.Process.Pid)
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	for _, pid := range tree {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	<-done
}

// descendants returns the pids of every process descending from pid.
func descendants(pid int) []int {
	ents, _ := os.ReadDir("/proc")
	parent := map[int]int{}
	for _, e := range ents {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		i := bytes.LastIndexByte(b, ')')
		if f := strings.Fields(string(b[i+1:])); i > 0 && len(f) > 1 {
			parent[p], _ = strconv.Atoi(f[1])
		}
	}
	var out []int
	for p := range parent {
		for q := parent[p]; q > 1; q = parent[q] {
			if q == pid {
				out = append(out, p)
				break
			}
		}
	}
	return out
}

// Down cuts the namespace's link: the server neither answers nor closes
// anything, as a host whose network went away. Up restores it.
func (s *Server) Down() { s.link("down") }

// Up restores the link Down cut.
func (s *Server) Up() { s.link("up") }

func (s *Server) link(state string) {
	s.t.Helper()
	if s.ns == nil {
		s.t.Fatal("sshdtest: Down and Up need a server in a network namespace")
	}
	if state == "down" {
		s.ns.Down()
	} else {
		s.ns.Up()
	}
}

// NewHostKey gives the server a new host key, which takes effect at the
// next Restart; KnownHosts keeps the old one.
func (s *Server) NewHostKey() ssh.PublicKey {
	return writeKey(s.t, filepath.Join(s.Dir, "host_key"))
}

// Restart starts the server (again, after Kill) on the same address and
// waits until it accepts connections.
func (s *Server) Restart() error {
	s.Kill()
	logFile, err := os.OpenFile(filepath.Join(s.Dir, "sshd.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer logFile.Close()
	args := []string{"-D", "-e", "-f", filepath.Join(s.Dir, "sshd_config")}
	cmd := exec.Command(s.sshd, args...)
	if s.ns != nil {
		cmd = s.ns.Command(s.sshd, args...)
	}
	// Its own process group: Kill ends the sessions' processes too.
	cmd.Stdout, cmd.Stderr, cmd.SysProcAttr = logFile, logFile, &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("sshd: %w", err)
	}
	done := make(chan struct{})
	var waitErr error
	go func() {
		waitErr = cmd.Wait()
		close(done)
	}()
	s.mu.Lock()
	s.cmd, s.done = cmd, done
	s.mu.Unlock()
	deadline := time.Now().Add(time.Minute)
	for {
		c, err := net.DialTimeout("tcp", s.Addr, time.Second)
		if err == nil {
			c.Close()
			return nil
		}
		select {
		case <-done:
			return fmt.Errorf("sshd ended (%v) before it listened on %s: %s", waitErr, s.Addr, s.Log())
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("nothing listens on %s after a minute: %s", s.Addr, s.Log())
		}
	}
}

// shellQuote quotes s for sh.
func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }
