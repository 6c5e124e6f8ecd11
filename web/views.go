package web

import (
	"fmt"
	"html/template"
	"maps"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/berth-dev/berth/auth"
	"github.com/berth-dev/berth/control"
	"github.com/berth-dev/berth/driver"
)

// bar is one resource of a node or a cluster: capacity, reserved and in
// use, as text and as the width classes of a two-layer bar.
type bar struct {
	Name      string
	Capacity  string
	Reserved  string
	InUse     string // empty when the back-end does not measure it
	ResClass  string
	UseClass  string
	ResPct    int
	UsePct    int
	Unlimited bool // no capacity reported
}

// widthClass returns the CSS class of a bar layer v/capacity wide, in steps
// of 2 %.
func widthClass(v, capacity float64) (string, int) {
	if capacity <= 0 || v <= 0 {
		return "w0", 0
	}
	pct := int(v / capacity * 100)
	if pct > 100 {
		pct = 100
	}
	step := (pct + 1) / 2 * 2
	if step == 0 {
		step = 2 // something is there: show a sliver
	}
	return "w" + strconv.Itoa(step), pct
}

// bars returns the four resource bars of capacity c, reserved r and use u
// (nil when unmeasured).
func bars(c, r driver.Resources, u *driver.Resources) [4]bar {
	var out [4]bar
	type res struct {
		name          string
		cap, rsv, use float64
		fmt           func(float64) string
	}
	cpus := func(v float64) string { return driver.MilliCPU(v).String() }
	mem := func(v float64) string { return driver.Bytes(v).Human() }
	count := func(v float64) string { return strconv.FormatInt(int64(v), 10) }
	rs := [4]res{
		{"cpus", float64(c.CPU), float64(r.CPU), 0, cpus},
		{"memory", float64(c.Memory), float64(r.Memory), 0, mem},
		{"disk", float64(c.Disk), float64(r.Disk), 0, mem},
		{"gpus", float64(c.GPUs), float64(r.GPUs), 0, count},
	}
	if u != nil {
		rs[0].use, rs[1].use, rs[2].use, rs[3].use = float64(u.CPU), float64(u.Memory), float64(u.Disk), float64(u.GPUs)
	}
	for i, x := range rs {
		b := bar{Name: x.name, Capacity: x.fmt(x.cap), Reserved: x.fmt(x.rsv), Unlimited: x.cap <= 0}
		b.ResClass, b.ResPct = widthClass(x.rsv, x.cap)
		b.UseClass = "w0"
		if u != nil {
			b.InUse = x.fmt(x.use)
			b.UseClass, b.UsePct = widthClass(x.use, x.cap)
		}
		out[i] = b
	}
	return out
}

// HTML renders the bar: a two-layer bar with its figures as an image
// label, then the figures as text. It is written by hand, every value
// escaped, because an overview of 10,000 nodes draws 40,000 of them and
// a template call each costs too much.
func (b bar) HTML() template.HTML {
	var sb strings.Builder
	b.write(&sb)
	return template.HTML(sb.String())
}

func (b bar) write(sb *strings.Builder) {
	capacity := b.Capacity
	if b.Unlimited {
		capacity = "–"
	}
	esc := template.HTMLEscapeString
	sb.WriteString(`<span class="bar" role="img" aria-label="`)
	sb.WriteString(esc(b.Name))
	sb.WriteString(": ")
	sb.WriteString(esc(b.Reserved))
	sb.WriteString(" reserved")
	if b.InUse != "" {
		sb.WriteString(", ")
		sb.WriteString(esc(b.InUse))
		sb.WriteString(" in use")
	}
	sb.WriteString(" of ")
	sb.WriteString(esc(capacity))
	sb.WriteString(`"><span class="res `)
	sb.WriteString(b.ResClass)
	sb.WriteString(`"></span><span class="use `)
	sb.WriteString(b.UseClass)
	sb.WriteString(`"></span></span><span class="num">`)
	sb.WriteString(esc(b.Reserved))
	if b.InUse != "" {
		sb.WriteString(" / ")
		sb.WriteString(esc(b.InUse))
	}
	sb.WriteString(" of ")
	sb.WriteString(esc(capacity))
	sb.WriteString("</span>")
}

// nodeRow is one node of the overview.
type nodeRow struct {
	Name      string
	Status    string
	Reason    string
	Instances int
	Berth     int
	Bars      [4]bar
	// Hour is the node's hour of use; nil when not measured or past
	// nodeCharts.
	Hour *hourView
}

