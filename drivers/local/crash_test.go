package local

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/berth-dev/berth/driver"
)

// churnEnv names the data dir in which the test binary, started again as a
// separate process, creates and deletes named instances until it is killed.
const churnEnv = "BERTH_LOCAL_TEST_CHURN_DIR"

// churnNames are the names the churning Berth cycles through; each
// instance carries its name in the tag "churn".
var churnNames = []string{"churn-a", "churn-b", "churn-c", "churn-d", "churn-e"}

// churnBerth creates an instance of each name in turn; when the name is
// taken it deletes the instance holding it instead. It runs until killed
// and returns only an unexpected error.
func churnBerth(dir string) error {
	ctx := context.Background()
	def, err := driver.Lookup("local")
	if err != nil {
		return err
	}
	d, err := def.Open(ctx, map[string]any{"data_dir": dir, "stop_grace": "2s", "poll_interval": "5ms", "allow_root": true}, driver.Env{})
	if err != nil {
		return err
	}
	for i := 0; ; i++ {
		name := churnNames[i%len(churnNames)]
		sp := shSpec("sleep 60")
		sp.Name = name
		sp.Tags = map[string]string{"churn": name}
		op, err := d.Create(ctx, "", sp)
		if err == nil {
			_, err = driver.Drive(ctx, op)
		}
		if !errors.Is(err, driver.ErrAlreadyExists) {
			if err != nil {
				return fmt.Errorf("create %s: %w", name, err)
			}
			continue
		}
		in, err := d.Find(ctx, name)
		if errors.Is(err, driver.ErrNotFound) {
			continue // the claim has no instance; the test reports it
		}
		if err != nil {
			return fmt.Errorf("find %s: %w", name, err)
		}
		if op, err = d.Delete(ctx, in.ID); err == nil {
			_, err = driver.Drive(ctx, op)
		}
		if err != nil && !errors.Is(err, driver.ErrNotFound) {
			return fmt.Errorf("delete %s: %w", name, err)
		}
	}
}

// TestKilledDuringCreateAndDelete kills a Berth that creates and deletes
// named instances at random moments, again and again on one data dir.
// Afterwards every name claim belongs to an instance that List returns
// with its tags, deleting the instances frees every name and leaves no
// file and no process behind.
func TestKilledDuringCreateAndDelete(t *testing.T) {
	dir := t.TempDir()
	const rounds = 40
	for round := range rounds {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), churnEnv+"="+dir)
		var stderr strings.Builder
		cmd.Stderr = &stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Duration(20+rand.IntN(180)) * time.Millisecond)
		cmd.Process.Signal(syscall.SIGKILL)
		err := cmd.Wait()
		var exit *exec.ExitError
		if !errors.As(err, &exit) || !exit.Sys().(syscall.WaitStatus).Signaled() {
			t.Fatalf("round %d: the churning Berth ended by itself (%v): %s", round, err, stderr.String())
		}
	}

	d := open(t, dir, nil)
	defer d.Close(context.Background())
	ctx := ctxT(t)
	list, err := d.List(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	byID := map[string]*driver.Instance{}
	for _, in := range list {
		byID[in.ID] = in
		t.Cleanup(func() { remove(t, d, in.ID) })
	}
	ids, err := d.ids()
	if err != nil {
		t.Fatal(err)
	}
	if len(ids) != len(list) {
		t.Errorf("%d instance directories, but List returns %d instances", len(ids), len(list))
	}
	claims, err := os.ReadDir(filepath.Join(dir, "names"))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range claims {
		name := c.Name()
		owner, err := os.ReadFile(d.namePath(name))
		if err != nil {
			t.Fatal(err)
		}
		in := byID[strings.TrimSpace(string(owner))]
		if in == nil {
			t.Errorf("name %q is claimed by %q, which List does not return", name, owner)
			continue
		}
		if in.Name != name || in.Tags["churn"] != name || in.Tags[driver.TagManaged] != "true" {
			t.Errorf("name %q is claimed by %s named %q with tags %v", name, in.ID, in.Name, in.Tags)
		}
		if got, err := d.Find(ctx, name); err != nil || got.ID != in.ID {
			t.Errorf("Find %q: %v, want %s", name, err, in.ID)
		}
	}
	t.Logf("after %d kills: %d instances, %d name claims", rounds, len(list), len(claims))

	var pids []int
	for _, in := range list {
		if pid := findByEnv(envInstanceID + "=" + in.ID); pid != 0 {
			pids = append(pids, pid)
		}
		op, err := d.Delete(ctx, in.ID)
		if err == nil {
			_, err = driver.Drive(ctx, op)
		}
		if err != nil {
			t.Fatalf("Delete %s (%s, %s): %v", in.ID, in.Name, in.State, err)
		}
	}
	for _, pid := range pids {
		if alive(pid) {
			t.Errorf("process %d outlived the Delete of its instance", pid)
		}
	}
	for _, name := range churnNames {
		sp := shSpec("exit 0")
		sp.Name = name
		in := create(t, d, sp)
		remove(t, d, in.ID)
	}
	for _, sub := range []string{"names", "instances", "tmp"} {
		if ents, _ := os.ReadDir(filepath.Join(dir, sub)); len(ents) != 0 {
			t.Errorf("%s/ holds %d entries after every instance was deleted", sub, len(ents))
		}
	}
}

// TestOpenClearsLeftovers gives Open what a killed Berth of any version may
// have left: an empty claim, a claim whose instance directory has no
// record, a directory in tmp/ of a Berth process that is gone and one of a
// deleted instance. Open clears them and both names can be taken again.
func TestOpenClearsLeftovers(t *testing.T) {
	dir := t.TempDir()
	d := open(t, dir, nil)
	d.Close(context.Background())

	gone := exec.Command("/bin/true")
	if err := gone.Run(); err != nil {
		t.Fatal(err)
	}
	orphan := newID()
	files := map[string]string{
		"names/empty":                         "",
		"names/norecord":                      orphan,
		"instances/" + orphan + "/stdout.log": "x",
		fmt.Sprintf("tmp/new-%d-%s/record.json", gone.Process.Pid, newID()): "{}",
		fmt.Sprintf("tmp/claim-%d-%s", gone.Process.Pid, newID()):           "x",
		"tmp/del-" + newID() + "-" + newID() + "/stdout.log":                "x",
	}
	for p, content := range files {
		p = filepath.Join(dir, p)
		if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	// A staged directory of a Berth process that still runs (this one)
	// is left alone.
	mine := filepath.Join(dir, "tmp", tmpPrefix("new")+newID())
	if err := os.Mkdir(mine, 0o700); err != nil {
		t.Fatal(err)
	}

	d = open(t, dir, nil)
	defer d.Close(context.Background())
	if ids, _ := d.ids(); len(ids) != 0 {
		t.Errorf("instance directories without a record survived Open: %v", ids)
	}
	if ents, _ := os.ReadDir(d.tmpDir()); len(ents) != 1 || ents[0].Name() != filepath.Base(mine) {
		t.Errorf("tmp/ after Open: %v, want only %s", ents, filepath.Base(mine))
	}
	for _, name := range []string{"empty", "norecord"} {
		if _, err := d.Find(ctxT(t), name); !errors.Is(err, driver.ErrNotFound) {
			t.Errorf("Find %q: %v, want ErrNotFound", name, err)
		}
		sp := shSpec("exit 0")
		sp.Name = name
		in := create(t, d, sp)
		if got, err := d.Find(ctxT(t), name); err != nil || got.ID != in.ID {
			t.Errorf("Find %q after Create: %v", name, err)
		}
	}
}
