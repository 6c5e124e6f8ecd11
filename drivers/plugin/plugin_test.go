package plugin_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/driver/plugin"
	_ "github.com/berth-dev/berth/drivers/plugin"
)

func TestDecodeRefusesByName(t *testing.T) {
	def, err := driver.Lookup("plugin")
	if err != nil {
		t.Fatal(err)
	}
	sum, err := plugin.Checksum("/bin/true")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		raw  map[string]any
		path string // the field refused; "" when none is
	}{
		{"ok", map[string]any{"path": "/bin/true", "sha256": sum}, ""},
		{"not-a-plugin", map[string]any{"path": "/bin/true", "sha256": sum, "options": map[string]any{"nodes": 3}}, "path"},
		{"upper-case", map[string]any{"path": "/bin/true", "sha256": strings.ToUpper(sum)}, ""},
		{"no-sha", map[string]any{"path": "/bin/true"}, "sha256"},
		{"wrong-sha", map[string]any{"path": "/bin/true", "sha256": strings.Repeat("ab", 32)}, "sha256"},
		{"no-path", map[string]any{"sha256": sum}, "path"},
		{"relative", map[string]any{"path": "bin/true", "sha256": sum}, "path"},
		{"missing", map[string]any{"path": "/nonexistent/plugin", "sha256": sum}, "path"},
		{"unknown", map[string]any{"path": "/bin/true", "sha256": sum, "bogus": 1}, "bogus"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := def.Decode(c.raw)
			if c.path == "" {
				if err != nil {
					t.Fatalf("Decode: %v", err)
				}
				return
			}
			var es driver.FieldErrors
			var fe *driver.FieldError
			found := false
			if errors.As(err, &es) {
				for _, e := range es {
					found = found || e.Path == c.path
				}
			} else if errors.As(err, &fe) {
				found = fe.Path == c.path
			}
			if !found {
				t.Fatalf("Decode = %v; want a field error for %s", err, c.path)
			}
		})
	}
}
