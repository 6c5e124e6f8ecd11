package driver_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"testing"
	"time"

	"github.com/berth-dev/berth/driver"
)

func TestErrorVocabulary(t *testing.T) {
	for _, k := range driver.Classes {
		err := fmt.Errorf("layer two: %w", driver.Errorf(k, "node %s", "n1"))
		if got := driver.ClassOf(err); got != k {
			t.Errorf("ClassOf(wrapped %v) = %v", k, got)
		}
		if want := k.Error() + ": node n1"; errors.Unwrap(err).Error() != want {
			t.Errorf("Errorf text %q, want %q", errors.Unwrap(err), want)
		}
	}
	if driver.ClassOf(nil) != nil || driver.ClassOf(io.EOF) != nil {
		t.Error("ClassOf of nil or an unclassified error is not nil")
	}
	fe := &driver.FieldError{Path: "ports[1].host_port", Reason: "bad"}
	if !errors.Is(fmt.Errorf("x: %w", fe), driver.ErrInvalid) || driver.ClassOf(fe) != driver.ErrInvalid {
		t.Error("a wrapped FieldError is not ErrInvalid")
	}
	if fe.Error() != "invalid ports[1].host_port: bad" || (&driver.FieldError{Reason: "r"}).Error() != "invalid: r" {
		t.Errorf("FieldError texts: %q", fe.Error())
	}
	var es driver.FieldErrors
	if es.Err() != nil {
		t.Error("an empty FieldErrors is an error")
	}
	es = driver.FieldErrors{fe, {Path: "name", Reason: "empty"}}
	err := fmt.Errorf("driver %q: %w", "x", es.Err())
	if !errors.Is(err, driver.ErrInvalid) {
		t.Error("wrapped FieldErrors is not ErrInvalid")
	}
	var got *driver.FieldError
	if !errors.As(err, &got) || got.Path != "ports[1].host_port" {
		t.Errorf("errors.As finds %+v, want the first field error", got)
	}
	if es.Error() != "invalid ports[1].host_port: bad; invalid name: empty" {
		t.Errorf("FieldErrors text %q", es.Error())
	}
}

type capsAll struct{ driver.Driver }

func (capsAll) Images(context.Context, string) ([]driver.Image, error) { return nil, nil }
func (capsAll) Kill(context.Context, string, string) error             { return nil }
func (capsAll) Suspend(context.Context, string) error                  { return nil }
func (capsAll) Resume(context.Context, string) error                   { return nil }
func (capsAll) Stop(context.Context, string, time.Duration) error      { return nil }
func (capsAll) Exec(context.Context, string, driver.ExecOptions, io.Reader, io.Writer, io.Writer) (int, error) {
	return 0, nil
}

func TestCapabilities(t *testing.T) {
	got := driver.Capabilities(capsAll{})
	want := []string{driver.CapExec, driver.CapImages, driver.CapKill, driver.CapStop, driver.CapSuspend}
	if !slices.Equal(got, want) {
		t.Errorf("Capabilities = %v, want %v", got, want)
	}
	if !slices.IsSorted(got) {
		t.Errorf("Capabilities not sorted: %v", got)
	}
	if got := driver.Capabilities(struct{ driver.Driver }{}); len(got) != 0 {
		t.Errorf("a bare driver declares %v", got)
	}
}

func TestPartialListError(t *testing.T) {
	var err error = fmt.Errorf("provider p: %w", &driver.PartialListError{Nodes: []string{"e2", "e3"}, Err: errors.New("e2: offline; e3: offline")})
	if !errors.Is(err, driver.ErrRetryable) || driver.ClassOf(err) != driver.ErrRetryable {
		t.Errorf("%v: not ErrRetryable", err)
	}
	if errors.Is(err, driver.ErrTimeout) || errors.Is(err, driver.ErrNotFound) {
		t.Errorf("%v: matches another kind", err)
	}
	var pe *driver.PartialListError
	if !errors.As(err, &pe) {
		t.Fatalf("%v: errors.As finds no PartialListError", err)
	}
	if !pe.Missing("e2") || !pe.Missing("e3") || pe.Missing("e1") {
		t.Errorf("Missing: nodes %v", pe.Nodes)
	}
	if want := "provider p: retryable: list is partial: nodes e2, e3 could not be listed: e2: offline; e3: offline"; err.Error() != want {
		t.Errorf("text %q, want %q", err, want)
	}
}

