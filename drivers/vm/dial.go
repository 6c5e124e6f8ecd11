package vm

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/knownhosts"
)

// Transports of a node's URI.
const (
	transportUnix = "unix"
	transportTCP  = "tcp"
	transportTLS  = "tls"
	transportSSH  = "ssh"
)

// Default ports of the network transports.
const (
	defaultTCPPort = "16509"
	defaultTLSPort = "16514"
	defaultSSHPort = "22"
)

// target is a node's URI taken apart: how to reach the daemon, and the URI
// to open once there.
type target struct {
	transport string
	user      string
	host      string // host:port for the network transports
	// remote is the URI the daemon is asked to open: the node's URI
	// without its transport and host (qemu:///system).
	remote string
}

// parseURI reads a libvirt URI: qemu[+unix|+tcp|+tls|+ssh]://[user@]host[:port]/system
// (or /session). Query parameters are refused: what libvirt reads from
// them (socket, keyfile, known_hosts, pkipath) are the node's own fields.
func parseURI(s string) (target, error) {
	u, err := url.Parse(s)
	if err != nil {
		return target{}, fmt.Errorf("not a URI: %v", err)
	}
	var t target
	switch u.Scheme {
	case "qemu", "qemu+unix":
		t.transport = transportUnix
	case "qemu+tcp":
		t.transport = transportTCP
	case "qemu+tls":
		t.transport = transportTLS
	case "qemu+ssh":
		t.transport = transportSSH
	default:
		return target{}, fmt.Errorf("scheme %q: want qemu, qemu+unix, qemu+ssh, qemu+tls or qemu+tcp", u.Scheme)
	}
	if u.Path != "/system" && u.Path != "/session" {
		return target{}, fmt.Errorf("path %q: want /system or /session", u.Path)
	}
	if u.RawQuery != "" || u.Fragment != "" {
		return target{}, errors.New("URI parameters are not read: give the node's socket, ssh_key, known_hosts or tls_dir instead")
	}
	if _, set := u.User.Password(); set {
		return target{}, errors.New("a password in the URI is refused: use ssh_key")
	}
	t.user = u.User.Username()
	t.remote = "qemu://" + u.Path
	if t.transport == transportUnix {
		if u.Host != "" {
			return target{}, fmt.Errorf("host %q: a unix socket reaches only this host (use qemu+ssh or qemu+tls)", u.Host)
		}
		return t, nil
	}
	if t.user != "" && t.transport != transportSSH {
		return target{}, fmt.Errorf("user %q: only qemu+ssh takes a user", t.user)
	}
	host, port := u.Hostname(), u.Port()
	if host == "" {
		return target{}, fmt.Errorf("%s needs a host", u.Scheme)
	}
	if port == "" {
		port = map[string]string{transportTCP: defaultTCPPort, transportTLS: defaultTLSPort, transportSSH: defaultSSHPort}[t.transport]
	}
	if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 {
		return target{}, fmt.Errorf("port %q: want 1 to 65535", port)
	}
	t.host = net.JoinHostPort(host, port)
	return t, nil
}

// dial opens a byte stream to the node's daemon over its URI's transport.
// It honours ctx through the handshakes; the stream it returns is not
// bound to ctx.
func (n *node) dial(ctx context.Context) (net.Conn, error) {
	var d net.Dialer
	switch n.target.transport {
	case transportUnix:
		return d.DialContext(ctx, "unix", n.cfg.Socket)
	case transportTCP:
		return d.DialContext(ctx, "tcp", n.target.host)
	case transportTLS:
		return n.dialTLS(ctx)
	case transportSSH:
		return n.dialSSH(ctx)
	}
	return nil, fmt.Errorf("transport %q", n.target.transport)
}

// during makes c's blocking calls end when ctx does, until the returned
// function is called.
func during(ctx context.Context, c net.Conn) (stop func()) {
	if dl, ok := ctx.Deadline(); ok {
		_ = c.SetDeadline(dl)
	}
	after := context.AfterFunc(ctx, func() { _ = c.SetDeadline(time.Unix(1, 0)) })
	return func() {
		after()
		_ = c.SetDeadline(time.Time{})
	}
}

// tlsFiles are the CA certificate, client certificate and client key of
// qemu+tls: those of tls_dir, else where libvirt's own client keeps them.
func (n *node) tlsFiles() (ca, cert, key string) {
	if dir := n.cfg.TLSDir; dir != "" {
		return filepath.Join(dir, "cacert.pem"), filepath.Join(dir, "clientcert.pem"), filepath.Join(dir, "clientkey.pem")
	}
	return "/etc/pki/CA/cacert.pem", "/etc/pki/libvirt/clientcert.pem", "/etc/pki/libvirt/private/clientkey.pem"
}

