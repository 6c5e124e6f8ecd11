// Package netnstest makes network namespaces for tests (as root, with
// iproute2's ip and util-linux's nsenter): hosts of their own addresses on
// one machine, whose network a test can cut and restore.
package netnstest

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"

	"github.com/berth-dev/berth/internal/testdeps"
)

// NS is a network namespace a test made.
type NS struct {
	t testing.TB
	// Name is the namespace's name (ip netns), Addr its address.
	Name, Addr string
	// link is the name of the link that joins it, dev in namespace on
	// ("" for the test's own).
	link, on string
}

// Command returns cmd run in the namespace: nsenter joins its network
// namespace only (ip netns exec would also mount a fresh /sys, hiding the
// cgroup tree) and execs the program, so cmd's process is the program's.
func (n *NS) Command(name string, args ...string) *exec.Cmd {
	return exec.Command("nsenter", append([]string{"--net=/run/netns/" + n.Name, name}, args...)...)
}

// Down cuts the namespace's link: what runs in it neither answers nor
// closes anything, as a host whose network went away. Up restores it.
func (n *NS) Down() { n.set("down") }

// Up restores the link Down cut.
func (n *NS) Up() { n.set("up") }

func (n *NS) set(state string) {
	n.t.Helper()
	args := []string{"link", "set", n.link, state}
	if n.on != "" {
		args = append([]string{"-n", n.on}, args...)
	}
	run(n.t, args...)
}

var count struct {
	mu sync.Mutex
	n  int
}

// tag returns a name part no other namespace of this process or another
// test process has.
func tag() (string, int) {
	count.mu.Lock()
	count.n++
	n := count.n
	count.mu.Unlock()
	var r [2]byte
	_, _ = rand.Read(r[:])
	return fmt.Sprintf("%04x%d", binary.BigEndian.Uint16(r[:]), n), n
}

// needRoot skips t (or fails it under testdeps.EnvRequireAll) unless it
// runs as root with ip (iproute2) and nsenter (util-linux) at hand.
func needRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		testdeps.Need(t, errors.New("network namespaces need root: run the tests as root"))
	}
	if _, err := exec.LookPath("ip"); err != nil {
		testdeps.Need(t, testdeps.Missing("ip", "iproute2"))
	}
	if _, err := exec.LookPath("nsenter"); err != nil {
		testdeps.Need(t, testdeps.Missing("nsenter", "util-linux"))
	}
}

// run runs ip with args, failing t on an error.
func run(t testing.TB, args ...string) {
	t.Helper()
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
	}
}

// Pair makes a namespace joined to the test's own by a veth pair on a /30
// of its own: the test reaches it at NS.Addr. It goes when the test ends.
func Pair(t testing.TB) *NS {
	t.Helper()
	needRoot(t)
	tg, n := tag()
	name, veth := "berth-"+tg, "bv"+tg
	// 10.<a>.<b>.<4c>/30: a random /30 for each namespace, so that tests
	// running at once never share one.
	var r [2]byte
	_, _ = rand.Read(r[:])
	a, b := 200+int(r[0]%50), int(r[1])
	c := (n % 64) * 4
	outer, inner := fmt.Sprintf("10.%d.%d.%d", a, b, c+1), fmt.Sprintf("10.%d.%d.%d", a, b, c+2)
	run(t, "netns", "add", name)
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", name).Run() })
	run(t, "link", "add", veth, "type", "veth", "peer", "name", veth+"p")
	t.Cleanup(func() { _ = exec.Command("ip", "link", "del", veth).Run() })
	run(t, "link", "set", veth+"p", "netns", name)
	run(t, "addr", "add", outer+"/30", "dev", veth)
	run(t, "link", "set", veth, "up")
	run(t, "-n", name, "addr", "add", inner+"/30", "dev", veth+"p")
	run(t, "-n", name, "link", "set", veth+"p", "up")
	run(t, "-n", name, "link", "set", "lo", "up")
	return &NS{t: t, Name: name, Addr: inner, link: veth}
}

// Hub is a private network of namespaces joined by a bridge, the test's
// own namespace among them: every namespace on it reaches every other
// and the test reaches them all, with no route through the machine's own
// firewall. The bridge lives in a namespace of its own.
type Hub struct {
	t      testing.TB
	name   string // the bridge's namespace
	prefix string // 10.<a>.<b>
	n      int    // namespaces added
}

// NewHub makes a hub on a /24 of its own; it goes when the test ends.
func NewHub(t testing.TB) *Hub {
	t.Helper()
	needRoot(t)
	tg, _ := tag()
	h := &Hub{t: t, name: "berth-hub-" + tg}
	var r [2]byte
	_, _ = rand.Read(r[:])
	h.prefix = fmt.Sprintf("10.%d.%d", 150+int(r[0]%50), r[1])
	run(t, "netns", "add", h.name)
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", h.name).Run() })
	run(t, "-n", h.name, "link", "add", "br0", "type", "bridge")
	run(t, "-n", h.name, "link", "set", "br0", "up")
	// The test's own end: address .1.
	veth := "bh" + tg
	run(t, "link", "add", veth, "type", "veth", "peer", "name", "host", "netns", h.name)
	t.Cleanup(func() { _ = exec.Command("ip", "link", "del", veth).Run() })
	run(t, "-n", h.name, "link", "set", "host", "master", "br0")
	run(t, "-n", h.name, "link", "set", "host", "up")
	run(t, "addr", "add", h.prefix+".1/24", "dev", veth)
	run(t, "link", "set", veth, "up")
	return h
}

// Add makes a namespace on the hub, at most 200 of them; Down cuts it off
// from every other.
func (h *Hub) Add() *NS {
	h.t.Helper()
	h.n++
	if h.n > 200 {
		h.t.Fatal("netnstest: at most 200 namespaces on a hub")
	}
	tg, _ := tag()
	name := "berth-" + tg
	addr := fmt.Sprintf("%s.%d", h.prefix, 10+h.n)
	run(h.t, "netns", "add", name)
	h.t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", name).Run() })
	port := fmt.Sprintf("p%d", h.n)
	run(h.t, "-n", name, "link", "add", "eth0", "type", "veth", "peer", "name", port, "netns", h.name)
	run(h.t, "-n", h.name, "link", "set", port, "master", "br0")
	run(h.t, "-n", h.name, "link", "set", port, "up")
	run(h.t, "-n", name, "addr", "add", addr+"/24", "dev", "eth0")
	run(h.t, "-n", name, "link", "set", "eth0", "up")
	run(h.t, "-n", name, "link", "set", "lo", "up")
	return &NS{t: h.t, Name: name, Addr: addr, link: port, on: h.name}
}
