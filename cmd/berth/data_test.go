package main

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/api/client"
	"github.com/berth-dev/berth/auth"
	"github.com/berth-dev/berth/control"
	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/driver/drivertest"
	"github.com/berth-dev/berth/scheduler"
	"github.com/berth-dev/berth/store"
	"github.com/berth-dev/berth/store/bolt"
)

// devServer runs berth server --dev on dir until stop is called, which
// stops it as SIGTERM does (its context ends) and returns its exit code.
// It returns the address the server listens on.
func devServer(t *testing.T, dir string) (addr string, stop func() int) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var out, errb drivertest.SyncBuffer
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"server", "--dev", "--data-dir", dir, "--listen", "127.0.0.1:0"}, &out, &errb)
	}()
	stopped := false
	stop = func() int {
		if stopped {
			return 0
		}
		stopped = true
		cancel()
		select {
		case code := <-done:
			return code
		case <-time.After(5 * time.Minute): // only a guard against a hung test
			t.Fatalf("the server did not stop:\n%s", errb.String())
			return -1
		}
	}
	t.Cleanup(func() { stop() })
	deadline := time.Now().Add(60 * time.Second)
	for {
		if m := listeningRE.FindStringSubmatch(errb.String()); m != nil {
			return m[1], stop
		}
		select {
		case code := <-done:
			stopped = true
			t.Fatalf("the server exited with %d before it listened:\n%s", code, errb.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("the server never listened:\n%s", errb.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// The request against berth server --dev: a priority the store
// cannot hold is refused naming the field, the instance routes answer
// after it, the server stops when told to, and starts again on the same
// data directory, also with a record of bad bytes in its store, which
// berth doctor then lists.
func TestDevSurvivesHostileNumbersAndBadRecords(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	addr, stop := devServer(t, dir)
	secret, err := os.ReadFile(filepath.Join(dir, auth.BootstrapFile))
	if err != nil {
		t.Fatal(err)
	}
	token := strings.TrimSpace(string(secret))
	cl, err := client.New("http://"+addr, client.WithToken(token))
	if err != nil {
		t.Fatal(err)
	}
	req := scheduler.Request{Spec: driver.Spec{Kind: driver.KindProcess, Command: []string{"sleep", "300"}}, Priority: 1 << 62}
	_, err = cl.Submit(ctx, req)
	var fe *driver.FieldError
	if !errors.Is(err, driver.ErrInvalid) || !errors.As(err, &fe) || fe.Path != "priority" {
		t.Fatalf("a priority of 2^62: %v, want invalid naming priority", err)
	}
	if _, err := cl.Instances(ctx, control.Filter{}); err != nil {
		t.Fatalf("the instances after the refusal: %v", err)
	}
	if code := stop(); code != 0 {
		t.Fatalf("server: exit %d", code)
	}

	st, err := bolt.Open(filepath.Join(dir, "berth.db"), bolt.Options{})
	if err != nil {
		t.Fatal(err)
	}
	bad := control.PrefixInstances + "mangled"
	if _, err := st.Txn(ctx, nil, []store.Op{store.Put(bad, []byte("\x01\x07\xff"))}); err != nil {
		t.Fatal(err)
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}

	addr, stop = devServer(t, dir)
	var out, errb drivertest.SyncBuffer
	if code := run(ctx, []string{"doctor", "--addr", "http://" + addr, "--token", token}, &out, &errb); code != 0 {
		t.Fatalf("berth doctor: exit %d: %s", code, errb.String())
	}
	if !strings.Contains(out.String(), bad) {
		t.Errorf("berth doctor does not list %s:\n%s", bad, out.String())
	}
	if code := stop(); code != 0 {
		t.Fatalf("server: exit %d", code)
	}
}
