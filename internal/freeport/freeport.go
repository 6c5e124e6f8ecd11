// Package freeport hands tests loopback TCP ports that nothing listens on,
// for servers they start that must be told their port before they listen
// (etcd members, kube-apiserver, a second Docker engine, libvirtd).
package freeport

import (
	"errors"
	"net"
	"strconv"
	"sync"
	"testing"
)

// given are the ports Take has returned in this process: the kernel may
// hand a port it has just freed out again at once, and two servers of one
// test given the same port cannot both start.
var given struct {
	sync.Mutex
	ports map[int]bool
}

// Take returns a loopback TCP port nobody listens on now and that Take has
// not returned before in this process.
func Take() (int, error) {
	given.Lock()
	defer given.Unlock()
	for range 100 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, err
		}
		port := l.Addr().(*net.TCPAddr).Port
		l.Close()
		if !given.ports[port] {
			if given.ports == nil {
				given.ports = map[int]bool{}
			}
			given.ports[port] = true
			return port, nil
		}
	}
	return 0, errors.New("freeport: no loopback port that was not handed out already")
}

// Port is Take for a test: it fails t when no port is left.
func Port(t testing.TB) int {
	t.Helper()
	port, err := Take()
	if err != nil {
		t.Fatal(err)
	}
	return port
}

// Addr returns Port as a host:port address on 127.0.0.1.
func Addr(t testing.TB) string {
	t.Helper()
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(Port(t)))
}
