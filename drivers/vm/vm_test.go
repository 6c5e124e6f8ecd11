package vm_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/driver/drivertest"
	"github.com/berth-dev/berth/drivers/vm"
)

// create drives a create on node local to its end and deletes the
// instance when the test ends.
func create(t *testing.T, d *vm.Driver, sp *driver.Spec) *driver.Instance {
	t.Helper()
	return createOn(t, d, "local", sp)
}

func testTags(extra map[string]string) map[string]string {
	tags := map[string]string{driver.TagManaged: "true", driver.TagCluster: "vm-test", driver.TagInstance: "i-1"}
	for k, v := range extra {
		tags[k] = v
	}
	return tags
}

// waitLogs polls the guest's standard output until it holds every one of
// want.
func waitLogs(t *testing.T, d *vm.Driver, id string, want ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for {
		var out, errOut drivertest.SyncBuffer
		if err := d.Logs(ctx, id, driver.LogOptions{Stdout: true, Stderr: true}, &out, &errOut); err != nil {
			t.Fatalf("Logs: %v", err)
		}
		all := true
		for _, w := range want {
			all = all && strings.Contains(out.String(), w)
		}
		if all {
			return out.String()
		}
		select {
		case <-ctx.Done():
			t.Fatalf("stdout %q (stderr %q) never held %q", out.String(), errOut.String(), want)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// TestConfigFilesAndUserData boots a guest with a config file and user
// data that prints it, and reads both back from the guest's serial ports.
func TestConfigFilesAndUserData(t *testing.T) {
	t.Parallel()
	d := open(t, options(t))
	sp := &driver.Spec{
		Name:        uniq("vm-config"),
		Kind:        driver.KindVM,
		Image:       "guest",
		Flavor:      "tiny",
		ConfigFiles: []driver.ConfigFile{{Path: "/etc/app/app.conf", Content: "colour=blue\nsize=7\n", Mode: 0o600}},
		UserData:    "echo \"user data ran as $0\"\necho \"mode $(stat -c %a /etc/app/app.conf)\"\ncat /etc/app/app.conf\n",
		SSHKeys:     []string{"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIB7 test@berth"},
		Tags:        testTags(nil),
	}
	inst := create(t, d, sp)
	if inst.State != driver.StateRunning || inst.Kind != driver.KindVM || inst.Image != "guest" {
		t.Errorf("created: %+v", inst)
	}
	if inst.Resources.Memory != 96*driver.MiB || inst.Resources.CPU != 500 {
		t.Errorf("created with resources %+v, want the flavor's", inst.Resources)
	}
	out := waitLogs(t, d, inst.ID, "colour=blue", "size=7", "user data ran", "mode 600")
	t.Logf("guest stdout: %q", out)
	console, err := d.Console(context.Background(), inst.ID)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(console, "ready") {
		t.Errorf("console %q has no ready line", console)
	}
}

// TestSuspendResume pauses a guest (on libvirt's user-mode network) and
// lets it run again.
func TestSuspendResume(t *testing.T) {
	t.Parallel()
	o := options(t)
	o.Network = "user"
	d := open(t, o)
	ctx := context.Background()
	inst := create(t, d, &driver.Spec{Name: uniq("vm-suspend"), Kind: driver.KindVM, Image: "guest", Flavor: "tiny", Tags: testTags(nil)})
	if err := d.Resume(ctx, inst.ID); !errors.Is(err, driver.ErrNotSuspended) {
		t.Errorf("Resume of a running guest: %v, want ErrNotSuspended", err)
	}
	if err := d.Suspend(ctx, inst.ID); err != nil {
		t.Fatalf("Suspend: %v", err)
	}
	if got, err := d.Get(ctx, inst.ID); err != nil || got.State != driver.StateSuspended {
		t.Fatalf("Get after Suspend: %+v %v, want suspended", got, err)
	}
	if err := d.Suspend(ctx, inst.ID); err != nil {
		t.Errorf("Suspend of a suspended guest: %v", err)
	}
	if err := d.Resume(ctx, inst.ID); err != nil {
		t.Fatalf("Resume: %v", err)
	}
	if got, err := d.Get(ctx, inst.ID); err != nil || got.State != driver.StateRunning {
		t.Fatalf("Get after Resume: %+v %v, want running", got, err)
	}
}

// TestLeakListing finds a guest from a second driver by its tags alone,
// and checks that Delete leaves no domain and no file.
func TestLeakListing(t *testing.T) {
	t.Parallel()
	o := options(t)
	d := open(t, o)
	ctx := context.Background()
	leak := uniq("leak")
	inst := create(t, d, &driver.Spec{Name: uniq("vm-leak"), Kind: driver.KindVM, Image: "guest", Flavor: "tiny",
		Tags: testTags(map[string]string{"case": leak}), Labels: map[string]string{"team": "infra"}})

	// A driver opened afresh knows nothing but what libvirt keeps.
	d2 := open(t, o)
	list, err := d2.List(ctx, map[string]string{driver.TagCluster: "vm-test", "case": leak})
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 1 || list[0].ID != inst.ID || list[0].Name != inst.Name || list[0].Labels["team"] != "infra" ||
		list[0].Tags[driver.TagInstance] != "i-1" {
		t.Fatalf("List by tags from a new driver: %+v, want [%s] with its name, labels and tags", list, inst.ID)
	}
	if other, err := d2.List(ctx, map[string]string{driver.TagCluster: "another-cluster"}); err != nil || len(other) != 0 {
		t.Errorf("List of another cluster: %v %v, want none", other, err)
	}
	_, uuid, _ := strings.Cut(inst.ID, "/")
	entries, err := os.ReadDir(o.StorageDir)
	if err != nil || len(entries) != 4 {
		t.Fatalf("storage dir: %v %v, want the guest's config drive and three serial logs", entries, err)
	}
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), uuid+".") {
			t.Errorf("storage dir holds %s, not a file of %s", e.Name(), uuid)
		}
	}
	op, err := d2.Delete(ctx, inst.ID)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := driver.Drive(ctx, op); err != nil {
		t.Fatalf("Delete: %v", err)
	}
	if entries, _ := os.ReadDir(o.StorageDir); len(entries) != 0 {
		t.Errorf("after Delete the storage dir holds %v", entries)
	}
	if _, err := d.Get(ctx, inst.ID); !errors.Is(err, driver.ErrNotFound) {
		t.Errorf("Get after Delete: %v, want ErrNotFound", err)
	}
}

