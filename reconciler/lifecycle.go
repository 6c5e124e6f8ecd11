// Package reconciler holds the lifecycle of Berth's instances: an explicit
// state machine written as a pure step function (no I/O, the clock passed
// in), in the manner of etcd's raft. The caller — package control — feeds it
// events (a tick, an operation's result, an observation of the back-end, a
// user's request), stores the instance it returns in one transaction, and
// then performs the actions it returns. Because the instance is stored before
// any action is taken, a crash between the two only ever repeats an action,
// and every action is safe to repeat.
//
// The phases:
//
//	pending   → scheduled   placed; the intent (provider, node, tags) is stored
//	scheduled → creating    the back-end is asked to create it
//	creating  → running     the create finished (or exited, for quick batch work)
//	running   → stopping → stopped, and stopped/exited → running on start
//	any       → deleting → deleted (or back to pending for a retry, or failed)
//	running   → held        kept until an expiry, then deleted (Nodepool's hold)
//	running   ⇄ suspended   paused on request, or seen paused; resumed likewise
//	failed                  permanent failure or out of attempts
//
// A user's verb (Verb) is accepted in every phase where it can mean
// something: what the instance cannot take yet is recorded on it (Want)
// and done by Step once it can.
package reconciler

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/berth-dev/berth/driver"
)

// Phase is an instance's lifecycle phase.
type Phase string

// Phases.
const (
	Pending   Phase = "pending"
	Scheduled Phase = "scheduled"
	Creating  Phase = "creating"
	Running   Phase = "running"
	Stopping  Phase = "stopping"
	Stopped   Phase = "stopped"
	Exited    Phase = "exited"
	Deleting  Phase = "deleting"
	Deleted   Phase = "deleted"
	Failed    Phase = "failed"
	Held      Phase = "held"
	// Suspended: the back-end keeps the instance paused (its processes
	// frozen, its resources held) until it is resumed. It is neither failed
	// nor lost: nothing restarts it.
	Suspended Phase = "suspended"
)

// Phases lists every phase.
var Phases = []Phase{Pending, Scheduled, Creating, Running, Stopping, Stopped, Exited, Deleting, Deleted, Failed, Held, Suspended}

// Valid reports whether p is a known phase.
func (p Phase) Valid() bool { return slices.Contains(Phases, p) }

// Terminal reports whether no more work will happen for the instance
// unless a user asks (deleted, or failed with nothing left in the back-end).
func (p Phase) Terminal() bool { return p == Deleted || p == Failed }

// HoldsNode reports whether an instance in phase p is counted on its node:
// it has been placed and its back-end resource may exist.
func (p Phase) HoldsNode() bool {
	switch p {
	case Scheduled, Creating, Running, Stopping, Stopped, Exited, Deleting, Held, Suspended:
		return true
	}
	return false
}

// Ref names one back-end resource: a stale copy of an instance that must be
// deleted once its node answers again.
type Ref struct {
	Provider  string `json:"provider"`
	Node      string `json:"node,omitempty"`
	BackendID string `json:"backend_id"`
}

