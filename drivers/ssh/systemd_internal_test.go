package ssh

import (
	"slices"
	"strings"
	"testing"

	"github.com/berth-dev/berth/driver"
)

// TestUnitName: the unit carries both ids, escaped as systemd-escape
// does, and a cluster's prefix never matches another cluster's units.
func TestUnitName(t *testing.T) {
	for _, c := range []struct{ cluster, id, want string }{
		{"c1", "h0.0123456789abcdef", `berth-c1-h0.0123456789abcdef.service`},
		{"prod-eu", "web-1.00000000000000ff", `berth-prod\x2deu-web\x2d1.00000000000000ff.service`},
		{"a_b", "n:x", ""}, // ':' is no name character
		{"", "h0.01", ""},
		{"c1", strings.Repeat("a", 300), ""},
	} {
		got, err := unitName(c.cluster, c.id)
		if c.want == "" {
			if err == nil {
				t.Errorf("unitName(%q, %q) = %q, want an error", c.cluster, c.id, got)
			}
			continue
		}
		if err != nil || got != c.want {
			t.Errorf("unitName(%q, %q) = %q, %v; want %q", c.cluster, c.id, got, err, c.want)
			continue
		}
		if id, ok := unitID(c.cluster, got); !ok || id != c.id {
			t.Errorf("unitID(%q, %q) = %q, %v; want %q", c.cluster, got, id, ok, c.id)
		}
	}
	// "prod" must not take "prod-eu"'s units.
	u, _ := unitName("prod-eu", "h0.0123456789abcdef")
	if id, ok := unitID("prod", u); ok {
		t.Errorf("unitID(prod, %q) = %q: another cluster's unit taken", u, id)
	}
	if _, ok := unitID("c1", `berth-c1-h0\x2.service`); ok {
		t.Error("unitID took a malformed escape")
	}
}

// TestUnitLimits: the properties of a spec's cpu and memory, and of none.
func TestUnitLimits(t *testing.T) {
	for _, c := range []struct {
		r    driver.Resources
		want []string
	}{
		{driver.Resources{}, []string{"CPUQuota=", "MemorySwapMax=infinity", "MemoryMax=infinity"}},
		{driver.Resources{CPU: 1500, Memory: 64 * driver.MiB}, []string{"CPUQuota=150%", "MemorySwapMax=0", "MemoryMax=67108864"}},
		{driver.Resources{CPU: 1}, []string{"CPUQuota=1%", "MemorySwapMax=infinity", "MemoryMax=infinity"}},
		{driver.Resources{CPU: 125}, []string{"CPUQuota=13%", "MemorySwapMax=infinity", "MemoryMax=infinity"}},
	} {
		if got := unitLimits(c.r); !slices.Equal(got, c.want) {
			t.Errorf("unitLimits(%+v) = %q, want %q", c.r, got, c.want)
		}
	}
}
