// Package plugintest builds the example driver plugins for tests, from
// their own module, as a plugin written outside Berth is built.
package plugintest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// BuildExample builds package pkg ("./sim", "./local") of the module
// examples/driverplugin of the Berth source tree at root into the binary
// out. It copies the module into a temporary directory and points its
// go.mod's replace at root, so that the build sees the tree as it is.
func BuildExample(root, pkg, out string) error {
	tmp, err := os.MkdirTemp("", "berth-example-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	src := filepath.Join(tmp, "src")
	if err := os.CopyFS(src, os.DirFS(filepath.Join(root, "examples", "driverplugin"))); err != nil {
		return err
	}
	mod, err := os.ReadFile(filepath.Join(src, "go.mod"))
	if err != nil {
		return err
	}
	mod = []byte(strings.ReplaceAll(string(mod), "=> ../..", "=> "+root))
	if err := os.WriteFile(filepath.Join(src, "go.mod"), mod, 0o644); err != nil {
		return err
	}
	cmd := exec.Command("go", "build", "-o", out, pkg)
	cmd.Dir = src
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build %s: %v\n%s", pkg, err, b)
	}
	return nil
}
