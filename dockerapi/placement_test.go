package dockerapi_test

import (
	"context"
	"errors"
	"fmt"
	"net/http/httptest"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/api"
	"github.com/berth-dev/berth/dockerapi"
	"github.com/berth-dev/berth/drivers/docker/dockertest"
	"github.com/berth-dev/berth/internal/testdeps"
	"github.com/berth-dev/berth/reconciler"
)

// TestNetworkPlacement: over two engines, the members of a network are
// placed on the node of the first, which spreading would not do; one the
// node has no room for waits, and its reasons (what berth why prints) name
// the rule. A network made with io.berth.spread=true has no such rule.
func TestNetworkPlacement(t *testing.T) {
	e, _ := twoEngines(t)
	e.must(t, "network", "create", "pack")
	e.must(t, "network", "create", "-o", dockerapi.OptSpread+"=true", "wide")
	var home string
	for i := range 3 {
		name := fmt.Sprintf("p%d", i)
		e.must(t, "run", "-d", "--name", name, "--network", "pack", "--cpus", "0.5", helloImage)
		in := e.waitPhase(t, name, reconciler.Running)
		if home == "" {
			home = in.Node
		}
		if in.Node != home {
			t.Errorf("%s of network pack runs on %s, the network's first member on %s", name, in.Node, home)
		}
	}
	// Spreading would put this one on the other node, which has room.
	e.must(t, "run", "-d", "--name", "big", "--network", "pack", "--cpus", "1", helloImage)
	deadline := time.Now().Add(time.Minute)
	for {
		in := e.waitPhase(t, "big", reconciler.Pending, reconciler.Running)
		if in.Phase == reconciler.Running {
			t.Fatalf("big runs on %s beside %s, the network's home", in.Node, home)
		}
		if strings.Contains(in.Message, "affinity label."+dockerapi.LabelBackendNetwork+".team.pack==true") && strings.Contains(in.Message, "cpu") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("big waits, saying %q; want the network's rule named", in.Message)
		}
		sleep()
	}
	// berth why says so.
	srv := httptest.NewServer(api.New(e.plane, api.Options{Logger: quiet, Tokens: e.tokens}))
	defer srv.Close()
	why, err := exec.Command(buildBerth(t), "--addr", srv.URL, "--token", e.token, "why", "big").CombinedOutput()
	t.Logf("berth why big:\n%s", why)
	if err != nil || !strings.Contains(string(why), "affinity label."+dockerapi.LabelBackendNetwork+".team.pack==true") {
		t.Errorf("berth why big: %v\n%s", err, why)
	}
	// A spread network's members go where placement puts them: spreading,
	// the first goes to the node pack does not load.
	e.must(t, "run", "-d", "--name", "w0", "--network", "wide", "--cpus", "0.5", helloImage)
	if in := e.waitPhase(t, "w0", reconciler.Running); in.Node == home {
		t.Errorf("w0 of the spread network wide runs on %s with pack's members, the busier node", in.Node)
	}
	// A running container on the other node may join wide, not pack: the
	// refusal names the network and the node its members are on.
	other := map[string]string{"main": "second", "second": "main"}[home]
	e.must(t, "run", "-d", "--name", "lone", "-e", "constraint:node=="+other, "--cpus", "0.25", helloImage)
	e.waitPhase(t, "lone", reconciler.Running)
	if _, errs, code := e.docker(t, "network", "connect", "pack", "lone"); code == 0 || !strings.Contains(errs, "network connect pack") || !strings.Contains(errs, "docker/"+home) {
		t.Errorf("network connect pack lone, lone on %s: exit %d, %s; want a refusal naming pack and docker/%s", other, code, errs, home)
	}
	e.must(t, "network", "connect", "wide", "lone")
	if got := strings.TrimSpace(e.must(t, "inspect", "--format", "{{range $k, $v := .NetworkSettings.Networks}}{{$k}} {{end}}", "lone")); got != "wide" {
		t.Errorf("lone's networks: %q, want wide", got)
	}
	// A container whose networks' members are on two nodes cannot start.
	e.must(t, "create", "--name", "torn", "--network", "pack", "--cpus", "0.25", helloImage)
	e.must(t, "network", "connect", "wide", "torn")
	e.must(t, "network", "create", "solo")
	e.must(t, "network", "connect", "solo", "lone")
	e.must(t, "network", "connect", "solo", "torn")
	if _, errs, code := e.docker(t, "start", "torn"); code == 0 || !strings.Contains(errs, "network pack") || !strings.Contains(errs, "network solo") {
		t.Errorf("start of torn, on pack and solo whose members run on two nodes: exit %d, %s", code, errs)
	}
	e.must(t, "rm", "-f", "p0", "p1", "p2", "big", "w0", "lone", "torn")
	e.waitNoEngineNetworks(t)
}

