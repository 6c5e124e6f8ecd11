package docker

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/client"

	"github.com/berth-dev/berth/driver"
)

// TestNetworks: the first container on a network makes it, labelled with
// its cluster; a second reaches the first there by an alias through the
// engine's DNS; the network goes with its last container. A network of
// another cluster is not joined.
func TestNetworks(t *testing.T) {
	leakCheck(t)
	d := openTest(t, testOptions(engineAddrs()...))
	run := randomID()
	cluster := "c-" + run
	net := "berth-test-net-" + run
	t.Cleanup(func() {
		removeByLabel(t, mainCli, "berth.test.run", run)
		removeNetworks(t, driver.TagCluster, cluster)
		removeNetworks(t, "berth.test.run", run)
	})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	tags := map[string]string{driver.TagCluster: cluster, driver.TagClusterName: "test", "berth.test.run": run}

	srv := helloSpec()
	srv.Tags, srv.Networks, srv.NetworkAliases = tags, []string{net}, []string{"srv", "db"}
	srv.Env = map[string]string{"HELLO_LISTEN": ":8080"}
	s := create(t, d, "e1", srv)
	n, err := mainCli.NetworkInspect(ctx, net, client.NetworkInspectOptions{})
	if err != nil {
		t.Fatalf("the network after its first container: %v", err)
	}
	if l := n.Network.Labels; l[driver.TagManaged] != "true" || l[driver.TagCluster] != cluster || l[driver.TagInstance] != "" || n.Network.Driver != "bridge" {
		t.Errorf("the network made: driver %s, labels %v; want a bridge with the cluster's tags and no instance", n.Network.Driver, l)
	}
	ci, err := mainCli.ContainerInspect(ctx, strings.TrimPrefix(s.ID, "e1/"), client.ContainerInspectOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if es := ci.Container.NetworkSettings.Networks[net]; es == nil || !slices.Contains(es.Aliases, "srv") || !slices.Contains(es.Aliases, "db") {
		t.Errorf("the server on %s: %+v, want aliases srv and db", net, es)
	}

	cli := helloSpec()
	cli.Tags, cli.Networks = tags, []string{net}
	cli.Command = []string{"dial", "srv:8080"}
	c := create(t, d, "e1", cli)
	var got *driver.Instance
	wait(t, func() bool {
		got, err = d.Get(ctx, c.ID)
		return err == nil && got.State == driver.StateExited
	})
	if got.ExitCode == nil || *got.ExitCode != 0 {
		var out strings.Builder
		_ = d.Logs(ctx, c.ID, driver.LogOptions{}, &out, &out)
		t.Errorf("the client dialling srv:8080 exited %v: %s", got.ExitCode, out.String())
	}

	del := func(id string) {
		t.Helper()
		op, err := d.Delete(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := driver.Drive(ctx, op); err != nil {
			t.Fatal(err)
		}
	}
	if second != nil {
		// Another engine has a network of the name of its own, made for
		// its first member there and gone with it.
		far := create(t, d, "e2", cli)
		if n2, err := second.Client.NetworkInspect(ctx, net, client.NetworkInspectOptions{}); err != nil || n2.Network.Labels[driver.TagCluster] != cluster {
			t.Errorf("the network on e2 after a member there: %v", err)
		}
		del(far.ID)
		if _, err := second.Client.NetworkInspect(ctx, net, client.NetworkInspectOptions{}); err == nil {
			t.Error("the network on e2 is left after its last container there")
		}
	}
	del(c.ID) // exited, and still the network's until removed
	if _, err := mainCli.NetworkInspect(ctx, net, client.NetworkInspectOptions{}); err != nil {
		t.Errorf("the network with a container left on it: %v", err)
	}
	del(s.ID)
	if _, err := mainCli.NetworkInspect(ctx, net, client.NetworkInspectOptions{}); err == nil {
		t.Error("the network is left after its last container")
	}

	other := "berth-test-other-" + run
	if _, err := mainCli.NetworkCreate(ctx, other, client.NetworkCreateOptions{Driver: "bridge",
		Labels: map[string]string{driver.TagManaged: "true", driver.TagCluster: "someone-else", "berth.test.run": run}}); err != nil {
		t.Fatal(err)
	}
	theirs := helloSpec()
	theirs.Tags, theirs.Networks = tags, []string{other}
	op, err := d.Create(ctx, "e1", theirs)
	if err == nil {
		_, err = driver.Drive(ctx, op)
	}
	if !errors.Is(err, driver.ErrPermanent) || !strings.Contains(err.Error(), "someone-else") {
		t.Errorf("joining another cluster's network: %v, want ErrPermanent naming its cluster", err)
	}
}

// TestConnectNetwork: a running container joins a network it was not
// created on, which the connect makes with the container's cluster's
// tags, with an alias there; a second connect changes nothing; the
// disconnect takes it off and removes the network it was the last on, and
// a second disconnect is no error.
func TestConnectNetwork(t *testing.T) {
	leakCheck(t)
	d := openTest(t, testOptions(engineAddrs()...))
	run := randomID()
	cluster := "c-" + run
	net := "berth-test-join-" + run
	t.Cleanup(func() {
		removeByLabel(t, mainCli, "berth.test.run", run)
		removeNetworks(t, driver.TagCluster, cluster)
	})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	spec := helloSpec()
	spec.Tags = map[string]string{driver.TagCluster: cluster, driver.TagClusterName: "test", "berth.test.run": run}
	in := create(t, d, "e1", spec)
	cid := strings.TrimPrefix(in.ID, "e1/")
	for range 2 {
		if err := d.ConnectNetwork(ctx, in.ID, net, []string{"joined"}); err != nil {
			t.Fatalf("ConnectNetwork: %v", err)
		}
	}
	n, err := mainCli.NetworkInspect(ctx, net, client.NetworkInspectOptions{})
	if err != nil {
		t.Fatalf("the network after the connect: %v", err)
	}
	if l := n.Network.Labels; l[driver.TagManaged] != "true" || l[driver.TagCluster] != cluster || l["berth.test.run"] != "" {
		t.Errorf("the network made by the connect: labels %v; want the cluster's tags only", l)
	}
	ci, err := mainCli.ContainerInspect(ctx, cid, client.ContainerInspectOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if es := ci.Container.NetworkSettings.Networks[net]; es == nil || !slices.Contains(es.Aliases, "joined") {
		t.Errorf("the container on %s: %+v, want the alias joined", net, es)
	}
	for range 2 {
		if err := d.DisconnectNetwork(ctx, in.ID, net); err != nil {
			t.Fatalf("DisconnectNetwork: %v", err)
		}
	}
	if ci, err = mainCli.ContainerInspect(ctx, cid, client.ContainerInspectOptions{}); err != nil || ci.Container.NetworkSettings.Networks[net] != nil {
		t.Errorf("the container after the disconnect: %v, still on %s", err, net)
	}
	if _, err := mainCli.NetworkInspect(ctx, net, client.NetworkInspectOptions{}); err == nil {
		t.Error("the network is left after its last container left it")
	}
	if err := d.ConnectNetwork(ctx, "e1/nonexistent", net, nil); !errors.Is(err, driver.ErrNotFound) {
		t.Errorf("ConnectNetwork of a missing container: %v, want ErrNotFound", err)
	}
}

// TestSweepNetworks: Sweep removes a network of this cluster that no
// container is on, and keeps one a container (created, not started) is
// on, another cluster's, and one Berth did not make.
func TestSweepNetworks(t *testing.T) {
	leakCheck(t)
	d := openTest(t, testOptions(DefaultHost))
	run := randomID()
	cluster := "c-" + run
	t.Cleanup(func() {
		removeByLabel(t, mainCli, "berth.test.run", run)
		removeNetworks(t, "berth.test.run", run)
	})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	mk := func(name string, labels map[string]string) {
		t.Helper()
		labels["berth.test.run"] = run
		if _, err := mainCli.NetworkCreate(ctx, name, client.NetworkCreateOptions{Driver: "bridge", Labels: labels}); err != nil {
			t.Fatal(err)
		}
	}
	leaked, used, theirs, users := "berth-test-leak-"+run, "berth-test-used-"+run, "berth-test-theirs-"+run, "berth-test-users-"+run
	mk(leaked, map[string]string{driver.TagManaged: "true", driver.TagCluster: cluster})
	mk(used, map[string]string{driver.TagManaged: "true", driver.TagCluster: cluster})
	mk(theirs, map[string]string{driver.TagManaged: "true", driver.TagCluster: "someone-else"})
	mk(users, map[string]string{driver.TagCluster: cluster})
	if _, err := mainCli.ContainerCreate(ctx, client.ContainerCreateOptions{Image: helloImage,
		Config: configWithLabels(map[string]string{"berth.test.run": run}), HostConfig: hostOnNetwork(used)}); err != nil {
		t.Fatal(err)
	}
	if err := d.Sweep(ctx, map[string]string{driver.TagCluster: cluster}); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]bool{leaked: false, used: true, theirs: true, users: true} {
		_, err := mainCli.NetworkInspect(ctx, name, client.NetworkInspectOptions{})
		if (err == nil) != want {
			t.Errorf("network %s after Sweep: %v, want it kept %v", name, err, want)
		}
	}
}

// removeNetworks removes the engine's networks labelled k=v (test
// cleanup, behind the driver's back).
func removeNetworks(t *testing.T, k, v string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res, err := mainCli.NetworkList(ctx, client.NetworkListOptions{Filters: make(client.Filters).Add("label", k+"="+v)})
	if err != nil {
		t.Errorf("cleanup: list networks: %v", err)
		return
	}
	for _, n := range res.Items {
		if _, err := mainCli.NetworkRemove(ctx, n.ID, client.NetworkRemoveOptions{}); err != nil {
			t.Errorf("cleanup: remove network %s: %v", n.Name, err)
		}
	}
}

func hostOnNetwork(name string) *container.HostConfig {
	return &container.HostConfig{NetworkMode: container.NetworkMode(name)}
}