// Instance is Berth's record of one instance, stored as JSON under
// /berth/instances/<id>.
type Instance struct {
	ID       string `json:"id"`
	Name     string `json:"name,omitempty"`
	Provider string `json:"provider,omitempty"`
	Node     string `json:"node,omitempty"`
	// Spec is what the instance runs. The instances of one request share
	// one Spec: it is never changed in place; a change (a resize) gives
	// the instance a changed copy. A nil Spec reads as the zero Spec.
	Spec  *driver.Spec `json:"spec"`
	Phase Phase        `json:"phase"`
	// HostPorts are the host ports the scheduler chose for the spec's
	// published "any port" ports, in order.
	HostPorts []int `json:"host_ports,omitempty"`
	// BackendID is the back-end's id of the resource; empty until the
	// back-end reports it.
	BackendID string `json:"backend_id,omitempty"`
	// Observed is what the back-end showed of the instance when last seen.
	Observed *Seen  `json:"observed,omitempty"`
	Owner    string `json:"owner,omitempty"`
	Pool     string `json:"pool,omitempty"`
	Label    string `json:"label,omitempty"`
	Group    string `json:"group,omitempty"`
	// Request is the id of the request the instance came from; the request
	// is kept under /berth/requests/<id> for placing it again.
	Request  string `json:"request,omitempty"`
	Priority int    `json:"priority,omitempty"`
	// Attempts counts failed create attempts (quota refusals and creates
	// the provider refused without trying them excluded).
	Attempts int `json:"attempts"`
	// Incarnation counts the times the instance was placed again after its
	// node or its back-end lost it; copies get distinct back-end names.
	Incarnation int `json:"incarnation,omitempty"`
	// Message says why the instance is pending, failed, or what last went
	// wrong.
	Message string `json:"message,omitempty"`
	// After is the phase a deleting instance takes once the back-end
	// resource is gone: deleted, pending (a retry) or failed.
	After Phase `json:"after,omitempty"`
	// Want is what a user asked of the instance that its phase cannot
	// take yet (see Verb): stopped or suspended (asked before the
	// instance exists; done once it is created), or running (a start of
	// a stopping instance; done once it has stopped). Empty: nothing is
	// waiting.
	Want Phase `json:"want,omitempty"`
	// Exclude lists nodes ("provider/node") not to place the instance on
	// again: nodes that went offline under it, refused a create with a
	// retryable error or lacked capacity. The
	// exclusions last until ExcludeUntil; each new one moves it to a full
	// Machine.ExcludeFor from then, and Step drops them all once it has
	// passed (a record with exclusions but no expiry drops them at once).
	Exclude      []string  `json:"exclude,omitempty"`
	ExcludeUntil time.Time `json:"exclude_until,omitzero"`
	// Refused lists the nodes ("provider/node") that refused to create the
	// instance for good (an image they lack, a spec their engine
	// refuses), each with its reason ("provider/node: reason"). The
	// instance is never placed on them again; once every node that fits
	// has refused it, it fails.
	Refused []string `json:"refused,omitempty"`
	// Stale are older copies of the instance on nodes that went offline;
	// they are deleted as soon as their node answers (Swarm's lesson: no
	// duplicate survives).
	Stale []Ref `json:"stale,omitempty"`
	// Deadline is the launch deadline while creating, the hold's expiry
	// while held, and the earliest next attempt while pending or deleting.
	Deadline time.Time `json:"deadline,omitzero"`
	Created  time.Time `json:"created"`
	Updated  time.Time `json:"updated"`
	// Revision is the store revision of the record as read; it is not
	// stored.
	Revision int64 `json:"revision"`
}

// Seen is what a back-end showed of an instance: its driver.Instance
// without what the record holds already (the back-end's id, the name, the
// node, the image, Berth's tags and the spec's labels).
type Seen struct {
	State     driver.State         `json:"state"`
	RawState  string               `json:"raw_state,omitempty"`
	Message   string               `json:"message,omitempty"`
	ExitCode  *int                 `json:"exit_code,omitempty"`
	Addresses []string             `json:"addresses,omitempty"`
	Ports     []driver.PortMapping `json:"ports,omitempty"`
	Resources driver.Resources     `json:"resources,omitzero"`
	Started   time.Time            `json:"started,omitzero"`
	Finished  time.Time            `json:"finished,omitzero"`
}

// SeenOf returns what in shows of an instance, or nil for nil.
func SeenOf(in *driver.Instance) *Seen {
	if in == nil {
		return nil
	}
	return &Seen{State: in.State, RawState: in.RawState, Message: in.Message, ExitCode: in.ExitCode,
		Addresses: in.Addresses, Ports: in.Ports, Resources: in.Resources, Started: in.Started, Finished: in.Finished}
}

// BackendName returns the name the back-end resource of in is created
// with: the instance's name, with the incarnation appended once the
// instance has been placed again, so that a stale copy that still holds the
// name cannot block its replacement.
func (in *Instance) BackendName() string {
	if in.Incarnation == 0 {
		return in.Name
	}
	return fmt.Sprintf("%s.%d", in.Name, in.Incarnation)
}

// NodeID returns "provider/node", the id answers and exclusions use.
func NodeID(provider, node string) string { return provider + "/" + node }

// Restarts reports whether the instance's restart policy asks for it to be
// run again when it is lost. Members of a group are placed again when
// their node goes offline whatever their policy: the group needs them.
func (in *Instance) Restarts() bool {
	if in.Spec == nil {
		return false
	}
	switch in.Spec.RestartPolicy.Name {
	case "always", "on-failure", "unless-stopped":
		return true
	}
	return false
}

// EventKind names an input of Step.
type EventKind string