// dialTLS opens a TLS connection checked against the CA of tls_dir, with
// the client certificate there, as libvirt's own client does. The files
// are read at each dial, so that renewed certificates are taken without a
// restart; an error names the file, never its contents.
func (n *node) dialTLS(ctx context.Context) (net.Conn, error) {
	caFile, certFile, keyFile := n.tlsFiles()
	ca, err := os.ReadFile(caFile)
	if err != nil {
		return nil, fmt.Errorf("tls: CA certificate: %w", err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(ca) {
		return nil, fmt.Errorf("tls: CA certificate %s: no PEM certificate in it", caFile)
	}
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("tls: client certificate %s and key %s: %w", certFile, keyFile, err)
	}
	host, _, _ := net.SplitHostPort(n.target.host)
	var d net.Dialer
	raw, err := d.DialContext(ctx, "tcp", n.target.host)
	if err != nil {
		return nil, err
	}
	c := tls.Client(raw, &tls.Config{ServerName: host, RootCAs: roots, Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12})
	stop := during(ctx, raw)
	defer stop()
	if err := c.HandshakeContext(ctx); err != nil {
		raw.Close()
		return nil, fmt.Errorf("tls %s: %w", n.target.host, err)
	}
	// The daemon checks the client's certificate after the handshake and
	// then sends one byte, 1, or closes the connection.
	var b [1]byte
	_, err = c.Read(b[:])
	if err == nil && b[0] == 1 {
		return c, nil
	}
	c.Close()
	if err != nil && !refusal(err) {
		return nil, fmt.Errorf("tls %s: waiting for the daemon to accept the client certificate: %w", n.target.host, err)
	}
	return nil, fmt.Errorf("tls %s: the daemon refused the client certificate %s (not signed by a CA it trusts, expired, or its name not in the daemon's tls_allowed_dn_list)", n.target.host, certFile)
}

// refusal reports whether err is the peer's ending of the connection: the
// end of the stream, a reset or a TLS alert (crypto/tls reports an alert
// as a net.OpError of Op "remote error").
func refusal(err error) bool {
	var op *net.OpError
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET) ||
		errors.As(err, &op) && op.Op == "remote error"
}

// dialSSH logs in to the node's host with ssh_key, checking the host's key
// against known_hosts, and opens the daemon's unix socket there (ssh's
// stream-local forwarding: nothing runs on the host but sshd).
func (n *node) dialSSH(ctx context.Context) (net.Conn, error) {
	key, err := os.ReadFile(n.cfg.SSHKey)
	if err != nil {
		return nil, fmt.Errorf("ssh_key: %w", err)
	}
	signer, err := ssh.ParsePrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("ssh_key %s: %w", n.cfg.SSHKey, err)
	}
	hostKey, err := knownhosts.New(n.cfg.KnownHosts)
	if err != nil {
		return nil, fmt.Errorf("known_hosts: %w", err)
	}
	var d net.Dialer
	raw, err := d.DialContext(ctx, "tcp", n.target.host)
	if err != nil {
		return nil, err
	}
	stop := during(ctx, raw)
	conn, chans, reqs, err := ssh.NewClientConn(raw, n.target.host, &ssh.ClientConfig{
		User:            n.target.user,
		Auth:            []ssh.AuthMethod{ssh.PublicKeys(signer)},
		HostKeyCallback: hostKey,
	})
	stop()
	if err != nil {
		raw.Close()
		return nil, fmt.Errorf("ssh %s: %w", n.target.host, err)
	}
	client := ssh.NewClient(conn, chans, reqs)
	c, err := client.Dial("unix", n.cfg.Socket)
	if err != nil {
		client.Close()
		return nil, fmt.Errorf("ssh %s: open %s: %w", n.target.host, n.cfg.Socket, err)
	}
	return &sshConn{Conn: c, client: client, raw: raw}, nil
}

// sshConn is a stream through an ssh connection of its own, which its
// Close ends too. Its deadlines are those of the TCP connection (an ssh
// channel has none).
type sshConn struct {
	net.Conn
	client *ssh.Client
	raw    net.Conn
}

func (c *sshConn) SetDeadline(t time.Time) error      { return c.raw.SetDeadline(t) }
func (c *sshConn) SetReadDeadline(t time.Time) error  { return c.raw.SetReadDeadline(t) }
func (c *sshConn) SetWriteDeadline(t time.Time) error { return c.raw.SetWriteDeadline(t) }

func (c *sshConn) Close() error {
	err := c.Conn.Close()
	if cerr := c.client.Close(); err == nil {
		err = cerr
	}
	return err
}

// defaultUser is the ssh user of a URI without one: the driver's own.
func defaultUser() string {
	if u, err := user.Current(); err == nil {
		return u.Username
	}
	return "root"
}

// homeFile is a file of the driver's home directory.
func homeFile(parts ...string) string {
	home, err := os.UserHomeDir()
	if err != nil {
		return ""
	}
	return filepath.Join(append([]string{home}, parts...)...)
}

// firstKey is the first of the usual private keys in ~/.ssh that exists.
func firstKey() string {
	for _, k := range []string{"id_ed25519", "id_ecdsa", "id_rsa"} {
		if p := homeFile(".ssh", k); p != "" {
			if _, err := os.Stat(p); err == nil {
				return p
			}
		}
	}
	return homeFile(".ssh", "id_ed25519")
}
