package control

import (
	"encoding/json"
	"math"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/reconciler"
	"github.com/berth-dev/berth/store"
)

func sampleInstance(spec *driver.Spec) *reconciler.Instance {
	now := time.Date(2026, 11, 24, 22, 25, 8, 346929000, time.UTC) // records keep microseconds
	code := 0
	return &reconciler.Instance{
		ID: "w3-0123-0456", Name: "w3-0123-0456", Provider: "sim", Node: "n01234", Spec: spec, Phase: reconciler.Running,
		BackendID: "sim-00012345-1",
		Observed:  &reconciler.Seen{State: driver.StateRunning, RawState: "running", Addresses: []string{"10.0.12.34"}, Started: now.Add(3 * time.Second), ExitCode: &code},
		Owner:     "default", Group: "w3-0123", Request: "w3-0123.s0",
		// Placed, started 3 s later, running for a while.
		Created: now, Updated: now.Add(3 * time.Second), Deadline: now.Add(5 * time.Minute),
	}
}

// Every field survives a record, the spec is left to the request when it is
// the request's, and the record is at most a fifth of the instance's JSON.
func TestRecordRoundTrip(t *testing.T) {
	shared := &driver.Spec{Image: "app:1", Kind: driver.KindContainer, Type: driver.TypeBatch, Resources: driver.Resources{CPU: 1000, Memory: driver.GiB}}
	lookup := func(req string) *driver.Spec {
		if req == "w3-0123.s0" {
			return shared
		}
		return nil
	}
	in := sampleInstance(shared)
	b := mustEncode(t, in, shared)
	full, _ := json.Marshal(in)
	t.Logf("record %d bytes, instance JSON %d: %q", len(b), len(full), b)
	if 5*len(b) > len(full) {
		t.Errorf("record of %d bytes is more than a fifth of the instance's %d: %q", len(b), len(full), b)
	}
	got, err := decodeRecord(store.KV{Key: PrefixInstances + in.ID, Value: b, ModRevision: 7}, lookup)
	if err != nil {
		t.Fatal(err)
	}
	want := *in
	want.Revision = 7
	if !reflect.DeepEqual(got, &want) {
		t.Errorf("decoded\n%+v\nwant\n%+v", got, &want)
	}
	if got.Spec != shared {
		t.Error("a record of an instance with its request's spec does not share it again")
	}

	// Every other field, set, with a spec of its own.
	own := &driver.Spec{Image: "other", Resources: driver.Resources{CPU: 500}}
	x := sampleInstance(own)
	x.Name, x.HostPorts, x.Pool, x.Label, x.Priority, x.Attempts, x.Incarnation = "named", []int{30001}, "ci", "small", 3, 2, 1
	x.Message, x.After, x.Exclude, x.ExcludeUntil = "retrying", reconciler.Pending, []string{"sim/n1"}, x.Created.Add(time.Minute)
	x.Want = reconciler.Stopped
	x.Refused, x.Stale = []string{"sim/n2: no image"}, []reconciler.Ref{{Provider: "sim", Node: "n3", BackendID: "b3"}}
	x.Observed.RawState, x.Observed.Message, x.Observed.Finished = "exited (0)", "done", x.Created.Add(time.Hour)
	got, err = decodeRecord(store.KV{Key: PrefixInstances + x.ID, Value: mustEncode(t, x, shared)}, lookup)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, x) {
		t.Errorf("decoded\n%+v\nwant\n%+v", got, x)
	}

	// Resources seen as the spec's are left to the spec; others, and none,
	// are kept as they are.
	for _, res := range []driver.Resources{shared.Resources, {CPU: 250}, {}} {
		y := sampleInstance(shared)
		y.Observed.Resources = res
		b := mustEncode(t, y, shared)
		wantRS := !res.IsZero() && !reflect.DeepEqual(res, shared.Resources)
		if strings.Contains(string(b), `"rs"`) != wantRS {
			t.Errorf("resources %+v against the spec's %+v: record %s", res, shared.Resources, b)
		}
		got, err := decodeRecord(store.KV{Key: PrefixInstances + y.ID, Value: b}, lookup)
		if err != nil || !reflect.DeepEqual(got.Observed.Resources, res) {
			t.Errorf("resources %+v decoded from %s as %+v, %v", res, b, got.Observed.Resources, err)
		}
	}

	// A request whose id has a '.' without being a group's service keeps
	// no group; a group's service keeps its group.
	for _, c := range []struct{ request, group string }{{"a.b", ""}, {"g.web", "g"}, {"plain", ""}, {"g.web", "other"}} {
		y := sampleInstance(shared)
		y.Request, y.Group = c.request, c.group
		got, err := decodeRecord(store.KV{Key: PrefixInstances + y.ID, Value: mustEncode(t, y, nil)}, lookup)
		if err != nil || got.Group != c.group {
			t.Errorf("request %q group %q: decoded group %q, %v", c.request, c.group, got.Group, err)
		}
	}

	// A record leaving its spec to a request that is not stored is an
	// error, not an instance without a spec.
	if _, err := decodeRecord(store.KV{Key: PrefixInstances + in.ID, Value: b}, func(string) *driver.Spec { return nil }); err == nil {
		t.Error("a record without its request's spec decoded")
	}
}