// Event kinds.
const (
	// Tick: time has passed; deadlines are checked.
	Tick EventKind = "tick"
	// Resume: the reconciler (re)started and no operation of this instance is
	// in flight; interrupted work is started again.
	Resume EventKind = "resume"
	// Placed: the scheduler chose Provider and Node.
	Placed EventKind = "placed"
	// Unplaceable: no node fits now; Message says why.
	Unplaceable EventKind = "unplaceable"
	// Refused: a pending instance cannot be placed but on nodes that
	// refused it for good (Instance.Refused); it fails with Message.
	Refused EventKind = "refused"
	// Created: the create finished; Instance is the back-end's instance.
	Created EventKind = "created"
	// Progress: the create reported the back-end id (Instance) before
	// finishing.
	Progress EventKind = "progress"
	// CreateFailed: the create failed with Err. Provider and Node, when
	// set, name the node the create was for: the outcome of a create for
	// another node (one that arrived after the instance moved) is ignored.
	CreateFailed EventKind = "create-failed"
	// NameTaken: the back-end refused the create because the instance's
	// back-end name is held by a resource it cannot show (what a crash in
	// the middle of a create may leave); the next attempt uses the next
	// incarnation's name. It counts as an attempt.
	NameTaken EventKind = "name-taken"
	// Abandoned: a create interrupted by a crash left Instance (nil when
	// nothing) broken; it is deleted and the launch retried, not counted as
	// an attempt.
	Abandoned EventKind = "abandoned"
	// Gone: the delete finished (or the resource was already gone).
	Gone EventKind = "gone"
	// DeleteFailed: the delete failed with Err; it is tried again.
	DeleteFailed EventKind = "delete-failed"
	// Observed: a listing of the back-end shows Instance, or (nil) that the
	// resource Ref.BackendID (when set) no longer exists.
	Observed EventKind = "observed"
	// NodeOffline: the node Provider/Node stopped answering. An instance
	// that is not (or no longer) on that node ignores it.
	NodeOffline EventKind = "node-offline"
	// StaleGone: the stale copy Ref is deleted.
	StaleGone EventKind = "stale-gone"
	// DeleteRequested: a user asked to delete the instance.
	DeleteRequested EventKind = "delete"
	// StopRequested, Stopped, StartRequested, Started: a user's stop and start,
	// and their completion. StopFailed/StartFailed carry Err.
	StopRequested  EventKind = "stop"
	StopDone       EventKind = "stopped"
	StopFailed     EventKind = "stop-failed"
	StartRequested EventKind = "start"
	StartDone      EventKind = "started"
	StartFailed    EventKind = "start-failed"
	// RestartRequested, SuspendRequested, ResumeRequested: a user's
	// restart, suspend and resume of an instance whose back-end resource
	// cannot take them now (see requested); the caller makes the
	// back-end call itself for one that can. SuspendFailed carries Err.
	RestartRequested EventKind = "restart"
	SuspendRequested EventKind = "suspend"
	ResumeRequested  EventKind = "unsuspend"
	SuspendFailed    EventKind = "suspend-failed"
	// Hold: keep the instance until Until, then delete it.
	Hold EventKind = "hold"
	// SuspendDone, ResumeDone: a user's suspend of a running instance, and
	// resume of a suspended one, took effect in the back-end. (Resume,
	// above, is the reconciler's restart, not this.)
	SuspendDone EventKind = "suspended"
	ResumeDone  EventKind = "resumed"
)

// Event is one input of Step.
type Event struct {
	Kind     EventKind
	Provider string
	Node     string
	Instance *driver.Instance
	Err      error
	Message  string
	Ref      Ref
	Until    time.Time
	// Ports are the host ports chosen with a placement.
	Ports []int
}

// ActionKind names an output of Step.
type ActionKind string

// Action kinds.
const (
	// Place: ask the scheduler for a node.
	Place ActionKind = "place"
	// Create: start the back-end create. When Adopt is set an earlier
	// attempt may have created the resource: look it up by the instance's
	// tag first and adopt it instead of creating a second copy.
	Create ActionKind = "create"
	// Cancel: abandon the create operation in flight.
	Cancel ActionKind = "cancel"
	// Delete: delete the back-end resource — BackendID, or when unknown,
	// everything tagged with the instance's id.
	Delete ActionKind = "delete"
	// DeleteStale: delete the Stale copies.
	DeleteStale ActionKind = "delete-stale"
	// Stop, Start, Suspend: call the back-end.
	Stop    ActionKind = "stop"
	Start   ActionKind = "start"
	Suspend ActionKind = "suspend"
	// Release: the instance no longer holds its node; the scheduler's
	// reservation is released.
	Release ActionKind = "release"
	// Wake: tick the instance again at At.
	Wake ActionKind = "wake"
)

// Action is one output of Step, performed by the caller after the instance
// returned with it is stored.
type Action struct {
	Kind  ActionKind
	Adopt bool
	At    time.Time
}

