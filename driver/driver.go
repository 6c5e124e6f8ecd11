package driver

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"
)

// Driver is the required interface of a compute back-end. Implementations are
// safe for concurrent use. No method blocks longer than one round trip to the
// back-end; the long work of Create and Delete happens in the Operation they
// return.
type Driver interface {
	// State returns a fresh reading of every node (Zoe's platform_state):
	// capacity, what is reserved, live usage where known, images present.
	// A back-end with no per-node detail returns one node and sets Aggregated.
	State(ctx context.Context) (*PlatformState, error)

	// Create starts building an instance of spec on node and returns at once.
	// Validation failures return ErrInvalid immediately and nothing is
	// created. ctx bounds the whole operation, not only this call: cancelling
	// it abandons the operation, which then reports ErrTimeout. The driver
	// stores spec.Tags on the resource before (or atomically with) creating it,
	// so that List finds it even if the caller crashes mid-operation.
	// Failures the driver knows without asking the back-end (ErrInvalid,
	// ErrUnsupported, an unknown node, an offline node, a full node by its own
	// count) may come from Create itself or from the first Advance; callers
	// treat both alike. Whatever the back-end answers comes through Advance.
	// The caller must not change spec until the operation is over, and the
	// driver never changes it: callers share its maps and slices between
	// operations that run at once.
	Create(ctx context.Context, node string, spec *Spec) (Operation, error)

	// Delete starts removing the instance with back-end id id. An instance
	// that is already gone makes the operation finish with ErrNotFound, which
	// callers count as success. ctx bounds the operation as in Create.
	Delete(ctx context.Context, id string) (Operation, error)

	// Get returns the instance with back-end id id, or ErrNotFound.
	Get(ctx context.Context, id string) (*Instance, error)

	// Find returns the instance named name, or ErrNotFound.
	Find(ctx context.Context, name string) (*Instance, error)

	// List returns every instance whose tags include all of tags (and always
	// TagManaged). Resources without Berth's tags are never listed. Leak
	// cleanup relies on List seeing everything Create ever made. When some
	// nodes cannot be asked, List may return the instances of the others
	// with a *PartialListError naming the nodes it missed; otherwise a
	// non-nil error means the listing is void.
	List(ctx context.Context, tags map[string]string) ([]*Instance, error)

	// Close releases every goroutine and connection the driver holds. It is
	// called once; instances keep running.
	Close(ctx context.Context) error
}

// Operation is a create or delete in progress: a state machine that the
// caller drives (Nodepool's state-machine drivers).
type Operation interface {
	// Advance performs at most one short, non-blocking step (well under
	// 200 ms) and reports progress. Once it returns Done or an error the
	// operation is over and further calls repeat the same result. ctx bounds
	// only this call.
	Advance(ctx context.Context) (Progress, error)
}

// Progress is what one Advance reports.
type Progress struct {
	// Done is true when the operation has finished successfully.
	Done bool
	// Instance is the instance as far as it is known: after a create it is
	// complete; before that it may hold only the back-end id (Nodepool's
	// external id). It is nil after a delete.
	Instance *Instance
	// Wait hints how long to wait before the next Advance is worth making; 0
	// means as soon as the caller likes.
	Wait time.Duration
	// Queued says that nothing of the operation has reached the back-end
	// yet: it waits its turn in the driver (a bound on the calls in
	// flight). The caller's launch timeout does not count meanwhile.
	Queued bool
}

// Optional capabilities. Callers find them by type assertion; package
// provider applies the fallback named in each comment when a driver lacks one.

// ImageLister lists the images present on a node.
// Fallback: Node.Images from State.
type ImageLister interface {
	Images(ctx context.Context, node string) ([]Image, error)
}

// Preloader makes an image present on the given nodes (all nodes when nodes
// is empty), reporting progress through progress, which may be nil.
// Fallback: ErrUnsupported unless every node already has the image.
type Preloader interface {
	Preload(ctx context.Context, image string, nodes []string, progress func(PreloadProgress)) error
}

