package driver

import (
	"cmp"
	"fmt"
	"slices"
	"time"
)

// DiffListings returns the events that lead from one listing of a
// back-end's instances to the next, both keyed by instance id: start (now
// running, or running again after a restart), die (ended; the exit code in
// Message), stop (after die, when it was asked for), pause and unpause
// (suspended and back), delete (no longer listed). Instances come in order of
// creation, then id; deletions last. It is what an EventWatcher built on
// polling reports, and the fallback of every driver without one.
func DiffListings(prev, cur map[string]*Instance, now time.Time) []Event {
	var out []Event
	ev := func(t EventType, in *Instance, msg string) {
		out = append(out, Event{Type: t, Instance: in.ID, Node: in.Node, State: in.State, Message: msg, Tags: in.Tags, Time: now})
	}
	up := func(s State) bool { return s == StateRunning || s == StateSuspended }
	ended := func(in *Instance) {
		msg := in.Message
		if in.ExitCode != nil {
			msg = fmt.Sprintf("exit code %d", *in.ExitCode)
		}
		ev(EventDie, in, msg)
		if in.State == StateStopped {
			ev(EventStop, in, "")
		}
	}
	for _, in := range byCreation(cur) {
		p := prev[in.ID]
		wasUp := p != nil && up(p.State)
		restarted := wasUp && up(in.State) && !p.Started.Equal(in.Started)
		if restarted {
			ev(EventDie, p, "restarted")
		}
		switch {
		case up(in.State) && (!wasUp || restarted):
			ev(EventStart, in, "")
		case wasUp && !up(in.State) && in.State != StateCreating:
			ended(in)
		case p != nil && p.State == StateCreating && !up(in.State) && in.State != StateCreating:
			ended(in) // ran and ended between two listings
		}
		if wasUp && up(in.State) && !restarted && p.State != in.State {
			if in.State == StateSuspended {
				ev(EventSuspend, in, "")
			} else {
				ev(EventResume, in, "")
			}
		}
	}
	for _, p := range byCreation(prev) {
		if cur[p.ID] == nil {
			ev(EventDelete, p, "")
		}
	}
	return out
}

func byCreation(m map[string]*Instance) []*Instance {
	out := make([]*Instance, 0, len(m))
	for _, in := range m {
		out = append(out, in)
	}
	slices.SortFunc(out, func(a, b *Instance) int {
		return cmp.Or(a.Created.Compare(b.Created), cmp.Compare(a.ID, b.ID))
	})
	return out
}
