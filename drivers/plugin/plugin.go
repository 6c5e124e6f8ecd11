// Package plugin registers the driver "plugin": a back-end served by a
// plugin binary outside Berth (package driver/plugin), configured by the
// binary's path and SHA-256:
//
//	providers:
//	  - name: ours
//	    driver: plugin
//	    options:
//	      path: /usr/local/libexec/berth/our-cloud
//	      sha256: 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08
//	      options: {region: north, nodes: 12}
//
// When the configuration is loaded the plugin is started once and asked
// which options its driver declares: an inner option it does not declare
// is refused then. The plugin decodes and checks the values itself when it
// opens; what it refuses names the field.
package plugin

import (
	"context"
	"encoding/hex"
	"errors"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/driver/plugin"
)

func init() {
	driver.Register(driver.Define("plugin", "a driver served by a plugin binary outside Berth, checked by its SHA-256", DefaultOptions, Open))
}

// Options configure the plugin driver.
type Options struct {
	Path       string         `option:"path" help:"the plugin binary, an absolute path (required)"`
	SHA256     string         `option:"sha256" help:"the binary's SHA-256 in hex (required); a binary that does not match is refused, at start and at every restart"`
	Options    map[string]any `option:"options" help:"the options of the plugin's driver, as JSON; the plugin checks them against the options it declares"`
	MaxBackoff time.Duration  `option:"max_backoff" range:"0s,1h" help:"longest wait before restarting a plugin that keeps failing (default 30s)"`
}

// DefaultOptions returns the defaults.
func DefaultOptions() *Options { return &Options{} }

// Validate checks the path and the checksum, and that the binary matches.
func (o *Options) Validate() error {
	es := driver.CheckRanges(o)
	switch {
	case o.Path == "":
		es.Add("path", "required: the plugin binary")
	case !filepath.IsAbs(o.Path):
		es.Add("path", "%q: want an absolute path", o.Path)
	}
	if b, err := hex.DecodeString(o.SHA256); err != nil || len(b) != 32 {
		es.Add("sha256", "required: the binary's SHA-256, 64 hex digits (sha256sum prints it)")
	}
	if len(es) == 0 {
		if sum, err := plugin.Checksum(o.Path); err != nil {
			es.Add("path", "%v", err)
		} else if !strings.EqualFold(sum, o.SHA256) {
			es.Add("sha256", "plugin %s has SHA-256 %s, not the %s configured: refused", o.Path, sum, o.SHA256)
		}
	}
	if len(es) == 0 && len(o.Options) > 0 {
		es = append(es, o.checkNames()...)
	}
	return es.Err()
}

// checkNames asks the plugin which options its driver declares and refuses
// the others; their values are checked by the plugin when it opens.
func (o *Options) checkNames() driver.FieldErrors {
	var es driver.FieldErrors
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	info, err := plugin.Describe(ctx, o.Path, o.SHA256)
	var fe *driver.FieldError
	switch {
	case errors.As(err, &fe):
		return append(es, fe)
	case err != nil:
		es.Add("path", "%v", err)
		return es
	}
	known := make([]string, len(info.Options))
	for i, opt := range info.Options {
		known[i] = opt.Name
	}
	for _, k := range slices.Sorted(maps.Keys(o.Options)) {
		if !slices.Contains(known, k) {
			es.Add("options."+k, "unknown option of the plugin's driver %q; it declares: %s", info.Name, strings.Join(known, ", "))
		}
	}
	return es
}

// Open starts the plugin and opens its driver.
func Open(ctx context.Context, o *Options, env driver.Env) (driver.Driver, error) {
	return plugin.Open(ctx, plugin.Config{Path: o.Path, SHA256: o.SHA256, Options: o.Options, Env: env, MaxBackoff: o.MaxBackoff})
}
