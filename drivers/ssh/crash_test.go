package ssh_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/berth-dev/berth/driver"
)

// launcherEnv names the file of options with which the test binary,
// started again as a separate process, is a Berth launching crashNames
// instances on the fleet until they all run.
const launcherEnv = "BERTH_SSH_TEST_LAUNCHER"

const crashCount = 24

// launcherConfig is what the launcher is given.
type launcherConfig struct {
	Options map[string]any `json:"options"`
	Cluster string         `json:"cluster"`
}

// launcher launches an instance of each name crash-0 ... crash-23, 8 at a
// time, as a Berth coming back to its work would: a name that runs is
// kept, a name whose create was cut short (the instance never started) is
// deleted and created again. It prints "created NAME ID" for each create
// it finished.
func launcher(file string) error {
	b, err := os.ReadFile(file)
	if err != nil {
		return err
	}
	var cfg launcherConfig
	if err := json.Unmarshal(b, &cfg); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	def, err := driver.Lookup("ssh")
	if err != nil {
		return err
	}
	d, err := def.Open(ctx, cfg.Options, driver.Env{Cluster: cfg.Cluster})
	if err != nil {
		return err
	}
	var mu sync.Mutex
	var errs []error
	work := make(chan int)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for i := range work {
				if err := launchOne(ctx, d, i, &mu); err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
				}
			}
		})
	}
	for i := range crashCount {
		work <- i
	}
	close(work)
	wg.Wait()
	return errors.Join(errs...)
}

func launchOne(ctx context.Context, d driver.Driver, i int, mu *sync.Mutex) error {
	name := fmt.Sprintf("crash-%d", i)
	in, err := d.Find(ctx, name)
	switch {
	case err == nil && in.State == driver.StateRunning:
		return nil
	case err == nil:
		op, err := d.Delete(ctx, in.ID)
		if err == nil {
			_, err = driver.Drive(ctx, op)
		}
		if err != nil && !errors.Is(err, driver.ErrNotFound) {
			return fmt.Errorf("delete %s (%s): %w", name, in.State, err)
		}
	case !errors.Is(err, driver.ErrNotFound):
		return fmt.Errorf("find %s: %w", name, err)
	}
	sp := shSpec(`trap 'exit 0' TERM; sleep 1000 & wait $!`)
	sp.Name = name
	sp.Tags = map[string]string{driver.TagManaged: "true", "crash": "yes"}
	op, err := d.Create(ctx, nodeName(i%3), sp)
	if err == nil {
		in, err = driver.Drive(ctx, op)
	}
	if err != nil {
		return fmt.Errorf("create %s: %w", name, err)
	}
	mu.Lock()
	fmt.Printf("created %s %s\n", name, in.ID)
	mu.Unlock()
	return nil
}

// TestKilledDuringLaunches kills (SIGKILL) a Berth launching instances on
// three hosts while creates are in flight, then starts another on the
// same hosts to finish the work. Afterwards every name runs exactly once,
// every instance the first Berth reported runs still, under the same
// process, and nothing else is listed.
func TestKilledDuringLaunches(t *testing.T) {
	t.Parallel()
	f := newFleet(t, 3)
	cfgFile := filepath.Join(t.TempDir(), "launcher.json")
	b, _ := json.Marshal(launcherConfig{Options: f.options(nil), Cluster: f.cluster})
	if err := os.WriteFile(cfgFile, b, 0o600); err != nil {
		t.Fatal(err)
	}
	run := func(killAfter int) map[string]string {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), launcherEnv+"="+cfgFile)
		cmd.Stderr = os.Stderr
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		created := map[string]string{}
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if f := strings.Fields(sc.Text()); len(f) == 3 && f[0] == "created" {
				created[f[1]] = f[2]
			}
			if killAfter > 0 && len(created) == killAfter {
				cmd.Process.Signal(syscall.SIGKILL)
				break
			}
		}
		err = cmd.Wait()
		if killAfter == 0 && err != nil {
			t.Fatalf("the second Berth: %v", err)
		}
		return created
	}
	first := run(6)
	t.Logf("killed the first Berth after %d creates", len(first))

	d := f.open(t, nil)
	defer d.Close(context.Background())
	pids := map[string]int{}
	for name, id := range first {
		pids[name] = pidOf(t, f, id)
	}

	second := run(0)
	t.Logf("the second Berth created %d", len(second))
	list, err := d.List(ctxT(t), map[string]string{"crash": "yes"})
	if err != nil {
		t.Fatalf("List: %v", err)
	}
	byName := map[string]*driver.Instance{}
	for _, in := range list {
		if byName[in.Name] != nil {
			t.Errorf("name %s is held twice: %s and %s", in.Name, byName[in.Name].ID, in.ID)
		}
		byName[in.Name] = in
		if in.State != driver.StateRunning {
			t.Errorf("%s (%s): %s (%s), want running", in.Name, in.ID, in.State, in.Message)
		}
	}
	if len(byName) != crashCount || len(list) != crashCount {
		t.Errorf("List: %d instances of %d names, want %d", len(list), len(byName), crashCount)
	}
	for name, id := range first {
		if in := byName[name]; in == nil || in.ID != id {
			t.Errorf("%s: the first Berth made %s, now %v", name, id, in)
		}
		if !processAlive(pids[name]) {
			t.Errorf("%s: process %d died", name, pids[name])
		}
	}
	for _, in := range list {
		op, err := d.Delete(ctxT(t), in.ID)
		if err == nil {
			_, err = driver.Drive(ctxT(t), op)
		}
		if err != nil {
			t.Errorf("Delete %s: %v", in.ID, err)
		}
	}
	ents, _ := os.ReadDir(filepath.Join(f.root, "c", f.cluster))
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), ".") {
			t.Errorf("left behind: %s", e.Name())
		}
	}
}