func (a Action) String() string {
	switch {
	case a.Kind == Create && a.Adopt:
		return "create+adopt"
	case a.Kind == Wake:
		return "wake"
	}
	return string(a.Kind)
}

// Machine holds the knobs of the lifecycle. The zero value is usable: each
// zero field takes its default.
type Machine struct {
	// LaunchTimeout bounds one create attempt; default 5m.
	LaunchTimeout time.Duration
	// MaxAttempts is the number of counted create failures after which the
	// instance fails; default 3. Quota refusals and a retryable refusal by
	// a node the instance does not exclude yet are not counted.
	MaxAttempts int
	// Backoff is the wait before the first retry; it doubles per attempt up
	// to MaxBackoff. Default 1s.
	Backoff time.Duration
	// MaxBackoff caps Backoff; default 1m.
	MaxBackoff time.Duration
	// ExcludeFor is how long a node stays excluded for an instance after
	// it went offline under it, refused its create with a retryable error
	// or lacked capacity; default 10m.
	ExcludeFor time.Duration
	// MaxRefusals is how many nodes may refuse to create an instance for
	// good (driver.ErrPermanent, ErrUnsupported or ErrNotFound from a
	// create on that node) before it fails; each refusal places it again
	// elsewhere. Default 5.
	MaxRefusals int
}

func (m Machine) excludeFor() time.Duration {
	if m.ExcludeFor > 0 {
		return m.ExcludeFor
	}
	return 10 * time.Minute
}

// maxRefusals is how many nodes may refuse an instance for good before it
// fails: the failover budget (MaxRefusals, default 5).
func (m Machine) maxRefusals() int {
	if m.MaxRefusals > 0 {
		return m.MaxRefusals
	}
	return 5
}

// RefusedNodes returns the nodes ("provider/node") that refused in for good.
func (in *Instance) RefusedNodes() []string {
	out := make([]string, len(in.Refused))
	for i, r := range in.Refused {
		out[i], _, _ = strings.Cut(r, ": ")
	}
	return out
}

// exclude excludes the instance's node until ExcludeFor from now.
func (m Machine) exclude(in *Instance, now time.Time) {
	in.Exclude = appendUnique(in.Exclude, NodeID(in.Provider, in.Node))
	in.ExcludeUntil = now.Add(m.excludeFor())
}

// Excluded returns the nodes ("provider/node") in must still avoid at now:
// Exclude, or nothing once ExcludeUntil has passed.
func (in *Instance) Excluded(now time.Time) []string {
	if len(in.Exclude) == 0 || !now.Before(in.ExcludeUntil) {
		return nil
	}
	return in.Exclude
}

func (m Machine) launchTimeout() time.Duration {
	if m.LaunchTimeout > 0 {
		return m.LaunchTimeout
	}
	return 5 * time.Minute
}

func (m Machine) maxAttempts() int {
	if m.MaxAttempts > 0 {
		return m.MaxAttempts
	}
	return 3
}

func (m Machine) backoff(attempt int) time.Duration {
	b, ceiling := m.Backoff, m.MaxBackoff
	if b <= 0 {
		b = time.Second
	}
	if ceiling <= 0 {
		ceiling = time.Minute
	}
	for i := 1; i < attempt && b < ceiling; i++ {
		b *= 2
	}
	return min(b, ceiling)
}

// Step applies ev to in at time now and returns the new instance and the
// actions to perform once it is stored. It does no I/O; an event that does
// not apply to the instance's phase returns it unchanged with no action.
func (m Machine) Step(in Instance, ev Event, now time.Time) (Instance, []Action) {
	out := in
	out.Exclude = slices.Clone(in.Exclude)
	out.Stale = slices.Clone(in.Stale)
	out.Refused = slices.Clone(in.Refused)
	if len(out.Exclude) > 0 && !now.Before(out.ExcludeUntil) {
		out.Exclude, out.ExcludeUntil = nil, time.Time{}
	}
	acts := m.step(&out, ev, now)
	if in.Phase.HoldsNode() && !out.Phase.HoldsNode() {
		acts = append([]Action{{Kind: Release}}, acts...)
	}
	if Changed(in, out) {
		out.Updated = now
	}
	return out, acts
}

// Changed reports whether b differs from a in anything worth storing.
func Changed(a, b Instance) bool {
	return a.Phase != b.Phase || a.Provider != b.Provider || a.Node != b.Node ||
		a.BackendID != b.BackendID || a.Attempts != b.Attempts || a.Incarnation != b.Incarnation || a.Message != b.Message ||
		a.After != b.After || a.Want != b.Want || !a.Deadline.Equal(b.Deadline) || !slices.Equal(a.Exclude, b.Exclude) || !a.ExcludeUntil.Equal(b.ExcludeUntil) ||
		!slices.Equal(a.Stale, b.Stale) || !slices.Equal(a.Refused, b.Refused) || a.Observed != b.Observed || !slices.Equal(a.HostPorts, b.HostPorts)
}