// TestErrors checks the mapping of failures the driver knows of.
func TestErrors(t *testing.T) {
	t.Parallel()
	o := options(t)
	o.Images["gone"] = vm.Image{ImageFiles: vm.ImageFiles{Disk: "/nonexistent/disk.qcow2"}}
	d := open(t, o)
	ctx := context.Background()
	cases := []struct {
		name string
		spec driver.Spec
		want error
		msg  string
	}{
		{"unregistered image", driver.Spec{Kind: driver.KindVM, Image: "nope"}, driver.ErrPermanent, `"nope"`},
		{"image file missing", driver.Spec{Kind: driver.KindVM, Image: "gone"}, driver.ErrPermanent, "node local"},
		{"security groups", driver.Spec{Kind: driver.KindVM, Image: "guest", SecurityGroups: []string{"web"}}, driver.ErrUnsupported, "security_groups"},
		{"ports", driver.Spec{Kind: driver.KindVM, Image: "guest", Ports: []driver.Port{{ContainerPort: 80}}}, driver.ErrUnsupported, "ports"},
		{"container", driver.Spec{Image: "guest"}, driver.ErrUnsupported, "kind"},
		{"unknown flavor", driver.Spec{Kind: driver.KindVM, Image: "guest", Flavor: "huge"}, driver.ErrUnsupported, "flavor"},
		{"host full", driver.Spec{Kind: driver.KindVM, Image: "guest", Resources: driver.Resources{Memory: driver.Bytes(driver.RangeBytes.Max)}}, driver.ErrInsufficientCapacity, "node local"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			sp := c.spec
			sp.Name = "vm-err"
			sp.Tags = testTags(nil)
			op, err := d.Create(ctx, "local", &sp)
			if err == nil {
				_, err = driver.Drive(ctx, op)
			}
			if !errors.Is(err, c.want) || !strings.Contains(err.Error(), c.msg) {
				t.Errorf("Create: %v, want %v naming %s", err, c.want, c.msg)
			}
			if _, err := d.Find(ctx, "vm-err"); !errors.Is(err, driver.ErrNotFound) {
				t.Errorf("Find after a failed create: %v, want ErrNotFound", err)
			}
		})
	}
	if err := d.CheckSpec(&driver.Spec{Kind: driver.KindVM, Image: "guest", SecurityGroups: []string{"web"}}); !drivertest.HasField(err, "security_groups") {
		t.Errorf("CheckSpec with security groups: %v, want a field error naming security_groups", err)
	}
}