// Records stored as JSON, before their binary form, are read as they
// were written; a binary record cut short, or with bytes after its end,
// is an error.
func TestRecordForms(t *testing.T) {
	shared := &driver.Spec{Image: "app:1", Resources: driver.Resources{CPU: 1000, Memory: driver.GiB}}
	lookup := func(string) *driver.Spec { return shared }
	in := sampleInstance(shared)
	in.Observed.ExitCode = nil
	created := in.Created.UnixMicro()
	asJSON := `{"p":"sim","nd":"n01234","ph":"running","b":"sim-00012345-1","o":{"a":["10.0.12.34"],"q":true,"t":3001},` +
		`"ow":"default","r":"w3-0123.s0","d":300001,"c":` + strconv.FormatInt(created, 10) + `,"u":3001}`
	in.Observed.Resources = shared.Resources
	got, err := decodeRecord(store.KV{Key: PrefixInstances + in.ID, Value: []byte(asJSON)}, lookup)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, in) {
		t.Errorf("from JSON\n%+v\nwant\n%+v", got, in)
	}

	b := mustEncode(t, in, shared)
	if len(b) > 96 {
		t.Errorf("a running instance's record is %d bytes, want at most 96: %q", len(b), b)
	}
	got, err = decodeRecord(store.KV{Key: PrefixInstances + in.ID, Value: b}, lookup)
	if err != nil || !reflect.DeepEqual(got, in) {
		t.Errorf("from %q\n%+v, %v\nwant\n%+v", b, got, err, in)
	}
	// Addresses in every form: one is binary, the others JSON; an empty
	// list is none.
	for _, addrs := range [][]string{nil, {}, {""}, {"10.0.0.1"}, {"10.0.0.1", "fd00::1"}} {
		x := *in
		o := *in.Observed
		o.Addresses, x.Observed = addrs, &o
		b := mustEncode(t, &x, shared)
		if len(addrs) == 0 {
			o.Addresses = nil
		}
		got, err := decodeRecord(store.KV{Key: PrefixInstances + x.ID, Value: b}, lookup)
		if err != nil || !reflect.DeepEqual(got, &x) {
			t.Errorf("addresses %#v: decoded %+v, %v", addrs, got, err)
		}
	}
	in.Message = "with the rest as JSON"
	for _, b := range [][]byte{b, mustEncode(t, in, shared)} {
		for n := range len(b) {
			if _, err := decodeRecord(store.KV{Key: PrefixInstances + in.ID, Value: b[:n]}, lookup); err == nil {
				t.Errorf("%q, cut to %d bytes, decoded", b, n)
			}
		}
		if _, err := decodeRecord(store.KV{Key: PrefixInstances + in.ID, Value: append(slices.Clip(b), 0)}, lookup); err == nil {
			t.Errorf("%q with a byte after its end decoded", b)
		}
	}
}

// Instances stored as JSON before records are read, sharing their
// request's spec when it is equal.
func TestRecordLegacy(t *testing.T) {
	shared := &driver.Spec{Image: "app:1", Resources: driver.Resources{CPU: 1000}}
	copyOf := *shared
	in := sampleInstance(&copyOf)
	old, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	got, err := decodeRecord(store.KV{Key: PrefixInstances + in.ID, Value: old, ModRevision: 3}, func(string) *driver.Spec { return shared })
	if err != nil {
		t.Fatal(err)
	}
	if got.Spec != shared || got.Revision != 3 || got.Observed.State != driver.StateRunning || !got.Created.Equal(in.Created) {
		t.Errorf("legacy instance read as %+v", got)
	}
}