// Step applies ev with the default Machine.
func Step(in Instance, ev Event, now time.Time) (Instance, []Action) {
	return Machine{}.Step(in, ev, now)
}

func (m Machine) step(in *Instance, ev Event, now time.Time) []Action {
	switch ev.Kind {
	case DeleteRequested:
		return m.deleteRequested(in, now)
	case StopRequested, StartRequested, RestartRequested, SuspendRequested, ResumeRequested:
		return m.requested(in, ev, now)
	case StaleGone:
		in.Stale = slices.DeleteFunc(in.Stale, func(r Ref) bool { return r == ev.Ref })
		return nil
	case Hold:
		if in.Phase == Running || in.Phase == Held {
			in.Phase, in.Deadline = Held, ev.Until
			in.Message = "held until " + ev.Until.UTC().Format(time.RFC3339)
			return []Action{{Kind: Wake, At: ev.Until}}
		}
		return nil
	}
	var acts []Action
	// Stale copies go on every tick, and as soon as the instance's new copy
	// is up (its placement and launch need no tick of their own).
	if len(in.Stale) > 0 && (ev.Kind == Tick || ev.Kind == Resume || ev.Kind == Created) {
		acts = append(acts, Action{Kind: DeleteStale})
	}
	switch in.Phase {
	case Pending:
		acts = append(acts, m.pending(in, ev, now)...)
	case Scheduled:
		if ev.Kind == Tick || ev.Kind == Resume {
			acts = append(acts, m.launch(in, now, false)...)
		}
	case Creating:
		acts = append(acts, m.creating(in, ev, now)...)
	case Running, Stopped, Exited, Held, Suspended:
		acts = append(acts, m.live(in, ev, now)...)
	case Stopping:
		acts = append(acts, m.stopping(in, ev)...)
	case Deleting:
		acts = append(acts, m.deleting(in, ev, now)...)
	case Failed:
		if ev.Kind == Observed && ev.Instance != nil && ev.Instance.ID == in.BackendID {
			in.Observed = SeenOf(ev.Instance)
		}
	}
	return acts
}

func (m Machine) pending(in *Instance, ev Event, now time.Time) []Action {
	switch ev.Kind {
	case Tick, Resume:
		if now.Before(in.Deadline) {
			return []Action{{Kind: Wake, At: in.Deadline}}
		}
		return []Action{{Kind: Place}}
	case Placed:
		in.Phase, in.Provider, in.Node, in.HostPorts = Scheduled, ev.Provider, ev.Node, slices.Clone(ev.Ports)
		in.Message, in.Deadline, in.BackendID, in.Observed = "", time.Time{}, "", nil
		return m.launch(in, now, false)
	case Unplaceable:
		in.Message = ev.Message
	case Refused:
		// Every node that fits refused the instance for good.
		in.Message = ev.Message
		return m.fail(in, now, false)
	}
	return nil
}

// launch moves a scheduled instance to creating.
func (m Machine) launch(in *Instance, now time.Time, adopt bool) []Action {
	in.Phase = Creating
	in.Deadline = now.Add(m.launchTimeout())
	return []Action{{Kind: Create, Adopt: adopt}, {Kind: Wake, At: in.Deadline}}
}

