package web

import (
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/control"
	"github.com/berth-dev/berth/driver"
)

var coordRE = regexp.MustCompile(`(-?[0-9.]+),(-?[0-9.]+)`)

// TestHourChart: no points draw an empty chart that says so; points draw
// two lines inside the chart, the latest figures in its label and data
// attributes.
func TestHourChart(t *testing.T) {
	now := time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC)
	empty := string(viewHour(nil, now, hourW, hourH).CPU)
	if !strings.Contains(empty, `data-points="0"`) || strings.Contains(empty, "<polyline") || !strings.Contains(empty, "not measured") {
		t.Errorf("chart of no points: %s", empty)
	}

	var pts []control.UsagePoint
	for k := range 10 {
		pts = append(pts, control.UsagePoint{Time: now.Add(-time.Duration(90-10*k) * time.Minute), CPU: driver.MilliCPU(100 * k),
			Memory: driver.Bytes(k) * driver.MiB, ReservedCPU: 500, ReservedMemory: 64 * driver.MiB})
	}
	hv := viewHour(pts, now, hourW, hourH)
	if !hv.Measured {
		t.Error("points, yet not measured")
	}
	cpu := string(hv.CPU)
	for _, want := range []string{`data-resource="cpus"`, `data-points="10"`, `data-used="900"`, `data-reserved="500"`,
		"cpus over the last hour: 0.9 in use, 0.5 reserved (latest); at most 0.9", `class="rsv"`, `class="use"`, "an hour ago"} {
		if !strings.Contains(cpu, want) {
			t.Errorf("the cpu chart lacks %q: %s", want, cpu)
		}
	}
	if !strings.Contains(string(hv.Memory), "9Mi in use, 64Mi reserved") {
		t.Errorf("the memory chart: %s", hv.Memory)
	}
	// Points older than the hour sit on the left edge; none leaves the chart.
	for _, m := range coordRE.FindAllStringSubmatch(cpu, -1) {
		x, _ := strconv.ParseFloat(m[1], 64)
		y, _ := strconv.ParseFloat(m[2], 64)
		if x < 0 || x > hourW || y < 0 || y > hourH {
			t.Errorf("point %s,%s outside the %dx%d chart", m[1], m[2], hourW, hourH)
		}
	}

	// A young series spans from its first point; the small charts have no labels.
	young := string(hourChart("cpus", pts[8:], now, sparkW, sparkH, func(v int64) string { return strconv.FormatInt(v, 10) },
		func(p control.UsagePoint) (int64, int64) { return int64(p.CPU), int64(p.ReservedCPU) }))
	if strings.Contains(young, "<text") || !strings.Contains(young, `points="0.0,`) {
		t.Errorf("a small chart of a young series: %s", young)
	}
}

// TestProgram: a process's program reads as a shell would, cut short.
func TestProgram(t *testing.T) {
	for _, c := range []struct {
		spec driver.Spec
		want string
	}{
		{driver.Spec{Entrypoint: []string{"/bin/sh", "-c", "echo hi"}}, "/bin/sh -c 'echo hi'"},
		{driver.Spec{Command: []string{"sleep", "60"}}, "sleep 60"},
		{driver.Spec{Entrypoint: []string{"/usr/bin/env"}, Command: []string{"x"}}, "/usr/bin/env x"},
		{driver.Spec{Command: []string{strings.Repeat("a", 100)}}, strings.Repeat("a", programWidth-1) + "…"},
	} {
		if got := program(&c.spec); got != c.want {
			t.Errorf("program(%+v) = %q, want %q", c.spec, got, c.want)
		}
	}
	// The row shows the image when there is one, else the program.
	in := &control.Instance{ID: "a", Spec: &driver.Spec{Image: "busybox", Command: []string{"sleep", "1"}}}
	if r := rowOf(in); r.Image != "busybox" {
		t.Errorf("row of a container: %q", r.Image)
	}
	in.Spec.Image = ""
	if r := rowOf(in); r.Image != "sleep 1" {
		t.Errorf("row of a process: %q", r.Image)
	}
}
