package driver_test

import (
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/driver"
)

func TestDiffListings(t *testing.T) {
	now := time.Now()
	t0, t1 := now.Add(-time.Minute), now
	code := 1
	inst := func(id string, s driver.State, started time.Time) *driver.Instance {
		return &driver.Instance{ID: id, State: s, Started: started, Created: t0}
	}
	m := func(ins ...*driver.Instance) map[string]*driver.Instance {
		out := map[string]*driver.Instance{}
		for _, in := range ins {
			out[in.ID] = in
		}
		return out
	}
	exited := inst("b", driver.StateExited, t0)
	exited.ExitCode = &code
	cases := []struct {
		name      string
		prev, cur map[string]*driver.Instance
		want      []string
	}{
		{"nothing", m(inst("a", driver.StateRunning, t0)), m(inst("a", driver.StateRunning, t0)), nil},
		{"new", m(), m(inst("a", driver.StateRunning, t0)), []string{"start a"}},
		{"exit", m(inst("b", driver.StateRunning, t0)), m(exited), []string{"die b exit code 1"}},
		{"stopped", m(inst("a", driver.StateRunning, t0)), m(inst("a", driver.StateStopped, t0)), []string{"die a", "stop a"}},
		{"suspend", m(inst("a", driver.StateRunning, t0)), m(inst("a", driver.StateSuspended, t0)), []string{"suspend a"}},
		{"resume", m(inst("a", driver.StateSuspended, t0)), m(inst("a", driver.StateRunning, t0)), []string{"resume a"}},
		{"restarted", m(inst("a", driver.StateRunning, t0)), m(inst("a", driver.StateRunning, t1)), []string{"die a restarted", "start a"}},
		{"started again", m(inst("a", driver.StateExited, t0)), m(inst("a", driver.StateRunning, t1)), []string{"start a"}},
		{"ran and ended unseen", m(inst("a", driver.StateCreating, time.Time{})), m(inst("a", driver.StateExited, t1)), []string{"die a"}},
		{"deleted", m(inst("a", driver.StateRunning, t0)), m(), []string{"delete a"}},
	}
	for _, c := range cases {
		var got []string
		for _, e := range driver.DiffListings(c.prev, c.cur, now) {
			s := string(e.Type) + " " + e.Instance
			if e.Message != "" {
				s += " " + e.Message
			}
			got = append(got, s)
		}
		if strings.Join(got, ",") != strings.Join(c.want, ",") {
			t.Errorf("%s: events %q, want %q", c.name, got, c.want)
		}
	}
}
