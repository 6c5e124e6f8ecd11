package netnstest

import (
	"net"
	"os"
	"runtime"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// inNS runs fn on a thread of its own inside ns's network namespace:
// sockets it makes stay there.
func inNS(t *testing.T, ns *NS, fn func()) {
	t.Helper()
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
		f, err := os.Open("/run/netns/" + ns.Name)
		if err != nil {
			errc <- err
			return
		}
		defer f.Close()
		if err := unix.Setns(int(f.Fd()), unix.CLONE_NEWNET); err != nil {
			errc <- err
			return
		}
		fn()
		errc <- nil
	}()
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
}

func dial(addr string) error {
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err == nil {
		c.Close()
	}
	return err
}

// TestHub: namespaces on a hub reach each other and the test reaches
// them; one cut off is reached by nobody until it is restored. A pair's
// namespace is reached from the test.
func TestHub(t *testing.T) {
	h := NewHub(t)
	a, b := h.Add(), h.Add()
	var ln net.Listener
	inNS(t, b, func() {
		var err error
		if ln, err = net.Listen("tcp", b.Addr+":0"); err != nil {
			t.Error(err)
		}
	})
	if ln == nil {
		t.FailNow()
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	addr := ln.Addr().String()
	fromA := func() (err error) {
		inNS(t, a, func() { err = dial(addr) })
		return err
	}
	if err := dial(addr); err != nil {
		t.Fatalf("the test cannot reach b at %s: %v", addr, err)
	}
	if err := fromA(); err != nil {
		t.Fatalf("a cannot reach b at %s: %v", addr, err)
	}
	b.Down()
	if dial(addr) == nil || fromA() == nil {
		t.Fatal("b answered while cut off")
	}
	b.Up()
	if err := fromA(); err != nil {
		t.Fatalf("b did not answer a once restored: %v", err)
	}

	p := Pair(t)
	var pl net.Listener
	inNS(t, p, func() {
		var err error
		if pl, err = net.Listen("tcp", p.Addr+":0"); err != nil {
			t.Error(err)
		}
	})
	if pl == nil {
		t.FailNow()
	}
	defer pl.Close()
	go func() {
		if c, err := pl.Accept(); err == nil {
			c.Close()
		}
	}()
	if err := dial(pl.Addr().String()); err != nil {
		t.Fatalf("the test cannot reach a pair's namespace: %v", err)
	}
}
