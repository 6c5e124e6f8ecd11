package ssh

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/berth-dev/berth/driver"
)

// The values of the option supervision, and of the node attribute
// supervisor (where auto is never seen).
const (
	// SupervisionAuto runs each instance's supervisor in a transient
	// systemd unit on a host where systemd is the service manager and
	// systemd-run works for the login user, else as SupervisionProcess.
	SupervisionAuto = "auto"
	// SupervisionSystemd is the attribute of a host whose instances run
	// in transient units.
	SupervisionSystemd = "systemd"
	// SupervisionProcess runs the supervisor as a process in a session
	// of its own, with the cgroups it makes itself.
	SupervisionProcess = "process"
)

// unitPrefix starts the name of every unit an instance runs in:
// berth-<cluster>-<instance id>.service, both ids escaped (unitEscape).
const unitPrefix = "berth-"

// maxUnitName is systemd's bound of a unit name, suffix included.
const maxUnitName = 255

// unitEscape escapes s as systemd-escape does a string that holds no
// "/": every byte but ASCII letters, digits, ':', '_' and '.' (and '.'
// first) becomes \xNN. The result holds no "-", which thus separates the
// parts of a unit name.
func unitEscape(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9', c == ':', c == '_', c == '.' && i > 0:
			b.WriteByte(c)
		default:
			fmt.Fprintf(&b, `\x%02x`, c)
		}
	}
	return b.String()
}

// unitUnescape reverses unitEscape; ok is false for what unitEscape
// never makes.
func unitUnescape(s string) (string, bool) {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '\\' {
			b.WriteByte(s[i])
			continue
		}
		if i+3 >= len(s) || s[i+1] != 'x' {
			return "", false
		}
		v, err := hex.DecodeString(s[i+2 : i+4])
		if err != nil {
			return "", false
		}
		b.WriteByte(v[0])
		i += 3
	}
	out := b.String()
	return out, unitEscape(out) == s
}

// unitName is the name of the transient unit instance id of cluster runs
// in. Both must be names (driver.CheckName), and the whole within
// systemd's bound.
func unitName(cluster, id string) (string, error) {
	if driver.CheckName("cluster", cluster, driver.MaxNameLength) != nil || driver.CheckName("id", id, driver.MaxNameLength) != nil {
		return "", fmt.Errorf("cluster %q, instance %q: not names a unit can carry", cluster, id)
	}
	name := unitPrefix + unitEscape(cluster) + "-" + unitEscape(id) + ".service"
	if len(name) > maxUnitName {
		return "", fmt.Errorf("unit %s: longer than systemd's %d bytes", name, maxUnitName)
	}
	return name, nil
}

// clusterUnitPrefix starts the names of cluster's units: unitName(cluster,
// id) for every id.
func clusterUnitPrefix(cluster string) string { return unitPrefix + unitEscape(cluster) + "-" }

// unitID returns the instance id of a unit of cluster, ok false when name
// is not one of cluster's.
func unitID(cluster, name string) (string, bool) {
	rest, ok := strings.CutPrefix(name, clusterUnitPrefix(cluster))
	if !ok {
		return "", false
	}
	rest, ok = strings.CutSuffix(rest, ".service")
	if !ok || strings.Contains(rest, "-") {
		return "", false
	}
	id, ok := unitUnescape(rest)
	return id, ok && driver.CheckName("id", id, driver.MaxNameLength) == nil
}

// unitLimits are the unit properties that hold r's cpu and memory, as
// NAME=VALUE: CPUQuota (percent of one cpu, rounded up, at least 1%),
// MemoryMax and MemorySwapMax 0 with a memory limit (as setLimits);
// no limit where r has none.
func unitLimits(r driver.Resources) []string {
	cpu := "CPUQuota="
	if r.CPU > 0 {
		cpu += strconv.FormatInt(max((int64(r.CPU)+9)/10, 1), 10) + "%"
	}
	mem, swap := "MemoryMax=infinity", "MemorySwapMax=infinity"
	if r.Memory > 0 {
		mem, swap = "MemoryMax="+strconv.FormatInt(int64(r.Memory), 10), "MemorySwapMax=0"
	}
	return []string{cpu, swap, mem}
}

// systemdTimeout bounds each systemctl and systemd-run the supervisor
// runs.
const systemdTimeout = time.Minute

// systemctl runs systemctl with args, no shell between, and returns its
// error with what it said.
func systemctl(args ...string) error { return runTool("systemctl", args...) }

func runTool(name string, args ...string) error {
	exe, err := lookPath(name, defaultPath)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), systemdTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, exe, args...)
	cmd.Env = []string{"PATH=" + defaultPath, "LANG=C", "SYSTEMD_PAGER=", "SYSTEMD_COLORS=0"}
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, bytes.TrimSpace(out))
	}
	return nil
}