// An instance survives its in-memory rec exactly: every field, the
// instance's spec (the same pointer) and what the back-end showed.
func TestRecRoundTrip(t *testing.T) {
	shared := &driver.Spec{Image: "app:1", Resources: driver.Resources{CPU: 1000, Memory: driver.GiB}}
	other := &driver.Spec{Image: "gpu", Resources: driver.Resources{CPU: 500, Other: map[string]int64{"fpga": 1}}}
	seen := func(in *reconciler.Instance) *reconciler.Seen { return in.Observed }
	tests := []struct {
		name string
		edit func(in *reconciler.Instance)
	}{
		{"running, the back-end shows the spec's resources", func(in *reconciler.Instance) { seen(in).ExitCode = nil; seen(in).Resources = shared.Resources }},
		{"as sampled", func(*reconciler.Instance) {}},
		{"pending, nothing seen", func(in *reconciler.Instance) {
			in.Phase, in.Node, in.Provider, in.BackendID, in.Observed, in.Message = reconciler.Pending, "", "", "", nil, "no node fits"
		}},
		{"named, a group of its own, every rare field", func(in *reconciler.Instance) {
			in.Name, in.Group, in.Label, in.Pool, in.HostPorts = "web-1", "other", "small", "ci", []int{30001}
			in.Priority, in.Attempts, in.Incarnation = -5, 2, 1
			in.After, in.Exclude, in.ExcludeUntil = reconciler.Pending, []string{"sim/n1"}, in.Created.Add(time.Minute)
			in.Refused, in.Stale = []string{"sim/n2: no image"}, []reconciler.Ref{{Provider: "sim", Node: "n3", BackendID: "b3"}}
		}},
		{"no group although the request's id names one", func(in *reconciler.Instance) { in.Group = "" }},
		{"a request without a group", func(in *reconciler.Instance) { in.Request, in.Group = "plain", "" }},
		{"a group whose id has a '.'", func(in *reconciler.Instance) { in.Request, in.Group = "r0.1.s0", "r0.1" }},
		{"seen with its own state, resources, ports and end", func(in *reconciler.Instance) {
			o := seen(in)
			o.RawState, o.Message, o.Finished = "exited (0)", "done", in.Created.Add(time.Hour)
			o.Resources, o.Ports = driver.Resources{CPU: 250}, []driver.PortMapping{{ContainerPort: 80, HostPort: 30080, Protocol: "tcp"}}
		}},
		{"seen with no resources", func(in *reconciler.Instance) { seen(in).Resources = driver.Resources{} }},
		{"seen in a state that is not the phase", func(in *reconciler.Instance) {
			in.Phase = reconciler.Stopping
			seen(in).ExitCode = nil
		}},
		{"seen with no state", func(in *reconciler.Instance) {
			o := seen(in)
			o.ExitCode, o.State, o.RawState = nil, "", ""
		}},
		{"seen with two addresses", func(in *reconciler.Instance) {
			o := seen(in)
			o.ExitCode, o.Addresses = nil, []string{"10.0.12.34", "fd00::1"}
		}},
		{"seen with no address", func(in *reconciler.Instance) { seen(in).ExitCode, seen(in).Addresses = nil, nil }},
		{"seen with an empty list of addresses", func(in *reconciler.Instance) { seen(in).ExitCode, seen(in).Addresses = nil, []string{} }},
		{"seen with an empty address", func(in *reconciler.Instance) { seen(in).ExitCode, seen(in).Addresses = nil, []string{""} }},
		{"a spec with other resources", func(in *reconciler.Instance) { in.Spec = other; seen(in).Resources = other.Resources }},
		{"no spec", func(in *reconciler.Instance) { in.Spec = nil }},
	}
	for _, tt := range tests {
		in := sampleInstance(shared)
		in.Revision = 9
		tt.edit(in)
		r := newRec(in)
		got := r.instance()
		if !reflect.DeepEqual(&got, in) {
			t.Errorf("%s: from its rec\n%+v\nwant\n%+v", tt.name, &got, in)
			continue
		}
		if got.Spec != in.Spec {
			t.Errorf("%s: the rec does not share the instance's spec", tt.name)
		}
		if r.Name() != in.Name || r.Group() != in.Group || r.Label() != in.Label || r.After() != in.After || r.Priority() != in.Priority {
			t.Errorf("%s: rec reads name %q group %q label %q after %q priority %d", tt.name, r.Name(), r.Group(), r.Label(), r.After(), r.Priority())
		}
	}
}

