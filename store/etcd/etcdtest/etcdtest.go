// Package etcdtest starts real etcd members for tests, in the test's
// process.
package etcdtest

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/berth-dev/berth/store/etcd"
)

// FreePort returns a loopback port nobody listens on now.
func FreePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// Member runs a one-member etcd cluster, stopped when the test ends. Its
// writes skip fsync.
func Member(t testing.TB) *etcd.Member {
	t.Helper()
	m, err := etcd.StartMember(context.Background(), etcd.MemberConfig{
		Name: "m", Dir: filepath.Join(t.TempDir(), "etcd"),
		PeerURL:   fmt.Sprintf("http://127.0.0.1:%d", FreePort(t)),
		ClientURL: fmt.Sprintf("http://127.0.0.1:%d", FreePort(t)),
		SkipFsync: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	return m
}

// Client returns a client of m, closed when the test ends (before m).
func Client(t testing.TB, m *etcd.Member) *clientv3.Client {
	t.Helper()
	c, err := m.Client()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}
