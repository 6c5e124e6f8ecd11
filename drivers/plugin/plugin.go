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
// The plugin decodes and checks its own options (the inner options) against
// the options it declares; what it refuses names the field.
package plugin

import (
	"context"
	"encoding/hex"
	"path/filepath"
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
	MaxBackoff time.Duration  `option:"max_backoff" help:"longest wait before restarting a plugin that keeps failing (default 30s)"`
}

// DefaultOptions returns the defaults.
func DefaultOptions() *Options { return &Options{} }

// Validate checks the path and the checksum, and that the binary matches.
func (o *Options) Validate() error {
	var es driver.FieldErrors
	switch {
	case o.Path == "":
		es.Add("path", "required: the plugin binary")
	case !filepath.IsAbs(o.Path):
		es.Add("path", "%q: want an absolute path", o.Path)
	}
	if b, err := hex.DecodeString(o.SHA256); err != nil || len(b) != 32 {
		es.Add("sha256", "required: the binary's SHA-256, 64 hex digits (sha256sum prints it)")
	}
	if o.MaxBackoff < 0 {
		es.Add("max_backoff", "must not be negative")
	}
	if len(es) == 0 {
		if sum, err := plugin.Checksum(o.Path); err != nil {
			es.Add("path", "%v", err)
		} else if !strings.EqualFold(sum, o.SHA256) {
			es.Add("sha256", "plugin %s has SHA-256 %s, not the %s configured: refused", o.Path, sum, o.SHA256)
		}
	}
	return es.Err()
}

// Open starts the plugin and opens its driver.
func Open(ctx context.Context, o *Options, env driver.Env) (driver.Driver, error) {
	return plugin.Open(ctx, plugin.Config{Path: o.Path, SHA256: o.SHA256, Options: o.Options, Env: env, MaxBackoff: o.MaxBackoff})
}
