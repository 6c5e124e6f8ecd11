package probe

import (
	"bytes"
	"os"
	"strings"
	"testing"
)

func TestRun(t *testing.T) {
	t.Setenv("PROBE_SET", "a=b")
	dir, _ := os.Getwd()
	for _, tc := range []struct {
		steps     []string
		stdin     string
		code      int
		out, errs string
	}{
		{[]string{"out=one", "err=two", "out=three"}, "", 0, "one\nthree\n", "two\n"},
		{[]string{"out=x", "exit=4", "out=never"}, "", 4, "x\n", ""},
		{[]string{"env=PROBE_SET", "env=PROBE_UNSET"}, "", 0, "PROBE_SET=a=b\nPROBE_UNSET unset\n", ""},
		{[]string{"pwd"}, "", 0, dir + "\n", ""},
		{[]string{"cat", "out=end"}, "in\n", 0, "in\nend\n", ""},
		{[]string{"tty"}, "", 0, "tty false\n", ""},
		{[]string{"read=/nonexistent-probe-file"}, "", 0, "/nonexistent-probe-file: missing\n", ""},
		{[]string{"frobnicate"}, "", 2, "", "probe: frobnicate: unknown step \"frobnicate\"\n"},
		{[]string{"exit=x"}, "", 2, "", ""},
	} {
		var out, errb bytes.Buffer
		code := Run(tc.steps, strings.NewReader(tc.stdin), &out, &errb)
		if code != tc.code || out.String() != tc.out || (tc.errs != "" || code == 0) && errb.String() != tc.errs {
			t.Errorf("Run(%q) = %d, stdout %q, stderr %q; want %d, %q, %q", tc.steps, code, out.String(), errb.String(), tc.code, tc.out, tc.errs)
		}
	}
}
