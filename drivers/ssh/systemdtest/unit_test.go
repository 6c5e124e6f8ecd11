package systemdtest_test

import (
	"errors"
	"path"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/driver"
)

// nodeAttrs returns the attributes of the driver's one node.
func nodeAttrs(t *testing.T, d driver.Driver) map[string]string {
	t.Helper()
	st, err := d.State(ctxT(t))
	if err != nil {
		t.Fatalf("State: %v", err)
	}
	if len(st.Nodes) != 1 {
		t.Fatalf("State: %d nodes, want 1", len(st.Nodes))
	}
	return st.Nodes[0].Attributes
}

// memoryLimit reads the memory limit the kernel holds for unit's cgroup:
// memory.max on cgroup v2, memory.limit_in_bytes on a v1 or hybrid host.
func memoryLimit(t *testing.T, unit string) string {
	t.Helper()
	cg := unitProps(t, unit, "ControlGroup")["ControlGroup"]
	if cg == "" {
		t.Fatalf("unit %s has no control group", unit)
	}
	out, err := host.exec(ctxT(t), "sh", "-c", `cat "/sys/fs/cgroup$1/memory.max" 2>/dev/null || cat "/sys/fs/cgroup/memory$1/memory.limit_in_bytes"`, "sh", cg)
	if err != nil {
		t.Fatalf("the memory limit of %s: %v", cg, err)
	}
	return out
}

