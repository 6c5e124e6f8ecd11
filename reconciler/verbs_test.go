package reconciler

import (
	"errors"
	"strings"
	"testing"

	"github.com/berth-dev/berth/driver"
)

// TestRefusal: only the verbs that can never apply are refused, each with
// a message naming the phase; every other verb in every phase is accepted.
func TestRefusal(t *testing.T) {
	refused := map[Phase]map[Verb]error{
		Deleted:  {VerbStart: driver.ErrInvalid, VerbRestart: driver.ErrInvalid, VerbSuspend: driver.ErrInvalid, VerbResume: driver.ErrInvalid},
		Deleting: {VerbStart: driver.ErrInvalid, VerbRestart: driver.ErrInvalid, VerbSuspend: driver.ErrInvalid, VerbResume: driver.ErrInvalid},
		Held:     {VerbSuspend: driver.ErrInvalid},
		Stopping: {VerbResume: driver.ErrNotSuspended},
		Stopped:  {VerbResume: driver.ErrNotSuspended},
		Exited:   {VerbResume: driver.ErrNotSuspended},
		Failed:   {VerbResume: driver.ErrNotSuspended},
	}
	for _, ph := range Phases {
		for _, v := range Verbs {
			in := &Instance{ID: "x", Phase: ph}
			if ph == Deleting {
				in.After = Deleted
			}
			err, want := Refusal(in, v), refused[ph][v]
			switch {
			case want == nil && err != nil:
				t.Errorf("%s of a %s instance: %v, want it accepted", v, ph, err)
			case want != nil && !errors.Is(err, want):
				t.Errorf("%s of a %s instance: %v, want %v", v, ph, err, want)
			case want != nil && !strings.Contains(err.Error(), string(ph)):
				t.Errorf("%s of a %s instance: %q does not name the phase", v, ph, err)
			}
		}
	}
	// Deleting a failed attempt before placing it again is not deleting
	// for good: every verb is accepted. On its way to failed, a start or
	// restart creates it again.
	for _, v := range Verbs {
		if err := Refusal(&Instance{ID: "x", Phase: Deleting, After: Pending}, v); err != nil {
			t.Errorf("%s of an instance deleting a failed attempt: %v", v, err)
		}
	}
	for _, v := range []Verb{VerbStart, VerbRestart} {
		if err := Refusal(&Instance{ID: "x", Phase: Deleting, After: Failed}, v); err != nil {
			t.Errorf("%s of an instance deleting on its way to failed: %v", v, err)
		}
	}
}