// TestUnreachable checks a daemon that does not answer: an offline node,
// retryable creates, partial listings.
func TestUnreachable(t *testing.T) {
	o := *vm.DefaultOptions()
	o.StorageDir = t.TempDir()
	o.Nodes = []vm.NodeConfig{{Name: "away", Socket: o.StorageDir + "/no-such-socket"}}
	o.Images = map[string]vm.Image{"guest": {ImageFiles: vm.ImageFiles{Kernel: "/dev/null"}}}
	d := open(t, o)
	ctx := context.Background()
	st, err := d.State(ctx)
	if err != nil || len(st.Nodes) != 1 || st.Nodes[0].Status != driver.NodeOffline {
		t.Errorf("State: %+v %v, want one offline node", st, err)
	}
	op, err := d.Create(ctx, "away", &driver.Spec{Name: "x", Kind: driver.KindVM, Image: "guest", Tags: testTags(nil)})
	if err == nil {
		_, err = driver.Drive(ctx, op)
	}
	if !errors.Is(err, driver.ErrRetryable) {
		t.Errorf("Create on an unreachable node: %v, want ErrRetryable", err)
	}
	_, err = d.List(ctx, nil)
	var pe *driver.PartialListError
	if !errors.As(err, &pe) || !pe.Missing("away") {
		t.Errorf("List: %v, want a partial listing missing node away", err)
	}
}

// TestOptions checks that option errors name their keys.
func TestOptions(t *testing.T) {
	def, err := driver.Lookup("vm")
	if err != nil {
		t.Fatal(err)
	}
	cases := map[string]map[string]any{
		"storage_dir":        {"storage_dir": "relative"},
		"nodes[0].uri":       {"nodes": []any{map[string]any{"name": "a", "uri": "xen:///"}}},
		"nodes[1].uri":       {"nodes": []any{map[string]any{"name": "a"}, map[string]any{"name": "b", "uri": "qemu+ssh://h/system?keyfile=/k"}}},
		"nodes[0].ssh_key":   {"nodes": []any{map[string]any{"name": "a", "uri": "qemu+tls://h/system", "ssh_key": "/k"}}},
		"nodes[0].tls_dir":   {"nodes": []any{map[string]any{"name": "a", "uri": "qemu+ssh://h/system", "tls_dir": "/pki"}}},
		"nodes[0].socket":    {"nodes": []any{map[string]any{"name": "a", "uri": "qemu+tcp://h/system", "socket": "/s"}}},
		"images.bad.initrd":  {"images": map[string]any{"bad": map[string]any{"initrd": "/x"}}},
		"flavors.small":      {"flavors": map[string]any{"small": map[string]any{"cpus": 0, "memory": "64Mi"}}},
		"domain_type":        {"domain_type": "xen"},
		"images.x.nodes.zzz": {"images": map[string]any{"x": map[string]any{"disk": "/d", "nodes": map[string]any{"zzz": map[string]any{"disk": "/e"}}}}},
	}
	for key, raw := range cases {
		_, err := def.Decode(raw)
		if !errors.Is(err, driver.ErrInvalid) || !strings.Contains(err.Error(), key) {
			t.Errorf("options %v: %v, want ErrInvalid naming %s", raw, err, key)
		}
	}
}

