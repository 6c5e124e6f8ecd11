package api_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berth-dev/berth/api/client"
	"github.com/berth-dev/berth/control"
	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/scheduler"
	"github.com/berth-dev/berth/simulate"
	"github.com/berth-dev/berth/store/bolt"
)

// BenchmarkSubmitSim1000 submits Citadel requests through the HTTP API
// (loopback) to a plane over a sim back-end of 1,000 nodes and the server's
// store (bbolt, durable before each answer), open loop at 1,000 requests
// per second. The load comes from a second process (this test binary,
// started again), as it would from clients: the server's garbage collector
// and scheduler do not delay the clock of the load, nor the other way
// round. Request i is due at start + i ms, and its latency is measured
// from when it was due, so a server that falls behind is charged for the
// queueing too. Run with -benchtime=10000x for 10 s of load; it reports
// p50, p99 and max latency and the rate achieved.
func BenchmarkSubmitSim1000(b *testing.B) {
	st, err := bolt.Open(filepath.Join(b.TempDir(), "berth.db"), bolt.Options{})
	if err != nil {
		b.Fatal(err)
	}
	e := newEnvOn(b, st, map[string]any{"nodes": 1000, "shape": `{"cpus": 64, "memory": "256Gi"}`}, 0)
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), loadEnv+"="+e.http.URL, fmt.Sprintf("%s=%d", loadCountEnv, b.N))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	b.ResetTimer()
	out, err := cmd.Output()
	b.StopTimer()
	if err != nil {
		b.Fatalf("load process: %v: %s", err, stderr.Bytes())
	}
	var res loadResult
	if err := json.Unmarshal(out, &res); err != nil || len(res.Micros) != b.N {
		b.Fatalf("load process answered %q: %v", out, err)
	}
	lat := res.Micros
	slices.Sort(lat)
	q := func(p float64) float64 { return float64(lat[int(p*float64(len(lat)-1))]) / 1000 }
	b.ReportMetric(q(0.5), "p50_ms")
	b.ReportMetric(q(0.99), "p99_ms")
	b.ReportMetric(float64(lat[len(lat)-1])/1000, "max_ms")
	b.ReportMetric(res.Rate, "req/s")
}

// Environment of the load process of BenchmarkSubmitSim1000.
const (
	loadEnv      = "BERTH_BENCH_LOAD_URL"
	loadCountEnv = "BERTH_BENCH_LOAD_COUNT"
)

// loadResult is what the load process prints: each request's latency in
// microseconds and the rate achieved.
type loadResult struct {
	Micros []int64 `json:"micros"`
	Rate   float64 `json:"rate"`
}

