package control

import (
	"fmt"

	"github.com/berth-dev/berth/auth"
	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/scheduler"
)

// CheckPools checks pools and quotas against the providers known
// (providers reports whether a name is one), the one validation of both
// for the configuration file and for New. Paths are "pools[i]..." and
// "quotas[i]...".
func CheckPools(pools []Pool, quotas []Quota, providers func(string) bool) driver.FieldErrors {
	var es driver.FieldErrors
	names := map[string]bool{}
	for i, p := range pools {
		f := fmt.Sprintf("pools[%d]", i)
		switch {
		case p.Name == "":
			es.Add(f+".name", "required")
		case auth.ValidName(p.Name) != nil:
			es.Add(f+".name", "%v", auth.ValidName(p.Name))
		case names[p.Name]:
			es.Add(f+".name", "%q is configured twice", p.Name)
		}
		names[p.Name] = true
		if !providers(p.Provider) {
			es.Add(f+".provider", "%q: no such provider", p.Provider)
		}
		scheduler.RangeCount.Check(&es, f+".max_instances", int64(p.MaxInstances))
		es.AddErr(f, p.QueuePolicy.Check("queue_policy"))
		labels := map[string]bool{}
		for j, l := range p.Labels {
			lf := fmt.Sprintf("%s.labels[%d]", f, j)
			if l.Name == "" {
				es.Add(lf+".name", "required")
			} else if labels[l.Name] {
				es.Add(lf+".name", "%q appears twice", l.Name)
			}
			labels[l.Name] = true
			if scheduler.RangeCount.Check(&es, lf+".min_ready", int64(l.MinReady)) && l.Max > 0 && l.MinReady > l.Max {
				es.Add(lf+".min_ready", "%d is more than max %d", l.MinReady, l.Max)
			}
			scheduler.RangeCount.Check(&es, lf+".max", int64(l.Max))
			es.AddErr(lf+".spec", l.Spec.Validate())
		}
	}
	for i, q := range quotas {
		f := fmt.Sprintf("quotas[%d]", i)
		es = append(es, q.Check(f)...)
		switch {
		case q.Provider != "" && !providers(q.Provider):
			es.Add(f+".provider", "%q: no such provider", q.Provider)
		case q.Pool != "" && !names[q.Pool]:
			es.Add(f+".pool", "%q: no such pool", q.Pool)
		case q.Owner != "" && auth.ValidName(q.Owner) != nil:
			es.Add(f+".namespace", "%v", auth.ValidName(q.Owner))
		}
	}
	return es
}
