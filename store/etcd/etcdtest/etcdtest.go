// Package etcdtest starts real etcd members for tests, in the test's
// process.
package etcdtest

import (
	"bytes"
	"context"
	"fmt"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/etcdserver/api/rafthttp"

	"github.com/berth-dev/berth/internal/freeport"
	"github.com/berth-dev/berth/store/etcd"
)

// Member runs a one-member etcd cluster, stopped when the test ends. Its
// writes skip fsync.
func Member(t testing.TB) *etcd.Member {
	t.Helper()
	m, err := etcd.StartMember(context.Background(), etcd.MemberConfig{
		Name: "m", Dir: filepath.Join(t.TempDir(), "etcd"),
		PeerURL:   fmt.Sprintf("http://127.0.0.1:%d", freeport.Port(t)),
		ClientURL: fmt.Sprintf("http://127.0.0.1:%d", freeport.Port(t)),
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

// AwaitClosed waits, after every member of the process and every client
// of them closed, until no goroutine of etcd is left, or gives up after
// twice rafthttp.ConnReadTimeout. A connection between members that was
// being read when its member closed lingers up to that timeout: etcd's
// peer connections set their read deadline again on each read, undoing
// the deadline net/http sets to end a request's background read.
func AwaitClosed(t testing.TB) {
	t.Helper()
	deadline := time.Now().Add(2 * rafthttp.ConnReadTimeout)
	buf := make([]byte, 1<<20)
	for time.Now().Before(deadline) {
		n := runtime.Stack(buf, true)
		if !bytes.Contains(buf[:n], []byte("go.etcd.io/etcd/")) {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}
