package testdeps

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// TestNeed runs a test that needs something missing in a child process,
// once without EnvRequireAll and once with it: skipped with the install
// line, then failed with it.
func TestNeed(t *testing.T) {
	if os.Getenv("TESTDEPS_CHILD") == "1" {
		Need(t, Missing("frobnicator", "frob-utils"))
		t.Log("ran on")
		return
	}
	for _, c := range []struct {
		require string
		ok      bool
		want    string
	}{
		{"", true, "--- SKIP"},
		{"1", false, "--- FAIL"},
	} {
		cmd := exec.Command(os.Args[0], "-test.run=^TestNeed$", "-test.v")
		cmd.Env = append(os.Environ(), "TESTDEPS_CHILD=1", EnvRequireAll+"="+c.require)
		out, err := cmd.CombinedOutput()
		if (err == nil) != c.ok || !strings.Contains(string(out), c.want) ||
			!strings.Contains(string(out), "apt-get install frob-utils") || strings.Contains(string(out), "ran on") {
			t.Errorf("%s=%q: %v\n%s\nwant %s naming the package, and the test stopped", EnvRequireAll, c.require, err, out, c.want)
		}
	}
}

// TestNeedNothingMissing: a nil error lets the test go on.
func TestNeedNothingMissing(t *testing.T) {
	t.Setenv(EnvRequireAll, "1")
	Need(t, nil)
	if err := Missing("a browser", "chromium-headless-shell"); err == nil || err.Error() != "no a browser: apt-get install chromium-headless-shell (.ci/run does)" {
		t.Errorf("Missing: %v", err)
	}
}
