package reconciler

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/driver"
)

// TestScenarios replays the scripted scenarios in testdata/*.txt through
// Step. A file holds scenarios; each starts with "scenario NAME", may set
// the machine ("machine launch=30s attempts=3 backoff=1s exclude=10m") and the initial
// instance ("init phase=running backend=b1 provider=p node=n restart=always
// group=g attempts=0 after=pending want=stopped"), then lists steps:
//
//	AT EVENT [k=v ...] -> PHASE [ACTION ...] [k=v ...]
//
// AT is the time since the start (a Go duration). EVENT is an EventKind;
// its arguments are provider, node, id and state (the driver instance), err
// (an error class: retryable, permanent, quota, capacity, timeout, invalid,
// notfound, deletefailed, or notattempted: a *driver.NotAttemptedError whose
// Until is the step's until), msg and until (a duration since the start). After
// the arrow come the expected phase, the expected actions in order ("-" for
// none; "create+adopt" is a create that looks up first; a wake is written
// "wake"), and checks: attempts=N, backend=ID (or backend=- for none),
// after=PHASE, want=PHASE (or want=- for none), node=N, stale=N, exclude=N, refused=N, incarnation=N,
// seen=STATE (the observed state, - for none), msg~TEXT (the message
// contains TEXT, with '_' for a space).
func TestScenarios(t *testing.T) {
	files, err := filepath.Glob("testdata/*.txt")
	if err != nil || len(files) == 0 {
		t.Fatalf("no scenario files: %v", err)
	}
	for _, file := range files {
		for _, sc := range parseScenarios(t, file) {
			t.Run(filepath.Base(file)+"/"+sc.name, func(t *testing.T) { sc.run(t) })
		}
	}
}

type scenario struct {
	name  string
	m     Machine
	init  Instance
	steps []scriptStep
}

type scriptStep struct {
	line    int
	at      time.Duration
	ev      Event
	phase   Phase
	actions []string
	checks  map[string]string
}

var start = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func (sc *scenario) run(t *testing.T) {
	in := sc.init
	for _, st := range sc.steps {
		var acts []Action
		in, acts = sc.m.Step(in, st.ev, start.Add(st.at))
		got := make([]string, len(acts))
		for i, a := range acts {
			got[i] = a.String()
		}
		if in.Phase != st.phase {
			t.Fatalf("line %d: phase %s, want %s (message %q)", st.line, in.Phase, st.phase, in.Message)
		}
		if !slices.Equal(got, st.actions) {
			t.Fatalf("line %d: actions %v, want %v", st.line, got, st.actions)
		}
		for k, want := range st.checks {
			if err := check(in, k, want); err != nil {
				t.Fatalf("line %d: %v", st.line, err)
			}
		}
	}
}

func check(in Instance, k, want string) error {
	var got string
	switch k {
	case "attempts":
		got = strconv.Itoa(in.Attempts)
	case "backend":
		got = in.BackendID
		if got == "" {
			got = "-"
		}
	case "after":
		got = string(in.After)
	case "want":
		got = string(in.Want)
		if got == "" {
			got = "-"
		}
	case "node":
		got = in.Node
	case "stale":
		got = strconv.Itoa(len(in.Stale))
	case "exclude":
		got = strconv.Itoa(len(in.Exclude))
	case "refused":
		got = strconv.Itoa(len(in.Refused))
	case "incarnation":
		got = strconv.Itoa(in.Incarnation)
	case "seen":
		got = "-"
		if in.Observed != nil {
			got = string(in.Observed.State)
		}
	case "msg~":
		if !strings.Contains(in.Message, strings.ReplaceAll(want, "_", " ")) {
			return fmt.Errorf("message %q does not contain %q", in.Message, want)
		}
		return nil
	default:
		return fmt.Errorf("unknown check %q", k)
	}
	if got != want {
		return fmt.Errorf("%s = %s, want %s", k, got, want)
	}
	return nil
}

var errClasses = map[string]error{
	"retryable":    driver.ErrRetryable,
	"permanent":    driver.ErrPermanent,
	"quota":        driver.ErrQuotaExceeded,
	"capacity":     driver.ErrInsufficientCapacity,
	"timeout":      driver.ErrTimeout,
	"invalid":      driver.ErrInvalid,
	"notfound":     driver.ErrNotFound,
	"deletefailed": driver.ErrDeleteFailed,
}

