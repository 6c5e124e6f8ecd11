package control

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"reflect"
	"strings"
	"sync"
	"time"
	"unique"

	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/reconciler"
	"github.com/berth-dev/berth/scheduler"
	"github.com/berth-dev/berth/store"
)

// record is an instance as stored under PrefixInstances+id, the one stored
// form of reconciler.Instance (the form the lifecycle steps). It is a fifth
// of the instance's own JSON or less:
//   - the id is the key's, not repeated; the name is left out when it is
//     the id;
//   - the spec is left out when it is its request's (the request's record
//     holds it, once for all its instances);
//   - the group is left out when the request's id names it (a group's
//     services are "<group>.<service>");
//   - the creation time is in Unix microseconds, the other times in
//     milliseconds after it (stamp); keys are short; zero values are left
//     out;
//   - the fields nearly every record sets are written in a binary form,
//     the others as JSON (append, read).
//
// Values that begin with legacyPrefix are the JSON of reconciler.Instance,
// as stored before records existed, and still read; the others are
// records.
type record struct {
	Name         string           `json:"n,omitempty"`
	Provider     string           `json:"p,omitempty"`
	Node         string           `json:"nd,omitempty"`
	Spec         *driver.Spec     `json:"s,omitempty"`
	Phase        reconciler.Phase `json:"ph,omitempty"`
	HostPorts    []int            `json:"hp,omitempty"`
	BackendID    string           `json:"b,omitempty"`
	Observed     *seenRecord      `json:"o,omitempty"`
	Owner        string           `json:"ow,omitempty"`
	Pool         string           `json:"pl,omitempty"`
	Label        string           `json:"lb,omitempty"`
	Group        string           `json:"g,omitempty"`
	Request      string           `json:"r,omitempty"`
	Priority     int              `json:"pr,omitempty"`
	Attempts     int              `json:"at,omitempty"`
	Incarnation  int              `json:"inc,omitempty"`
	Message      string           `json:"m,omitempty"`
	After        reconciler.Phase `json:"af,omitempty"`
	Want         reconciler.Phase `json:"w,omitempty"`
	Exclude      []string         `json:"ex,omitempty"`
	ExcludeUntil int64            `json:"exu,omitempty"`
	Refused      []string         `json:"rf,omitempty"`
	Stale        []reconciler.Ref `json:"st,omitempty"`
	Deadline     int64            `json:"d,omitempty"`
	Created      int64            `json:"c,omitempty"`
	Updated      int64            `json:"u,omitempty"`
	// NoGroup is set when the instance has no group although its
	// request's id has a '.'.
	NoGroup bool `json:"ng,omitempty"`
}

// seenRecord is reconciler.Seen as a record stores it.
type seenRecord struct {
	State     driver.State         `json:"s,omitempty"` // left out when it is the phase's name
	RawState  string               `json:"r,omitempty"` // left out when it is State
	Message   string               `json:"m,omitempty"`
	ExitCode  *int                 `json:"x,omitempty"`
	Addresses []string             `json:"a,omitempty"`
	Ports     []driver.PortMapping `json:"pt,omitempty"`
	Resources driver.Resources     `json:"rs,omitzero"`
	// AsSpec is set, and Resources left out, when the resources are
	// exactly the spec's (sameResources): as a back-end shows them for
	// nearly every instance. A record without it and without Resources
	// saw none.
	AsSpec   bool  `json:"q,omitempty"`
	Started  int64 `json:"t,omitempty"`
	Finished int64 `json:"f,omitempty"`
}

// legacyPrefix begins the JSON of every reconciler.Instance (its first
// field is the id), and no record.
const legacyPrefix = `{"id":`