func (m Machine) creating(in *Instance, ev Event, now time.Time) []Action {
	switch ev.Kind {
	case Resume:
		// The operation died with the previous reconciler; the resource may
		// exist, so look it up before creating.
		in.Deadline = now.Add(m.launchTimeout())
		return []Action{{Kind: Create, Adopt: true}, {Kind: Wake, At: in.Deadline}}
	case Tick:
		if !now.Before(in.Deadline) {
			return append([]Action{{Kind: Cancel}}, m.launchFailed(in, driver.Errorf(driver.ErrTimeout, "launch did not finish within %s", m.launchTimeout()), now)...)
		}
		return []Action{{Kind: Wake, At: in.Deadline}}
	case Progress:
		if ev.Instance != nil && ev.Instance.ID != "" {
			in.BackendID = ev.Instance.ID
		}
	case Created:
		if ev.Instance != nil {
			in.BackendID = ev.Instance.ID
			in.Observed = SeenOf(ev.Instance)
			if ev.Instance.Node != "" {
				in.Node = ev.Instance.Node
			}
		}
		in.Phase, in.Message, in.Deadline = Running, "", time.Time{}
		if ev.Instance != nil {
			m.observe(in, ev.Instance)
		}
		return m.wanted(in)
	case CreateFailed:
		if ev.Node != "" && !onNode(in, ev) {
			return nil
		}
		if ev.Instance != nil && ev.Instance.ID != "" {
			in.BackendID = ev.Instance.ID
		}
		if acts, ok := m.notAttempted(in, ev.Err, now); ok {
			return acts
		}
		if acts, ok := m.retryElsewhere(in, ev.Err, now); ok {
			return acts
		}
		return m.launchFailed(in, ev.Err, now)
	case NameTaken:
		in.Incarnation++
		return m.launchFailed(in, ev.Err, now)
	case Abandoned:
		if ev.Instance != nil && ev.Instance.ID != "" {
			in.BackendID = ev.Instance.ID
		}
		in.Message = "an interrupted launch left a broken copy; launching again"
		return m.requeue(in, now, in.BackendID != "", 0)
	case NodeOffline:
		return m.nodeOffline(in, ev, now)
	}
	return nil
}

// launchFailed maps a create error to exactly one action per error class.
func (m Machine) launchFailed(in *Instance, err error, now time.Time) []Action {
	kind := driver.ClassOf(err)
	msg := fmt.Sprint(err)
	// mayExist: the resource may have been created in part.
	mayExist := in.BackendID != "" || kind == driver.ErrTimeout || kind == nil
	switch {
	case kind == driver.ErrQuotaExceeded:
		// Nodepool: abort and requeue; not a failure of the request.
		in.Message = "waiting for quota: " + msg
		return m.requeue(in, now, mayExist, m.backoff(1))
	case (kind == driver.ErrPermanent || kind == driver.ErrUnsupported || kind == driver.ErrNotFound) &&
		in.Node != "" && len(in.Refused) < m.maxRefusals():
		// Specific to this node (an image it lacks, a spec its engine
		// refuses): place the instance elsewhere, never here again.
		in.Refused = append(in.Refused, NodeID(in.Provider, in.Node)+": "+msg)
		in.Message = fmt.Sprintf("node %s refused the create for good, placing the instance elsewhere: %s", in.Node, msg)
		return m.requeue(in, now, mayExist, 0)
	case kind == driver.ErrPermanent || kind == driver.ErrInvalid || kind == driver.ErrUnsupported ||
		kind == driver.ErrNotFound || kind == driver.ErrNotSuspended:
		in.Message = msg
		if len(in.Refused) > 0 {
			in.Message = fmt.Sprintf("%d nodes refused it: %s", len(in.Refused)+1, strings.Join(append(slices.Clone(in.Refused), NodeID(in.Provider, in.Node)+": "+msg), "; "))
		}
		return m.fail(in, now, mayExist)
	}
	// Retryable (on a node already excluded: see retryElsewhere),
	// insufficient capacity, timeout, already exists, delete failed and
	// unclassified errors are counted attempts.
	in.Attempts++
	if kind == driver.ErrInsufficientCapacity && in.Node != "" {
		m.exclude(in, now)
	}
	if in.Attempts >= m.maxAttempts() {
		in.Message = fmt.Sprintf("failed after %d attempts: %s", in.Attempts, msg)
		return m.fail(in, now, mayExist)
	}
	in.Message = fmt.Sprintf("attempt %d failed, retrying: %s", in.Attempts, msg)
	return m.requeue(in, now, mayExist, m.backoff(in.Attempts))
}

// notAttempted requeues the instance after a create the provider refused
// without passing it on (a *driver.NotAttemptedError: its circuit breaker
// is open): the request was never tried, so, like a quota refusal, it is
// not counted. The instance waits in pending until the provider lets calls
// through again (at least Backoff), its message saying why and until when.
// ok is false when err is not such a refusal.
func (m Machine) notAttempted(in *Instance, err error, now time.Time) (acts []Action, ok bool) {
	na, ok := errors.AsType[*driver.NotAttemptedError](err)
	if !ok {
		return nil, false
	}
	wait := max(na.Until.Sub(now), m.backoff(1))
	in.Message = fmt.Sprintf("waiting until %s, provider %s did not attempt the create: %v",
		now.Add(wait).UTC().Format(time.RFC3339), in.Provider, err)
	return m.requeue(in, now, in.BackendID != "", wait), true
}