// Resizer changes the cpu and memory limits of a live instance (Zoe's
// update_service). Fields of r that are zero are left unchanged.
// Fallback: ErrUnsupported.
type Resizer interface {
	Resize(ctx context.Context, id string, r Resources) error
}

// Starter starts a stopped or exited instance. Starting a running instance
// is not an error.
// Fallback: ErrUnsupported.
type Starter interface {
	Start(ctx context.Context, id string) error
}

// Stopper stops an instance gracefully: a polite request, then a forced stop
// after grace. Stopping a stopped instance is not an error.
// Fallback: ErrUnsupported (never a delete).
type Stopper interface {
	Stop(ctx context.Context, id string, grace time.Duration) error
}

// Restarter restarts an instance; a stopped or exited one is started.
// Fallback: Stop then Start when the driver has both, else ErrUnsupported.
type Restarter interface {
	Restart(ctx context.Context, id string, grace time.Duration) error
}

// Killer sends a signal to an instance. Drivers read the signal with
// ParseSignal ("TERM", "SIGKILL", "9", ...); a bad one is ErrInvalid. An
// instance that is not running returns ErrPermanent: signalling it will
// never succeed.
// Fallback: KILL becomes Stop with zero grace; other signals ErrUnsupported.
type Killer interface {
	Kill(ctx context.Context, id string, signal string) error
}

// Suspender pauses and resumes an instance. Suspending a suspended instance
// is not an error; suspending one that is not running returns ErrPermanent.
// Resume on an instance that is not suspended returns ErrNotSuspended.
// Fallback: ErrUnsupported.
type Suspender interface {
	Suspend(ctx context.Context, id string) error
	Resume(ctx context.Context, id string) error
}

// LogReader copies an instance's output to stdout and stderr, each stream to
// its own writer, and returns when done (or, with Follow, when ctx ends or the
// instance ends).
// Fallback: ErrUnsupported.
type LogReader interface {
	Logs(ctx context.Context, id string, opts LogOptions, stdout, stderr io.Writer) error
}

// Attacher connects to the standard streams of an instance made with
// Spec.Stdin or Spec.TTY.
//
// Attach copies the instance's output to stdout and stderr (with a
// terminal, everything comes on stdout) and, when stdin is not nil, stdin
// to the instance's input, until the output ends (the instance ended) or
// ctx ends. It returns nil when the output ended and ctx's error when ctx
// ended. When stdin reaches its end the instance's input is closed (the
// instance reads end of file: the input of Spec.Stdin is open until the
// first attach with stdin ends it) and the output goes on. Attach reads
// stdin in a goroutine that may outlive the call until stdin's Read
// returns: the caller closes what stdin reads from once Attach returns.
// Attaching to an instance that has ended gives what Replay replays, and
// returns.
//
// ResizeTTY sets the size of the instance's terminal; an instance made
// without Spec.TTY is ErrInvalid.
//
// Fallback: ErrUnsupported; such a driver never has the features CapStdin
// and CapTTY (Features drops them), so placement never sends it a spec that
// asks for either.
type Attacher interface {
	Attach(ctx context.Context, id string, opts AttachOptions, stdin io.Reader, stdout, stderr io.Writer) error
	ResizeTTY(ctx context.Context, id string, size TTYSize) error
}

// AttachOptions qualify an Attach.
type AttachOptions struct {
	// Replay writes what the instance wrote before the attach ahead of
	// what it writes next, as far as the back-end keeps it (an instance
	// that started before the caller could attach loses nothing).
	Replay bool
}

// TTYSize is a terminal's size in characters.
type TTYSize struct {
	Rows uint16 `json:"rows"`
	Cols uint16 `json:"cols"`
}

