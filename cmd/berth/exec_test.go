package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/api"
	"github.com/berth-dev/berth/api/apitest"
	"github.com/berth-dev/berth/control"
	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/drivers/local"
	"github.com/berth-dev/berth/provider"
	"github.com/berth-dev/berth/reconciler"
	"github.com/berth-dev/berth/scheduler"
	"github.com/berth-dev/berth/store/memory"
)

// TestExec runs berth exec against a real process's instance (the local
// back-end): the exit status is the command's, its output apart, its
// input this one's with -i, -e and -w apply, -t gives it a terminal.
func TestExec(t *testing.T) {
	e := apitest.StartWith(t, memory.New(memory.Options{}), nil, api.Options{}, func(c *control.Config) {
		opts := local.DefaultOptions()
		opts.DataDir = t.TempDir()
		opts.StopGrace = time.Second
		opts.PollInterval = 20 * time.Millisecond
		opts.CgroupRoot = ""
		opts.AllowRoot = true // the tests run as root
		d, err := local.Open(context.Background(), opts, driver.Env{Provider: "local"})
		if err != nil {
			t.Fatal(err)
		}
		p, err := provider.New(d, provider.Config{Name: "local"})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = p.Close(context.Background()) })
		c.Providers = []*provider.Provider{p}
	})
	t.Setenv(EnvToken, e.Token)
	if _, err := e.Client(t, "").Submit(context.Background(), scheduler.Request{ID: "svc", Spec: driver.Spec{Kind: driver.KindProcess, Entrypoint: []string{"/bin/sh", "-c", "exec sleep 60"}}}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "svc to run", func() bool {
		in, err := e.Plane.Instance(context.Background(), "svc")
		return err == nil && in.Phase == reconciler.Running
	})
	exec := func(stdin string, args ...string) (int, string, string) {
		var out, errb bytes.Buffer
		code := runIn(context.Background(), append([]string{"--addr", e.HTTP.URL, "exec"}, args...), strings.NewReader(stdin), &out, &errb)
		return code, out.String(), errb.String()
	}
	code, out, errs := exec("input\n", "-i", "-e", "X=from exec", "-w", "/proc", "svc", "--", "/bin/sh", "-c", `cat; echo "$X"; pwd; echo oops >&2; exit 3`)
	if code != 3 || out != "input\nfrom exec\n/proc\n" || errs != "oops\n" {
		t.Errorf("berth exec -i -e -w: exit %d, stdout %q, stderr %q; want 3, the input, X, /proc and oops apart", code, out, errs)
	}
	if code, out, errs := exec("ignored\n", "svc", "/bin/sh", "-c", "cat; echo done"); code != 0 || out != "done\n" {
		t.Errorf("berth exec without -i: exit %d, stdout %q, stderr %q; want 0, no input and done", code, out, errs)
	}
	if code, out, errs := exec("", "-t", "svc", "--", "/bin/sh", "-c", "test -t 0 && echo on a terminal"); code != 0 || strings.TrimSpace(out) != "on a terminal" {
		t.Errorf("berth exec -t: exit %d, stdout %q, stderr %q", code, out, errs)
	}
	if code, _, errs := exec("", "svc", "--", "/berth-no-such-program"); code != 127 || !strings.Contains(errs, "berth-no-such-program") {
		t.Errorf("berth exec of a missing program: exit %d, stderr %q; want 127 naming it", code, errs)
	}
	if code, _, _ := exec("", "svc"); code != exitUsage {
		t.Errorf("berth exec without a command: exit %d, want %d", code, exitUsage)
	}
	if code, _, _ := exec("", "nosuch", "--", "ls"); code != exitNotFound {
		t.Errorf("berth exec in an unknown instance: exit %d, want %d", code, exitNotFound)
	}
}
