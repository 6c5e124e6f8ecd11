package reconciler

import (
	"time"

	"github.com/berth-dev/berth/driver"
)

// Verb is what a user asks of an instance. Every verb is accepted in every
// phase where it can mean something, and carried out when the instance
// can take it (Kubernetes' desired state, not a refusal for a transient
// phase):
//
//   - stop, kill: an instance not created yet (pending, scheduled,
//     creating, or deleting a failed attempt to place it again) records
//     Want stopped and is stopped once it exists; a running, held or
//     suspended one is stopped (killed) now. Where nothing runs or will
//     run (stopping, stopped, exited, failed, deleting, deleted) the verb
//     is satisfied already: it succeeds and changes nothing. A suspended
//     instance is resumed by the caller first (Step leaves it as it is).
//   - start, restart: an instance not created yet will run: the verb
//     cancels a stop or suspend asked before (Want); a stopping one
//     records Want running and is started once stopped; a stopped or
//     exited one is started, a running one restarted (start: satisfied);
//     a suspended one is resumed (start) or restarted; a failed one, or
//     one deleting on its way to failed, is created again.
//   - suspend: an instance not created yet records Want suspended; a
//     running one is suspended now; where nothing runs it is satisfied.
//   - resume: an instance not created yet cancels a suspend asked
//     before; a suspended one is resumed; a running or held one is
//     satisfied.
//   - delete: every phase (deleted: satisfied).
//
// Refusal says which verbs can never apply.
type Verb string

// Verbs.
const (
	VerbStop    Verb = "stop"
	VerbKill    Verb = "kill"
	VerbStart   Verb = "start"
	VerbRestart Verb = "restart"
	VerbSuspend Verb = "suspend"
	VerbResume  Verb = "resume"
	VerbDelete  Verb = "delete"
)

// Verbs lists every verb.
var Verbs = []Verb{VerbStop, VerbKill, VerbStart, VerbRestart, VerbSuspend, VerbResume, VerbDelete}

// Unborn reports whether in has no back-end resource yet but will have
// one: pending, scheduled, creating, or deleting what a failed attempt
// left before it is placed again. A verb for it is recorded (Want).
func (in *Instance) Unborn() bool {
	switch in.Phase {
	case Pending, Scheduled, Creating:
		return true
	case Deleting:
		return in.After == Pending
	}
	return false
}

// gone reports whether in is deleted or being deleted for good.
func (in *Instance) gone() bool {
	return in.Phase == Deleted || in.Phase == Deleting && in.After != Pending && in.After != Failed
}

// Refusal returns why verb v can never apply to in, naming its phase, or
// nil when v is accepted (done now, recorded for later, or satisfied
// already):
//   - start, restart, suspend and resume of an instance deleted or being
//     deleted (ErrInvalid);
//   - suspend of a held instance: it is kept as it runs until its hold
//     expires (ErrInvalid);
//   - resume of an instance that is not suspended and does not run:
//     stopping, stopped, exited or failed (ErrNotSuspended; start it).
func Refusal(in *Instance, v Verb) error {
	switch v {
	case VerbStart, VerbRestart, VerbSuspend, VerbResume:
		if in.gone() {
			return driver.Errorf(driver.ErrInvalid, "instance %s is %s: it cannot %s", in.ID, phaseOf(in), v)
		}
	}
	switch {
	case v == VerbSuspend && in.Phase == Held:
		return driver.Errorf(driver.ErrInvalid, "instance %s is held: it is kept as it runs until its hold expires, not suspended", in.ID)
	case v == VerbResume:
		switch in.Phase {
		case Stopping, Stopped, Exited, Failed, Deleting:
			if !in.Unborn() {
				return driver.Errorf(driver.ErrNotSuspended, "instance %s is %s, not suspended: start it instead", in.ID, phaseOf(in))
			}
		}
	}
	return nil
}

// phaseOf names in's phase for a message: "deleting" says where to.
func phaseOf(in *Instance) string {
	if in.Phase == Deleting && in.After != "" && in.After != Deleted {
		return "deleting (then " + string(in.After) + ")"
	}
	return string(in.Phase)
}

// requested steps a user's stop, start, restart, suspend or resume (see
// Verb). The back-end calls a verb makes at once (stop, start) are
// actions; the caller makes the others (restart, suspend and resume of an
// instance that exists) itself. An event that asks for what is done
// already changes nothing.
func (m Machine) requested(in *Instance, ev Event, now time.Time) []Action {
	if in.Unborn() {
		switch ev.Kind {
		case StopRequested:
			in.Want = Stopped
		case SuspendRequested:
			in.Want = Suspended
		case StartRequested, RestartRequested:
			in.Want = ""
		case ResumeRequested:
			if in.Want == Suspended {
				in.Want = ""
			}
		}
		return nil
	}
	switch ev.Kind {
	case StopRequested:
		switch in.Phase {
		case Running, Held:
			in.Phase, in.Message, in.Want = Stopping, "", ""
			return []Action{{Kind: Stop}}
		case Stopping:
			in.Want = ""
		}
	case StartRequested, RestartRequested:
		switch in.Phase {
		case Stopping:
			in.Want = Running
		case Stopped, Exited:
			if ev.Kind == StartRequested {
				in.Message = ""
				return []Action{{Kind: Start}}
			}
		case Failed:
			return m.recreate(in, now)
		case Deleting:
			if in.After == Failed {
				in.After, in.Attempts, in.Refused = Pending, 0, nil
				in.Message = "restarted on request: placing it again once the failed copy is deleted"
			}
		}
	}
	return nil
}

// wanted carries out what a user asked of an instance before it was
// created (Want), now that it is.
func (m Machine) wanted(in *Instance) []Action {
	want := in.Want
	in.Want = ""
	if in.Phase != Running {
		// It ended by itself: a stop is satisfied, and nothing runs to
		// suspend.
		return nil
	}
	switch want {
	case Stopped:
		in.Phase = Stopping
		return []Action{{Kind: Stop}}
	case Suspended:
		return []Action{{Kind: Suspend}}
	}
	return nil
}

// recreate places a failed instance again, on a user's start or restart:
// its copy (if the back-end still shows one) is deleted first, and its
// attempts and refusals start afresh.
func (m Machine) recreate(in *Instance, now time.Time) []Action {
	in.Attempts, in.Refused, in.Want = 0, nil, ""
	in.Message = "restarted on request: placing it again"
	if in.BackendID != "" {
		in.Phase, in.After, in.Deadline = Deleting, Pending, time.Time{}
		return []Action{{Kind: Delete}}
	}
	in.toPending(now)
	return []Action{{Kind: Place}}
}