// Execer runs a command inside a running instance, as docker exec does.
//
// Exec starts opts.Cmd in the instance id, with the instance's environment
// and opts.Env over it, as opts.User (the instance's user when empty), in
// opts.WorkDir (the instance's working directory when empty), on a
// terminal when opts.TTY. It copies the command's output to stdout and
// stderr (with a terminal, everything comes on stdout) and, when stdin is
// not nil, stdin to the command's input; the end of stdin closes that
// input (the command reads end of file) and the output goes on. Exec
// returns the command's exit code once the command has ended and its
// output is copied. A command the instance cannot start (no such
// executable, not executable) ends with exit code 127 or 126 and a
// message on stderr, as a shell's does. Exec reads stdin in a goroutine
// that may outlive the call until stdin's Read returns: the caller closes
// what stdin reads from once Exec returns.
//
// When ctx ends first, Exec returns ctx's error; the driver's documentation
// says whether the command is ended then (a back-end that cannot end it
// lets it run on). An instance that is not running is ErrPermanent; an
// empty Cmd, an Env entry without "=", and a Size or Resize without TTY
// are ErrInvalid.
//
// Fallback: ErrUnsupported.
type Execer interface {
	Exec(ctx context.Context, id string, opts ExecOptions, stdin io.Reader, stdout, stderr io.Writer) (exitCode int, err error)
}

// ExecOptions describe the command an Exec runs.
type ExecOptions struct {
	// Cmd is the command and its arguments; required.
	Cmd []string
	// Env holds NAME=value entries set over the instance's environment.
	Env []string
	// User is the user (name or id, optionally ":group") the command runs
	// as; empty means the instance's.
	User string
	// WorkDir is the working directory of the command; empty means the
	// instance's.
	WorkDir string
	// TTY runs the command on a terminal.
	TTY bool
	// Size is the terminal's size at the start (TTY only); zero leaves the
	// back-end's default.
	Size TTYSize
	// Resize delivers later sizes of the terminal (TTY only); nil sends
	// none. Exec stops reading it when it returns.
	Resize <-chan TTYSize
}

// Check reports the first malformed field of o as a *FieldError: an empty
// Cmd, an Env entry without a name and "=", a Size or Resize without TTY.
func (o *ExecOptions) Check() error {
	if len(o.Cmd) == 0 || o.Cmd[0] == "" {
		return &FieldError{Path: "cmd", Reason: "required: the command to run"}
	}
	for i, kv := range o.Env {
		if k, _, ok := strings.Cut(kv, "="); !ok || k == "" {
			return &FieldError{Path: fmt.Sprintf("env[%d]", i), Reason: "want NAME=value"}
		}
	}
	if !o.TTY && (o.Size != (TTYSize{}) || o.Resize != nil) {
		return &FieldError{Path: "tty", Reason: "a terminal size needs a terminal (tty)"}
	}
	return nil
}

// EventWatcher calls fn for every change in the back-end until ctx ends, and
// returns ctx's error then, or the error that broke the stream.
// Fallback: the caller polls List and reports the differences.
type EventWatcher interface {
	Watch(ctx context.Context, fn func(Event)) error
}

// Walker hands out the instances List would return one at a time, for
// back-ends with many of them: Walk calls fn for each instance List(ctx,
// tags) would return, in the same order, and ends with the error List
// would return (a *PartialListError included). The back-end need not build
// the whole listing, and fn owns each instance it is given. fn may run
// while the back-end holds its own locks: it must be quick and must not
// call the back-end. An error from fn ends the walk; Walk returns it.
// Fallback: List, then fn for each instance.
type Walker interface {
	Walk(ctx context.Context, tags map[string]string, fn func(*Instance) error) error
}

// Skimmer walks a listing at a glance, for callers that already know most
// instances and need the whole of few: Skim calls skim with the Glance of
// each instance List(ctx, tags) would return, in the same order, and fn
// with the whole instance (as Walk gives it) just after skim returns true
// for it. It ends with the error List would return (a *PartialListError
// included). A glance is valid only during skim. skim and fn follow fn's
// rules in Walk: quick, never calling the back-end; an error from fn ends
// the skim and Skim returns it.
// Fallback: Walk (or List), each instance's glance taken from it.
type Skimmer interface {
	Skim(ctx context.Context, tags map[string]string, skim func(*Glance) bool, fn func(*Instance) error) error
}

