package local

import (
	"context"
	"fmt"
	"time"

	"github.com/berth-dev/berth/driver"
)

// Watch looks at every instance each poll_interval (which also reaps the
// processes Berth is the parent of) and calls fn for each change since the
// previous look: start, die (with the exit code in Message), stop (after
// die, when the end was asked for), pause, unpause and delete. The first
// look only sets the baseline. It returns ctx's error when ctx ends.
func (d *Driver) Watch(ctx context.Context, fn func(driver.Event)) error {
	prev, err := d.snapshot(ctx)
	if err != nil {
		return err
	}
	t := time.NewTicker(d.opts.PollInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
		cur, err := d.snapshot(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return err
		}
		for _, ev := range diff(d.node, prev, cur, time.Now()) {
			fn(ev)
		}
		prev = cur
	}
}

func (d *Driver) snapshot(ctx context.Context) (map[string]*driver.Instance, error) {
	insts, err := d.List(ctx, nil)
	if err != nil {
		return nil, err
	}
	m := make(map[string]*driver.Instance, len(insts))
	for _, in := range insts {
		m[in.ID] = in
	}
	return m, nil
}

// diff returns the events that lead from prev to cur, ordered by instance
// creation as cur lists them, then deletions.
func diff(node string, prev, cur map[string]*driver.Instance, now time.Time) []driver.Event {
	var out []driver.Event
	ev := func(t driver.EventType, in *driver.Instance, msg string) {
		out = append(out, driver.Event{Type: t, Instance: in.ID, Node: node, State: in.State, Message: msg, Tags: in.Tags, Time: now})
	}
	up := func(s driver.State) bool { return s == driver.StateRunning || s == driver.StateSuspended }
	ended := func(in *driver.Instance) {
		msg := in.Message
		if in.ExitCode != nil {
			msg = fmt.Sprintf("exit code %d", *in.ExitCode)
		}
		ev(driver.EventDie, in, msg)
		if in.State == driver.StateStopped {
			ev(driver.EventStop, in, "")
		}
	}
	for _, in := range sortedByCreation(cur) {
		p := prev[in.ID]
		wasUp := p != nil && up(p.State)
		restarted := wasUp && up(in.State) && !p.Started.Equal(in.Started)
		if restarted {
			ev(driver.EventDie, p, "restarted")
		}
		switch {
		case up(in.State) && (!wasUp || restarted):
			ev(driver.EventStart, in, "")
		case wasUp && !up(in.State) && in.State != driver.StateCreating:
			ended(in)
		case p != nil && p.State == driver.StateCreating && !up(in.State) && in.State != driver.StateCreating:
			ended(in) // ran and ended between two looks
		}
		if wasUp && up(in.State) && !restarted && p.State != in.State {
			if in.State == driver.StateSuspended {
				ev(driver.EventPause, in, "")
			} else {
				ev(driver.EventUnpause, in, "")
			}
		}
	}
	for _, p := range sortedByCreation(prev) {
		if cur[p.ID] == nil {
			ev(driver.EventDelete, p, "")
		}
	}
	return out
}

func sortedByCreation(m map[string]*driver.Instance) []*driver.Instance {
	out := make([]*driver.Instance, 0, len(m))
	for _, in := range m {
		out = append(out, in)
	}
	sortInstances(out)
	return out
}
