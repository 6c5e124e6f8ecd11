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

// ReasonCount is one line of Reasons.
type ReasonCount struct {
	Reason string `json:"reason"`
	Nodes  int    `json:"nodes"`
}

// String summarises the reasons, most common first:
// "4,812 nodes: not enough memory; 188: constraint disk==ssd". With no nodes
// at all it says "no nodes".
func (r Reasons) String() string {
	if len(r.Counts) == 0 {
		if r.Nodes == 0 {
			return "no nodes"
		}
		return commas(r.Nodes) + " nodes: no reason recorded"
	}
	var b strings.Builder
	for i, c := range r.Counts {
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

// tally collects reasons.
type tally map[string]int

func (t tally) reasons() Reasons {
	var r Reasons
	for k, v := range t {
		r.Counts = append(r.Counts, ReasonCount{Reason: k, Nodes: v})
		r.Nodes += v
	}
	slices.SortFunc(r.Counts, func(a, b ReasonCount) int {
		if c := cmp.Compare(b.Nodes, a.Nodes); c != 0 {
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