// HTML renders the node's table row by hand, every value escaped, for the
// reason given at bar.HTML.
func (n nodeRow) HTML() template.HTML {
	var sb strings.Builder
	sb.Grow(1500)
	esc := template.HTMLEscapeString
	sb.WriteString(`<tr><th scope="row">`)
	sb.WriteString(esc(n.Name))
	sb.WriteString(`</th><td><span class="state state-`)
	sb.WriteString(esc(n.Status))
	sb.WriteString(`">`)
	sb.WriteString(esc(n.Status))
	sb.WriteString("</span>")
	if n.Reason != "" {
		sb.WriteString(" (")
		sb.WriteString(esc(n.Reason))
		sb.WriteString(")")
	}
	sb.WriteString("</td><td>")
	sb.WriteString(strconv.Itoa(n.Instances))
	sb.WriteString(" (")
	sb.WriteString(strconv.Itoa(n.Berth))
	sb.WriteString(")</td>")
	for _, b := range n.Bars {
		sb.WriteString("<td>")
		b.write(&sb)
		sb.WriteString("</td>")
	}
	sb.WriteString(`<td class="hours">`)
	if n.Hour != nil {
		sb.WriteString(string(n.Hour.CPU))
		sb.WriteString(string(n.Hour.Memory))
	} else {
		sb.WriteString("–")
	}
	sb.WriteString("</td></tr>\n")
	return template.HTML(sb.String())
}

// providerBlock is one provider of the overview with its nodes.
type providerBlock struct {
	Name         string
	Driver       string
	Breaker      string
	Failures     uint32
	LastError    string
	LastErrorAt  string
	Error        string
	Capabilities string
	Totals       [4]bar
	Nodes        []nodeRow
	// NodeCount is how many nodes the provider has; Nodes holds the first
	// of them, up to the page's limit.
	NodeCount int
	Statuses  []statusCount
}

type statusCount struct {
	Status string
	N      int
}

// quotaRow is one quota with its use.
type quotaRow struct {
	Namespace string
	Scope     string
	Instances string
	CPUs      string
	Memory    string
	InstClass string
	CPUClass  string
	MemClass  string
}

// overviewData is the overview page.
type overviewData struct {
	// NodeLimit is the rows per provider (0: all); Truncated says some
	// provider has more nodes than rows.
	NodeLimit int
	Truncated bool
	Providers []providerBlock
	Totals    [4]bar
	Nodes     int
	Statuses  []statusCount
	Phases    []statusCount
	Quotas    []quotaRow
	// Hour is the cluster's hour of use.
	Hour hourView
}