// A record is stored in one of two forms, told apart by its first byte:
//   - '{': the record's JSON, as stored before the binary form;
//   - recordBinary: the fields nearly every record sets, in this order,
//     strings as a uvarint length and bytes, integers as (u)varints:
//     flags (uvarint: recordSeen, recordAsSpec, recordNoGroup,
//     recordRest), phase, provider, node, back-end id, owner, pool,
//     request, created, updated, deadline, priority, attempts,
//     incarnation; when recordSeen, the seen state, its one address
//     ("" when it has not exactly one, non-empty) and started; when
//     recordRest, last, the JSON of the record's other fields (its spec,
//     exclusions, message, what else the back-end showed...), read over
//     the ones before.
//
// A running instance is about 90 bytes so, against about 160 as JSON.
const recordBinary = 0x01

// The flags of a binary record.
const (
	recordSeen    = 1 << iota // Observed is set
	recordAsSpec              // Observed.AsSpec
	recordNoGroup             // NoGroup
	recordRest                // the JSON of the other fields follows
)

// append appends r in its binary form to b. It may change r: the fields
// it writes before the JSON of the rest are cleared.
func (r *record) append(b []byte) ([]byte, error) {
	var flags uint64
	var address string
	o := r.Observed
	if o != nil {
		flags |= recordSeen
		if o.AsSpec {
			flags |= recordAsSpec
		}
		switch a := o.Addresses; {
		case len(a) == 1 && a[0] != "":
			address, o.Addresses = a[0], nil
		case len(a) == 0:
			o.Addresses = nil // none, as JSON leaves an empty list out
		}
	}
	if r.NoGroup {
		flags |= recordNoGroup
	}
	b = append(b, recordBinary)
	flagsAt := len(b)
	b = binary.AppendUvarint(b, flags) // one byte: rewritten below
	for _, v := range []string{string(r.Phase), r.Provider, r.Node, r.BackendID, r.Owner, r.Pool, r.Request} {
		b = appendString(b, v)
	}
	for _, v := range []int64{r.Created, r.Updated, r.Deadline, int64(r.Priority), int64(r.Attempts), int64(r.Incarnation)} {
		b = binary.AppendVarint(b, v)
	}
	if o != nil {
		b = appendString(b, string(o.State))
		b = appendString(b, address)
		b = binary.AppendVarint(b, o.Started)
		*o = seenRecord{RawState: o.RawState, Message: o.Message, ExitCode: o.ExitCode, Addresses: o.Addresses,
			Ports: o.Ports, Resources: o.Resources, Finished: o.Finished}
		if o.isZero() {
			r.Observed = nil
		}
	}
	*r = record{Name: r.Name, Spec: r.Spec, HostPorts: r.HostPorts, Observed: r.Observed, Label: r.Label, Group: r.Group,
		Message: r.Message, After: r.After, Want: r.Want, Exclude: r.Exclude, ExcludeUntil: r.ExcludeUntil, Refused: r.Refused, Stale: r.Stale}
	if r.isZero() {
		return b, nil
	}
	b[flagsAt] |= recordRest
	more := *r // only a record with more escapes to the heap
	rest, err := json.Marshal(&more)
	if err != nil {
		return nil, err
	}
	return append(b, rest...), nil
}

// isZero reports whether r sets no field.
func (r *record) isZero() bool {
	return r.Name == "" && r.Provider == "" && r.Node == "" && r.Spec == nil && r.Phase == "" && r.HostPorts == nil &&
		r.BackendID == "" && r.Observed == nil && r.Owner == "" && r.Pool == "" && r.Label == "" && r.Group == "" &&
		r.Request == "" && r.Priority == 0 && r.Attempts == 0 && r.Incarnation == 0 && r.Message == "" && r.After == "" && r.Want == "" &&
		r.Exclude == nil && r.ExcludeUntil == 0 && r.Refused == nil && r.Stale == nil && r.Deadline == 0 && r.Created == 0 &&
		r.Updated == 0 && !r.NoGroup
}

// isZero reports whether o sets no field.
func (o *seenRecord) isZero() bool {
	return o.State == "" && o.RawState == "" && o.Message == "" && o.ExitCode == nil && o.Addresses == nil && o.Ports == nil &&
		o.Resources.IsZero() && !o.AsSpec && o.Started == 0 && o.Finished == 0
}

