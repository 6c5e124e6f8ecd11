package docker

import "testing"

func TestExitCodeOfStatus(t *testing.T) {
	for _, tc := range []struct {
		status string
		code   int
		ok     bool
	}{
		{"Exited (0) 2 seconds ago", 0, true},
		{"Exited (137) About a minute ago", 137, true},
		{"Up 3 minutes", 0, false},
		{"Exited (x) now", 0, false},
		{"Exited (3", 0, false},
		{"Created", 0, false},
	} {
		code, ok := exitCodeOfStatus(tc.status)
		if code != tc.code || ok != tc.ok {
			t.Errorf("exitCodeOfStatus(%q) = %d, %v; want %d, %v", tc.status, code, ok, tc.code, tc.ok)
		}
	}
}
