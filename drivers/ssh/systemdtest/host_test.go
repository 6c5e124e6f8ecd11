package systemdtest_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	gossh "golang.org/x/crypto/ssh"

	"github.com/berth-dev/berth/internal/testdeps"
)

// imageTag names the image of the systemd host; the suffix changes with
// what buildRootFS puts in it.
const imageTag = "berth-systemd-host:bookworm-1"

// hostLabel marks the containers these tests start.
const hostLabel = "berth.test=systemd-host"

// errMissing marks a dependency the machine lacks: testdeps decides
// whether the test skips or fails.
var errMissing = errors.New("missing dependency")

// systemdHost is a container booted with systemd as PID 1 whose sshd
// lets in Key as root.
type systemdHost struct {
	ID      string // the container's
	Addr    string // its address
	Key     string // the client's private key file
	HostKey string // sshd's ed25519 key, authorized_keys form
}

// docker runs the docker CLI and returns its output, or an error with
// what it said.
func docker(ctx context.Context, stdin []byte, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, "docker", args...)
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("docker %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(errb.String()))
	}
	return strings.TrimSpace(out.String()), nil
}

// ensureImage makes imageTag unless Docker has it: from the root file
// system's tarball in the cache directory, which is made first (with
// debootstrap) when it is not there. A lock in the cache directory keeps
// two test binaries from making it at once.
func ensureImage(ctx context.Context) error {
	if _, err := exec.LookPath("docker"); err != nil {
		return fmt.Errorf("%w: %w", errMissing, testdeps.Missing("docker CLI", "docker.io"))
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		return err
	}
	cache = filepath.Join(cache, "berth")
	if err := os.MkdirAll(cache, 0o755); err != nil {
		return err
	}
	lock, err := os.OpenFile(filepath.Join(cache, "systemd-host.lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return err
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return err
	}
	if _, err := docker(ctx, nil, "image", "inspect", "--format", "{{.Id}}", imageTag); err == nil {
		return nil
	}
	tarball := filepath.Join(cache, strings.ReplaceAll(strings.ReplaceAll(imageTag, ":", "-"), "/", "-")+".tar")
	if _, err := os.Stat(tarball); err != nil {
		if err := buildRootFS(ctx, cache, tarball); err != nil {
			return err
		}
	}
	_, err = docker(ctx, nil, "import", tarball, imageTag)
	return err
}

// buildRootFS makes a Debian bookworm root file system with systemd, dbus
// and sshd (debootstrap, from the machine's Debian mirror) and writes it
// to tarball.
func buildRootFS(ctx context.Context, cache, tarball string) error {
	if _, err := exec.LookPath("debootstrap"); err != nil {
		return fmt.Errorf("%w: %w", errMissing, testdeps.Missing("debootstrap", "debootstrap"))
	}
	dir := filepath.Join(cache, "systemd-host-build")
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	cmd := exec.CommandContext(ctx, "debootstrap", "--variant=minbase", "--include=systemd,systemd-sysv,openssh-server,dbus",
		"bookworm", dir, debianMirror())
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("debootstrap: %w: %s", err, lastLines(out, 20))
	}
	// A machine id made at each boot, and no host keys in the image:
	// each container makes its own.
	os.WriteFile(filepath.Join(dir, "etc/machine-id"), nil, 0o444)
	keys, _ := filepath.Glob(filepath.Join(dir, "etc/ssh/ssh_host_*"))
	for _, k := range keys {
		os.Remove(k)
	}
	unit := "[Unit]\nDescription=sshd host keys\nBefore=ssh.service\n[Service]\nType=oneshot\nExecStart=/usr/bin/ssh-keygen -A\n[Install]\nWantedBy=multi-user.target\n"
	if err := os.WriteFile(filepath.Join(dir, "etc/systemd/system/ssh-keys.service"), []byte(unit), 0o644); err != nil {
		return err
	}
	wants := filepath.Join(dir, "etc/systemd/system/multi-user.target.wants")
	if err := os.MkdirAll(wants, 0o755); err != nil {
		return err
	}
	if err := os.Symlink("/etc/systemd/system/ssh-keys.service", filepath.Join(wants, "ssh-keys.service")); err != nil && !errors.Is(err, os.ErrExist) {
		return err
	}
	tmp := tarball + ".tmp"
	if out, err := exec.CommandContext(ctx, "tar", "-C", dir, "-cf", tmp, ".").CombinedOutput(); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("tar: %w: %s", err, out)
	}
	return os.Rename(tmp, tarball)
}

// debianMirror is the first Debian archive of the machine's apt sources
// (the security archive aside), else deb.debian.org.
func debianMirror() string {
	files, _ := filepath.Glob("/etc/apt/sources.list.d/*")
	for _, f := range append([]string{"/etc/apt/sources.list"}, files...) {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(bytes.NewReader(b))
		for sc.Scan() {
			fields := strings.Fields(sc.Text())
			var uri string
			switch {
			case len(fields) >= 2 && fields[0] == "URIs:":
				uri = fields[1]
			case len(fields) >= 3 && fields[0] == "deb" && !strings.HasPrefix(fields[1], "["):
				uri = fields[1]
			}
			if strings.HasPrefix(uri, "http") && !strings.Contains(uri, "security") {
				return uri
			}
		}
	}
	return "http://deb.debian.org/debian"
}