// An answer shows every field of the lifecycle's instance under the same
// JSON name but the lifecycle's bookkeeping (left), with a spec of its own.
func TestViewOf(t *testing.T) {
	left := map[string]bool{"After": true}
	it, vt := reflect.TypeFor[reconciler.Instance](), reflect.TypeFor[Instance]()
	for f := range it.Fields() {
		g, ok := vt.FieldByName(f.Name)
		switch {
		case left[f.Name] && ok:
			t.Errorf("Instance shows %s, which answers leave out", f.Name)
		case left[f.Name]:
		case !ok:
			t.Errorf("Instance has no field %s: show it, or leave it out in this test and say so in viewOf", f.Name)
		case g.Tag != f.Tag || g.Type != f.Type:
			t.Errorf("Instance.%s is %s `%s`, reconciler.Instance's %s `%s`", f.Name, g.Type, g.Tag, f.Type, f.Tag)
		}
	}
	if n := it.NumField() - len(left); vt.NumField() != n {
		t.Errorf("Instance has %d fields, want %d", vt.NumField(), n)
	}

	spec := &driver.Spec{Image: "app:1", Env: map[string]string{"K": "v"}}
	x := sampleInstance(spec)
	x.Name, x.HostPorts, x.Pool, x.Label, x.Priority, x.Attempts, x.Incarnation = "named", []int{30001}, "ci", "small", 3, 2, 1
	x.Message, x.After, x.Exclude, x.ExcludeUntil = "retrying", reconciler.Pending, []string{"sim/n1"}, x.Created.Add(time.Minute)
	x.Want = reconciler.Stopped
	x.Refused, x.Stale, x.Revision = []string{"sim/n2: no image"}, []reconciler.Ref{{Provider: "sim", Node: "n3", BackendID: "b3"}}, 9
	v := viewOf(x)
	var got, want map[string]any
	for _, c := range []struct {
		v   any
		out *map[string]any
	}{{v, &got}, {x, &want}} {
		b, err := json.Marshal(c.v)
		if err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(b, c.out); err != nil {
			t.Fatal(err)
		}
	}
	delete(want, "after")
	if !reflect.DeepEqual(got, want) {
		t.Errorf("answer\n%v\nwant\n%v", got, want)
	}
	if v.Spec == spec || !reflect.DeepEqual(*v.Spec, *spec) {
		t.Errorf("answer's spec %p %+v, want a copy of %p %+v", v.Spec, v.Spec, spec, spec)
	}
}

// A rec and what it shows keep the sizes their doc gives: every byte counts
// a million times over.
func TestRecSizes(t *testing.T) {
	if n := unsafe.Sizeof(rec{}); n != 144 {
		t.Errorf("a rec is %d bytes, want 144", n)
	}
	if n := unsafe.Sizeof(seenRec{}); n != 32 {
		t.Errorf("a seenRec is %d bytes, want 32", n)
	}
}

// An instant keeps a time to the nanosecond, in UTC, and the zero time
// apart from every other; times no clock gives are kept at the nearest
// instant that is.
func TestInstant(t *testing.T) {
	at := time.Date(2026, 11, 26, 6, 40, 1, 123456789, time.FixedZone("CET", 3600))
	for _, tt := range []struct {
		in, want time.Time
	}{
		{time.Time{}, time.Time{}},
		{at, at.UTC()},
		{time.Unix(0, 0), time.Unix(0, 0).UTC()},
		{time.Unix(0, math.MinInt64+1), time.Unix(0, math.MinInt64+1).UTC()},
		{time.Date(1000, 1, 1, 0, 0, 0, 0, time.UTC), time.Unix(0, math.MinInt64+1).UTC()},
		{time.Date(3000, 1, 1, 0, 0, 0, 0, time.UTC), time.Unix(0, math.MaxInt64).UTC()},
	} {
		if got := instantOf(tt.in).time(); got != tt.want {
			t.Errorf("instantOf(%v).time() = %v, want %v", tt.in, got, tt.want)
		}
	}
	if instantOf(at.Add(-time.Nanosecond)) >= instantOf(at) || instantOf(time.Time{}) >= instantOf(time.Unix(0, math.MinInt64+1)) {
		t.Error("instants do not keep the order of their times")
	}
}

// mustEncode is encodeRecord, failing the test on an error.
func mustEncode(t testing.TB, in *reconciler.Instance, shared *driver.Spec) []byte {
	t.Helper()
	b, err := encodeRecord(in, shared)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
