package driver_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/berth-dev/berth/driver"
)

var registered atomic.Int64

// unique returns a driver name no test has registered yet, so that the
// tests can run more than once in one process (-count).
func unique(name string) string {
	return fmt.Sprintf("%s-%d", name, registered.Add(1))
}

func openNothing(context.Context, any, driver.Env) (driver.Driver, error) { return nil, nil }

func mustPanic(t *testing.T, what, want string, fn func()) {
	t.Helper()
	defer func() {
		t.Helper()
		r := recover()
		if r == nil {
			t.Fatalf("%s did not panic", what)
		}
		if !strings.Contains(r.(string), want) {
			t.Errorf("%s panicked with %q, want it to mention %q", what, r, want)
		}
	}()
	fn()
}

func TestRegisterPanics(t *testing.T) {
	mustPanic(t, "Register with an empty name", "empty name", func() {
		driver.Register(driver.Definition{OpenWith: openNothing})
	})
	mustPanic(t, "Register with a nil OpenWith", "nil OpenWith", func() {
		driver.Register(driver.Definition{Name: "test-nil-open"})
	})
	dup := unique("test-dup")
	driver.Register(driver.Definition{Name: dup, OpenWith: openNothing})
	mustPanic(t, "Register twice", "twice", func() {
		driver.Register(driver.Definition{Name: dup, OpenWith: openNothing})
	})
	if slices.Contains(driver.Drivers(), "test-nil-open") {
		t.Error("a rejected definition was registered")
	}
}

func TestLookup(t *testing.T) {
	zeta, alpha := unique("test-zeta"), unique("test-alpha")
	driver.Register(driver.Definition{Name: zeta, OpenWith: openNothing})
	driver.Register(driver.Definition{Name: alpha, OpenWith: openNothing})
	names := driver.Drivers()
	if !slices.IsSorted(names) || !slices.Contains(names, zeta) || !slices.Contains(names, alpha) {
		t.Errorf("Drivers() = %v, want sorted and holding %s and %s", names, zeta, alpha)
	}
	d, err := driver.Lookup(alpha)
	if err != nil || d.Name != alpha {
		t.Fatalf("Lookup test-alpha: %+v %v", d, err)
	}
	_, err = driver.Lookup("nosuch")
	if !errors.Is(err, driver.ErrInvalid) {
		t.Fatalf("Lookup of an unknown driver: %v, want ErrInvalid", err)
	}
	msg := err.Error()
	if !strings.Contains(msg, `"nosuch"`) || !strings.Contains(msg, "forgotten import?") {
		t.Errorf("Lookup error %q does not name the driver or hint at the import", msg)
	}
	if !strings.Contains(msg, strings.Join(names, ", ")) {
		t.Errorf("Lookup error %q does not list the registered drivers in order %v", msg, names)
	}
}

type regOpts struct {
	Size    int    `option:"size" help:"how big"`
	Name    string `option:"name"`
	checked bool
}

func (o *regOpts) Validate() error {
	o.checked = true
	if o.Size > 10 {
		return &driver.FieldError{Path: "size", Reason: "at most 10"}
	}
	return nil
}

type fakeDriver struct {
	driver.Driver
	opts *regOpts
	env  driver.Env
}

func TestDefineOpen(t *testing.T) {
	def := driver.Define("test-define", "a test", func() *regOpts { return &regOpts{Size: 3} },
		func(ctx context.Context, o *regOpts, env driver.Env) (driver.Driver, error) {
			if o.Name == "fail" {
				return nil, driver.Errorf(driver.ErrRetryable, "cannot reach the back-end")
			}
			return &fakeDriver{opts: o, env: env}, nil
		})
	d, err := def.Open(context.Background(), map[string]any{"name": "x"}, driver.Env{})
	if err != nil {
		t.Fatal(err)
	}
	fd := d.(*fakeDriver)
	if fd.opts.Size != 3 || fd.opts.Name != "x" || !fd.opts.checked {
		t.Errorf("options %+v: want the default size, the given name, and Validate called", fd.opts)
	}
	if fd.env.Provider != "test-define" || fd.env.Logger == nil {
		t.Errorf("env %+v: want the provider defaulted to the driver name and a logger", fd.env)
	}
	_, err = def.Open(context.Background(), map[string]any{"size": 11}, driver.Env{})
	if !errors.Is(err, driver.ErrInvalid) || !strings.Contains(err.Error(), `driver "test-define"`) || !strings.Contains(err.Error(), "size") {
		t.Errorf("Validate failure: %v, want ErrInvalid naming the driver and size", err)
	}
	_, err = def.Open(context.Background(), map[string]any{"name": "fail"}, driver.Env{})
	if !errors.Is(err, driver.ErrRetryable) || !strings.Contains(err.Error(), `driver "test-define": open`) {
		t.Errorf("open failure: %v, want the back-end's error wrapped with the driver name", err)
	}
	opts := def.Options()
	if len(opts) != 2 || opts[0].Name != "name" || opts[1].Name != "size" || opts[1].Default != "3" || opts[1].Help != "how big" || opts[1].Type != "int" {
		t.Errorf("Options() = %+v", opts)
	}
	if got := driver.FlagName("test-define", opts[1]); got != "test-define-size" {
		t.Errorf("FlagName = %q", got)
	}
}

func TestNoOptions(t *testing.T) {
	def := driver.Definition{Name: "test-bare", OpenWith: openNothing}
	if v, err := def.Decode(nil); v != nil || err != nil {
		t.Errorf("Decode(nil) = %v %v", v, err)
	}
	_, err := def.Decode(map[string]any{"b": 1, "a": 2})
	var fe *driver.FieldError
	if !errors.As(err, &fe) || fe.Path != "a" || !strings.Contains(err.Error(), `driver "test-bare"`) {
		t.Errorf("Decode with options for a driver without any: %v, want a field error on a", err)
	}
	if def.Options() != nil {
		t.Errorf("Options() = %v, want nil", def.Options())
	}
}