// TestUnit: on a systemd host an instance runs in its transient unit
// with its limits as the unit's properties, Resize sets them on the
// running unit, the instance outlives the driver's connection, and Delete
// removes the unit.
func TestUnit(t *testing.T) {
	need(t)
	c := cluster("unit")
	d := open(t, c, nil)
	if a := nodeAttrs(t, d); a["supervisor"] != "systemd" || a["limits"] != "systemd" {
		t.Errorf("node attributes %v: want supervisor systemd, limits systemd", a)
	}
	sp := shSpec(serviceScript)
	sp.Resources = driver.Resources{CPU: 500, Memory: 128 * driver.MiB}
	in := create(t, d, sp)
	unit := unitName(c, in.ID)
	wantProps(t, "after Create", unit, map[string]string{
		"ActiveState": "active", "CPUQuotaPerSecUSec": "500ms", "MemoryMax": "134217728", "MemorySwapMax": "0",
	})
	if got := memoryLimit(t, unit); got != "134217728" {
		t.Errorf("after Create: the memory limit of the unit's cgroup is %q, want 134217728", got)
	}
	// The supervisor is the unit's main process, the instance beside it.
	mainPID := unitProps(t, unit, "MainPID")["MainPID"]
	cmdline, err := host.exec(ctxT(t), "cat", "/proc/"+mainPID+"/cmdline")
	if err != nil || !strings.Contains(cmdline, "ssh-supervise\x00run\x00"+path.Join(root, "c", c, in.ID)) {
		t.Errorf("the unit's main process %s runs %q (%v), want the supervisor of %s", mainPID, cmdline, err, in.ID)
	}
	if err := d.(driver.Resizer).Resize(ctxT(t), in.ID, driver.Resources{CPU: 1500, Memory: 256 * driver.MiB}); err != nil {
		t.Fatalf("Resize: %v", err)
	}
	wantProps(t, "after Resize", unit, map[string]string{
		"ActiveState": "active", "CPUQuotaPerSecUSec": "1.500000s", "MemoryMax": "268435456", "MemorySwapMax": "0",
	})

	if got := memoryLimit(t, unit); got != "268435456" {
		t.Errorf("after Resize: the memory limit of the unit's cgroup is %q, want 268435456", got)
	}

	// The driver goes, its connection with it; the instance stays.
	if err := d.Close(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	d = open(t, c, nil)
	defer d.Close(ctxT(t))
	got, err := d.Get(ctxT(t), in.ID)
	if err != nil || got.State != driver.StateRunning || !got.Started.Equal(in.Started) {
		t.Fatalf("after a new connection: %+v, %v; want the instance started at %v running", got, err, in.Started)
	}
	if p := unitProps(t, unit, "MainPID")["MainPID"]; p != mainPID {
		t.Errorf("after a new connection: the unit's main process %s, want %s", p, mainPID)
	}

	op, err := d.Delete(ctxT(t), in.ID)
	if err == nil {
		_, err = driver.Drive(ctxT(t), op)
	}
	if err != nil {
		t.Fatalf("Delete: %v", err)
	}
	wantProps(t, "after Delete", unit, map[string]string{"LoadState": "not-found"})
}

// TestLeakedUnits: a unit of this cluster whose instance directory is
// gone is a leak, which a listing stops; another cluster's unit is never
// touched.
func TestLeakedUnits(t *testing.T) {
	need(t)
	// The other's name starts with this one's: their units' names do not.
	mine := cluster("leak-")
	other := mine + "-other"
	dm, do := open(t, mine, nil), open(t, other, nil)
	defer dm.Close(ctxT(t))
	defer do.Close(ctxT(t))
	a, b := create(t, dm, shSpec(serviceScript)), create(t, do, shSpec(serviceScript))
	ua, ub := unitName(mine, a.ID), unitName(other, b.ID)
	for _, dir := range []string{path.Join(root, "c", mine, a.ID), path.Join(root, "c", other, b.ID)} {
		if _, err := host.exec(ctxT(t), "rm", "-rf", dir); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := dm.List(ctxT(t), nil); err != nil {
		t.Fatalf("List: %v", err)
	}
	wantProps(t, "after this cluster's listing", ua, map[string]string{"LoadState": "not-found"})
	wantProps(t, "after the first cluster's listing", ub, map[string]string{"ActiveState": "active"})
	if _, err := do.List(ctxT(t), nil); err != nil {
		t.Fatalf("List: %v", err)
	}
	wantProps(t, "after its cluster's listing", ub, map[string]string{"LoadState": "not-found"})
}

// TestForcedProcess: with the option supervision process the supervisor
// runs as a process of its own on a systemd host too, in no unit.
func TestForcedProcess(t *testing.T) {
	need(t)
	c := cluster("proc")
	d := open(t, c, map[string]any{"supervision": "process"})
	defer d.Close(ctxT(t))
	if a := nodeAttrs(t, d); a["supervisor"] != "process" {
		t.Errorf("node attributes %v: want supervisor process", a)
	}
	in := create(t, d, shSpec(serviceScript))
	wantProps(t, "a process-supervised instance", unitName(c, in.ID), map[string]string{"LoadState": "not-found"})
	op, err := d.Delete(ctxT(t), in.ID)
	if err == nil {
		_, err = driver.Drive(ctxT(t), op)
	}
	if err != nil && !errors.Is(err, driver.ErrNotFound) {
		t.Fatalf("Delete: %v", err)
	}
}

// TestUnitStartFails: a process that cannot start fails the create with
// ErrPermanent, the supervisor's report coming back through the unit, and
// leaves no unit behind.
func TestUnitStartFails(t *testing.T) {
	need(t)
	c := cluster("fail")
	d := open(t, c, nil)
	defer d.Close(ctxT(t))
	op, err := d.Create(ctxT(t), "sd", &driver.Spec{Kind: driver.KindProcess, Entrypoint: []string{"/no/such/program"}})
	if err == nil {
		_, err = driver.Drive(ctxT(t), op)
	}
	if !errors.Is(err, driver.ErrPermanent) || !strings.Contains(err.Error(), "/no/such/program") {
		t.Fatalf("Create of a missing executable: %v, want ErrPermanent naming it", err)
	}
	out, err := host.exec(ctxT(t), "systemctl", "list-units", "--all", "--plain", "--no-legend", "berth-"+c+"-*")
	if err != nil || out != "" {
		t.Errorf("units of the cluster after the failed create: %q (%v), want none", out, err)
	}
}

// TestUnitSupervisorKilled: systemd ends what is left in the unit when
// its supervisor is killed, the instance's process too, which then reads
// as ended without an exit code; the unit is collected.
func TestUnitSupervisorKilled(t *testing.T) {
	need(t)
	c := cluster("kill")
	d := open(t, c, nil)
	defer d.Close(ctxT(t))
	in := create(t, d, shSpec(serviceScript))
	unit := unitName(c, in.ID)
	mainPID := unitProps(t, unit, "MainPID")["MainPID"]
	if _, err := host.exec(ctxT(t), "kill", "-KILL", mainPID); err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t)
	for {
		got, err := d.Get(ctx, in.ID)
		if err != nil {
			t.Fatalf("Get: %v", err)
		}
		if got.State == driver.StateExited {
			if got.ExitCode != nil {
				t.Errorf("exit code %d, want none: nobody saw the end", *got.ExitCode)
			}
			break
		}
		if got.State != driver.StateRunning {
			t.Fatalf("state %s (%s), want running, then exited", got.State, got.Message)
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the instance still runs after its supervisor was killed: %+v", got)
		case <-time.After(100 * time.Millisecond):
		}
	}
	for props := unitProps(t, unit, "LoadState"); props["LoadState"] != "not-found"; props = unitProps(t, unit, "LoadState") {
		select {
		case <-ctx.Done():
			t.Fatalf("the unit is still loaded: %v", props)
		case <-time.After(100 * time.Millisecond):
		}
	}
	op, err := d.Delete(ctx, in.ID)
	if err == nil {
		_, err = driver.Drive(ctx, op)
	}
	if err != nil {
		t.Fatalf("Delete: %v", err)
	}
}
