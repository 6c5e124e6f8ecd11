package memory

import (
	"math"
	"testing"
)

// TestEntryParts checks that an entry gives back its revisions and value,
// at the ends of the revisions' range and with an empty value.
func TestEntryParts(t *testing.T) {
	for _, c := range []struct {
		create, modRev int64
		value          string
	}{
		{1, 1, ""},
		{1, 1, "v"},
		{127, 128, "{}"},
		{1 << 40, math.MaxInt64, "value"},
		{math.MaxInt64, math.MaxInt64, ""},
	} {
		create, modRev, value := newEntry(c.create, c.modRev, []byte(c.value)).parts()
		if create != c.create || modRev != c.modRev || value != c.value {
			t.Errorf("newEntry(%d, %d, %q).parts() = %d, %d, %q", c.create, c.modRev, c.value, create, modRev, value)
		}
	}
}
