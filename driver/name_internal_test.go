package driver

import (
	"math/rand/v2"
	"regexp"
	"testing"
)

// TestIsNameMatchesRegexp checks isName against the regular expression it
// spells out, on fixed cases and on random strings over a small alphabet.
func TestIsNameMatchesRegexp(t *testing.T) {
	re := regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9_.-]*$`)
	cases := []string{"", "a", "Z9", "web-1", "a.b_c-d", "-a", "_a", ".a", "a b", "a/b", "é", "a\n", "a:b", "9"}
	r := rand.New(rand.NewPCG(5, 6))
	const alphabet = "aZ09_.-/ :é\x00"
	for range 20000 {
		b := make([]byte, r.IntN(6))
		for i := range b {
			b[i] = alphabet[r.IntN(len(alphabet))]
		}
		cases = append(cases, string(b))
	}
	for _, c := range cases {
		if got, want := isName(c), re.MatchString(c); got != want {
			t.Errorf("isName(%q) = %v, the regexp says %v", c, got, want)
		}
	}
}
