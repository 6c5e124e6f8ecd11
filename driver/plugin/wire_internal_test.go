package plugin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"

	"github.com/berth-dev/berth/driver"
)

// roundTrip sends err over the wire as an answer does.
func roundTrip(t *testing.T, err error) error {
	t.Helper()
	var r emptyReply
	r.setErr(err)
	b, merr := json.Marshal(&r)
	if merr != nil {
		t.Fatal(merr)
	}
	var back emptyReply
	if uerr := json.Unmarshal(b, &back); uerr != nil {
		t.Fatal(uerr)
	}
	return back.error()
}

func TestErrorsSurviveTheWire(t *testing.T) {
	for _, k := range driver.Classes {
		err := roundTrip(t, fmt.Errorf("sim: create: %w", driver.Errorf(k, "because")))
		if !errors.Is(err, k) || driver.ClassOf(err) != k || err.Error() != "sim: create: "+k.Error()+": because" {
			t.Errorf("%v came back as %v (class %v)", k, err, driver.ClassOf(err))
		}
	}
	if err := roundTrip(t, nil); err != nil {
		t.Errorf("nil came back as %v", err)
	}
	if err := roundTrip(t, errors.New("odd")); driver.ClassOf(err) != nil || err.Error() != "odd" {
		t.Errorf("an unclassified error came back as %v (class %v)", err, driver.ClassOf(err))
	}

	var es driver.FieldErrors
	es.Add("nodes", "want an int")
	es.Add("shape.cpus", "too many")
	err := roundTrip(t, fmt.Errorf("driver %q: %w", "sim", es))
	var back driver.FieldErrors
	if !errors.Is(err, driver.ErrInvalid) || !errors.As(err, &back) || len(back) != 2 || back[1].Path != "shape.cpus" {
		t.Errorf("field errors came back as %v (%v)", err, back)
	}
	var one *driver.FieldError
	if err := roundTrip(t, &driver.FieldError{Path: "signal", Reason: "no such"}); !errors.As(err, &one) || one.Path != "signal" {
		t.Errorf("a field error came back as %v", err)
	}

	err = roundTrip(t, &driver.PartialListError{Nodes: []string{"a", "c"}, Err: errors.New("engine a: down")})
	var pe *driver.PartialListError
	if !errors.Is(err, driver.ErrRetryable) || !errors.As(err, &pe) || !pe.Missing("c") || pe.Missing("b") {
		t.Errorf("a partial listing came back as %v", err)
	}

	err = roundTrip(t, fmt.Errorf("%w: %w", driver.ErrTimeout, context.DeadlineExceeded))
	if !errors.Is(err, driver.ErrTimeout) || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("a deadline came back as %v", err)
	}
}