// read sets r from b, a record in either of its forms.
func (r *record) read(b []byte) error {
	if len(b) == 0 || b[0] != recordBinary {
		return json.Unmarshal(b, r)
	}
	d := recordReader{b: b[1:]}
	flags := d.uvarint()
	if flags >= recordRest<<1 {
		return fmt.Errorf("record: unknown flags %#x", flags)
	}
	var phase string
	for _, v := range []*string{&phase, &r.Provider, &r.Node, &r.BackendID, &r.Owner, &r.Pool, &r.Request} {
		*v = d.string()
	}
	r.Phase = reconciler.Phase(phase)
	r.Created, r.Updated, r.Deadline = d.varint(), d.varint(), d.varint()
	r.Priority, r.Attempts, r.Incarnation = int(d.varint()), int(d.varint()), int(d.varint())
	r.NoGroup = flags&recordNoGroup != 0
	if flags&recordSeen != 0 {
		o := &seenRecord{State: driver.State(d.string()), AsSpec: flags&recordAsSpec != 0}
		if a := d.string(); a != "" {
			o.Addresses = []string{a}
		}
		o.Started = d.varint()
		r.Observed = o
	}
	if d.err != nil {
		return d.err
	}
	if flags&recordRest == 0 {
		if len(d.b) > 0 {
			return fmt.Errorf("record: %d bytes after its end", len(d.b))
		}
		return nil
	}
	// The rest sets only fields that are not set above: reading it over
	// them (into the same Observed) leaves those.
	return json.Unmarshal(d.b, r)
}

// appendString appends v as a uvarint length and its bytes.
func appendString(b []byte, v string) []byte {
	return append(binary.AppendUvarint(b, uint64(len(v))), v...)
}

// recordReader reads the fields of a binary record; the first error
// stops it and is kept in err.
type recordReader struct {
	b   []byte
	err error
}

func (d *recordReader) uvarint() uint64 { return readNumber(d, binary.Uvarint) }

func (d *recordReader) varint() int64 { return readNumber(d, binary.Varint) }

