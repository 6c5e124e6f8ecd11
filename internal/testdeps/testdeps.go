// Package testdeps decides what a test does when something it needs from
// the machine (a browser, a libvirt daemon, the kubernetes test servers) is
// missing: it skips, saying what to install, or, when EnvRequireAll is set
// to 1 (as .ci/run sets it), it fails with the same words. A plain
// `go test ./...` on a fresh machine thus runs everything it can, and CI
// cannot pass with a dependency silently gone.
package testdeps

import (
	"fmt"
	"os"
	"testing"
)

// EnvRequireAll names the variable under which a missing dependency fails
// the test instead of skipping it.
const EnvRequireAll = "BERTH_REQUIRE_ALL"

// Required reports whether missing dependencies fail tests (EnvRequireAll=1).
func Required() bool { return os.Getenv(EnvRequireAll) == "1" }

// Need skips t, or fails it when Required, if missing is not nil. missing
// should name what to install (for example "no chromium-headless-shell:
// apt-get install chromium-headless-shell").
func Need(t testing.TB, missing error) {
	t.Helper()
	if missing == nil {
		return
	}
	if Required() {
		t.Fatalf("%v (%s=1: a missing dependency fails the test)", missing, EnvRequireAll)
	}
	t.Skipf("%v (skipped; %s=1 makes this fail)", missing, EnvRequireAll)
}

// Missing is the error Need takes for a missing package: "no WHAT: apt-get
// install PACKAGES".
func Missing(what, packages string) error {
	return fmt.Errorf("no %s: apt-get install %s (.ci/run does)", what, packages)
}