// Glance is what a caller that knows an instance needs to tell whether it
// changed: its id, the Berth instance it is tagged with, its state and
// exit code, as Instance has them.
type Glance struct {
	ID string
	// Instance is the value of the instance's TagInstance tag, "" when it
	// has none.
	Instance string
	State    State
	ExitCode *int
}

// UsageReporter measures one instance's live usage.
// Fallback: ErrUnsupported; node usage comes from State's InUse.
type UsageReporter interface {
	Usage(ctx context.Context, id string) (*Usage, error)
}

// ConsoleReader returns an instance's console output (a VM's serial log).
// Fallback: the last lines of Logs when the driver is a LogReader.
type ConsoleReader interface {
	Console(ctx context.Context, id string) (string, error)
}

// SpecChecker says, without touching the back-end, why it could never run
// spec: an error wrapping ErrUnsupported or ErrInvalid (a *FieldError
// naming the field) that holds on every node, whatever their state. The
// engine asks before it accepts a request, so that what a back-end cannot
// run is refused at submit rather than failing at create. A driver checks
// only what is specific to it; Spec.Validate has run already.
// Fallback: every valid spec is taken (and may fail at create).
type SpecChecker interface {
	CheckSpec(spec *Spec) error
}

// VolumeRemover removes the named volume name from node, where the
// instances that mounted it (Volume.Source) made it. A volume that is not
// there is not an error; one an instance of the back-end still uses is
// ErrPermanent, and stays.
// Fallback: ErrUnsupported.
type VolumeRemover interface {
	RemoveVolume(ctx context.Context, node, name string) error
}

// NetworkConnector puts an instance that exists on the back-end (running
// or not) on one more of the back-end's networks, or takes it off one,
// without making it again. ConnectNetwork makes the network on the
// instance's node when it is not there, as a create does for
// Spec.Networks, and gives the instance aliases there besides its name;
// an instance on the network already is not an error. DisconnectNetwork
// of a network the instance is not on is not an error; the network goes
// with its last instance, as after a Delete.
// Fallback: ErrUnsupported.
type NetworkConnector interface {
	ConnectNetwork(ctx context.Context, id, network string, aliases []string) error
	DisconnectNetwork(ctx context.Context, id, network string) error
}

// Renamer gives the back-end resource of an instance a new name (the
// name its create was given, Spec.Name), leaving everything else as it is;
// a name another resource of the back-end holds is ErrAlreadyExists.
// Fallback: ErrUnsupported.
type Renamer interface {
	Rename(ctx context.Context, id, name string) error
}

// Sweeper removes what the back-end made for its instances to share (the
// docker driver's networks) once no instance uses it: Sweep removes the
// shared resources tagged with all of tags (always TagManaged) that no
// instance of the back-end uses, and never one whose tags differ. The
// engine calls it after each complete listing of its cluster's instances,
// with the cluster's tag, so that what a crash or a removal by hand left
// behind goes; a driver removes what it shares on Delete too.
// Fallback: nothing is shared, nothing is swept.
type Sweeper interface {
	Sweep(ctx context.Context, tags map[string]string) error
}

// SharedBackend is implemented by a driver whose instances live in a
// back-end that every server opening the same options reaches (an engine,
// a cluster or hosts named by address), not in the server's own process
// or machine. A server that does not lead then reads an instance's logs
// and usage through its own copy of the driver instead of asking the
// leader. Only reads: a server that does not lead never changes a
// back-end.
// Capabilities names it (CapShared) when SharedBackend returns true.
// Fallback: false, the back-end is the process's own (sim, local), and
// such reads go to the leader.
type SharedBackend interface {
	SharedBackend() bool
}