// TestDiskOverlay boots a guest whose image has a qcow2 disk: its root
// disk is an overlay of the image, of the spec's size, and the image is
// never written.
func TestDiskOverlay(t *testing.T) {
	t.Parallel()
	o := options(t)
	base := filepath.Join(filepath.Dir(o.StorageDir), "base.qcow2")
	if out, err := exec.Command("qemu-img", "create", "-q", "-f", "qcow2", base, "16M").CombinedOutput(); err != nil {
		t.Fatalf("qemu-img: %v: %s", err, out)
	}
	if err := os.Chmod(base, 0o644); err != nil {
		t.Fatal(err)
	}
	before, err := os.ReadFile(base)
	if err != nil {
		t.Fatal(err)
	}
	g := o.Images["guest"]
	g.Disk = base
	o.Images["guest-disk"] = g
	d := open(t, o)
	inst := create(t, d, &driver.Spec{Name: uniq("vm-disk"), Kind: driver.KindVM, Image: "guest-disk", Tags: testTags(nil),
		Resources: driver.Resources{CPU: 500, Memory: 96 * driver.MiB, Disk: 32 * driver.MiB},
		UserData:  "cat /sys/block/vda/size\n"})
	// vda is the 32 MiB root disk: 65536 sectors of 512 bytes.
	waitLogs(t, d, inst.ID, "65536")
	_, uuid, _ := strings.Cut(inst.ID, "/")
	out, err := exec.Command("qemu-img", "info", "--output=json", "-U", filepath.Join(o.StorageDir, uuid+".root.qcow2")).Output()
	if err != nil {
		t.Fatalf("qemu-img info: %v", err)
	}
	var info struct {
		BackingFilename string `json:"backing-filename"`
		VirtualSize     int64  `json:"virtual-size"`
	}
	if err := json.Unmarshal(out, &info); err != nil {
		t.Fatal(err)
	}
	if info.BackingFilename != base || info.VirtualSize != 32<<20 {
		t.Errorf("overlay: backing %q size %d, want %q and 32 MiB", info.BackingFilename, info.VirtualSize, base)
	}
	if after, err := os.ReadFile(base); err != nil || !bytes.Equal(before, after) {
		t.Errorf("the image changed under its guest (%v)", err)
	}
}

// TestOptionsDecode reads flavors and images as the config file gives them.
func TestOptionsDecode(t *testing.T) {
	def, err := driver.Lookup("vm")
	if err != nil {
		t.Fatal(err)
	}
	v, err := def.Decode(map[string]any{
		"storage_dir": t.TempDir(),
		"flavors":     map[string]any{"small": map[string]any{"cpus": 0.5, "memory": "64Mi", "disk": "1Gi"}},
		"images":      `{"tiny": {"kernel": "/boot/k", "initrd": "/boot/i", "cmdline": "console=ttyS0"}}`,
	})
	if err != nil {
		t.Fatal(err)
	}
	o := v.(*vm.Options)
	if f := o.Flavors["small"]; f.CPU != 500 || f.Memory != 64*driver.MiB || f.Disk != driver.GiB {
		t.Errorf("flavor small: %+v", f)
	}
	if im := o.Images["tiny"]; im.Kernel != "/boot/k" || im.Cmdline != "console=ttyS0" {
		t.Errorf("image tiny: %+v", im)
	}
}

// TestPublishedPort reaches a server in the guest through a port the
// driver forwards from the host with user-mode networking.
func TestPublishedPort(t *testing.T) {
	t.Parallel()
	o := options(t)
	o.Network = "user"
	d := open(t, o)
	inst := create(t, d, &driver.Spec{Name: uniq("vm-port"), Kind: driver.KindVM, Image: "guest", Flavor: "tiny", Tags: testTags(nil),
		Ports:    []driver.Port{{ContainerPort: 8080}},
		UserData: "while true; do echo hello from the guest | nc -l -p 8080; done\n"})
	if len(inst.Ports) != 1 || inst.Ports[0].HostPort == 0 || inst.Ports[0].ContainerPort != 8080 || inst.Ports[0].HostIP != "127.0.0.1" {
		t.Fatalf("ports %+v, want 8080 forwarded from a loopback port", inst.Ports)
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(inst.Ports[0].HostPort))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var got []byte
	for !bytes.Contains(got, []byte("hello from the guest")) {
		if ctx.Err() != nil {
			t.Fatalf("%s never answered (last read %q)", addr, got)
		}
		// The host side accepts before the guest listens: try again.
		c, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
		if err == nil {
			_ = c.SetDeadline(time.Now().Add(5 * time.Second))
			got, _ = io.ReadAll(c)
			c.Close()
		}
		time.Sleep(200 * time.Millisecond)
	}
	st, err := d.State(ctx)
	if err != nil || len(st.Nodes) != 1 || !slices.Contains(st.Nodes[0].Ports, inst.Ports[0].HostPort) {
		t.Errorf("State: %+v %v, want the forwarded port among the node's ports", st, err)
	}
}