func lastLines(b []byte, n int) string {
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return strings.Join(lines[max(len(lines)-n, 0):], "\n")
}

// bootScript runs before systemd in the container: the cgroup
// hierarchies Docker mounts read-only (the container's own, in a cgroup
// namespace of its own) are made writable, for systemd to make its units'
// cgroups and write their limits there.
const bootScript = `if [ "$(stat -f -c %T /sys/fs/cgroup)" = cgroup2fs ]; then
	mount -o remount,rw /sys/fs/cgroup
else
	for d in /sys/fs/cgroup/*/; do mountpoint -q "$d" && mount -o remount,bind,rw "$d"; done
fi
exec /sbin/init`

// startHost boots a container of imageTag with systemd as PID 1, lets a
// fresh client key in as root and waits for its sshd. keyDir holds the
// key. The container has a cgroup namespace of its own, /run and /tmp on
// tmpfs, and every capability but CAP_SYS_RESOURCE rather than
// --privileged: a Docker Engine that runs in a container without that
// capability (as CI's may) cannot give it.
func startHost(ctx context.Context, keyDir string) (*systemdHost, error) {
	var r [6]byte
	_, _ = rand.Read(r[:])
	name := "berth-systemd-host-" + hex.EncodeToString(r[:])
	id, err := docker(ctx, nil, "run", "-d", "--cgroupns=private",
		"--cap-add", "ALL", "--cap-drop", "SYS_RESOURCE",
		"--security-opt", "seccomp=unconfined", "--security-opt", "apparmor=unconfined",
		"--tmpfs", "/run", "--tmpfs", "/run/lock", "--tmpfs", "/tmp",
		"--label", hostLabel, "--name", name, imageTag, "/bin/sh", "-c", bootScript)
	if err != nil {
		// A container made and not started is left by docker run.
		(&systemdHost{ID: name}).remove()
		return nil, err
	}
	h := &systemdHost{ID: id}
	if err := h.boot(ctx, keyDir); err != nil {
		logs, _ := docker(context.Background(), nil, "logs", "--tail", "30", id)
		h.remove()
		return nil, fmt.Errorf("%w; the container's last output:\n%s", err, logs)
	}
	return h, nil
}

// boot waits for the container's systemd to finish starting, writes the
// client key and reads the host key and address.
func (h *systemdHost) boot(ctx context.Context, keyDir string) error {
	// systemctl fails until systemd runs (the boot script is PID 1
	// first); then it waits for the boot to end.
	var state string
	var err error
	for deadline := time.Now().Add(2 * time.Minute); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		state, err = docker(ctx, nil, "exec", h.ID, "systemctl", "is-system-running", "--wait")
		if state != "" || ctx.Err() != nil {
			break
		}
	}
	if state != "running" && state != "degraded" {
		failed, _ := docker(ctx, nil, "exec", h.ID, "systemctl", "--failed", "--no-legend")
		return fmt.Errorf("systemd in the container: %q (%v); failed units: %s", state, err, failed)
	}
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return err
	}
	block, err := gossh.MarshalPrivateKey(priv, "")
	if err != nil {
		return err
	}
	h.Key = filepath.Join(keyDir, "id_ed25519")
	if err := os.WriteFile(h.Key, pem.EncodeToMemory(block), 0o600); err != nil {
		return err
	}
	sshPub, err := gossh.NewPublicKey(pub)
	if err != nil {
		return err
	}
	if _, err := docker(ctx, gossh.MarshalAuthorizedKey(sshPub), "exec", "-i", h.ID, "sh", "-c",
		"umask 077 && mkdir -p /root/.ssh && cat >/root/.ssh/authorized_keys"); err != nil {
		return err
	}
	if h.HostKey, err = docker(ctx, nil, "exec", h.ID, "cat", "/etc/ssh/ssh_host_ed25519_key.pub"); err != nil {
		return err
	}
	if h.Addr, err = docker(ctx, nil, "inspect", "--format", "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}", h.ID); err != nil {
		return err
	}
	for {
		c, err := net.DialTimeout("tcp", net.JoinHostPort(h.Addr, "22"), time.Second)
		if err == nil {
			c.Close()
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("sshd at %s: %w", h.Addr, err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// exec runs a command in the container and returns its output.
func (h *systemdHost) exec(ctx context.Context, args ...string) (string, error) {
	return docker(ctx, nil, append([]string{"exec", h.ID}, args...)...)
}

// remove removes the container.
func (h *systemdHost) remove() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	docker(ctx, nil, "rm", "-f", "-v", h.ID)
}
