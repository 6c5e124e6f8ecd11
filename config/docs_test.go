package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	_ "github.com/berth-dev/berth/drivers/local"
	_ "github.com/berth-dev/berth/drivers/sim"
)

// TestDocumentedExample loads the example configuration of docs/cli.md, so
// that the reference never drifts from what Load accepts.
func TestDocumentedExample(t *testing.T) {
	doc, err := os.ReadFile("../docs/cli.md")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(doc), "```yaml\n")
	if !ok {
		t.Fatal("docs/cli.md has no yaml example")
	}
	example, _, _ := strings.Cut(rest, "```")
	p := filepath.Join(t.TempDir(), "example.yaml")
	if err := os.WriteFile(p, []byte(example), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := Load(p, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.Providers) != 2 || len(cfg.Pools) != 1 || len(cfg.Quotas) != 3 || cfg.Providers[0].Decoded == nil {
		t.Fatalf("example decoded to %+v", cfg)
	}
}