// buildOverview gathers the overview from the plane's answers.
// At most nodeLimit nodes of each provider get a row (0: all); the totals
// count every node.
func buildOverview(nodes []control.NodeView, provs []control.ProviderView, quotas []control.QuotaUse, counts map[control.Phase]int, id Identity, nodeLimit int) overviewData {
	d := overviewData{NodeLimit: nodeLimit}
	byProv := map[string]*providerBlock{}
	for _, p := range provs {
		b := &providerBlock{Name: p.Name, Driver: p.Driver, Breaker: p.Health.Breaker, Failures: p.Health.ConsecutiveFailures,
			LastError: p.Health.LastError, Error: p.Error, Capabilities: strings.Join(p.Capabilities, ", ")}
		if !p.Health.LastErrorAt.IsZero() {
			b.LastErrorAt = p.Health.LastErrorAt.UTC().Format(time.RFC3339)
		}
		byProv[p.Name] = b
	}
	var capAll, rsvAll, useAll driver.Resources
	measured := false
	allStatus := map[string]int{}
	provStatus := map[string]map[string]int{}
	provCap := map[string][3]driver.Resources{}
	provMeasured := map[string]bool{}
	for _, n := range nodes {
		b := byProv[n.Provider]
		if b == nil {
			b = &providerBlock{Name: n.Provider}
			byProv[n.Provider] = b
		}
		b.NodeCount++
		if nodeLimit == 0 || len(b.Nodes) < nodeLimit {
			b.Nodes = append(b.Nodes, nodeRow{Name: n.Name, Status: string(n.Status), Reason: n.Reason, Instances: n.Instances, Berth: n.BerthCount,
				Bars: bars(n.Capacity, n.Reserved, n.InUse)})
		} else {
			d.Truncated = true
		}
		if provStatus[n.Provider] == nil {
			provStatus[n.Provider] = map[string]int{}
		}
		provStatus[n.Provider][string(n.Status)]++
		allStatus[string(n.Status)]++
		pc := provCap[n.Provider]
		pc[0] = addCounted(pc[0], n.Capacity)
		pc[1] = addCounted(pc[1], n.Reserved)
		if n.InUse != nil {
			pc[2] = addCounted(pc[2], *n.InUse)
			provMeasured[n.Provider] = true
			useAll = addCounted(useAll, *n.InUse)
			measured = true
		}
		provCap[n.Provider] = pc
		capAll = addCounted(capAll, n.Capacity)
		rsvAll = addCounted(rsvAll, n.Reserved)
	}
	for _, name := range slices.Sorted(maps.Keys(byProv)) {
		b := byProv[name]
		pc := provCap[name]
		var use *driver.Resources
		if provMeasured[name] {
			use = &pc[2]
		}
		b.Totals = bars(pc[0], pc[1], use)
		b.Statuses = sortedCounts(provStatus[name])
		d.Providers = append(d.Providers, *b)
	}
	var use *driver.Resources
	if measured {
		use = &useAll
	}
	d.Totals = bars(capAll, rsvAll, use)
	d.Nodes = len(nodes)
	d.Statuses = sortedCounts(allStatus)
	if id.All() {
		pc := map[string]int{}
		for ph, n := range counts {
			pc[string(ph)] = n
		}
		d.Phases = sortedCounts(pc)
	}
	for _, q := range quotas {
		if id.Authorize(auth.Read, q.Owner) != nil { // "": the cluster's own, every namespace's
			continue
		}
		row := quotaRow{Namespace: q.Owner, Scope: quotaScope(q.Quota)}
		row.Instances, row.InstClass = usage(float64(q.UsedInstances), float64(q.Instances), strconv.Itoa(q.UsedInstances), strconv.Itoa(q.Instances))
		row.CPUs, row.CPUClass = usage(float64(q.UsedCPU), float64(q.CPU), q.UsedCPU.String(), q.CPU.String())
		row.Memory, row.MemClass = usage(float64(q.UsedMemory), float64(q.Memory), q.UsedMemory.Human(), q.Memory.Human())
		d.Quotas = append(d.Quotas, row)
	}
	return d
}

// addCounted adds the four counted resources (Other is left out).
func addCounted(a, b driver.Resources) driver.Resources {
	return driver.Resources{CPU: a.CPU + b.CPU, Memory: a.Memory + b.Memory, Disk: a.Disk + b.Disk, GPUs: a.GPUs + b.GPUs}
}

func usage(used, limit float64, usedText, limitText string) (string, string) {
	if limit <= 0 {
		return usedText + " (no limit)", "w0"
	}
	c, _ := widthClass(used, limit)
	return usedText + " of " + limitText, c
}

func quotaScope(q control.Quota) string {
	var parts []string
	if q.Provider != "" {
		parts = append(parts, "provider "+q.Provider)
	}
	if q.Pool != "" {
		parts = append(parts, "pool "+q.Pool)
	}
	if len(parts) == 0 {
		return "everywhere"
	}
	return strings.Join(parts, ", ")
}

func sortedCounts(m map[string]int) []statusCount {
	out := make([]statusCount, 0, len(m))
	for k, v := range m {
		out = append(out, statusCount{k, v})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Status < out[j].Status })
	return out
}

// instanceRow is one line of the instances table.
type instanceRow struct {
	ID        string
	Name      string
	Namespace string
	Provider  string
	Node      string
	Phase     string
	Kind      string
	Image     string
	Message   string
	Updated   string
}

func rowOf(in *control.Instance) instanceRow {
	r := instanceRow{ID: in.ID, Name: in.Name, Namespace: namespaceOf(in), Provider: in.Provider, Node: in.Node,
		Phase: string(in.Phase), Message: in.Message}
	if in.Spec != nil {
		r.Kind, r.Image = string(in.Spec.Kind), in.Spec.Image
		if r.Image == "" {
			r.Image = program(in.Spec)
		}
	}
	if !in.Updated.IsZero() {
		r.Updated = in.Updated.UTC().Format("2006-01-02 15:04:05")
	}
	return r
}

// programWidth bounds the program shown in a row of the instances table.
const programWidth = 60

// program is what a process runs, as a shell would read it (entrypoint,
// then command), cut to programWidth runes.
func program(s *driver.Spec) string {
	p := quoteArgs(append(slices.Clip(s.Entrypoint), s.Command...))
	if r := []rune(p); len(r) > programWidth {
		p = string(r[:programWidth-1]) + "…"
	}
	return p
}

// namespaceOf is the namespace an instance belongs to: its owner.
func namespaceOf(in *control.Instance) string { return in.Owner }

