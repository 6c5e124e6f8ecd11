package web

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/berth-dev/berth/auth"
	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/scheduler"
	"github.com/berth-dev/berth/simulate"
)

// MaxWorkloadSize bounds the workload file of a what-if run.
const MaxWorkloadSize = 1 << 20

// SimLimits bound the what-if simulator, so that no page can make the
// server work without end. Zero fields take the defaults.
type SimLimits struct {
	// MaxNodes caps the simulated nodes; default 10,000.
	MaxNodes int
	// MaxInstances caps the instances a workload asks for, preplaced
	// ones included; default 200,000.
	MaxInstances int
	// Timeout caps the time of all the runs of one page; default 15 s.
	Timeout time.Duration
}

func (l SimLimits) withDefaults() SimLimits {
	if l.MaxNodes <= 0 {
		l.MaxNodes = 10_000
	}
	if l.MaxInstances <= 0 {
		l.MaxInstances = 200_000
	}
	if l.Timeout <= 0 {
		l.Timeout = 15 * time.Second
	}
	return l
}

// simRunner runs one simulation at a time.
type simRunner struct {
	limits SimLimits
	slot   chan struct{}
}

func newSimRunner(l SimLimits) *simRunner {
	return &simRunner{limits: l.withDefaults(), slot: make(chan struct{}, 1)}
}

// whatifForm is the form as given, shown again with the results.
type whatifForm struct {
	Source     string // a built-in name or "file"
	Workload   string
	Nodes      string
	Strategies []string
}

// whatifData is the what-if page.
type whatifData struct {
	Form       whatifForm
	Builtins   []string
	Strategies []string
	Limits     SimLimits
	Error      string
	Runs       []simRun
	Nodes      chart
	Speed      chart
}

// simRun is one run's figures.
type simRun struct {
	Strategy       string
	Nodes          int
	Instances      int
	Placed         int
	Unplaced       int
	PlacementsPerS string
	NodesUsed      int
	LowerBound     int
	Packing        string
	Seconds        string
	UnplacedReason string
	DoubleBooked   int
	Interrupted    bool
}

func (s *Server) whatifPage(w http.ResponseWriter, r *http.Request, c *caller) error {
	d := whatifData{Form: whatifForm{Source: "w2", Nodes: "1000", Strategies: []string{""}}}
	return s.renderWhatif(w, http.StatusOK, c, d)
}

func (s *Server) renderWhatif(w http.ResponseWriter, status int, c *caller, d whatifData) error {
	d.Builtins = simulate.Builtins
	d.Strategies = []string{"", string(scheduler.StrategyBinpack), string(scheduler.StrategySpread)}
	d.Limits = s.sim.limits
	return s.render(w, status, "whatif", s.frame(c, "What-if", "whatif", d))
}

// whatif runs the workload of the form through the simulator, once per
// chosen strategy, and shows the figures and charts.
func (s *Server) whatif(w http.ResponseWriter, r *http.Request, c *caller) error {
	if !c.Allows(auth.Operate) { // it costs the server CPU
		return errDenied
	}
	f := whatifForm{Source: r.PostFormValue("source"), Workload: r.PostFormValue("workload"), Nodes: strings.TrimSpace(r.PostFormValue("nodes")),
		Strategies: r.PostForm["strategy"]}
	if file, _, err := r.FormFile("workload_file"); err == nil {
		b, err := io.ReadAll(io.LimitReader(file, MaxWorkloadSize+1))
		file.Close()
		if err != nil {
			return fmt.Errorf("%w: reading the workload file: %v", errBadForm, err)
		}
		if len(b) > 0 {
			f.Workload, f.Source = string(b), "file"
		}
	}
	d := whatifData{Form: f}
	runs, err := s.sim.run(r.Context(), f)
	if errors.Is(err, errSimBusy) {
		return err
	}
	if err != nil {
		d.Error = err.Error()
		return s.renderWhatif(w, http.StatusUnprocessableEntity, c, d)
	}
	d.Runs = runs
	d.Nodes, d.Speed = charts(runs)
	return s.renderWhatif(w, http.StatusOK, c, d)
}