// Capability names, as reported by Capabilities and required by placement
// constraints.
const (
	CapImages  = "images"
	CapPreload = "preload"
	CapResize  = "resize"
	CapStart   = "start"
	CapStop    = "stop"
	CapRestart = "restart"
	CapKill    = "kill"
	CapSuspend = "suspend"
	CapLogs    = "logs"
	CapEvents  = "events"
	CapUsage   = "usage"
	CapConsole = "console"
	CapAttach  = "attach"
	CapExec    = "exec"
	CapArchive = "archive"
	CapTop     = "top"
	// CapVolumeRemove: named volumes are removed (VolumeRemover).
	CapVolumeRemove = "volume-remove"
	// CapNetworkConnect: an instance joins and leaves networks where it
	// is (NetworkConnector).
	CapNetworkConnect = "network-connect"
	// CapRename: an instance's back-end resource takes a new name
	// (Renamer).
	CapRename = "rename"
	// CapShared: every server reaches the back-end's instances the same
	// (SharedBackend).
	CapShared = "shared-backend"
)

// Features: what a back-end can run, as declared by a FeatureReporter and
// required by placement from each spec (SpecFeatures). They are
// capabilities too: a provider lacking one a spec needs is never chosen for
// it, and a spec no provider has them for is refused at submit.
const (
	CapKindContainer = "kind:container"
	CapKindProcess   = "kind:process"
	CapKindVM        = "kind:vm"
	CapKindBareMetal = "kind:baremetal"
	// CapRestartPolicy: the back-end restarts an instance by its
	// restart_policy.
	CapRestartPolicy = "restart-policy"
	// CapVolumes: volumes are mounted.
	CapVolumes = "volumes"
	// CapHostPorts: ports are bound on the node.
	CapHostPorts = "host-ports"
	// CapGPUs: GPUs are given to instances.
	CapGPUs = "gpus"
	// CapRunAsUser: the instance runs as spec's user and group.
	CapRunAsUser = "run-as-user"
	// CapStdin: the instance's standard input is kept open and an
	// Attacher forwards to it.
	CapStdin = "stdin"
	// CapTTY: the instance runs on a terminal an Attacher connects to.
	CapTTY = "tty"
)

// AllFeatures are every feature, the fallback of a driver that declares
// none.
var AllFeatures = []string{CapKindContainer, CapKindProcess, CapKindVM, CapKindBareMetal,
	CapRestartPolicy, CapVolumes, CapHostPorts, CapGPUs, CapRunAsUser, CapStdin, CapTTY}

// FeatureReporter declares the kinds and features (CapKind..., CapVolumes
// ...) the driver can run. Placement never sends it a spec needing one it
// lacks.
// Fallback: every feature (AllFeatures); the driver then refuses at create
// what it cannot run. CapStdin and CapTTY count only for an Attacher,
// declared or not: without Attach nobody could reach the streams.
type FeatureReporter interface {
	Features() []string
}

// SpecFeatures returns the features spec needs of a back-end: its kind,
// and each of restart policy, volumes, host ports, GPUs, a user, stdin and
// a terminal when it asks for them.
func SpecFeatures(spec *Spec) []string {
	f := []string{"kind:" + string(spec.KindOrDefault())}
	if n := spec.RestartPolicy.Name; n != "" && n != "no" {
		f = append(f, CapRestartPolicy)
	}
	if len(spec.Volumes) > 0 {
		f = append(f, CapVolumes)
	}
	if len(spec.Ports) > 0 {
		f = append(f, CapHostPorts)
	}
	if spec.GPUs > 0 {
		f = append(f, CapGPUs)
	}
	if spec.User != "" {
		f = append(f, CapRunAsUser)
	}
	if spec.Stdin {
		f = append(f, CapStdin)
	}
	if spec.TTY {
		f = append(f, CapTTY)
	}
	return f
}

