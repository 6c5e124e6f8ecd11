package scheduler

import (
	"cmp"
	"slices"
	"strconv"
	"strings"
)

// Reasons says why instances could not be placed: how many nodes were
// considered and, for each reason, how many nodes it rejected. Each node is
// counted once, under the first filter it failed.
type Reasons struct {
	Nodes  int           `json:"nodes"`
	Counts []ReasonCount `json:"counts"`
}

// ReasonCount is one line of Reasons: the nodes of one provider that one
// reason rejected.
type ReasonCount struct {
	Provider string `json:"provider,omitempty"`
	Reason   string `json:"reason"`
	Nodes    int    `json:"nodes"`
}

// String summarises the reasons, most common first:
// "4,812 nodes: not enough memory (reservations); 188: constraint
// disk==ssd". With nodes of several providers it says them provider by
// provider ("provider docker: 3 nodes: not enough cpu (reservations);
// provider local: 1 node: provider lacks capability kind:container"). With
// no nodes at all it says "no nodes".
func (r Reasons) String() string {
	if len(r.Counts) == 0 {
		if r.Nodes == 0 {
			return "no nodes"
		}
		return commas(r.Nodes) + " nodes: no reason recorded"
	}
	provs := map[string]bool{}
	for _, c := range r.Counts {
		provs[c.Provider] = true
	}
	if len(provs) == 1 {
		return line(r.Counts)
	}
	var names []string
	for p := range provs {
		names = append(names, p)
	}
	slices.Sort(names)
	var parts []string
	for _, p := range names {
		var cs []ReasonCount
		for _, c := range r.Counts {
			if c.Provider == p {
				cs = append(cs, c)
			}
		}
		parts = append(parts, "provider "+p+": "+line(cs))
	}
	return strings.Join(parts, "; ")
}

// line says counts, most common first, the first with its unit.
func line(counts []ReasonCount) string {
	var b strings.Builder
	for i, c := range counts {
		if i > 0 {
			b.WriteString("; ")
		}
		b.WriteString(commas(c.Nodes))
		if i == 0 {
			if c.Nodes == 1 {
				b.WriteString(" node")
			} else {
				b.WriteString(" nodes")
			}
		}
		b.WriteString(": ")
		b.WriteString(c.Reason)
	}
	return b.String()
}

// tally collects reasons per provider.
type tally map[tallyKey]int

type tallyKey struct{ provider, reason string }

func (t tally) reasons() Reasons {
	var r Reasons
	for k, v := range t {
		r.Counts = append(r.Counts, ReasonCount{Provider: k.provider, Reason: k.reason, Nodes: v})
		r.Nodes += v
	}
	slices.SortFunc(r.Counts, func(a, b ReasonCount) int {
		if c := cmp.Compare(b.Nodes, a.Nodes); c != 0 {
			return c
		}
		if c := strings.Compare(a.Provider, b.Provider); c != 0 {
			return c
		}
		return strings.Compare(a.Reason, b.Reason)
	})
	return r
}

// commas writes n with thousands separators.
func commas(n int) string {
	s := strconv.Itoa(n)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	if neg {
		b.WriteByte('-')
	}
	for i, ch := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(ch)
	}
	return b.String()
}
