package main

import (
	"math/big"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/driver/drivertest"
)

// TestEveryNumericOptionHasARange: every number among every driver's
// options declares its range (a `range` tag holding its default), and a
// value just beyond either end is refused naming the option.
func TestEveryNumericOptionHasARange(t *testing.T) {
	for _, name := range driver.Drivers() {
		def, err := driver.Lookup(name)
		if err != nil {
			t.Fatal(err)
		}
		if def.NewOptions == nil {
			continue
		}
		for _, p := range driver.CheckOptionRanges(def.NewOptions()) {
			t.Errorf("driver %s: option %s", name, p)
		}
		for _, o := range def.Options() {
			if o.Range == "" {
				continue
			}
			lo, hi, _ := strings.Cut(o.Range, ",")
			for _, v := range []string{beyond(t, o.Type, lo, -1), beyond(t, o.Type, hi, +1)} {
				if _, err := def.Decode(map[string]any{o.Name: v}); !drivertest.HasField(err, o.Name) {
					t.Errorf("driver %s: %s=%s (range %s): %v, want an error naming %s", name, o.Name, v, o.Range, err, o.Name)
				}
			}
		}
	}
}

// beyond returns the flag text of the value one step past end (in
// direction dir) of an option of type typ.
func beyond(t *testing.T, typ, end string, dir int) string {
	t.Helper()
	switch typ {
	case "duration":
		d, err := time.ParseDuration(end)
		if err != nil {
			t.Fatalf("range end %q: %v", end, err)
		}
		return (d + time.Duration(dir)).String()
	case "int":
		n, ok := new(big.Int).SetString(end, 10)
		if !ok {
			t.Fatalf("range end %q", end)
		}
		// Past an unsigned field's 0 or the largest uint64 the value does
		// not parse: refused as well, naming the option.
		return n.Add(n, big.NewInt(int64(dir))).String()
	case "float":
		f, err := strconv.ParseFloat(end, 64)
		if err != nil {
			t.Fatalf("range end %q: %v", end, err)
		}
		return strconv.FormatFloat(f+float64(dir)*(0.001+f/1000), 'g', -1, 64)
	}
	t.Fatalf("a range on an option of type %s", typ)
	return ""
}