// retryElsewhere requeues the instance after a retryable create failure
// (Zoe) on a node it does not avoid yet: the node is excluded for
// ExcludeFor and the failure is not counted, so that a node that stopped
// answering does not use up the attempts while another can take the
// instance. Once the instance is back on an excluded node (the scheduler
// found no other), its failures count again. ok is false when the failure
// is for launchFailed.
func (m Machine) retryElsewhere(in *Instance, err error, now time.Time) (acts []Action, ok bool) {
	if driver.ClassOf(err) != driver.ErrRetryable || in.Node == "" || slices.Contains(in.Exclude, NodeID(in.Provider, in.Node)) {
		return nil, false
	}
	m.exclude(in, now)
	in.Message = fmt.Sprintf("node %s refused the create, placing the instance elsewhere: %s", in.Node, err)
	return m.requeue(in, now, in.BackendID != "", m.backoff(1)), true
}

// requeue sends the instance back to pending, deleting a partial resource
// first.
func (m Machine) requeue(in *Instance, now time.Time, mayExist bool, wait time.Duration) []Action {
	if mayExist {
		in.Phase, in.After, in.Deadline = Deleting, Pending, time.Time{}
		return []Action{{Kind: Delete}}
	}
	in.toPending(now.Add(wait))
	return []Action{{Kind: Wake, At: in.Deadline}}
}

func (in *Instance) toPending(notBefore time.Time) {
	in.Phase, in.After, in.Deadline = Pending, "", notBefore
	in.Provider, in.Node, in.BackendID, in.Observed, in.HostPorts = "", "", "", nil, nil
}

// fail fails the instance, deleting a partial resource first.
func (m Machine) fail(in *Instance, now time.Time, mayExist bool) []Action {
	if mayExist {
		in.Phase, in.After, in.Deadline = Deleting, Failed, time.Time{}
		return []Action{{Kind: Delete}}
	}
	in.Phase, in.Deadline = Failed, time.Time{}
	return nil
}

// live handles running, stopped, exited, held and suspended instances.
func (m Machine) live(in *Instance, ev Event, now time.Time) []Action {
	switch ev.Kind {
	case Tick, Resume:
		if in.Phase == Held && !in.Deadline.IsZero() {
			if !now.Before(in.Deadline) {
				in.Phase, in.After, in.Deadline, in.Message = Deleting, Deleted, time.Time{}, "hold expired"
				return []Action{{Kind: Delete}}
			}
			return []Action{{Kind: Wake, At: in.Deadline}}
		}
	case Observed:
		if ev.Instance == nil {
			if ev.Ref.BackendID != "" && ev.Ref.BackendID != in.BackendID {
				// About a copy the instance no longer uses.
				return nil
			}
			if in.Restarts() {
				in.Message = "the back-end lost the instance; placing it again"
				in.Incarnation++
				in.toPending(now)
				return []Action{{Kind: Place}}
			}
			in.Phase, in.Message = Failed, "the back-end lost the instance"
			in.BackendID, in.Observed = "", nil
			return nil
		}
		if ev.Instance.ID != in.BackendID {
			return nil
		}
		in.Observed = SeenOf(ev.Instance)
		m.observe(in, ev.Instance)
	case NodeOffline:
		return m.nodeOffline(in, ev, now)
	case StartDone:
		in.Phase, in.Message = Running, ""
		in.Observed = seenAs(in.Observed, driver.StateRunning)
	case StartFailed:
		in.Message = fmt.Sprint("start failed: ", ev.Err)
	case SuspendDone:
		if in.Phase == Running {
			in.Phase, in.Message = Suspended, ""
			in.Observed = seenAs(in.Observed, driver.StateSuspended)
		}
	case ResumeDone:
		if in.Phase == Suspended {
			in.Phase, in.Message = Running, ""
			in.Observed = seenAs(in.Observed, driver.StateRunning)
		}
	case SuspendFailed:
		in.Message = fmt.Sprint("suspend failed: ", ev.Err)
	}
	return nil
}

// seenAs returns a copy of obs in state st: what the back-end shows once a
// change the plane made has taken effect, so that the next listing that
// shows the same is no change.
func seenAs(obs *Seen, st driver.State) *Seen {
	out := &Seen{}
	if obs != nil {
		*out = *obs
	}
	out.State, out.RawState = st, ""
	return out
}

// observe maps the back-end's state onto the phase of a live instance. A
// held instance stays held whatever the back-end shows, until its expiry.
func (m Machine) observe(in *Instance, obs *driver.Instance) {
	if in.Phase == Held {
		return
	}
	switch obs.State {
	case driver.StateRunning:
		in.Phase = Running
	case driver.StateSuspended:
		in.Phase = Suspended
	case driver.StateStopped:
		in.Phase = Stopped
	case driver.StateExited:
		in.Phase = Exited
	case driver.StateFailed:
		in.Phase = Failed
		in.Message = obs.Message
	}
}

