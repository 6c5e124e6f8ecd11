package driver

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
)

// Env is what Berth hands every driver it opens.
type Env struct {
	// Provider is the name of the configured back-end (a driver may be
	// configured several times under different provider names).
	Provider string
	// Cluster identifies the Berth installation; drivers need it only to
	// build names.
	Cluster string
	// DataDir is a directory the driver may keep files in; it survives
	// restarts. Empty means the driver must keep nothing on disk.
	DataDir string
	// Logger carries the provider attribute already. Never nil after Open.
	Logger *slog.Logger
}

// Definition describes a driver to the registry.
type Definition struct {
	// Name is how configuration selects the driver ("sim", "docker").
	Name string
	// Summary is one line for `berth drivers`.
	Summary string
	// NewOptions returns a pointer to a fresh options struct holding the
	// defaults. Exported fields tagged `option:"name"` are the driver's
	// options; a `help:"..."` tag documents each. A nil NewOptions means the
	// driver takes no options.
	NewOptions func() any
	// OpenWith opens the back-end with decoded, validated options (the value
	// NewOptions returned). If it fails it must have released everything it
	// acquired (Caddy's Cleanup after a failed Provision).
	OpenWith func(ctx context.Context, opts any, env Env) (Driver, error)
}

// Define builds a Definition for a driver whose options are the struct O.
// defaults returns O filled with default values.
func Define[O any](name, summary string, defaults func() *O, open func(ctx context.Context, opts *O, env Env) (Driver, error)) Definition {
	return Definition{
		Name:       name,
		Summary:    summary,
		NewOptions: func() any { return defaults() },
		OpenWith: func(ctx context.Context, opts any, env Env) (Driver, error) {
			return open(ctx, opts.(*O), env)
		},
	}
}

// Validator is implemented by options structs that check more than types:
// Open calls Validate after decoding and before opening.
type Validator interface {
	Validate() error
}

// Options returns the definition's declared options, sorted by name.
func (d Definition) Options() []Option {
	if d.NewOptions == nil {
		return nil
	}
	return optionsOf(d.NewOptions())
}

// Decode decodes raw (from a config file or from flags) strictly into a fresh
// options struct and validates it. Unknown keys and wrong types are errors
// naming the driver and the key.
func (d Definition) Decode(raw map[string]any) (any, error) {
	if d.NewOptions == nil {
		if len(raw) > 0 {
			keys := sortedKeys(raw)
			return nil, fmt.Errorf("driver %q: %w", d.Name, &FieldError{Path: keys[0], Reason: "unknown option: this driver takes no options"})
		}
		return nil, nil
	}
	opts := d.NewOptions()
	if err := decodeOptions(opts, raw); err != nil {
		return nil, fmt.Errorf("driver %q: %w", d.Name, err)
	}
	// Every number, set or default: a default out of its range is the
	// driver's bug, found at the first Decode.
	if err := CheckRanges(opts).Err(); err != nil {
		return nil, fmt.Errorf("driver %q: %w", d.Name, err)
	}
	if v, ok := opts.(Validator); ok {
		if err := v.Validate(); err != nil {
			return nil, fmt.Errorf("driver %q: %w", d.Name, err)
		}
	}
	return opts, nil
}

// Open decodes raw options and opens the back-end.
func (d Definition) Open(ctx context.Context, raw map[string]any, env Env) (Driver, error) {
	opts, err := d.Decode(raw)
	if err != nil {
		return nil, err
	}
	if env.Logger == nil {
		env.Logger = slog.Default()
	}
	if env.Provider == "" {
		env.Provider = d.Name
	}
	env.Logger = env.Logger.With("provider", env.Provider, "driver", d.Name)
	drv, err := d.OpenWith(ctx, opts, env)
	if err != nil {
		return nil, fmt.Errorf("driver %q: open: %w", d.Name, err)
	}
	return drv, nil
}

var (
	registryMu sync.RWMutex
	registry   = map[string]Definition{}
)

// Register makes a driver available by name. It is meant for init functions
// and panics if the name is empty, already registered, or OpenWith is nil.
func Register(d Definition) {
	registryMu.Lock()
	defer registryMu.Unlock()
	if d.Name == "" {
		panic("driver: Register with an empty name")
	}
	if d.OpenWith == nil {
		panic("driver: Register " + d.Name + " with a nil OpenWith")
	}
	if _, dup := registry[d.Name]; dup {
		panic("driver: Register called twice for driver " + d.Name)
	}
	registry[d.Name] = d
}

// Lookup returns the registered driver called name. An unknown name is an
// error listing the registered drivers.
func Lookup(name string) (Definition, error) {
	registryMu.RLock()
	d, ok := registry[name]
	registryMu.RUnlock()
	if !ok {
		known := Drivers()
		if len(known) == 0 {
			return Definition{}, fmt.Errorf("%w: unknown driver %q: no drivers are registered (forgotten import?)", ErrInvalid, name)
		}
		return Definition{}, fmt.Errorf("%w: unknown driver %q (forgotten import?); registered: %s", ErrInvalid, name, strings.Join(known, ", "))
	}
	return d, nil
}

// Drivers returns the sorted names of the registered drivers.
func Drivers() []string {
	registryMu.RLock()
	defer registryMu.RUnlock()
	names := make([]string, 0, len(registry))
	for n := range registry {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