// TestVolumePlacement: over two engines, a later container mounting a
// named volume lands on the node of its first user, where spreading would
// not put it; one the node has no room for waits, and berth why names the
// constraint. The volume is removed from that engine.
func TestVolumePlacement(t *testing.T) {
	e, second := twoEngines(t)
	vol := "v-" + dockertest.RandomID()
	t.Cleanup(func() { removeEngineVolume(mainCli, "team."+vol) })
	ids := map[string]string{}
	var home string
	for _, name := range []string{"v0", "v1"} {
		ids[name] = strings.TrimSpace(e.must(t, "run", "-d", "--name", name, "-v", vol+":/data", "--cpus", "0.5", helloImage))
		in := e.waitPhase(t, name, reconciler.Running)
		if home == "" {
			home = in.Node
		}
		if in.Node != home {
			t.Errorf("%s mounting %s runs on %s, the volume's first user on %s", name, vol, in.Node, home)
		}
	}
	if out := e.must(t, "volume", "inspect", "-f", "{{.Status.Node}}", vol); !strings.Contains(out, "/"+home) {
		t.Errorf("volume inspect: node %q; want %s", out, home)
	}
	// The other node has room for it, the volume's has not.
	ids["big"] = strings.TrimSpace(e.must(t, "run", "-d", "--name", "big", "-v", vol+":/data", "--cpus", "1.5", helloImage))
	e.waitMessage(t, "big", "node=="+home)
	srv := httptest.NewServer(api.New(e.plane, api.Options{Logger: quiet, Tokens: e.tokens}))
	defer srv.Close()
	why, err := exec.Command(buildBerth(t), "--addr", srv.URL, "--token", e.token, "why", "big").CombinedOutput()
	t.Logf("berth why big:\n%s", why)
	if err != nil || !strings.Contains(string(why), "node=="+home) {
		t.Errorf("berth why big: %v\n%s", err, why)
	}
	e.must(t, "rm", "-f", "v0", "v1", "big")
	for _, id := range ids {
		e.waitGone(t, id)
	}
	e.must(t, "volume", "rm", vol)
	noEngineVolume(t, mainCli, "team."+vol)
	noEngineVolume(t, second.Client, "team."+vol)
}

// twoEngines starts a second dockerd holding the test image, and an env
// whose docker provider has two nodes of 2 cpus: "main", the machine's
// engine, and "second". The engine goes when the test ends.
func twoEngines(t *testing.T) (*env, *dockertest.Engine) {
	t.Helper()
	return twoEnginesAt(t, "", "")
}

// twoEnginesAt is twoEngines with the plane's store and cluster name of
// setupStore.
func twoEnginesAt(t *testing.T, cluster, db string) (*env, *dockertest.Engine) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	second, err := dockertest.StartEngine(ctx, dockertest.EngineOptions{})
	if errors.Is(err, dockertest.ErrUnavailable) {
		testdeps.Need(t, fmt.Errorf("no second engine: %w", err))
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(second.Destroy)
	if err := dockertest.CopyImage(ctx, mainCli, second.Client, helloImage); err != nil {
		t.Fatal(err)
	}
	e := setupStore(t, fmt.Sprintf(`[{"name":"main","address":%q,"capacity":{"cpus":2}},{"name":"second","address":%q,"capacity":{"cpus":2}}]`,
		dockertest.MainHost, second.Address()), cluster, db)
	return e, second
}