// onNode reports whether in is on the node ev names.
func onNode(in *Instance, ev Event) bool {
	return in.Node != "" && in.Provider == ev.Provider && in.Node == ev.Node
}

func (m Machine) nodeOffline(in *Instance, ev Event, now time.Time) []Action {
	if !onNode(in, ev) {
		return nil
	}
	where, wasCreating := in.Node, in.Phase == Creating
	if !in.Restarts() && in.Group == "" {
		in.Message = fmt.Sprintf("node %s is offline", where)
		return nil
	}
	if in.BackendID != "" || wasCreating {
		in.Stale = append(in.Stale, Ref{Provider: in.Provider, Node: in.Node, BackendID: in.BackendID})
	}
	m.exclude(in, now)
	in.Message = fmt.Sprintf("node %s went offline; placing the instance again", where)
	in.Incarnation++
	in.toPending(now)
	acts := []Action{{Kind: Place}}
	if wasCreating {
		acts = append([]Action{{Kind: Cancel}}, acts...)
	}
	return acts
}

func (m Machine) stopping(in *Instance, ev Event) []Action {
	switch ev.Kind {
	case Resume:
		return []Action{{Kind: Stop}}
	case StopDone:
		in.Phase = Stopped
		if in.Want == Running {
			// Started while it stopped.
			in.Want = ""
			return []Action{{Kind: Start}}
		}
	case StopFailed:
		in.Phase, in.Message, in.Want = Running, fmt.Sprint("stop failed: ", ev.Err), ""
	case Observed:
		if ev.Instance == nil {
			in.Phase, in.Message, in.BackendID, in.Observed = Failed, "the back-end lost the instance", "", nil
		}
	}
	return nil
}

func (m Machine) deleting(in *Instance, ev Event, now time.Time) []Action {
	switch ev.Kind {
	case Resume:
		return []Action{{Kind: Delete}}
	case Tick:
		if !now.Before(in.Deadline) {
			return []Action{{Kind: Delete}}
		}
		return []Action{{Kind: Wake, At: in.Deadline}}
	case Gone:
		after := in.After
		if after == "" {
			after = Deleted
		}
		in.After, in.Deadline, in.Observed = "", time.Time{}, nil
		switch after {
		case Pending:
			in.toPending(now.Add(m.backoff(max(in.Attempts, 1))))
			return []Action{{Kind: Wake, At: in.Deadline}}
		default:
			in.Phase, in.BackendID = after, ""
		}
	case NodeOffline:
		if in.After != Pending || !onNode(in, ev) {
			return nil
		}
		// A retry's cleanup cannot reach the partial copy: the copy becomes
		// stale, deleted when its node answers again, and the instance is
		// placed again now.
		where := in.Node
		in.Stale = append(in.Stale, Ref{Provider: in.Provider, Node: in.Node, BackendID: in.BackendID})
		m.exclude(in, now)
		in.Message = fmt.Sprintf("node %s went offline before the failed copy was deleted; placing the instance again", where)
		in.Incarnation++
		in.toPending(now)
		return []Action{{Kind: Place}}
	case DeleteFailed:
		in.Message = fmt.Sprint("delete failed, retrying: ", ev.Err)
		in.Deadline = now.Add(m.backoff(2))
		return []Action{{Kind: Wake, At: in.Deadline}}
	}
	return nil
}

func (m Machine) deleteRequested(in *Instance, now time.Time) []Action {
	if in.Phase != Deleted {
		in.Want = ""
	}
	switch in.Phase {
	case Deleted:
		return nil
	case Pending, Scheduled:
		// A scheduled instance has not reached the back-end: the move to
		// creating is stored before any create is made.
		in.Phase, in.Message, in.Deadline = Deleted, "deleted on request", time.Time{}
		in.BackendID, in.Observed = "", nil
		return nil
	case Failed:
		if in.BackendID == "" {
			in.Phase, in.Message = Deleted, "deleted on request"
			return nil
		}
	case Deleting:
		in.After, in.Message = Deleted, "deleted on request"
		return nil
	}
	acts := []Action{{Kind: Delete}}
	if in.Phase == Creating {
		acts = append([]Action{{Kind: Cancel}}, acts...)
	}
	in.Phase, in.After, in.Deadline, in.Message = Deleting, Deleted, time.Time{}, "deleted on request"
	return acts
}

func appendUnique(s []string, v string) []string {
	if slices.Contains(s, v) {
		return s
	}
	return append(s, v)
}
