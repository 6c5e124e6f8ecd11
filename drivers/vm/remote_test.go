package vm_test

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/knownhosts"

	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/drivers/vm"
	"github.com/berth-dev/berth/internal/sshdtest"
)

// TestTwoTransports reaches this machine's daemon as two nodes: over its
// unix socket and through sshd. A guest made on the ssh node is listed
// once, as that node's, and the other node does not know it.
func TestTwoTransports(t *testing.T) {
	t.Parallel()
	o := options(t)
	h := sshdtest.Start(t, sshdtest.Options{})
	local, remote := uniq("unix"), uniq("ssh")
	o.Nodes = []vm.NodeConfig{
		{Name: local},
		{Name: remote, URI: "qemu+ssh://root@" + h.Addr + "/system", SSHKey: h.Key, KnownHosts: h.KnownHosts},
	}
	d := open(t, o)
	ctx := context.Background()
	st, err := d.State(ctx)
	if err != nil || len(st.Nodes) != 2 {
		t.Fatalf("State: %+v %v", st, err)
	}
	for _, n := range st.Nodes {
		if n.Status != driver.NodeOnline || n.Capacity.CPU == 0 {
			t.Fatalf("node %s: %s (%s), capacity %+v; want online", n.Name, n.Status, n.Reason, n.Capacity)
		}
	}
	tag := uniq("case")
	sp := &driver.Spec{Name: uniq("vm-ssh"), Kind: driver.KindVM, Image: "guest", Flavor: "tiny",
		Tags: testTags(map[string]string{"case": tag}), UserData: "echo over ssh\n"}
	inst := createOn(t, d, remote, sp)
	if inst.Node != remote || !strings.HasPrefix(inst.ID, remote+"/") || inst.State != driver.StateRunning {
		t.Fatalf("created %+v, want running on node %s", inst, remote)
	}
	waitLogs(t, d, inst.ID, "over ssh")

	list, err := d.List(ctx, map[string]string{"case": tag})
	if err != nil || len(list) != 1 || list[0].ID != inst.ID {
		t.Fatalf("List: %+v %v, want only %s (one domain, reached by two nodes)", list, err, inst.ID)
	}
	_, uuid, _ := strings.Cut(inst.ID, "/")
	if _, err := d.Get(ctx, local+"/"+uuid); !errors.Is(err, driver.ErrNotFound) {
		t.Errorf("Get through the other node: %v, want ErrNotFound", err)
	}
	st, err = d.State(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range st.Nodes {
		want := map[string]int{local: 0, remote: 1}[n.Name]
		if n.Instances != want {
			t.Errorf("node %s counts %d instances, want %d", n.Name, n.Instances, want)
		}
		if n.Reserved.Memory < 96*driver.MiB {
			t.Errorf("node %s reserves %s memory: the guest holds the host's memory whichever node made it", n.Name, n.Reserved.Memory)
		}
	}

	op, err := d.Delete(ctx, inst.ID)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := driver.Drive(ctx, op); err != nil {
		t.Fatalf("Delete: %v", err)
	}
	if list, err := d.List(ctx, map[string]string{"case": tag}); err != nil || len(list) != 0 {
		t.Errorf("List after Delete: %+v %v", list, err)
	}
}

// TestSSHUnknownHost refuses a host whose key is not the one known.
func TestSSHUnknownHost(t *testing.T) {
	t.Parallel()
	o := options(t)
	h := sshdtest.Start(t, sshdtest.Options{})
	pub, _, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	wrong, err := ssh.NewPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	kh := filepath.Join(t.TempDir(), "known_hosts")
	if err := os.WriteFile(kh, []byte(knownhosts.Line([]string{h.Addr}, wrong)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	o.Nodes = []vm.NodeConfig{{Name: "ssh", URI: "qemu+ssh://root@" + h.Addr + "/system", SSHKey: h.Key, KnownHosts: kh}}
	d := open(t, o)
	st, err := d.State(context.Background())
	if err != nil || len(st.Nodes) != 1 {
		t.Fatalf("State: %+v %v", st, err)
	}
	if n := st.Nodes[0]; n.Status != driver.NodeOffline || !strings.Contains(n.Reason, "key") {
		t.Errorf("node behind a host key that is not the known one: %s (%s), want offline over the key", n.Status, n.Reason)
	}
}

// createOn drives a create on node to its end and deletes the instance
// when the test ends.
func createOn(t *testing.T, d *vm.Driver, node string, sp *driver.Spec) *driver.Instance {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	inst, err := driver.Drive(ctx, beginCreate(ctx, t, d, node, sp))
	if err != nil {
		t.Fatalf("Create: operation: %v", err)
	}
	return inst
}

// beginCreate starts a create on node and deletes the instance when the
// test ends; the caller drives the operation.
func beginCreate(ctx context.Context, t *testing.T, d *vm.Driver, node string, sp *driver.Spec) driver.Operation {
	t.Helper()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		inst, err := d.Find(ctx, sp.Name)
		if err != nil {
			return
		}
		if op, err := d.Delete(ctx, inst.ID); err == nil {
			_, _ = driver.Drive(ctx, op)
		}
	})
	op, err := d.Create(ctx, node, sp)
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	return op
}

// TestPreload copies an image's initrd from one node to another that
// lacks it, byte for byte, boots a guest from it there, and says
// "present" the second time.
func TestPreload(t *testing.T) {
	t.Parallel()
	o := options(t)
	preloaded := twoNodes(t, &o, "copied")
	g := o.Images["guest"]
	o.Images["nowhere"] = vm.Image{ImageFiles: vm.ImageFiles{Kernel: g.Kernel, Initrd: filepath.Join(preloaded, "none.cpio")}}
	d := open(t, o)
	ctx := context.Background()
	var reports []driver.PreloadProgress
	if err := d.Preload(ctx, "copied", []string{"remote"}, func(p driver.PreloadProgress) { reports = append(reports, p) }); err != nil {
		t.Fatalf("Preload: %v", err)
	}
	want, err := os.ReadFile(g.Initrd)
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(filepath.Join(preloaded, "initrd.cpio"))
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("the copy: %d bytes (%v), want the %d bytes of %s", len(got), err, len(want), g.Initrd)
	}
	if last := reports[len(reports)-1]; last.Status != "done" || last.Node != "remote" || last.Image != "copied" {
		t.Errorf("last report %+v, want done on remote", last)
	}
	inst := createOn(t, d, "remote", &driver.Spec{Name: uniq("vm-preloaded"), Kind: driver.KindVM, Image: "copied", Flavor: "tiny",
		Tags: testTags(nil), UserData: "echo booted from the copy\n"})
	waitLogs(t, d, inst.ID, "booted from the copy")

	reports = nil
	if err := d.Preload(ctx, "copied", nil, func(p driver.PreloadProgress) { reports = append(reports, p) }); err != nil {
		t.Fatalf("Preload again: %v", err)
	}
	for _, p := range reports {
		if p.Status != "present" {
			t.Errorf("second Preload reported %+v, want present on every node", p)
		}
	}
	if err := d.Preload(ctx, "nowhere", nil, nil); !errors.Is(err, driver.ErrPermanent) || !strings.Contains(err.Error(), "initrd") {
		t.Errorf("Preload of an image no node has: %v, want ErrPermanent naming the initrd", err)
	}
}

// twoNodes makes o's nodes this machine's daemon twice: "local" over its
// unix socket and "remote" through a test sshd. It adds the image name,
// the guest's, present on "local" only: on "remote" its initrd is in the
// directory it returns, which does not exist yet (a preload's to fill).
func twoNodes(t *testing.T, o *vm.Options, name string) (preloaded string) {
	t.Helper()
	h := sshdtest.Start(t, sshdtest.Options{})
	o.Nodes = []vm.NodeConfig{
		{Name: "local"},
		{Name: "remote", URI: "qemu+ssh://root@" + h.Addr + "/system", SSHKey: h.Key, KnownHosts: h.KnownHosts},
	}
	g := o.Images["guest"]
	preloaded = filepath.Join(filepath.Dir(o.StorageDir), "preloaded")
	t.Cleanup(func() { dropPools(t, preloaded) })
	o.Images[name] = vm.Image{ImageFiles: g.ImageFiles, Cmdline: g.Cmdline, Nodes: map[string]vm.ImageFiles{
		"remote": {Kernel: g.Kernel, Initrd: filepath.Join(preloaded, "initrd.cpio")},
	}}
	return preloaded
}
