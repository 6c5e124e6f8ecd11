package driver_test

import (
	"context"
	"errors"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/driver/drivertest"
)

type allOpts struct {
	Str   string            `option:"str" help:"a string"`
	Flag  bool              `option:"flag"`
	Count int               `option:"count"`
	Ratio float64           `option:"ratio"`
	Wait  time.Duration     `option:"wait"`
	List  []string          `option:"list"`
	Map   map[string]string `option:"map"`
	Size  driver.Bytes      `option:"size"`
	CPUs  driver.MilliCPU   `option:"cpus"`
	Shape struct {
		Width int `json:"width"`
	} `option:"shape"`
	Untagged int
}

var allDef = driver.Define("test-all", "every option type",
	func() *allOpts { return &allOpts{Count: 2, Wait: time.Second, List: []string{"a", "b"}} },
	func(context.Context, *allOpts, driver.Env) (driver.Driver, error) { return nil, nil })

func decodeAll(t *testing.T, raw map[string]any) (*allOpts, error) {
	t.Helper()
	v, err := allDef.Decode(raw)
	if err != nil {
		return nil, err
	}
	return v.(*allOpts), nil
}

func TestOptionTypes(t *testing.T) {
	got := map[string]string{}
	for _, o := range allDef.Options() {
		got[o.Name] = o.Type + "|" + o.Default
	}
	want := map[string]string{
		"str": "string|", "flag": "bool|", "count": "int|2", "ratio": "float|", "wait": "duration|1s",
		"list": "list|a,b", "map": "map|", "size": "size|", "cpus": "cpus|", "shape": "json|",
	}
	if !maps.Equal(got, want) {
		t.Errorf("Options() types and defaults = %v, want %v", got, want)
	}
	names := []string{}
	for _, o := range allDef.Options() {
		names = append(names, o.Name)
	}
	if !slices.IsSorted(names) {
		t.Errorf("Options() not sorted: %v", names)
	}
}

func TestOptionFlagText(t *testing.T) {
	o, err := decodeAll(t, map[string]any{
		"str": "hello", "flag": "true", "count": "42", "ratio": "0.5", "wait": "1m30s",
		"list": "x, y,,z", "map": "a=1,b=2", "size": "2Gi", "cpus": "250m", "shape": `{"width": 3}`,
	})
	if err != nil {
		t.Fatal(err)
	}
	if o.Str != "hello" || !o.Flag || o.Count != 42 || o.Ratio != 0.5 || o.Wait != 90*time.Second ||
		!slices.Equal(o.List, []string{"x", "y", "z"}) || !maps.Equal(o.Map, map[string]string{"a": "1", "b": "2"}) ||
		o.Size != 2*driver.GiB || o.CPUs != 250 || o.Shape.Width != 3 {
		t.Errorf("decoded %+v", o)
	}
}

func TestOptionJSONValues(t *testing.T) {
	o, err := decodeAll(t, map[string]any{
		"flag": true, "count": 7, "ratio": 1.25, "list": []any{"p", "q"}, "map": map[string]any{"k": "v"},
		"size": 512, "cpus": 0.5, "shape": map[string]any{"width": 9},
	})
	if err != nil {
		t.Fatal(err)
	}
	if !o.Flag || o.Count != 7 || o.Ratio != 1.25 || !slices.Equal(o.List, []string{"p", "q"}) || o.Map["k"] != "v" ||
		o.Size != 512*driver.MiB || o.CPUs != 500 || o.Shape.Width != 9 {
		t.Errorf("decoded %+v", o)
	}
	if o.Wait != time.Second {
		t.Errorf("an option not given lost its default: wait %s", o.Wait)
	}
}