type attachOnly struct{ driver.Driver }

func (attachOnly) Attach(context.Context, string, driver.AttachOptions, io.Reader, io.Writer, io.Writer) error {
	return nil
}
func (attachOnly) ResizeTTY(context.Context, string, driver.TTYSize) error { return nil }

type declares struct {
	driver.Driver
	f []string
}

func (d declares) Features() []string { return d.f }

func TestFeaturesStdinNeedsAttach(t *testing.T) {
	for _, tc := range []struct {
		name      string
		d         driver.Driver
		stdin     bool
		hasAttach bool
	}{
		{"no features declared, no attach", struct{ driver.Driver }{}, false, false},
		{"no features declared, attach", attachOnly{}, true, true},
		{"stdin declared, no attach", declares{f: []string{driver.CapKindContainer, driver.CapStdin, driver.CapTTY}}, false, false},
		{"stdin not declared", declares{f: []string{driver.CapKindContainer}}, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := driver.Features(tc.d)
			if got := slices.Contains(f, driver.CapStdin) && slices.Contains(f, driver.CapTTY); got != tc.stdin {
				t.Errorf("Features = %v: stdin and tty %v, want %v", f, got, tc.stdin)
			}
			if got := slices.Contains(driver.Capabilities(tc.d), driver.CapAttach); got != tc.hasAttach {
				t.Errorf("Capabilities attach %v, want %v", got, tc.hasAttach)
			}
		})
	}
	spec := &driver.Spec{Image: "x", Stdin: true, TTY: true}
	need := driver.SpecFeatures(spec)
	if !slices.Contains(need, driver.CapStdin) || !slices.Contains(need, driver.CapTTY) {
		t.Errorf("SpecFeatures(stdin, tty) = %v", need)
	}
	if driver.FeatureField(driver.CapStdin) != "stdin" || driver.FeatureField(driver.CapTTY) != "tty" {
		t.Errorf("FeatureField names %q and %q", driver.FeatureField(driver.CapStdin), driver.FeatureField(driver.CapTTY))
	}
}

func TestExecOptionsCheck(t *testing.T) {
	sizes := make(chan driver.TTYSize)
	for _, tc := range []struct {
		opts driver.ExecOptions
		path string // "" when valid
	}{
		{driver.ExecOptions{Cmd: []string{"ls"}, Env: []string{"A=1", "B="}}, ""},
		{driver.ExecOptions{Cmd: []string{"ls"}, TTY: true, Size: driver.TTYSize{Rows: 2, Cols: 3}, Resize: sizes}, ""},
		{driver.ExecOptions{}, "cmd"},
		{driver.ExecOptions{Cmd: []string{""}}, "cmd"},
		{driver.ExecOptions{Cmd: []string{"ls"}, Env: []string{"A=1", "B"}}, "env[1]"},
		{driver.ExecOptions{Cmd: []string{"ls"}, Env: []string{"=1"}}, "env[0]"},
		{driver.ExecOptions{Cmd: []string{"ls"}, Size: driver.TTYSize{Rows: 2, Cols: 3}}, "tty"},
		{driver.ExecOptions{Cmd: []string{"ls"}, Resize: sizes}, "tty"},
	} {
		err := tc.opts.Check()
		var fe *driver.FieldError
		switch {
		case tc.path == "" && err != nil:
			t.Errorf("Check(%+v) = %v, want nil", tc.opts, err)
		case tc.path != "" && (!errors.As(err, &fe) || fe.Path != tc.path):
			t.Errorf("Check(%+v) = %v, want a field error on %s", tc.opts, err, tc.path)
		}
	}
}
