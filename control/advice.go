package control

import (
	"cmp"
	"context"
	"slices"
	"strings"

	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/reconciler"
	"github.com/berth-dev/berth/scheduler"
)

// Size is cpus and memory in the API's convention: cpus as a number,
// memory as a whole number of bytes.
type Size struct {
	CPUs        driver.MilliCPU `json:"cpus"`
	MemoryBytes int64           `json:"memory_bytes"`
}

func sizeOf(r driver.Resources) Size { return Size{CPUs: r.CPU, MemoryBytes: int64(r.Memory)} }

// InstanceAdvice is the right size of one running instance whose
// reservation is far from its measured use.
type InstanceAdvice struct {
	Instance  string `json:"instance"`
	Name      string `json:"name,omitempty"`
	Group     string `json:"group,omitempty"`
	Namespace string `json:"namespace,omitempty"`
	Provider  string `json:"provider"`
	Node      string `json:"node"`
	// Reserved is what it reserves, Used the chosen percentile of its
	// measured use, Suggested what it should reserve, Saves the
	// difference (negative when it uses more than it reserves).
	Reserved  Size `json:"reserved"`
	Used      Size `json:"used"`
	Suggested Size `json:"suggested"`
	Saves     Size `json:"saves"`
	// Samples is how many measurements the advice rests on.
	Samples int `json:"samples"`
}

// GroupAdvice sums the advice on a group's instances.
type GroupAdvice struct {
	Group     string `json:"group"`
	Instances int    `json:"instances"`
	Reserved  Size   `json:"reserved"`
	Suggested Size   `json:"suggested"`
	Saves     Size   `json:"saves"`
}

// AdviceAnswer is Plane.Advice's answer: the instances to resize (at most
// the filter's Limit, those that give back the most cpu first; Advised
// counts them all), the groups they belong to, and what the cluster would
// get back in all.
type AdviceAnswer struct {
	Instances []InstanceAdvice `json:"instances"`
	Advised   int              `json:"advised"`
	Groups    []GroupAdvice    `json:"groups"`
	Saves     Size             `json:"saves"`
}

// Advice lists the running instances that f selects whose reservation is
// far from their measured use (scheduler.Advise over the samples the usage
// loop keeps), with a suggested size each, sums by group and in all.
// Instances without samples (a back-end that cannot measure, or not
// measured yet) are left out. f.Limit bounds the instances listed (0: no
// bound); the sums cover them all. f.After is ignored.
func (p *Plane) Advice(ctx context.Context, f Filter, opt scheduler.AdviceOptions) (*AdviceAnswer, error) {
	if err := p.refuse(); err != nil {
		return nil, err
	}
	limit := f.Limit
	f.Limit, f.After, f.All = 0, "", false
	f.Phases = []reconciler.Phase{reconciler.Running, reconciler.Held, reconciler.Suspended}
	list, err := p.Instances(ctx, f)
	if err != nil {
		return nil, err
	}
	ans := &AdviceAnswer{Instances: []InstanceAdvice{}, Groups: []GroupAdvice{}}
	groups := map[string]*GroupAdvice{}
	var total driver.Resources
	for _, in := range list {
		if in.Spec == nil {
			continue
		}
		a, far := scheduler.Advise(in.Spec.Resources, p.meter.samples(in.ID), opt)
		if !far {
			continue
		}
		ans.Instances = append(ans.Instances, InstanceAdvice{
			Instance: in.ID, Name: in.Name, Group: in.Group, Namespace: in.Owner, Provider: in.Provider, Node: in.Node,
			Reserved: sizeOf(a.Reserved), Used: sizeOf(a.Used), Suggested: sizeOf(a.Suggested), Saves: sizeOf(a.Saves), Samples: a.Samples,
		})
		total.CPU += a.Saves.CPU
		total.Memory += a.Saves.Memory
		if in.Group == "" {
			continue
		}
		g := groups[in.Group]
		if g == nil {
			g = &GroupAdvice{Group: in.Group}
			groups[in.Group] = g
		}
		g.Instances++
		g.Reserved = add(g.Reserved, a.Reserved)
		g.Suggested = add(g.Suggested, a.Suggested)
		g.Saves = add(g.Saves, a.Saves)
	}
	ans.Advised = len(ans.Instances)
	slices.SortFunc(ans.Instances, func(a, b InstanceAdvice) int {
		if c := cmp.Compare(b.Saves.CPUs, a.Saves.CPUs); c != 0 {
			return c
		}
		return strings.Compare(a.Instance, b.Instance)
	})
	if limit > 0 && len(ans.Instances) > limit {
		ans.Instances = ans.Instances[:limit]
	}
	for _, g := range groups {
		ans.Groups = append(ans.Groups, *g)
	}
	slices.SortFunc(ans.Groups, func(a, b GroupAdvice) int { return strings.Compare(a.Group, b.Group) })
	ans.Saves = sizeOf(total)
	return ans, nil
}

func add(s Size, r driver.Resources) Size {
	return Size{CPUs: s.CPUs + r.CPU, MemoryBytes: s.MemoryBytes + int64(r.Memory)}
}
