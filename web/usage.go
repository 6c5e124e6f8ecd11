package web

import (
	"html/template"
	"strconv"
	"strings"
	"time"

	"github.com/berth-dev/berth/control"
	"github.com/berth-dev/berth/driver"
)

// Sizes of the hour-of-use charts: the large ones of the cluster and an
// instance, and the small ones in the rows of the nodes.
const (
	hourW, hourH   = 480, 120
	sparkW, sparkH = 90, 28
	// labelH is the room under a large chart for its time labels.
	labelH = 14
	// nodeCharts is how many nodes of each provider get charts in their
	// rows: the overview of thousands stays light.
	nodeCharts = 100
)

// hourView is the cpu and memory charts of one hour of use.
type hourView struct {
	CPU, Memory template.HTML
	// Measured says whether there is any point to draw.
	Measured bool
	// Step is how far apart the points are.
	Step string
}

// viewHour draws pts (oldest first) as two charts w×h ending at now.
func viewHour(pts []control.UsagePoint, now time.Time, w, h int) hourView {
	cpus := func(v int64) string { return driver.MilliCPU(v).String() }
	mem := func(v int64) string { return driver.Bytes(v).Human() }
	return hourView{
		CPU: hourChart("cpus", pts, now, w, h, cpus, func(p control.UsagePoint) (int64, int64) {
			return int64(p.CPU), int64(p.ReservedCPU)
		}),
		Memory: hourChart("memory", pts, now, w, h, mem, func(p control.UsagePoint) (int64, int64) {
			return int64(p.Memory), int64(p.ReservedMemory)
		}),
		Measured: len(pts) > 0,
		Step:     control.HistoryStep.String(),
	}
}

// hourChart draws one resource's hour: in use as a solid line, reserved
// as a dashed one, the time axis running from an hour before now (or the
// first point, when younger) to now and the value axis from 0 to the
// largest value drawn. It is written by
// hand, every value escaped or a number, with its figures as the image's
// label and as data attributes (data-used, data-reserved: the latest, in
// the resource's unit; data-points).
func hourChart(name string, pts []control.UsagePoint, now time.Time, w, h int, format func(int64) string, val func(control.UsagePoint) (used, reserved int64)) template.HTML {
	var top int64 = 1
	for _, p := range pts {
		u, r := val(p)
		top = max(top, u, r)
	}
	const pad = 2
	labels := w >= hourW/2 // the small charts have no room for labels
	plotH := float64(h - 2*pad)
	if labels {
		plotH -= labelH
	}
	// The time axis ends now and starts an hour before, or at the first
	// point when the series is younger (at least a minute before now).
	from := now.Add(-control.HistoryWindow)
	if len(pts) > 0 && pts[0].Time.After(from) {
		from = pts[0].Time
	}
	if latest := now.Add(-time.Minute); from.After(latest) {
		from = latest
	}
	span := now.Sub(from)
	x := func(t time.Time) string {
		f := float64(t.Sub(from)) / float64(span)
		return strconv.FormatFloat(min(max(f, 0), 1)*float64(w), 'f', 1, 64)
	}
	y := func(v int64) string {
		return strconv.FormatFloat(float64(pad)+plotH-float64(v)/float64(top)*plotH, 'f', 1, 64)
	}
	esc := template.HTMLEscapeString
	label := name + " over the last hour: not measured"
	var lastU, lastR int64
	if n := len(pts); n > 0 {
		lastU, lastR = val(pts[n-1])
		label = name + " over the last hour: " + format(lastU) + " in use, " + format(lastR) + " reserved (latest); at most " + format(top)
	}
	var sb strings.Builder
	sb.Grow(200 + 30*len(pts))
	sb.WriteString(`<svg class="hour" data-resource="`)
	sb.WriteString(esc(name))
	sb.WriteString(`" data-points="`)
	sb.WriteString(strconv.Itoa(len(pts)))
	sb.WriteString(`" data-used="`)
	sb.WriteString(strconv.FormatInt(lastU, 10))
	sb.WriteString(`" data-reserved="`)
	sb.WriteString(strconv.FormatInt(lastR, 10))
	sb.WriteString(`" width="`)
	sb.WriteString(strconv.Itoa(w))
	sb.WriteString(`" height="`)
	sb.WriteString(strconv.Itoa(h))
	sb.WriteString(`" viewBox="0 0 `)
	sb.WriteString(strconv.Itoa(w))
	sb.WriteString(" ")
	sb.WriteString(strconv.Itoa(h))
	sb.WriteString(`" role="img" aria-label="`)
	sb.WriteString(esc(label))
	sb.WriteString(`"><title>`)
	sb.WriteString(esc(label))
	sb.WriteString(`</title><line class="axis" x1="0" y1="`)
	sb.WriteString(y(0))
	sb.WriteString(`" x2="`)
	sb.WriteString(strconv.Itoa(w))
	sb.WriteString(`" y2="`)
	sb.WriteString(y(0))
	sb.WriteString(`"></line>`)
	if labels {
		sb.WriteString(`<text class="lbl" x="4" y="12">`)
		sb.WriteString(esc(format(top)))
		sb.WriteString(`</text><text class="lbl" x="0" y="`)
		sb.WriteString(strconv.Itoa(h - 3))
		sb.WriteString(`">`)
		sb.WriteString(ago(span))
		sb.WriteString(`</text><text class="lbl" x="`)
		sb.WriteString(strconv.Itoa(w))
		sb.WriteString(`" y="`)
		sb.WriteString(strconv.Itoa(h - 3))
		sb.WriteString(`" text-anchor="end">now</text>`)
	}
	line := func(class string, reserved bool) {
		sb.WriteString(`<polyline class="`)
		sb.WriteString(class)
		sb.WriteString(`" points="`)
		for k, p := range pts {
			u, r := val(p)
			v := u
			if reserved {
				v = r
			}
			if k > 0 {
				sb.WriteByte(' ')
			}
			sb.WriteString(x(p.Time))
			sb.WriteByte(',')
			sb.WriteString(y(v))
		}
		sb.WriteString(`"></polyline>`)
	}
	if len(pts) > 0 {
		line("rsv", true)
		line("use", false)
	}
	sb.WriteString("</svg>")
	return template.HTML(sb.String())
}

// nodeHours sets the charts of the first nodeCharts nodes of every
// provider in d.
func (s *Server) nodeHours(d *overviewData, now time.Time) {
	for i := range d.Providers {
		b := &d.Providers[i]
		for j := range b.Nodes[:min(len(b.Nodes), nodeCharts)] {
			n := &b.Nodes[j]
			if pts := s.plane.NodeUsageHour(b.Name, n.Name); len(pts) > 0 {
				hv := viewHour(pts, now, sparkW, sparkH)
				n.Hour = &hv
			}
		}
	}
}

// ago labels the start of a time axis span long.
func ago(span time.Duration) string {
	switch m := int(span.Round(time.Minute) / time.Minute); {
	case m >= 60:
		return "an hour ago"
	case m <= 1:
		return "a minute ago"
	default:
		return strconv.Itoa(m) + " minutes ago"
	}
}