func parseScenarios(t *testing.T, file string) []*scenario {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []*scenario
	var cur *scenario
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if i := strings.Index(line, "#"); i >= 0 {
			line = strings.TrimSpace(line[:i])
		}
		if line == "" {
			continue
		}
		fields := strings.Fields(line)
		bad := func(format string, args ...any) {
			t.Fatalf("%s:%d: %s", file, n, fmt.Sprintf(format, args...))
		}
		switch fields[0] {
		case "scenario":
			cur = &scenario{name: strings.Join(fields[1:], "_"), init: Instance{ID: "i1", Spec: &driver.Spec{}, Phase: Pending, Created: start}}
			out = append(out, cur)
			continue
		}
		if cur == nil {
			bad("a step before the first scenario line")
		}
		switch fields[0] {
		case "machine":
			for k, v := range kv(fields[1:], bad) {
				d, err := time.ParseDuration(v)
				switch k {
				case "launch":
					cur.m.LaunchTimeout = d
				case "backoff":
					cur.m.Backoff = d
				case "attempts":
					cur.m.MaxAttempts, err = strconv.Atoi(v)
				case "exclude":
					cur.m.ExcludeFor = d
				case "refusals":
					cur.m.MaxRefusals, err = strconv.Atoi(v)
				default:
					bad("unknown machine knob %q", k)
				}
				if err != nil {
					bad("%s: %v", k, err)
				}
			}
			continue
		case "init":
			for k, v := range kv(fields[1:], bad) {
				switch k {
				case "phase":
					cur.init.Phase = Phase(v)
				case "backend":
					cur.init.BackendID = v
				case "provider":
					cur.init.Provider = v
				case "node":
					cur.init.Node = v
				case "restart":
					cur.init.Spec.RestartPolicy.Name = v
				case "group":
					cur.init.Group = v
				case "attempts":
					cur.init.Attempts, _ = strconv.Atoi(v)
				case "after":
					cur.init.After = Phase(v)
				case "want":
					cur.init.Want = Phase(v)
				default:
					bad("unknown init key %q", k)
				}
			}
			continue
		}
		arrow := slices.Index(fields, "->")
		if arrow < 2 || arrow == len(fields)-1 {
			bad("want: AT EVENT [k=v...] -> PHASE [ACTIONS] [checks]")
		}
		at, err := time.ParseDuration(fields[0])
		if err != nil {
			bad("time %q: %v", fields[0], err)
		}
		st := scriptStep{line: n, at: at, ev: Event{Kind: EventKind(fields[1])}, checks: map[string]string{}}
		var obs *driver.Instance
		notAttempted := false
		for k, v := range kv(fields[2:arrow], bad) {
			switch k {
			case "provider":
				st.ev.Provider = v
			case "node":
				st.ev.Node = v
			case "id":
				obs = cond(obs)
				obs.ID = v
			case "state":
				obs = cond(obs)
				obs.State = driver.State(v)
			case "err":
				if v == "notattempted" {
					notAttempted = true
					continue
				}
				cls, ok := errClasses[v]
				if !ok {
					bad("unknown error class %q", v)
				}
				st.ev.Err = driver.Errorf(cls, "scripted %s error", v)
			case "msg":
				st.ev.Message = strings.ReplaceAll(v, "_", " ")
			case "until":
				d, err := time.ParseDuration(v)
				if err != nil {
					bad("until: %v", err)
				}
				st.ev.Until = start.Add(d)
			case "ref":
				st.ev.Ref = Ref{Provider: cur.init.Provider, Node: cur.init.Node, BackendID: v}
			default:
				bad("unknown event key %q", k)
			}
		}
		if notAttempted {
			st.ev.Err = &driver.NotAttemptedError{Until: st.ev.Until, Err: errors.New("scripted: circuit breaker is open")}
		}
		st.ev.Instance = obs
		st.phase = Phase(fields[arrow+1])
		if !st.phase.Valid() {
			bad("unknown phase %q", st.phase)
		}
		for _, f := range fields[arrow+2:] {
			if k, v, ok := strings.Cut(f, "~"); ok && !strings.Contains(k, "=") {
				st.checks[k+"~"] = v
				continue
			}
			if k, v, ok := strings.Cut(f, "="); ok {
				st.checks[k] = v
				continue
			}
			if f != "-" {
				st.actions = append(st.actions, f)
			}
		}
		if st.actions == nil {
			st.actions = []string{}
		}
		cur.steps = append(cur.steps, st)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func cond(obs *driver.Instance) *driver.Instance {
	if obs == nil {
		return &driver.Instance{}
	}
	return obs
}

func kv(fields []string, bad func(string, ...any)) map[string]string {
	m := map[string]string{}
	for _, f := range fields {
		k, v, ok := strings.Cut(f, "=")
		if !ok {
			bad("want key=value, got %q", f)
		}
		m[k] = v
	}
	return m
}