// TestResizeMemory grows a live guest's memory within its headroom and
// watches the guest see it.
func TestResizeMemory(t *testing.T) {
	t.Parallel()
	d := open(t, options(t))
	ctx := context.Background()
	inst := create(t, d, &driver.Spec{Name: uniq("vm-resize"), Kind: driver.KindVM, Image: "guest", Flavor: "tiny", Tags: testTags(nil),
		UserData: "while true; do grep MemTotal /proc/meminfo; sleep 1; done\n"})
	// The guest's MemTotal lines so far, in KiB.
	memTotals := func() []int {
		var kibs []int
		for line := range strings.SplitSeq(waitLogs(t, d, inst.ID, "MemTotal"), "\n") {
			if f := strings.Fields(line); len(f) >= 2 && f[0] == "MemTotal:" {
				kib, _ := strconv.Atoi(f[1])
				kibs = append(kibs, kib)
			}
		}
		return kibs
	}
	memTotal := func() int {
		if kibs := memTotals(); len(kibs) > 0 {
			return kibs[len(kibs)-1]
		}
		return 0
	}
	// The guest boots with its maximum and its balloon then takes what
	// it was created without, a little at a time (slowly where QEMU
	// emulates the processor on a loaded machine): its MemTotal is read
	// once three lines in a row agree.
	deadline := time.Now().Add(5 * time.Minute)
	before := 0
	for {
		kibs := memTotals()
		if n := len(kibs); n >= 3 && kibs[n-1] == kibs[n-2] && kibs[n-2] == kibs[n-3] {
			before = kibs[n-1]
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the guest's MemTotal never settled: %v KiB", kibs)
		}
		time.Sleep(500 * time.Millisecond)
	}
	if err := d.Resize(ctx, inst.ID, driver.Resources{Memory: 160 * driver.MiB}); err != nil {
		t.Fatalf("Resize: %v", err)
	}
	got, err := d.Get(ctx, inst.ID)
	if err != nil || got.Resources.Memory != 160*driver.MiB || got.Resources.CPU != 500 {
		t.Fatalf("Get after Resize: %+v %v, want 160Mi and the same cpus", got, err)
	}
	// The guest's MemTotal does not grow by all that the balloon gives
	// back (46 MiB of 64 was seen once, 48 and more other times): more than
	// half of it shows the resize reached the guest.
	deadline = time.Now().Add(5 * time.Minute)
	for after := memTotal(); after < before+32*1024; after = memTotal() {
		if time.Now().After(deadline) {
			t.Fatalf("the guest's MemTotal went from %d KiB to %d KiB, want more than 32 MiB more", before, after)
		}
		time.Sleep(500 * time.Millisecond)
	}
	if err := d.Resize(ctx, inst.ID, driver.Resources{Memory: 1 * driver.GiB}); !errors.Is(err, driver.ErrUnsupported) {
		t.Errorf("Resize above the maximum: %v, want ErrUnsupported", err)
	}
	if err := d.Resize(ctx, inst.ID, driver.Resources{CPU: 2000}); !errors.Is(err, driver.ErrUnsupported) {
		t.Errorf("Resize to another number of vCPUs: %v, want ErrUnsupported", err)
	}
}

// TestResizeVCPUs plugs a second vCPU into a running guest, which brings
// it online and counts two processors.
func TestResizeVCPUs(t *testing.T) {
	t.Parallel()
	o := options(t)
	o.CPUHeadroom = 2
	d := open(t, o)
	ctx := context.Background()
	inst := create(t, d, &driver.Spec{Name: uniq("vm-vcpus"), Kind: driver.KindVM, Image: "guest", Flavor: "tiny", Tags: testTags(nil),
		UserData: "while true; do\n" +
			"for c in /sys/devices/system/cpu/cpu[0-9]*; do [ -f $c/online ] && [ \"$(cat $c/online)\" = 0 ] && echo 1 > $c/online; done\n" +
			"echo \"cpus $(grep -c ^processor /proc/cpuinfo)\"; sleep 1\ndone\n"})
	waitLogs(t, d, inst.ID, "cpus 1")
	if err := d.Resize(ctx, inst.ID, driver.Resources{CPU: 2000}); err != nil {
		t.Fatalf("Resize to 2 cpus: %v", err)
	}
	got, err := d.Get(ctx, inst.ID)
	if err != nil || got.Resources.CPU != 2000 || got.Resources.Memory != 96*driver.MiB {
		t.Fatalf("Get after Resize: %+v %v, want 2 cpus and the same memory", got, err)
	}
	waitLogs(t, d, inst.ID, "cpus 2")
	if err := d.Resize(ctx, inst.ID, driver.Resources{CPU: 3000}); !errors.Is(err, driver.ErrUnsupported) {
		t.Errorf("Resize above the maximum vCPUs: %v, want ErrUnsupported", err)
	}
}