// run checks the form and runs the simulations.
func (sr *simRunner) run(ctx context.Context, f whatifForm) ([]simRun, error) {
	lim := sr.limits
	nodes := 0
	if f.Nodes != "" {
		n, err := strconv.Atoi(f.Nodes)
		if err != nil || n < 1 || n > lim.MaxNodes {
			return nil, &driver.FieldError{Path: "nodes", Reason: fmt.Sprintf("%q: want 1 to %d", f.Nodes, lim.MaxNodes)}
		}
		nodes = n
	}
	if len(f.Strategies) == 0 {
		f.Strategies = []string{""}
	}
	if len(f.Strategies) > 3 {
		return nil, &driver.FieldError{Path: "strategy", Reason: "choose at most 3"}
	}
	for _, st := range f.Strategies {
		if st != "" && !slices.Contains(scheduler.Strategies, scheduler.Strategy(st)) {
			return nil, &driver.FieldError{Path: "strategy", Reason: fmt.Sprintf("%q is not a strategy", st)}
		}
	}
	var wl *simulate.Workload
	var err error
	switch {
	case f.Source == "file":
		if len(f.Workload) > MaxWorkloadSize {
			return nil, &driver.FieldError{Path: "workload", Reason: fmt.Sprintf("larger than %d bytes", MaxWorkloadSize)}
		}
		if strings.TrimSpace(f.Workload) == "" {
			return nil, &driver.FieldError{Path: "workload", Reason: "paste a workload or choose a file"}
		}
		if wl, err = simulate.Decode(strings.NewReader(f.Workload)); err != nil {
			return nil, err
		}
		if nodes > 0 {
			scaleNodes(wl, nodes)
		}
	case slices.Contains(simulate.Builtins, f.Source):
		if nodes == 0 {
			return nil, &driver.FieldError{Path: "nodes", Reason: fmt.Sprintf("required with a built-in workload: 1 to %d", lim.MaxNodes)}
		}
		if wl, err = simulate.Builtin(f.Source, nodes); err != nil {
			return nil, err
		}
	default:
		return nil, &driver.FieldError{Path: "source", Reason: fmt.Sprintf("%q: want file or one of %s", f.Source, strings.Join(simulate.Builtins, ", "))}
	}
	total, inst := 0, 0
	for _, p := range wl.Nodes {
		total += p.Count
	}
	if total > lim.MaxNodes {
		return nil, &driver.FieldError{Path: "nodes", Reason: fmt.Sprintf("the workload has %d nodes: this server simulates at most %d", total, lim.MaxNodes)}
	}
	for _, it := range wl.Requests {
		inst += max(it.Repeat, 1) * it.N()
		if inst > lim.MaxInstances {
			return nil, &driver.FieldError{Path: "requests", Reason: fmt.Sprintf("more than %d instances in all: this server simulates at most that", lim.MaxInstances)}
		}
	}
	select {
	case sr.slot <- struct{}{}:
	default:
		return nil, errSimBusy
	}
	defer func() { <-sr.slot }()
	ctx, cancel := context.WithTimeout(ctx, lim.Timeout)
	defer cancel()
	var out []simRun
	for _, st := range f.Strategies {
		res, err := simulate.Run(ctx, wl, simulate.Options{Strategy: scheduler.Strategy(st)})
		if err != nil {
			if ctx.Err() != nil {
				return nil, fmt.Errorf("the simulation did not finish within %s: choose fewer nodes, requests or strategies", lim.Timeout)
			}
			return nil, err
		}
		name := st
		if name == "" {
			name = "as in the workload"
		}
		out = append(out, simRun{Strategy: name, Nodes: res.Nodes, Instances: res.Instances, Placed: res.Placed, Unplaced: res.Unplaced,
			PlacementsPerS: strconv.FormatFloat(res.PlacementsPerSec, 'f', 0, 64), NodesUsed: res.NodesUsed, LowerBound: res.LowerBoundNodes,
			Packing: strconv.FormatFloat(res.PackingRatio, 'f', 2, 64), Seconds: strconv.FormatFloat(res.Seconds, 'f', 3, 64),
			UnplacedReason: res.UnplacedReason, DoubleBooked: res.DoubleBooked, Interrupted: ctx.Err() != nil})
		if ctx.Err() != nil {
			return nil, fmt.Errorf("the simulation did not finish within %s: choose fewer nodes, requests or strategies", lim.Timeout)
		}
	}
	return out, nil
}