// FeatureField names the spec field that asks for feature f.
func FeatureField(f string) string {
	switch f {
	case CapRestartPolicy:
		return "restart_policy"
	case CapVolumes:
		return "volumes"
	case CapHostPorts:
		return "ports"
	case CapGPUs:
		return "gpus"
	case CapRunAsUser:
		return "user"
	case CapStdin:
		return "stdin"
	case CapTTY:
		return "tty"
	}
	return "kind"
}

// Capabilities returns the sorted names of the optional interfaces d
// implements itself (fallbacks not counted).
func Capabilities(d Driver) []string {
	var caps []string
	add := func(ok bool, name string) {
		if ok {
			caps = append(caps, name)
		}
	}
	_, ok := As[Archiver](d, CapArchive)
	add(ok, CapArchive)
	_, ok = As[Attacher](d, CapAttach)
	add(ok, CapAttach)
	_, ok = As[ConsoleReader](d, CapConsole)
	add(ok, CapConsole)
	_, ok = As[EventWatcher](d, CapEvents)
	add(ok, CapEvents)
	_, ok = As[Execer](d, CapExec)
	add(ok, CapExec)
	_, ok = As[ImageLister](d, CapImages)
	add(ok, CapImages)
	_, ok = As[Killer](d, CapKill)
	add(ok, CapKill)
	_, ok = As[LogReader](d, CapLogs)
	add(ok, CapLogs)
	_, ok = As[Preloader](d, CapPreload)
	add(ok, CapPreload)
	_, ok = As[Resizer](d, CapResize)
	add(ok, CapResize)
	_, ok = As[Restarter](d, CapRestart)
	add(ok, CapRestart)
	_, ok = As[Starter](d, CapStart)
	add(ok, CapStart)
	_, ok = As[Stopper](d, CapStop)
	add(ok, CapStop)
	_, ok = As[Suspender](d, CapSuspend)
	add(ok, CapSuspend)
	_, ok = As[Topper](d, CapTop)
	add(ok, CapTop)
	_, ok = As[UsageReporter](d, CapUsage)
	add(ok, CapUsage)
	_, ok = As[VolumeRemover](d, CapVolumeRemove)
	add(ok, CapVolumeRemove)
	_, ok = As[NetworkConnector](d, CapNetworkConnect)
	add(ok, CapNetworkConnect)
	_, ok = As[Renamer](d, CapRename)
	add(ok, CapRename)
	sb, ok := As[SharedBackend](d, CapShared)
	add(ok && sb.SharedBackend(), CapShared)
	return caps
}

// Features returns the sorted kinds and features d declares
// (FeatureReporter), or AllFeatures when it declares none; CapStdin and
// CapTTY only when d is an Attacher.
func Features(d Driver) []string {
	var f []string
	if fr, ok := d.(FeatureReporter); ok {
		f = slices.Clone(fr.Features())
	} else {
		f = slices.Clone(AllFeatures)
	}
	if _, ok := As[Attacher](d, CapAttach); !ok {
		f = slices.DeleteFunc(f, func(c string) bool { return c == CapStdin || c == CapTTY })
	}
	slices.Sort(f)
	return slices.Compact(f)
}

// Forwarder is implemented by a driver that stands for a driver elsewhere
// (the host side of a plugin): its type has every optional interface, and
// Has reports whether the driver behind it really has capability c (a Cap
// name: CapResize, CapLogs...). Capabilities, Features and package
// provider count a capability a Forwarder has not got as missing and apply
// its fallback, so a forwarded driver looks exactly like the driver it
// forwards to.
type Forwarder interface {
	Has(c string) bool
}

// As returns d as the optional interface T, the capability named c, when d
// implements it and, if d is a Forwarder, really has it. Callers find
// capabilities with As rather than a bare type assertion.
func As[T any](d Driver, c string) (T, bool) {
	t, ok := d.(T)
	if !ok {
		return t, false
	}
	if f, fwd := d.(Forwarder); fwd && !f.Has(c) {
		var zero T
		return zero, false
	}
	return t, true
}