func TestOptionErrors(t *testing.T) {
	cases := []struct {
		name string
		raw  map[string]any
		key  string
	}{
		{"unknown key", map[string]any{"colour": "red"}, "colour"},
		{"bool text", map[string]any{"flag": "maybe"}, "flag"},
		{"int text", map[string]any{"count": "many"}, "count"},
		{"int from float", map[string]any{"count": 1.5}, "count"},
		{"int from bool", map[string]any{"count": true}, "count"},
		{"float text", map[string]any{"ratio": "half"}, "ratio"},
		{"duration text", map[string]any{"wait": "soon"}, "wait"},
		{"duration number", map[string]any{"wait": 5}, "wait"},
		{"map text", map[string]any{"map": "novalue"}, "map"},
		{"list from number", map[string]any{"list": 3}, "list"},
		{"size text", map[string]any{"size": "lots"}, "size"},
		{"cpus text", map[string]any{"cpus": "fast"}, "cpus"},
		{"json unknown field", map[string]any{"shape": `{"height": 1}`}, "shape"},
		{"json trailing data", map[string]any{"shape": `{"width": 1} {}`}, "shape"},
		{"json wrong type", map[string]any{"shape": map[string]any{"width": "wide"}}, "shape"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := decodeAll(t, c.raw)
			if !errors.Is(err, driver.ErrInvalid) {
				t.Fatalf("Decode(%v): %v, want ErrInvalid", c.raw, err)
			}
			var fe *driver.FieldError
			if !errors.As(err, &fe) || fe.Path != c.key {
				t.Errorf("Decode(%v): %v, want a field error on %q", c.raw, err, c.key)
			}
			if !strings.Contains(err.Error(), `driver "test-all"`) {
				t.Errorf("Decode(%v): %q does not name the driver", c.raw, err)
			}
		})
	}
	_, err := decodeAll(t, map[string]any{"colour": "red"})
	if !strings.Contains(err.Error(), "known: count, cpus, flag, list, map, ratio, shape, size, str, wait") {
		t.Errorf("unknown key error %q does not list the known options", err)
	}
	_, err = decodeAll(t, map[string]any{"zz": 1, "count": "x", "aa": 2})
	var fes driver.FieldErrors
	if !errors.As(err, &fes) || len(fes) != 3 || fes[0].Path != "aa" || fes[1].Path != "count" || fes[2].Path != "zz" {
		t.Errorf("several bad keys: %v, want three field errors in key order", err)
	}
}

type rangedOptions struct {
	Workers int           `option:"workers" range:"1,8"`
	Grace   time.Duration `option:"grace" range:"0s,1m"`
	Ratio   float64       `option:"ratio" range:"0,1"`
	Bare    int           `option:"bare"`
}

// TestOptionRanges: a value outside a declared range is refused naming the
// option, whether set or left at a default; a number without a range is
// reported.
func TestOptionRanges(t *testing.T) {
	def := driver.Define("ranged", "test", func() *rangedOptions { return &rangedOptions{Workers: 2, Ratio: 0.5} },
		func(context.Context, *rangedOptions, driver.Env) (driver.Driver, error) { return nil, nil })
	for _, c := range []struct {
		raw   map[string]any
		field string
	}{
		{map[string]any{"workers": 9}, "workers"},
		{map[string]any{"workers": "0"}, "workers"},
		{map[string]any{"grace": "-1ns"}, "grace"},
		{map[string]any{"grace": "61s"}, "grace"},
		{map[string]any{"ratio": 1.5}, "ratio"},
	} {
		if _, err := def.Decode(c.raw); !drivertest.HasField(err, c.field) {
			t.Errorf("%v: %v, want an error naming %s", c.raw, err, c.field)
		}
	}
	if _, err := def.Decode(map[string]any{"workers": 8, "grace": "1m", "ratio": 0}); err != nil {
		t.Errorf("the ends of the ranges: %v", err)
	}
	bad := driver.Define("ranged", "test", func() *rangedOptions { return &rangedOptions{Workers: 0} },
		func(context.Context, *rangedOptions, driver.Env) (driver.Driver, error) { return nil, nil })
	if _, err := bad.Decode(nil); !drivertest.HasField(err, "workers") {
		t.Errorf("a default out of its range: %v, want an error naming workers", err)
	}
	if got := driver.CheckOptionRanges(&rangedOptions{Workers: 2}); len(got) != 1 || !strings.HasPrefix(got[0], "bare:") {
		t.Errorf("CheckOptionRanges: %q, want bare reported", got)
	}
	if o := def.Options(); o[3].Name != "workers" || o[3].Range != "1,8" {
		t.Errorf("options: %+v", o)
	}
}
