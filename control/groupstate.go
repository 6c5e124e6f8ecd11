package control

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"

	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/reconciler"
	"github.com/berth-dev/berth/scheduler"
	"github.com/berth-dev/berth/store"
)

// GroupState summarises a group's essential instances.
type GroupState string

// Group states, from the essential instances of every service.
const (
	// GroupWaiting: the group waits in the gang queue; nothing is placed.
	GroupWaiting GroupState = "waiting"
	// GroupStarting: every essential instance is placed, not all run yet.
	GroupStarting GroupState = "starting"
	// GroupRunning: every essential instance runs.
	GroupRunning GroupState = "running"
	// GroupDegraded: an essential instance lost its node or its back-end
	// resource and is not placed again yet, failed, or was deleted while
	// others still live; Message names it and says why.
	GroupDegraded GroupState = "degraded"
	// GroupDeleted: every instance of the group is deleted.
	GroupDeleted GroupState = "deleted"
)

// GroupStatus is the state of one group and of each of its services.
type GroupStatus struct {
	ID       string          `json:"id"`
	State    GroupState      `json:"state"`
	Message  string          `json:"message,omitempty"`
	Services []ServiceStatus `json:"services"`
}

// ServiceStatus counts the instances of one service of a group.
type ServiceStatus struct {
	Request   string `json:"request"`
	Essential int    `json:"essential"`
	Count     int    `json:"count"`
	// Running counts the running (or held) instances, EssentialRunning
	// those of them that are essential.
	Running          int `json:"running"`
	EssentialRunning int `json:"essential_running"`
}

// Group returns the state of group id; driver.ErrNotFound when no such
// group is stored.
func (p *Plane) Group(ctx context.Context, id string) (GroupStatus, error) {
	return p.admitter.groupStatus(ctx, id)
}

// groupStatus is Plane.Group.
func (s admitter) groupStatus(ctx context.Context, id string) (GroupStatus, error) {
	kv, err := s.st.Get(ctx, PrefixGroups+id)
	if errors.Is(err, store.ErrNotFound) {
		return GroupStatus{}, driver.Errorf(driver.ErrNotFound, "group %q", id)
	}
	if err != nil {
		return GroupStatus{}, fmt.Errorf("control: read group %s: %w", id, err)
	}
	var g scheduler.Group
	if err := json.Unmarshal(kv.Value, &g); err != nil {
		return GroupStatus{}, fmt.Errorf("control: decode %s: %w", kv.Key, err)
	}
	members := s.snapshot(func(in *rec) bool { return in.Group() == id })
	byReq := map[string][]reconciler.Instance{}
	for _, in := range members {
		byReq[in.Request] = append(byReq[in.Request], in)
	}
	st := GroupStatus{ID: id, State: GroupRunning, Services: []ServiceStatus{}}
	rank := map[GroupState]int{GroupRunning: 0, GroupStarting: 1, GroupDegraded: 2}
	raise := func(to GroupState, msg string) {
		if rank[to] > rank[st.State] {
			st.State, st.Message = to, msg
		}
	}
	deleted := 0
	for i := range g.Services {
		sv := &g.Services[i]
		name := sv.Name
		if name == "" {
			name = sv.ID
		}
		if name == "" {
			name = "s" + strconv.Itoa(i)
		}
		req := g.ID + "." + name
		ss := ServiceStatus{Request: req, Essential: sv.EssentialCount(), Count: sv.N()}
		for _, in := range byReq[req] {
			essential := indexOf(&in) < ss.Essential
			// A suspended member is paused on request, whole where it
			// was: it counts as running, not as lost.
			running := in.Phase == reconciler.Running || in.Phase == reconciler.Held || in.Phase == reconciler.Suspended
			if running {
				ss.Running++
				if essential {
					ss.EssentialRunning++
				}
			}
			if in.Phase == reconciler.Deleted || (in.Phase == reconciler.Deleting && in.After == reconciler.Deleted) {
				deleted++
			}
			if !essential || running {
				continue
			}
			switch {
			case in.Phase == reconciler.Failed:
				raise(GroupDegraded, fmt.Sprintf("essential instance %s failed: %s", in.ID, in.Message))
			case in.Phase == reconciler.Deleted || in.Phase == reconciler.Deleting && in.After == reconciler.Deleted:
				raise(GroupDegraded, fmt.Sprintf("essential instance %s is deleted", in.ID))
			case in.Phase == reconciler.Pending && in.Incarnation > 0:
				raise(GroupDegraded, fmt.Sprintf("essential instance %s waits to be placed again: %s", in.ID, in.Message))
			default:
				raise(GroupStarting, "")
			}
		}
		st.Services = append(st.Services, ss)
	}
	switch {
	case s.gangQueued(id):
		st.State, st.Message = GroupWaiting, ""
	case len(members) > 0 && deleted == len(members):
		st.State, st.Message = GroupDeleted, ""
	}
	return st, nil
}
