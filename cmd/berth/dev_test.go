package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/user"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/api"
	"github.com/berth-dev/berth/api/client"
	"github.com/berth-dev/berth/auth"
	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/driver/drivertest"
	"github.com/berth-dev/berth/reconciler"
	"github.com/berth-dev/berth/scheduler"
)

var listeningRE = regexp.MustCompile(`msg=listening addr=(\S+)`)

// TestDevAsRootRunsNobody: berth server --dev started as root says which
// user its processes run as, runs a request naming no user as nobody, and
// runs nothing as root: an operator's root is forbidden by the namespace's
// policy (403), an admin's refused by the back-end (no allow_root).
func TestDevAsRootRunsNobody(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("--dev as root: run as root (CI does)")
	}
	nobody, err := user.Lookup("nobody")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	var out, errb drivertest.SyncBuffer
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"server", "--dev", "--data-dir", dir, "--listen", "127.0.0.1:0"}, &out, &errb)
	}()
	t.Cleanup(func() {
		cancel()
		if code := <-done; code != 0 {
			t.Errorf("server: exit %d: %s", code, errb.String())
		}
	})
	var addr string
	deadline := time.Now().Add(60 * time.Second)
	for addr == "" {
		if m := listeningRE.FindStringSubmatch(errb.String()); m != nil {
			addr = m[1]
		} else if time.Now().After(deadline) {
			t.Fatalf("the server never listened:\n%s", errb.String())
		} else {
			time.Sleep(20 * time.Millisecond)
		}
	}
	if !strings.Contains(errb.String(), "runs processes as user nobody") {
		t.Errorf("the --dev warning does not say who processes run as:\n%s", errb.String())
	}
	secret, err := os.ReadFile(filepath.Join(dir, auth.BootstrapFile))
	if err != nil {
		t.Fatal(err)
	}
	admin, err := client.New("http://"+addr, client.WithToken(strings.TrimSpace(string(secret))))
	if err != nil {
		t.Fatal(err)
	}
	tok, err := admin.CreateToken(ctx, api.TokenRequest{Name: "op", Role: auth.RoleOperator, Namespaces: []string{"team"}})
	if err != nil {
		t.Fatal(err)
	}
	op, err := client.New("http://"+addr, client.WithToken(tok.Token))
	if err != nil {
		t.Fatal(err)
	}
	process := func(user string) scheduler.Request {
		return scheduler.Request{Spec: driver.Spec{Kind: driver.KindProcess, User: user, Entrypoint: []string{"/bin/sh", "-c", "id -u; id -g"}}}
	}

	ans, err := op.Submit(ctx, process(""))
	if err != nil {
		t.Fatal(err)
	}
	id := ans.Instances[0].Instance.ID
	for {
		in, err := op.Instance(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if in.Phase == reconciler.Exited || in.Phase.Terminal() {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("instance %s is still %s", id, in.Phase)
		}
		time.Sleep(20 * time.Millisecond)
	}
	var logs bytes.Buffer
	if err := op.Logs(ctx, id, driver.LogOptions{}, &logs, &logs); err != nil {
		t.Fatal(err)
	}
	if want := nobody.Uid + "\n" + nobody.Gid + "\n"; logs.String() != want {
		t.Errorf("a request naming no user ran as %q, want nobody (%q)", logs.String(), want)
	}

	for _, u := range []string{"root", "0"} {
		_, err := op.Submit(ctx, process(u))
		var fe *driver.FieldError
		if ae := (*api.Error)(nil); !errors.As(err, &ae) || ae.Status != 403 || !errors.As(err, &fe) || fe.Path != "user" {
			t.Errorf("an operator's user %q: %v, want 403 naming user", u, err)
		}
		if _, err := admin.Submit(ctx, process(u)); !errors.Is(err, driver.ErrUnsupported) || !errors.As(err, &fe) || fe.Path != "user" {
			t.Errorf("an admin's user %q: %v, want refused naming user (no allow_root)", u, err)
		}
	}
}