// sendLoad is the load process: it submits the requests open loop at 1,000
// per second to the server named by the environment and prints a
// loadResult. It returns the process's exit code.
func sendLoad() int {
	n, err := strconv.Atoi(os.Getenv(loadCountEnv))
	if err != nil || n < 1 {
		fmt.Fprintf(os.Stderr, "%s: want a positive count, got %q\n", loadCountEnv, os.Getenv(loadCountEnv))
		return 2
	}
	tr := &http.Transport{MaxIdleConnsPerHost: 256}
	defer tr.CloseIdleConnections()
	cl, err := client.New(os.Getenv(loadEnv), client.WithHTTPClient(&http.Client{Transport: tr}))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	const rate = 1000
	interval := time.Second / rate
	lat := make([]int64, n)
	errs := make([]error, n)
	sem := make(chan struct{}, 256)
	var wg sync.WaitGroup
	req := scheduler.Request{Spec: driver.Spec{Image: "crosbymichael/redis", Type: driver.TypeService,
		Resources: driver.Resources{CPU: driver.CPUs(0.2), Memory: 512 * driver.MiB}}}
	start := time.Now()
	for i := range n {
		due := start.Add(time.Duration(i) * interval)
		if d := time.Until(due); d > 0 {
			time.Sleep(d)
		}
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			_, errs[i] = cl.Submit(context.Background(), req)
			lat[i] = time.Since(due).Microseconds()
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	for i, err := range errs {
		if err != nil {
			fmt.Fprintf(os.Stderr, "request %d: %v\n", i, err)
			return 1
		}
	}
	if err := json.NewEncoder(os.Stdout).Encode(loadResult{Micros: lat, Rate: float64(n) / elapsed.Seconds()}); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// BenchmarkW3EndToEnd runs workload w3 through the whole path: 1,000 batch
// groups of 1,000 instances (all essential, one zone constraint each) are
// submitted through the HTTP API to a plane over the server's store (bbolt)
// and a sim back-end of 5,000 nodes, and the clock stops when all 1,000,000
// instances run. It reports the seconds taken and the process's peak RSS.
// Run with -benchtime=1x; GOMEMLIMIT sets the soft memory limit, as the
// server's --memory-limit does.
func BenchmarkW3EndToEnd(b *testing.B) {
	w, err := simulate.Builtin("w3", 0)
	if err != nil {
		b.Fatal(err)
	}
	pools, err := json.Marshal(w.Nodes)
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		st, err := bolt.Open(filepath.Join(b.TempDir(), "berth.db"), bolt.Options{})
		if err != nil {
			b.Fatal(err)
		}
		e := newEnvOn(b, st, map[string]any{"pools": string(pools)}, 0)
		ctx := context.Background()
		total := 0
		start := time.Now()
		for g, it := range w.Requests {
			svc := scheduler.Service{Request: it.Request, Essential: it.Essential}
			svc.ID = "s"
			if _, err := e.client.SubmitGroup(ctx, scheduler.Group{ID: fmt.Sprintf("g%d", g), Services: []scheduler.Service{svc}}); err != nil {
				b.Fatalf("group %d: %v", g, err)
			}
			total += it.Request.N()
		}
		submitted := time.Since(start)
		b.Logf("submitted %d groups in %s", len(w.Requests), submitted.Round(time.Millisecond))
		// The sim back-end's nodes count the instances that exist there;
		// summing them is cheap where listing a million records is not.
		deadline := time.Now().Add(8 * time.Minute)
		lastLog := time.Now()
		for {
			nodes, err := e.client.Nodes(ctx, "")
			if err != nil {
				b.Fatal(err)
			}
			created := 0
			for _, n := range nodes {
				created += n.Instances
			}
			if created >= total {
				break
			}
			if time.Since(lastLog) > 10*time.Second {
				b.Logf("%s: %d of %d instances exist in the back-end", time.Since(start).Round(time.Second), created, total)
				lastLog = time.Now()
			}
			if time.Now().After(deadline) {
				b.Fatalf("after %s only %d of %d instances exist", time.Since(start).Round(time.Second), created, total)
			}
			time.Sleep(time.Second)
		}
		notYet := []control.Phase{"pending", "scheduled", "creating"}
		for {
			left, err := e.plane.Instances(ctx, control.Filter{Phases: notYet})
			if err != nil {
				b.Fatal(err)
			}
			if len(left) == 0 {
				break
			}
			time.Sleep(200 * time.Millisecond)
		}
		elapsed := time.Since(start)
		running, err := e.plane.Instances(ctx, control.Filter{Phases: []control.Phase{"running"}})
		if err != nil {
			b.Fatal(err)
		}
		if len(running) != total {
			b.Fatalf("%d instances running, want %d", len(running), total)
		}
		b.ReportMetric(submitted.Seconds(), "submit_s")
		b.ReportMetric(elapsed.Seconds(), "running_s")
		b.ReportMetric(float64(total), "instances")
		b.ReportMetric(float64(peakRSS()), "peak_rss_bytes")
	}
}

// peakRSS returns the process's peak resident set size (VmHWM), or 0.
func peakRSS() int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb * 1024
		}
	}
	return 0
}