// readNumber reads a number with decode (binary.Uvarint or binary.Varint).
func readNumber[T uint64 | int64](d *recordReader, decode func([]byte) (T, int)) T {
	if d.err != nil {
		return 0
	}
	v, n := decode(d.b)
	if n <= 0 {
		d.err = errors.New("record: truncated or overlong number")
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *recordReader) string() string {
	n := d.uvarint()
	if d.err != nil {
		return ""
	}
	if n > uint64(len(d.b)) {
		d.err = fmt.Errorf("record: a string of %d bytes where %d are left", n, len(d.b))
		return ""
	}
	v := string(d.b[:n])
	d.b = d.b[n:]
	return v
}

// stamp is t as a record keeps it: 0 for the zero time; Unix microseconds
// when base is zero; else the milliseconds from base to t, one farther
// from zero (so that a time equal to base is not the zero time).
func stamp(t, base time.Time) int64 {
	switch {
	case t.IsZero():
		return 0
	case base.IsZero():
		return t.UnixMicro()
	}
	d := t.Sub(base).Milliseconds()
	if d < 0 {
		return d - 1
	}
	return d + 1
}

// unstamp is stamp's inverse, within the microsecond or millisecond.
func unstamp(n int64, base time.Time) time.Time {
	switch {
	case n == 0:
		return time.Time{}
	case base.IsZero():
		return time.UnixMicro(n).UTC()
	case n < 0:
		n++
	default:
		n--
	}
	return base.Add(time.Duration(n) * time.Millisecond)
}

// groupOf is the group a request's id names: what comes before its first
// '.', or "".
func groupOf(request string) string {
	g, _, _ := strings.Cut(request, ".")
	if g == request {
		return ""
	}
	return g
}

// intern returns the one copy of s that every caller shares.
func intern(s string) string {
	if s == "" {
		return ""
	}
	return unique.Make(s).Value()
}

// A rec keeps priority, attempts and incarnation in 32 bits. The
// priority's range is the scheduler's (scheduler.RangePriority, which
// validation checks before anything is stored); attempts and incarnation
// count up from 0 within rangeCounts. encodeRecord stores no number
// beyond these ranges and decodeRecord reads none, so that newRec never
// meets one.
var rangeCounts = driver.Range{Min: 0, Max: math.MaxInt32}

// A rec's int32 holds the priority's range: this does not compile
// otherwise.
const _, _ int32 = scheduler.MinPriority, scheduler.MaxPriority

// checkNumbers returns the driver.FieldErrors of the numbers of in that
// are beyond what a record holds, or nil.
func checkNumbers(in *reconciler.Instance) error {
	var es driver.FieldErrors
	scheduler.RangePriority.Check(&es, "priority", int64(in.Priority))
	rangeCounts.Check(&es, "attempts", int64(in.Attempts))
	rangeCounts.Check(&es, "incarnation", int64(in.Incarnation))
	return es.Err()
}

// checkOwnSpec returns what breaks an invariant of a spec a record holds
// itself (not its request's, checked with the request): its resources,
// which the scheduler's ledger reserves, beyond their ranges.
func checkOwnSpec(spec *driver.Spec) error {
	if spec == nil {
		return nil
	}
	return driver.ValidateResources("spec.", spec.Resources)
}

// encodeRecord returns the stored form of in. shared is its request's spec
// as the plane keeps it: when in's spec is that one, the record leaves it
// out. A number beyond its range (checkNumbers) is an error, and nothing
// is stored.
func encodeRecord(in *reconciler.Instance, shared *driver.Spec) ([]byte, error) {
	if err := checkNumbers(in); err != nil {
		return nil, fmt.Errorf("control: encode instance %s: %w", in.ID, err)
	}
	r := record{
		Provider: in.Provider, Node: in.Node, Phase: in.Phase,
		HostPorts: in.HostPorts, BackendID: in.BackendID, Owner: in.Owner, Pool: in.Pool, Label: in.Label,
		Group: in.Group, Request: in.Request, Priority: in.Priority, Attempts: in.Attempts,
		Incarnation: in.Incarnation, Message: in.Message, After: in.After, Want: in.Want, Exclude: in.Exclude,
		Refused: in.Refused, Stale: in.Stale, Created: stamp(in.Created, time.Time{}),
	}
	created := unstamp(r.Created, time.Time{})
	r.ExcludeUntil, r.Deadline, r.Updated = stamp(in.ExcludeUntil, created), stamp(in.Deadline, created), stamp(in.Updated, created)
	if in.Name != in.ID {
		r.Name = in.Name
	}
	switch {
	case in.Group == groupOf(in.Request):
		r.Group = "" // the request's id says it
	case in.Group == "":
		r.NoGroup = true // the request's id has a '.', yet no group
	}
	if in.Spec != shared || shared == nil {
		r.Spec = in.Spec
		if err := checkOwnSpec(r.Spec); err != nil {
			return nil, fmt.Errorf("control: encode instance %s: %w", in.ID, err)
		}
	}
	if o := in.Observed; o != nil {
		r.Observed = &seenRecord{State: o.State, Message: o.Message, ExitCode: o.ExitCode, Addresses: o.Addresses,
			Ports: o.Ports, Resources: o.Resources, Started: stamp(o.Started, created), Finished: stamp(o.Finished, created)}
		if !o.Resources.IsZero() && sameResources(o.Resources, in.Spec) {
			r.Observed.Resources, r.Observed.AsSpec = driver.Resources{}, true
		}
		if o.RawState != string(o.State) {
			r.Observed.RawState = o.RawState
		}
		if string(o.State) == string(in.Phase) {
			r.Observed.State = ""
		}
	}
	b, err := r.append(make([]byte, 0, 96))
	if err != nil {
		return nil, fmt.Errorf("control: encode instance %s: %w", in.ID, err)
	}
	return b, nil
}

// decodeRecord reads the instance stored in kv, a record or the JSON of an
// instance from before records. spec returns the spec of a request as the
// plane keeps it (nil when unknown): a record without a spec takes its
// request's, and an older instance whose spec equals its request's shares
// it.
func decodeRecord(kv store.KV, spec func(request string) *driver.Spec) (*reconciler.Instance, error) {
	id := strings.TrimPrefix(kv.Key, PrefixInstances)
	if id == "" || id == kv.Key {
		return nil, fmt.Errorf("control: decode %q: not the key of an instance", kv.Key)
	}
	if bytes.HasPrefix(kv.Value, []byte(legacyPrefix)) {
		var in reconciler.Instance
		if err := json.Unmarshal(kv.Value, &in); err != nil {
			return nil, fmt.Errorf("control: decode %s: %w", kv.Key, err)
		}
		if s := spec(in.Request); s != nil && in.Spec != nil && reflect.DeepEqual(s, in.Spec) {
			in.Spec = s
		}
		if in.Spec == nil {
			in.Spec = &driver.Spec{}
		}
		in.ID, in.Revision = id, kv.ModRevision
		if err := errors.Join(checkNumbers(&in), checkOwnSpec(in.Spec)); err != nil {
			return nil, fmt.Errorf("control: decode %s: %w", kv.Key, err)
		}
		return &in, nil
	}
	var r record
	if err := r.read(kv.Value); err != nil {
		return nil, fmt.Errorf("control: decode %s: %w", kv.Key, err)
	}
	if !scheduler.RangePriority.Has(int64(r.Priority)) || !rangeCounts.Has(int64(r.Attempts)) || !rangeCounts.Has(int64(r.Incarnation)) {
		return nil, fmt.Errorf("control: decode %s: priority %d, attempts %d or incarnation %d out of range", kv.Key, r.Priority, r.Attempts, r.Incarnation)
	}
	if err := checkOwnSpec(r.Spec); err != nil {
		return nil, fmt.Errorf("control: decode %s: %w", kv.Key, err)
	}
	in := &reconciler.Instance{
		ID: id, Name: r.Name, Provider: r.Provider, Node: r.Node, Spec: r.Spec, Phase: r.Phase,
		HostPorts: r.HostPorts, BackendID: r.BackendID, Owner: r.Owner, Pool: r.Pool, Label: r.Label,
		Group: r.Group, Request: r.Request, Priority: r.Priority, Attempts: r.Attempts,
		Incarnation: r.Incarnation, Message: r.Message, After: r.After, Want: r.Want, Exclude: r.Exclude,
		Refused: r.Refused, Stale: r.Stale, Created: unstamp(r.Created, time.Time{}), Revision: kv.ModRevision,
	}
	in.ExcludeUntil, in.Deadline, in.Updated = unstamp(r.ExcludeUntil, in.Created), unstamp(r.Deadline, in.Created), unstamp(r.Updated, in.Created)
	if in.Name == "" {
		in.Name = id
	}
	// Many instances share these strings: each decoded record would else
	// hold copies of its own.
	in.Provider, in.Node, in.Owner, in.Pool = intern(in.Provider), intern(in.Node), intern(in.Owner), intern(in.Pool)
	in.Label, in.Request, in.Group = intern(in.Label), intern(in.Request), intern(in.Group)
	in.Phase, in.After = reconciler.Phase(intern(string(in.Phase))), reconciler.Phase(intern(string(in.After)))
	if in.Group == "" && !r.NoGroup {
		in.Group = groupOf(in.Request)
	}
	if in.Spec == nil {
		in.Spec = spec(r.Request)
	}
	if in.Spec == nil {
		return nil, fmt.Errorf("control: decode %s: the record leaves its spec to request %q, which is not stored", kv.Key, r.Request)
	}
	if o := r.Observed; o != nil {
		in.Observed = &reconciler.Seen{State: o.State, RawState: o.RawState, Message: o.Message, ExitCode: o.ExitCode,
			Addresses: o.Addresses, Ports: o.Ports, Resources: o.Resources, Started: unstamp(o.Started, in.Created), Finished: unstamp(o.Finished, in.Created)}
		if o.AsSpec {
			in.Observed.Resources = in.Spec.Resources
		}
		if in.Observed.State == "" {
			in.Observed.State = driver.State(in.Phase)
		}
		in.Observed.State = driver.State(intern(string(in.Observed.State)))
		if in.Observed.RawState == "" {
			in.Observed.RawState = string(in.Observed.State)
		}
	}
	return in, nil
}

// rec is an instance as the plane keeps it in memory: what the control
// plane reads of every instance on its hot paths (placement, sync, the
// usage loop, listings' filters) in fields named as reconciler.Instance's,
// and the rest, set on few instances, behind one pointer. As in a record,
// the name is left out when it is the id and the group when the request's
// id names it (Name and Group give them). What a back-end showed is kept
// in seenRec's smaller form. Where it runs, whose it is and its phase,
// which many instances share, are one shared copy (recShared); its times
// are instants. It is 144 bytes and what it shows 32, against 448 and 192
// for reconciler.Instance and its Seen: a million instances hold about
// 460 MB less.
//
// A rec is never changed once cached (records are replaced, so a pointer
// read under the records' lock stays valid after it is released);
// instance returns the reconciler.Instance it stands for, a fresh copy.
type rec struct {
	ID string
	// recShared gives Provider, Owner, Pool and Phase.
	*recShared
	Node      string
	BackendID string
	Request   string
	// Spec is shared as reconciler.Instance shares it.
	Spec *driver.Spec
	// created, updated and deadline give Created, Updated and Deadline.
	created, updated, deadline instant
	Revision                   int64

	priority, attempts, incarnation int32
	// group says where Group is: the request's id names it, the
	// request's id without its last '.'-part is it, there is none, or it
	// is cold.group.
	group groupFrom

	seen *seenRec
	cold *coldRec
}

// recShared is the part of a rec that many instances have alike: every
// rec with the same provider, owner, pool and phase points to one copy
// (shareOf), never changed.
type recShared struct {
	Provider string
	Owner    string
	Pool     string
	Phase    reconciler.Phase
}

// shares holds the one copy of every recShared made (*recShared by
// value): as many as the combinations of providers, owners (namespaces),
// pools and phases ever seen by this process, a few per namespace.
var shares sync.Map

// shareOf returns the one copy of v.
func shareOf(v recShared) *recShared {
	if p, ok := shares.Load(v); ok {
		return p.(*recShared)
	}
	v.Provider, v.Owner, v.Pool = intern(v.Provider), intern(v.Owner), intern(v.Pool)
	v.Phase = reconciler.Phase(intern(string(v.Phase)))
	p, _ := shares.LoadOrStore(v, &v)
	return p.(*recShared)
}

// groupFrom says where a rec keeps its group.
type groupFrom uint8

const (
	groupOfRequest  groupFrom = iota // groupOf(Request)
	groupBeforeLast                  // Request without its last '.'-part
	groupNone                        // no group
	groupCold                        // cold.group
)

// coldRec is the part of an instance few instances set.
type coldRec struct {
	name         string // "" when it is the id
	group        string // set when rec.group is groupCold
	label        string
	message      string
	after        reconciler.Phase
	want         reconciler.Phase
	hostPorts    []int
	exclude      []string
	excludeUntil time.Time
	refused      []string
	stale        []reconciler.Ref
}

// seenRec is reconciler.Seen as a rec keeps it: the state only when it
// differs from the instance's phase, the raw state only when it differs
// from the state, the resources only when they differ from the spec's, one
// address as a string, and the rest of what is seldom set behind one
// pointer. It is 32 bytes.
type seenRec struct {
	// address is the one address seen, "" for none (Addresses nil);
	// other addresses are in more.
	address string
	started instant
	more    *seenMore
}

// seenMore is the part of a Seen few instances set.
type seenMore struct {
	state    driver.State // set when ownState: it is not the phase
	ownState bool
	// addresses are the addresses seen when not one non-empty address
	// nor none: then never nil.
	addresses []string
	rawState  string // "" when it is state
	message   string
	exitCode  *int
	ports     []driver.PortMapping
	resources driver.Resources
	ownRes    bool // resources are these, not the spec's
	finished  time.Time
}

// newRec returns the rec of in.
func newRec(in *reconciler.Instance) *rec {
	r := &rec{
		ID: in.ID, recShared: shareOf(recShared{Provider: in.Provider, Owner: in.Owner, Pool: in.Pool, Phase: in.Phase}),
		Node: in.Node, BackendID: in.BackendID, Request: in.Request, Spec: in.Spec,
		created: instantOf(in.Created), updated: instantOf(in.Updated), deadline: instantOf(in.Deadline), Revision: in.Revision,
		priority: int32(in.Priority), attempts: int32(in.Attempts), incarnation: int32(in.Incarnation),
	}
	if int(r.priority) != in.Priority || int(r.attempts) != in.Attempts || int(r.incarnation) != in.Incarnation {
		// encodeRecord and decodeRecord let no number beyond its range
		// through (checkNumbers): only a bug gets here, and it is logged
		// rather than taking the records' lock down with a panic.
		slog.Error("control: instance numbers beyond 32 bits", "instance", in.ID, "priority", in.Priority,
			"attempts", in.Attempts, "incarnation", in.Incarnation)
	}
	var name, group string
	if in.Name != in.ID {
		name = in.Name
	}
	switch {
	case in.Group == groupOf(in.Request):
	case in.Group == "":
		r.group = groupNone
	case in.Group == beforeLastDot(in.Request):
		r.group = groupBeforeLast
	default:
		r.group, group = groupCold, in.Group
	}
	if name != "" || group != "" || in.Label != "" || in.Message != "" || in.After != "" || in.Want != "" || in.HostPorts != nil || in.Exclude != nil ||
		!in.ExcludeUntil.IsZero() || in.Refused != nil || in.Stale != nil {
		r.cold = &coldRec{name: name, group: group, label: in.Label, message: in.Message, after: in.After, want: in.Want, hostPorts: in.HostPorts,
			exclude: in.Exclude, excludeUntil: in.ExcludeUntil, refused: in.Refused, stale: in.Stale}
	}
	if o := in.Observed; o != nil {
		sr := &seenRec{started: instantOf(o.Started)}
		var raw string
		if o.RawState != string(o.State) {
			raw = o.RawState
		}
		var addrs []string
		switch a := o.Addresses; {
		case len(a) == 1 && a[0] != "":
			sr.address = a[0]
		case a != nil:
			addrs = a
		}
		ownState := string(o.State) != string(in.Phase)
		own := !sameResources(o.Resources, in.Spec)
		if ownState || addrs != nil || raw != "" || o.Message != "" || o.ExitCode != nil || o.Ports != nil || own || !o.Finished.IsZero() {
			sr.more = &seenMore{addresses: addrs, rawState: raw, message: o.Message, exitCode: o.ExitCode, ports: o.Ports, ownRes: own, finished: o.Finished}
			if ownState {
				sr.more.state, sr.more.ownState = o.State, true
			}
			if own {
				sr.more.resources = o.Resources
			}
		}
		r.seen = sr
	}
	return r
}

// sameResources reports whether r is exactly spec's resources, so that a
// seenRec may leave r out. Resources with other resources are kept.
func sameResources(r driver.Resources, spec *driver.Spec) bool {
	if spec == nil {
		return r.CPU == 0 && r.Memory == 0 && r.Disk == 0 && r.GPUs == 0 && r.Other == nil
	}
	s := spec.Resources
	return r.CPU == s.CPU && r.Memory == s.Memory && r.Disk == s.Disk && r.GPUs == s.GPUs && r.Other == nil && s.Other == nil
}

// instance returns the instance r stands for.
func (r *rec) instance() reconciler.Instance {
	in := reconciler.Instance{
		ID: r.ID, Name: r.Name(), Provider: r.Provider, Node: r.Node, Spec: r.Spec, Phase: r.Phase, BackendID: r.BackendID,
		Owner: r.Owner, Pool: r.Pool, Group: r.Group(), Request: r.Request,
		Priority: int(r.priority), Attempts: int(r.attempts), Incarnation: int(r.incarnation),
		Deadline: r.deadline.time(), Created: r.created.time(), Updated: r.updated.time(), Revision: r.Revision,
	}
	if c := r.cold; c != nil {
		in.Label, in.Message, in.After, in.Want, in.HostPorts = c.label, c.message, c.after, c.want, c.hostPorts
		in.Exclude, in.ExcludeUntil, in.Refused, in.Stale = c.exclude, c.excludeUntil, c.refused, c.stale
	}
	if sr := r.seen; sr != nil {
		state, _, _ := r.seenState()
		o := &reconciler.Seen{State: state, RawState: string(state), Started: sr.started.time()}
		if sr.address != "" {
			o.Addresses = []string{sr.address}
		}
		if m := sr.more; m != nil {
			if m.addresses != nil {
				o.Addresses = m.addresses
			}
			if m.rawState != "" {
				o.RawState = m.rawState
			}
			o.Message, o.ExitCode, o.Ports, o.Finished = m.message, m.exitCode, m.ports, m.finished
			if m.ownRes {
				o.Resources = m.resources
			}
		}
		if sr.more == nil || !sr.more.ownRes {
			if r.Spec != nil {
				o.Resources = r.Spec.Resources
			}
		}
		in.Observed = o
	}
	return in
}

// Updated is the instance's reconciler.Instance.Updated.
func (r *rec) Updated() time.Time { return r.updated.time() }

// instant is a time as a rec keeps it, in 8 bytes rather than
// time.Time's 24: Unix nanoseconds in UTC, without a monotonic reading,
// noInstant for the zero time. Times before 1678 or after 2261, which
// no clock gives, are kept as the nearest instant that is not.
type instant int64

// noInstant is the zero time; no other time is kept as it.
const noInstant instant = math.MinInt64

var (
	firstInstant = time.Unix(0, math.MinInt64+1)
	lastInstant  = time.Unix(0, math.MaxInt64)
)

// instantOf returns t as an instant.
func instantOf(t time.Time) instant {
	switch {
	case t.IsZero():
		return noInstant
	case t.Before(firstInstant):
		t = firstInstant
	case t.After(lastInstant):
		t = lastInstant
	}
	return instant(t.UnixNano())
}

// time returns i as a time in UTC.
func (i instant) time() time.Time {
	if i == noInstant {
		return time.Time{}
	}
	return time.Unix(0, int64(i)).UTC()
}

// Name is the instance's reconciler.Instance.Name.
func (r *rec) Name() string {
	if r.cold == nil || r.cold.name == "" {
		return r.ID
	}
	return r.cold.name
}

// Group is the instance's reconciler.Instance.Group.
func (r *rec) Group() string {
	switch r.group {
	case groupNone:
		return ""
	case groupBeforeLast:
		return beforeLastDot(r.Request)
	case groupCold:
		return r.cold.group
	}
	return groupOf(r.Request)
}

// beforeLastDot is what comes before the last '.' of id, or "".
func beforeLastDot(id string) string {
	if i := strings.LastIndexByte(id, '.'); i >= 0 {
		return id[:i]
	}
	return ""
}

// After is the instance's reconciler.Instance.After.
func (r *rec) After() reconciler.Phase {
	if r.cold == nil {
		return ""
	}
	return r.cold.after
}

// Label is the instance's reconciler.Instance.Label.
func (r *rec) Label() string {
	if r.cold == nil {
		return ""
	}
	return r.cold.label
}

// Stale is the instance's reconciler.Instance.Stale.
func (r *rec) Stale() []reconciler.Ref {
	if r.cold == nil {
		return nil
	}
	return r.cold.stale
}

// Priority is the instance's reconciler.Instance.Priority.
func (r *rec) Priority() int { return int(r.priority) }

// seenState returns the state the back-end last showed and its exit
// code, and whether it showed the instance at all.
func (r *rec) seenState() (driver.State, *int, bool) {
	if r.seen == nil {
		return "", nil, false
	}
	state := driver.State(r.Phase)
	var code *int
	if m := r.seen.more; m != nil {
		if m.ownState {
			state = m.state
		}
		code = m.exitCode
	}
	return state, code, true
}