// scaleNodes gives the workload n nodes in all, its pools keeping their
// shares (each at least one node).
func scaleNodes(w *simulate.Workload, n int) {
	total := 0
	for _, p := range w.Nodes {
		total += p.Count
	}
	if total == 0 {
		return
	}
	left := n
	for i := range w.Nodes {
		c := max(1, w.Nodes[i].Count*n/total)
		if i == len(w.Nodes)-1 {
			c = max(1, left)
		}
		c = min(c, max(1, left-(len(w.Nodes)-1-i)))
		w.Nodes[i].Count = c
		left -= c
	}
}

// chart is a bar chart drawn as SVG by the template: every bar has its
// label and value as text, so it reads without colour.
type chart struct {
	Title   string
	Width   int
	Height  int
	AxisY   int
	LegendX int
	Bars    []chartBar
	Groups  []legend // a label under each group of bars
	Legend  []legend
}

type chartBar struct {
	X, Y, W, H int
	Class      string
	Value      string // above the bar
	LabelX     int
	ValueY     int
}

// legend is a text (with a swatch of Class when set) at X, Y.
type legend struct {
	Class, Text  string
	X, Y         int
	TextX, TextY int
}

const (
	chartBarW   = 36
	chartGap    = 8
	chartGroup  = 40
	chartPlot   = 180
	chartTop    = 24
	chartBottom = 40
	chartLeft   = 16
	chartLegend = 190
)

// charts draws nodes used vs the lower bound and the cluster's nodes per
// strategy, and placements per second per strategy.
func charts(runs []simRun) (nodes, speed chart) {
	type series struct {
		class, name string
		val         func(simRun) float64
		text        func(simRun) string
	}
	build := func(title string, ss []series) chart {
		maxV := 0.0
		for _, r := range runs {
			for _, s := range ss {
				maxV = max(maxV, s.val(r))
			}
		}
		if maxV == 0 {
			maxV = 1
		}
		groupW := max(len(ss)*(chartBarW+chartGap)+chartGroup, 140) // room for the label
		c := chart{Title: title, Width: chartLeft + len(runs)*groupW + chartLegend, Height: chartTop + chartPlot + chartBottom, AxisY: chartTop + chartPlot}
		c.LegendX = c.Width - chartLegend + 10
		for g, r := range runs {
			x0 := chartLeft + g*groupW
			for k, s := range ss {
				h := int(s.val(r) / maxV * chartPlot)
				x := x0 + k*(chartBarW+chartGap)
				c.Bars = append(c.Bars, chartBar{X: x, Y: chartTop + chartPlot - h, W: chartBarW, H: h, Class: s.class,
					Value: s.text(r), ValueY: chartTop + chartPlot - h - 4, LabelX: x + chartBarW/2})
			}
			c.Groups = append(c.Groups, legend{Text: r.Strategy, X: x0, Y: chartTop + chartPlot + 20})
		}
		for k, s := range ss {
			y := chartTop + k*22
			c.Legend = append(c.Legend, legend{Class: s.class, Text: s.name, X: c.LegendX, Y: y, TextX: c.LegendX + 20, TextY: y + 12})
		}
		return c
	}
	itoa := func(v int) string { return strconv.Itoa(v) }
	nodes = build("Nodes used at peak, the lower bound, and the cluster's nodes", []series{
		{"s1", "used at peak", func(r simRun) float64 { return float64(r.NodesUsed) }, func(r simRun) string { return itoa(r.NodesUsed) }},
		{"s2", "lower bound", func(r simRun) float64 { return float64(r.LowerBound) }, func(r simRun) string { return itoa(r.LowerBound) }},
		{"s3", "in the cluster", func(r simRun) float64 { return float64(r.Nodes) }, func(r simRun) string { return itoa(r.Nodes) }},
	})
	speed = build("Placements per second", []series{
		{"s1", "placements/s", func(r simRun) float64 { v, _ := strconv.ParseFloat(r.PlacementsPerS, 64); return v }, func(r simRun) string { return r.PlacementsPerS }},
	})
	return nodes, speed
}
