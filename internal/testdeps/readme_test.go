package testdeps

import (
	"os"
	"regexp"
	"strings"
	"testing"
)

// TestReadmeCommands: the README's test command is .ci/run, the script CI
// runs, which sets EnvRequireAll and runs every package's tests; the
// README's first command starts the server in dev mode.
func TestReadmeCommands(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	ci, err := os.ReadFile("../../.ci/run")
	if err != nil {
		t.Fatal(err)
	}
	if got := blockAfter(t, string(readme), "## Test it"); got != "bash .ci/run" {
		t.Errorf("README's test command: %q, want %q", got, "bash .ci/run")
	}
	if got := blockAfter(t, string(readme), "## Run it"); got != "go run ./cmd/berth server --dev" {
		t.Errorf("README's first command: %q, want %q", got, "go run ./cmd/berth server --dev")
	}
	if !regexp.MustCompile(`(?m)^export ` + EnvRequireAll + `=1$`).Match(ci) {
		t.Errorf(".ci/run does not export %s=1", EnvRequireAll)
	}
	// Every package: ./... at once, or, while the kubernetes servers
	// build, the others (go list ./...) and then the kubernetes ones.
	for _, re := range []string{
		`(?m)^\s*go test -race -count=1 -timeout 20m "\$@"`,
		`(?m)^\s*k8s_pkgs=\(\./\.\.\.\)$`,
		`(?m)^\s*mapfile -t others < <\(go list \./\.\.\. \|`,
	} {
		if !regexp.MustCompile(re).Match(ci) {
			t.Errorf(".ci/run does not run go test -race -count=1 over ./...: no line matches %s", re)
		}
	}
}

// blockAfter returns the first fenced code block after the heading, its
// lines joined by newlines with comments and blank lines dropped.
func blockAfter(t *testing.T, doc, heading string) string {
	t.Helper()
	i := strings.Index(doc, "\n"+heading+"\n")
	if i < 0 {
		t.Fatalf("README has no %q", heading)
	}
	rest := doc[i+len(heading)+2:]
	if next := strings.Index(rest, "\n## "); next >= 0 {
		rest = rest[:next]
	}
	start := strings.Index(rest, "```sh\n")
	if start < 0 {
		t.Fatalf("README's %q has no sh block", heading)
	}
	rest = rest[start+len("```sh\n"):]
	end := strings.Index(rest, "```")
	if end < 0 {
		t.Fatalf("README's %q: unclosed block", heading)
	}
	var lines []string
	for _, l := range strings.Split(rest[:end], "\n") {
		if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "#") {
			lines = append(lines, l)
		}
	}
	return strings.Join(lines, "\n")
}