// checkSystemd returns why instances cannot run in transient units on
// this host (nil when they can): systemd is not the service manager, or
// systemd-run does not work for this user, which it tries with a unit
// running this binary's status verb.
func checkSystemd() error {
	if fi, err := os.Stat("/run/systemd/system"); err != nil || !fi.IsDir() {
		return errors.New("systemd is not the service manager (no /run/systemd/system)")
	}
	if b, err := os.ReadFile("/proc/1/comm"); err != nil || strings.TrimSpace(string(b)) != "systemd" {
		return fmt.Errorf("pid 1 is %q, not systemd", strings.TrimSpace(string(b)))
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	var r [8]byte
	_, _ = rand.Read(r[:])
	// Not under unitPrefix: no cluster's listing may take it for a leak.
	unit := "berth_check_" + hex.EncodeToString(r[:]) + ".service"
	if err := runTool("systemd-run", "--quiet", "--wait", "--collect", "--unit="+unit,
		"--property=TimeoutStartSec=30", "--", self, SuperviseCommand, "status"); err != nil {
		return fmt.Errorf("systemd-run does not work for uid %d: %w", os.Geteuid(), err)
	}
	return nil
}

// checkSystemdLimits returns why systemd cannot hold cpu and memory
// limits here (nil when it can): the cpu or memory controller is missing
// or disabled in /proc/cgroups.
func checkSystemdLimits() error {
	b, err := os.ReadFile("/proc/cgroups")
	if err != nil {
		return err
	}
	on := map[string]bool{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 4 && f[3] == "1" {
			on[f[0]] = true
		}
	}
	if !on["cpu"] || !on["memory"] {
		return fmt.Errorf("the kernel's cpu or memory controller is missing or disabled (/proc/cgroups)")
	}
	return nil
}

// startUnit starts the supervisor of dir (an absolute path), whose record
// is rec, in rec's transient unit with rec's limits, and returns once the
// supervisor told systemd it is ready (it then wrote its report), or the
// unit failed. A unit of that name left from an earlier run is stopped
// first.
func startUnit(dir string, rec *record) error {
	unit, err := unitName(rec.Cluster, rec.ID)
	if err != nil {
		return coded(exitPermanent, "%v", err)
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	stopUnit(unit)
	args := []string{"--quiet", "--collect", "--unit=" + unit, "--service-type=notify",
		"--description=berth instance " + rec.ID + " of cluster " + rec.Cluster,
		"--property=TimeoutStartSec=" + strconv.Itoa(int(systemdTimeout/time.Second)-5)}
	for _, p := range unitLimits(rec.Resources) {
		args = append(args, "--property="+p)
	}
	if h := os.Getenv("HOME"); h != "" && !strings.ContainsAny(h, "\n") {
		args = append(args, "--setenv=HOME="+h)
	}
	args = append(args, "--", self, SuperviseCommand, "run", dir)
	return runTool("systemd-run", args...)
}

// stopUnit stops unit and forgets its failure, when there is such a unit;
// what systemctl says is dropped (a unit not loaded is the usual case).
func stopUnit(unit string) {
	systemctl("stop", unit)
	systemctl("reset-failed", unit)
}

// cleanUnits stops the units of the cluster whose instance directories
// are under root and have none there: an instance directory exists before
// its unit starts and after it stopped, so such a unit is a leak. Another
// cluster's units are never touched. It does nothing on a host without
// systemd.
func cleanUnits(root string) {
	if _, err := os.Stat("/run/systemd/system"); err != nil {
		return
	}
	cluster := filepath.Base(root)
	exe, err := lookPath("systemctl", defaultPath)
	if err != nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), systemdTimeout)
	defer cancel()
	// All of Berth's units, the cluster's picked here: systemctl's
	// pattern would read the escapes' backslashes as its own.
	cmd := exec.CommandContext(ctx, exe, "list-units", "--all", "--plain", "--no-legend", "--full", "--type=service", unitPrefix+"*")
	cmd.Env = []string{"PATH=" + defaultPath, "LANG=C", "SYSTEMD_PAGER=", "SYSTEMD_COLORS=0"}
	out, err := cmd.Output()
	if err != nil {
		return
	}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(strings.TrimPrefix(strings.TrimSpace(sc.Text()), "●"))
		if len(f) == 0 {
			continue
		}
		id, ok := unitID(cluster, f[0])
		if !ok {
			continue
		}
		if _, err := os.Stat(filepath.Join(root, id)); errors.Is(err, os.ErrNotExist) {
			stopUnit(f[0])
		}
	}
}

// notifyReady tells systemd, at $NOTIFY_SOCKET, that this supervisor is
// ready (sd_notify READY=1).
func notifyReady(socket string) error {
	c, err := net.DialUnix("unixgram", nil, &net.UnixAddr{Name: socket, Net: "unixgram"})
	if err != nil {
		return err
	}
	defer c.Close()
	_, err = c.Write([]byte("READY=1"))
	return err
}
