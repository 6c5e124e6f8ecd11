package dockerapi_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/berth-dev/berth/control"
	"github.com/berth-dev/berth/dockerapi"
	"github.com/berth-dev/berth/drivers/docker/dockertest"
	"github.com/berth-dev/berth/provider"
	"github.com/berth-dev/berth/reconciler"
)

// TestNetworkConnectRunning: with the docker CLI, a container on two
// networks reaches the members of each by name, and a running container
// connected to a network reaches its members by name until it is
// disconnected, and a running container renamed is reached by its new
// name. The same steps against the machine's engine are the reference;
// both must pass every step. Against Berth the connect is recorded in
// the instance's stored spec.
func TestNetworkConnectRunning(t *testing.T) {
	e := setup(t)
	refCfg := e.dockerConfig(t, "")
	ref := func(args ...string) (string, string, int) {
		return dockerAt(t, dockertest.MainHost, refCfg, args...)
	}
	pfx := "r" + dockertest.RandomID()[:8]
	t.Cleanup(func() {
		ref("rm", "-f", pfx+"a", pfx+"b", pfx+"m", pfx+"c")
		ref("network", "rm", pfx+"na", pfx+"nb")
	})
	for _, why := range networkLife(ref, pfx) {
		t.Errorf("against the engine itself: %s", why)
	}

	berth := func(args ...string) (string, string, int) { return e.docker(t, args...) }
	for _, why := range networkLife(berth, "k") {
		t.Errorf("against Berth: %s", why)
	}
	// The connect is in the instance's spec, which the store keeps.
	e.must(t, "network", "connect", "knb", "kc")
	in := e.waitPhase(t, "kc", reconciler.Running)
	if !slices.Equal(in.Spec.Networks, []string{"team.kna", "team.knb"}) || in.Spec.Labels[dockerapi.LabelNetwork] != "kna,knb" {
		t.Errorf("kc after network connect knb: networks %v, label %q", in.Spec.Networks, in.Spec.Labels[dockerapi.LabelNetwork])
	}
	// Renamed, its new name takes the old one's place among its aliases,
	// for the copies made of it later.
	e.must(t, "rename", "kc", "kc2")
	if got := e.waitPhase(t, "kc2", reconciler.Running).Spec.NetworkAliases; !slices.Contains(got, "kc2") || slices.Contains(got, "kc") {
		t.Errorf("the network aliases of kc renamed kc2: %v", got)
	}
	e.must(t, "rename", "kc2", "kc")
	in = e.waitPhase(t, "kc", reconciler.Running)
	// The store holds it: a plane started over the store reads it back.
	again, err := control.New(context.Background(), control.Config{Store: e.store, Providers: []*provider.Provider{e.prov}, Cluster: e.cluster, Logger: quiet, ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	if got, err := again.Instance(context.Background(), in.ID); err != nil || !slices.Equal(got.Spec.Networks, in.Spec.Networks) || got.Spec.Labels[dockerapi.LabelNetwork] != "kna,knb" {
		t.Errorf("kc read from the store by a fresh plane: %v, networks %v", err, got.Spec)
	}
	if got := strings.Fields(e.must(t, "network", "inspect", "--format", "{{range .Containers}}{{.Name}} {{end}}", "knb")); !slices.Equal(slices.Sorted(slices.Values(got)), []string{"kb", "kc", "km"}) {
		t.Errorf("the containers of knb: %v, want kb, kc and km", got)
	}
	if _, errs, code := e.docker(t, "network", "connect", "knb", "kc"); code == 0 || !strings.Contains(errs, "already exists") {
		t.Errorf("a second network connect knb kc: exit %d, %s", code, errs)
	}
	if _, errs, code := e.docker(t, "network", "rm", "knb"); code == 0 || !strings.Contains(errs, "active endpoints") {
		t.Errorf("network rm knb with members: exit %d, %s", code, errs)
	}
	e.must(t, "rm", "-f", "ka", "kb", "km", "kc")
	e.must(t, "network", "rm", "kna", "knb")
	e.waitNoEngineNetworks(t)
}

// networkLife runs, through docker, the steps of TestNetworkConnectRunning
// with names prefixed pfx, and returns why each failed step failed. It
// leaves the containers and networks for the caller to remove.
func networkLife(docker func(args ...string) (string, string, int), pfx string) []string {
	var fails []string
	step := func(want bool, args ...string) string {
		out, errs, code := docker(args...)
		if (code == 0) != want {
			fails = append(fails, fmt.Sprintf("docker %s: exit %d\nstdout: %s\nstderr: %s", strings.Join(args, " "), code, out, errs))
		}
		return out
	}
	nets := func(name string) string {
		return strings.TrimSpace(step(true, "inspect", "--format", "{{range $k, $v := .NetworkSettings.Networks}}{{$k}} {{end}}", name))
	}
	dial := func(want bool, from, to string) {
		args := []string{"exec", from, "/hello", "dial", to + ":8080"}
		if !want {
			args = []string{"exec", "-e", "HELLO_DIAL_FOR=3s", from, "/hello", "dial", to + ":8080"}
		}
		if out := step(want, args...); want && !strings.Contains(out, "hello") {
			fails = append(fails, fmt.Sprintf("%s dialled %s and read %q, want hello", from, to, out))
		}
	}
	na, nb := pfx+"na", pfx+"nb"
	a, b, m, c := pfx+"a", pfx+"b", pfx+"m", pfx+"c"
	step(true, "network", "create", na)
	step(true, "network", "create", nb)
	step(true, "run", "-d", "--name", a, "--network", na, "-e", "HELLO_LISTEN=:8080", helloImage)
	step(true, "run", "-d", "--name", b, "--network", nb, "-e", "HELLO_LISTEN=:8080", helloImage)
	// m is on both networks: created on one, connected to the other
	// before its start (as Compose does), and reaches a member of each.
	step(true, "create", "--name", m, "--network", na, helloImage)
	step(true, "network", "connect", nb, m)
	step(true, "start", m)
	if got := nets(m); got != na+" "+nb {
		fails = append(fails, fmt.Sprintf("inspect %s: networks %q, want %s and %s", m, got, na, nb))
	}
	dial(true, m, a)
	dial(true, m, b)
	// c runs on na only, is connected to nb while it runs, then
	// disconnected.
	step(true, "run", "-d", "--name", c, "--network", na, helloImage)
	dial(true, c, a)
	dial(false, c, b)
	step(true, "network", "connect", nb, c)
	if got := nets(c); got != na+" "+nb {
		fails = append(fails, fmt.Sprintf("inspect %s after network connect: networks %q, want %s and %s", c, got, na, nb))
	}
	dial(true, c, b)
	step(true, "network", "disconnect", nb, c)
	if got := nets(c); got != na {
		fails = append(fails, fmt.Sprintf("inspect %s after network disconnect: networks %q, want %s", c, got, na))
	}
	dial(false, c, b)
	dial(true, c, a)
	step(false, "network", "disconnect", nb, c)
	// A running member renamed is reached by its new name, and by its
	// name again once renamed back.
	step(true, "rename", a, a+"x")
	dial(true, m, a+"x")
	step(true, "rename", a+"x", a)
	dial(true, m, a)
	return fails
}
