package etcd_test

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"testing"

	"github.com/berth-dev/berth/store"
	"github.com/berth-dev/berth/store/etcd"
	"github.com/berth-dev/berth/store/storetest"
)

// freePort returns a loopback port nobody listens on now.
func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// startMember runs a one-member etcd cluster in the test process, stopped
// when the test ends.
func startMember(t testing.TB) *etcd.Member {
	t.Helper()
	m, err := etcd.StartMember(context.Background(), etcd.MemberConfig{
		Name: "m", Dir: filepath.Join(t.TempDir(), "etcd"),
		PeerURL:   fmt.Sprintf("http://127.0.0.1:%d", freePort(t)),
		ClientURL: fmt.Sprintf("http://127.0.0.1:%d", freePort(t)),
		SkipFsync: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	return m
}

// openStore opens a store on a fresh member; the client and the member
// close when the test ends, after the store.
func openStore(t testing.TB, opts etcd.Options) *etcd.Store {
	t.Helper()
	m := startMember(t)
	c, err := m.Client()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return etcd.New(c, opts)
}

func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) store.Store { return openStore(t, etcd.Options{Prefix: "/test", History: 1000}) })
}
