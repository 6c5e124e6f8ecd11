package control

import (
	"testing"
	"time"
)

// TestHourPut: a measurement within the step of the newest point replaces
// it, one past the step opens a new point, an older one is ignored, and the
// series keeps at most HistoryPoints points, none older than the window.
func TestHourPut(t *testing.T) {
	s := int64(time.Second)
	var h hour
	h.put(point{at: 0, cpu: 1})
	h.put(point{at: 10 * s, cpu: 2}) // same step: replaces
	h.put(point{at: 5 * s, cpu: 9})  // older than the newest: ignored
	h.put(point{at: 30 * s, cpu: 3}) // a new step
	h.put(point{at: 50 * s, cpu: 4}) // its step: replaces
	h.put(point{at: 61 * s, cpu: 5}) // a new step
	if got := len(h.pts); got != 3 || h.pts[0] != (point{at: 10 * s, cpu: 2}) || h.pts[1] != (point{at: 50 * s, cpu: 4}) || h.pts[2] != (point{at: 61 * s, cpu: 5}) {
		t.Fatalf("points %+v, want (10 s, 2), (50 s, 4), (61 s, 5)", h.pts)
	}

	// A gap longer than the window leaves only the new point.
	h.put(point{at: 61*s + int64(HistoryWindow), cpu: 6})
	if len(h.pts) != 1 || h.pts[0].cpu != 6 {
		t.Fatalf("after a gap of the window: %+v, want one point", h.pts)
	}

	// Many steps keep HistoryPoints, the newest, in order, within the window.
	h = hour{}
	step := int64(HistoryStep)
	for k := range int64(3 * HistoryPoints) {
		h.put(point{at: k * step, cpu: k})
	}
	if len(h.pts) > HistoryPoints || len(h.pts) < HistoryPoints-1 || h.pts[len(h.pts)-1].cpu != 3*HistoryPoints-1 {
		t.Fatalf("%d points, newest %+v; want at most %d, the newest last", len(h.pts), h.pts[len(h.pts)-1], HistoryPoints)
	}
	now := time.Unix(0, (3*HistoryPoints-1)*step)
	pts := h.points(now)
	for k := 1; k < len(pts); k++ {
		if !pts[k].Time.After(pts[k-1].Time) || now.Sub(pts[0].Time) > HistoryWindow {
			t.Fatalf("points out of order or too old: %+v", pts)
		}
	}
}