// secret describes a secret value by its size and SHA-256 digest only.
func secret(v string) string { return driver.SecretDigest(v) }

// kv is a key and a shown value.
type kv struct{ K, V string }

// specView is an instance's spec as the page shows it: secrets as size
// and digest.
type specView struct {
	Fields      []kv
	Env         []kv
	Labels      []kv
	ConfigFiles []kv
	UserData    string
	Ports       []string
	Volumes     []string
}

func viewSpec(s *driver.Spec, hostPorts []int) specView {
	var v specView
	if s == nil {
		return v
	}
	add := func(k, val string) {
		if val != "" {
			v.Fields = append(v.Fields, kv{k, val})
		}
	}
	add("kind", string(s.Kind))
	add("type", string(s.Type))
	add("image", s.Image)
	add("flavor", s.Flavor)
	if s.CPU > 0 {
		add("cpus", s.CPU.String())
	}
	if s.Memory > 0 {
		add("memory", s.Memory.String())
	}
	if s.Disk > 0 {
		add("disk", s.Disk.String())
	}
	if s.GPUs > 0 {
		add("gpus", strconv.FormatInt(s.GPUs, 10))
	}
	add("entrypoint", quoteArgs(s.Entrypoint))
	add("command", quoteArgs(s.Command))
	add("working dir", s.WorkingDir)
	add("hostname", s.Hostname)
	add("network mode", s.NetworkMode)
	add("networks", strings.Join(s.Networks, ", "))
	add("network aliases", strings.Join(s.NetworkAliases, ", "))
	add("restart policy", s.RestartPolicy.Name)
	for _, k := range slices.Sorted(maps.Keys(s.Env)) {
		v.Env = append(v.Env, kv{k, secret(s.Env[k])})
	}
	for _, k := range slices.Sorted(maps.Keys(s.Labels)) {
		v.Labels = append(v.Labels, kv{k, s.Labels[k]})
	}
	for _, f := range s.ConfigFiles {
		mode := f.Mode
		if mode == 0 {
			mode = 0o644
		}
		v.ConfigFiles = append(v.ConfigFiles, kv{fmt.Sprintf("%s (mode %04o)", f.Path, mode), secret(f.Content)})
	}
	if s.UserData != "" {
		v.UserData = secret(s.UserData)
	}
	for i, p := range s.Ports {
		proto := p.Protocol
		if proto == "" {
			proto = "tcp"
		}
		host := p.HostPort
		if host == 0 && i < len(hostPorts) {
			host = hostPorts[i]
		}
		v.Ports = append(v.Ports, fmt.Sprintf("%d → %d/%s", host, p.ContainerPort, proto))
	}
	for _, vol := range s.Volumes {
		v.Volumes = append(v.Volumes, fmt.Sprintf("%+v", vol))
	}
	return v
}

// quoteArgs shows an argument list as a shell would read it.
func quoteArgs(args []string) string {
	if len(args) == 0 {
		return ""
	}
	out := make([]string, len(args))
	for i, a := range args {
		if a == "" || strings.ContainsAny(a, " \t\n'\"\\$`;&|<>()*?[]{}~#") {
			a = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
		}
		out[i] = a
	}
	return strings.Join(out, " ")
}

// reasonGroup is one reason instances wait for, where they may go, and
// how many wait for it.
type reasonGroup struct {
	Reason string
	Where  string
	N      int
	IDs    []string // the first few
}

// groupReasons groups pending instances by reason and by the class of
// nodes they may go to (pool, else provider, else any), most common first.
func groupReasons(pending []control.Instance) []reasonGroup {
	type key struct{ reason, where string }
	m := map[key]*reasonGroup{}
	for i := range pending {
		in := &pending[i]
		where := "any provider"
		switch {
		case in.Pool != "":
			where = "pool " + in.Pool
		case in.Provider != "":
			where = "provider " + in.Provider
		}
		reason := in.Message
		if reason == "" {
			reason = "not tried yet"
		}
		k := key{reason, where}
		g := m[k]
		if g == nil {
			g = &reasonGroup{Reason: reason, Where: where}
			m[k] = g
		}
		g.N++
		if len(g.IDs) < 5 {
			g.IDs = append(g.IDs, in.ID)
		}
	}
	out := make([]reasonGroup, 0, len(m))
	for _, g := range m {
		out = append(out, *g)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].N != out[j].N {
			return out[i].N > out[j].N
		}
		if out[i].Reason != out[j].Reason {
			return out[i].Reason < out[j].Reason
		}
		return out[i].Where < out[j].Where
	})
	return out
}
