package web_test

import (
	"net/http"
	"testing"
)

// BenchmarkOverview10000Nodes renders the overview of a sim cluster of
// 10,000 nodes (with 10,000 instances placed), through the handler: the
// plane's answers, the page's figures and the template. "all" lists every
// node (?nodes=all), "first500" the default page. Target: under 200 ms.
//
//	go test -run '^$' -bench Overview10000 -benchtime 10x ./web/
func BenchmarkOverview10000Nodes(b *testing.B) {
	plane := simPlane(b, 10_000)
	submit(b, plane, "team-a", "r", 10_000, nil)
	s := newWeb(b, plane, nil)
	for _, c := range []struct{ name, path string }{{"all", "/ui/?nodes=all"}, {"first500", "/ui/"}} {
		b.Run(c.name, func(b *testing.B) {
			w := get(s, c.path, "admin-secret")
			if w.Code != http.StatusOK {
				b.Fatalf("status %d", w.Code)
			}
			size := w.Body.Len()
			for b.Loop() {
				if w := get(s, c.path, "admin-secret"); w.Code != http.StatusOK {
					b.Fatalf("status %d", w.Code)
				}
			}
			b.ReportMetric(float64(size), "bytes/page")
		})
	}
}
