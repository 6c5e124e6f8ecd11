package api_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berth-dev/berth/api/client"
	"github.com/berth-dev/berth/config"
	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/internal/freeport"
	"github.com/berth-dev/berth/internal/pkitest"
	"github.com/berth-dev/berth/internal/procfs"
	"github.com/berth-dev/berth/leader"
	"github.com/berth-dev/berth/scheduler"
	"github.com/berth-dev/berth/simulate"
	"github.com/berth-dev/berth/store"
	"github.com/berth-dev/berth/store/bolt"
	"github.com/berth-dev/berth/store/etcd"
	"github.com/berth-dev/berth/store/etcd/etcdtest"
)

// BenchmarkSubmitSim1000 submits Citadel requests through the HTTP API
// (loopback) to a plane over a sim back-end of 1,000 nodes and the server's
// store (bbolt, durable before each answer), open loop at 1,000 requests
// per second. The load comes from a second process (this test binary,
// started again), as it would from clients: the server's garbage collector
// and scheduler do not delay the clock of the load, nor the other way
// round. Request i is due at start + i ms, and its latency is measured
// from when it was due, so a server that falls behind is charged for the
// queueing too. This process, the server, takes `berth server`'s runtime
// settings. Run with -benchtime=10000x for 10 s of load; it reports p50,
// p99 and max latency and the rate achieved.
//
// Every request carries a bearer token, as every client's must. The
// sub-benchmark tls serves the same API over TLS (the load process checks
// the server's certificate), to measure what TLS costs.
//
// The sub-benchmark etcd3 keeps the state in a cluster of three etcd
// members (in this process, writing to disk with fsync, as a cluster of
// three servers on one machine would), the plane writing through the
// leader's fenced store: the cost of high availability.
func BenchmarkSubmitSim1000(b *testing.B) {
	for _, tls := range []bool{false, true} {
		name := "http"
		if tls {
			name = "tls"
		}
		b.Run(name, func(b *testing.B) {
			serverRuntime(b)
			st, err := bolt.Open(filepath.Join(b.TempDir(), "berth.db"), bolt.Options{})
			if err != nil {
				b.Fatal(err)
			}
			benchSubmit(b, st, tls)
		})
	}
	b.Run("etcd3", func(b *testing.B) {
		serverRuntime(b)
		// Registered first, run last: the keep-alive connections of the
		// set-up's calls end with the benchmark.
		b.Cleanup(http.DefaultTransport.(*http.Transport).CloseIdleConnections)
		benchSubmit(b, etcdCluster(b, 0, false), false)
	})
}

// etcdCluster starts a three-member etcd cluster and returns the store of
// its elected leader, fenced by its term, with the leader's lease ttl (0:
// the servers' default). With apart, only the first member runs in this
// process, as a server's own member does, and hands the etcd lead off as
// a leading server's does; the two others run in processes of their own
// (this test binary started again, memberProcess), so that this process's
// peak RSS is that of one server, its plane and its member.
func etcdCluster(b *testing.B, ttl time.Duration, apart bool) store.Store {
	var peers, names []string
	for i := range 3 {
		names = append(names, fmt.Sprintf("m%d", i))
		peers = append(peers, fmt.Sprintf("http://127.0.0.1:%d", freeport.Port(b)))
	}
	var initial []string
	for i := range 3 {
		initial = append(initial, names[i]+"="+peers[i])
	}
	configs := make([]etcd.MemberConfig, 3)
	for i := range 3 {
		configs[i] = etcd.MemberConfig{
			Name: names[i], Dir: filepath.Join(b.TempDir(), names[i]), PeerURL: peers[i],
			ClientURL: fmt.Sprintf("http://127.0.0.1:%d", freeport.Port(b)), InitialCluster: strings.Join(initial, ","),
			// The servers' Raft timings, which let etcd grant their
			// default lease.
			Heartbeat: etcd.DefaultHeartbeat, ElectionTimeout: etcd.DefaultElectionTimeout,
		}
	}
	members := make([]*etcd.Member, 3)
	errs := make(chan error, 3)
	inProcess := 0
	for i := range 3 {
		if apart && i > 0 {
			startMemberProcess(b, configs[i])
			continue
		}
		inProcess++
		go func() {
			m, err := etcd.StartMember(context.Background(), configs[i])
			members[i] = m
			errs <- err
		}()
	}
	for range inProcess {
		if err := <-errs; err != nil {
			b.Fatal(err)
		}
	}
	b.Cleanup(func() {
		for _, m := range members {
			if m != nil {
				m.Close()
			}
		}
		etcdtest.AwaitClosed(b)
	})
	c := etcdtest.Client(b, members[0])
	st := etcd.New(c, etcd.Options{})
	b.Cleanup(func() { _ = st.Close() })
	ctx, cancel := context.WithCancel(context.Background())
	terms := make(chan leader.Term, 1)
	done := make(chan struct{})
	cfg := leader.Config{Client: c, TTL: ttl, Self: leader.Info{Name: "bench", Address: "http://127.0.0.1"}}
	if apart {
		cfg.HandOff = members[0].HandOff
	}
	go func() {
		defer close(done)
		_ = leader.Run(ctx, cfg,
			func(tctx context.Context, term leader.Term, _ func()) error {
				terms <- term
				<-tctx.Done()
				return nil
			})
	}()
	b.Cleanup(func() { cancel(); <-done })
	term := <-terms
	return leader.Fenced(st, term, func() {
		// A deposed leader's plane writes nothing more: what the
		// benchmark waits for would never come.
		b.Errorf("the leader lost its lease (the term of revision %d)", term.Rev)
		cancel()
	})
}

// memberEnv, set to the JSON of an etcd.MemberConfig, makes this test
// binary an etcd member (memberProcess) instead of running tests.
const memberEnv = "BERTH_BENCH_MEMBER"

// memberProcess is the process of one etcd member of etcdCluster: it runs
// the member until its standard input ends (the benchmark closed it, or
// ended).
func memberProcess() int {
	var c etcd.MemberConfig
	if err := json.Unmarshal([]byte(os.Getenv(memberEnv)), &c); err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", memberEnv, err)
		return 2
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	m, err := etcd.StartMember(ctx, c)
	cancel()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	_, _ = io.Copy(io.Discard, os.Stdin)
	m.Close()
	return 0
}

// startMemberProcess starts a member of config c in a process of its own,
// stopped when the benchmark ends, and adds it to memberPIDs.
func startMemberProcess(b *testing.B, c etcd.MemberConfig) {
	cfg, err := json.Marshal(c)
	if err != nil {
		b.Fatal(err)
	}
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), memberEnv+"="+string(cfg))
	stdin, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	var errb bytes.Buffer
	cmd.Stderr = &errb
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	memberPIDs = append(memberPIDs, cmd.Process.Pid)
	b.Cleanup(func() {
		memberPIDs = slices.DeleteFunc(memberPIDs, func(pid int) bool { return pid == cmd.Process.Pid })
		_ = stdin.Close()
		if err := cmd.Wait(); err != nil {
			b.Errorf("member %s: %v: %s", c.Name, err, errb.Bytes())
		}
	})
}

// memberPIDs are the running member processes of etcdCluster. Only the
// benchmark's goroutine uses it.
var memberPIDs []int

func benchSubmit(b *testing.B, st store.Store, useTLS bool) {
	e := newEnvOn(b, st, map[string]any{"nodes": 1000, "shape": `{"cpus": 64, "memory": "256Gi"}`}, 0)
	url, ca := e.http.URL, ""
	if useTLS {
		// An ECDSA P-256 certificate signed by a CA that the load process
		// trusts, as a deployment would have: its handshakes cost a
		// fraction of RSA's.
		tlsCA := pkitest.NewCA("berth bench CA")
		ts := httptest.NewUnstartedServer(e.api)
		ts.TLS = &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{tlsCA.Server("127.0.0.1").TLSCertificate()}}
		ts.StartTLS()
		b.Cleanup(ts.Close)
		dir := b.TempDir()
		if err := pkitest.WriteFiles(dir, map[string][]byte{"ca.pem": tlsCA.CertPEM}); err != nil {
			b.Fatal(err)
		}
		ca = filepath.Join(dir, "ca.pem")
		url = ts.URL
	}
	load := startLoad(b, url, loadSubmit, b.N, e.token, ca)
	b.ResetTimer()
	var res loadResult
	load.wait(b, &res)
	b.StopTimer()
	if len(res.Micros) != b.N {
		b.Fatalf("load process measured %d requests, want %d", len(res.Micros), b.N)
	}
	lat := res.Micros
	slices.Sort(lat)
	q := func(p float64) float64 { return float64(lat[int(p*float64(len(lat)-1))]) / 1000 }
	b.ReportMetric(q(0.5), "p50_ms")
	b.ReportMetric(q(0.99), "p99_ms")
	b.ReportMetric(float64(lat[len(lat)-1])/1000, "max_ms")
	b.ReportMetric(res.Rate, "req/s")
}

// The load of the benchmarks comes from a second process, as it would from
// clients: this test binary started again with the environment below, in
// which TestMain calls sendLoad instead of running tests.
const (
	loadEnv      = "BERTH_BENCH_LOAD_URL"   // the server's URL
	loadKindEnv  = "BERTH_BENCH_LOAD_KIND"  // loadSubmit or loadW3
	loadCountEnv = "BERTH_BENCH_LOAD_COUNT" // how many requests (loadSubmit)
	loadTokenEnv = "BERTH_BENCH_LOAD_TOKEN" // the bearer token
	loadCAEnv    = "BERTH_BENCH_LOAD_CA"    // PEM file of the CA of the server's certificate, for TLS
	loadRateEnv  = "BERTH_BENCH_LOAD_RATE"  // requests per second (loadSubmit)
)

// submitRate is the open loop's rate of the submission benchmarks:
// go test -bench SubmitSim1000 ./api -args -submit-rate 2000.
var submitRate = flag.Int("submit-rate", 1000, "requests per second of the SubmitSim1000 benchmarks' open loop")

// Kinds of load.
const (
	loadSubmit = "submit" // single requests, open loop at -submit-rate per second
	loadW3     = "w3"     // workload w3's groups, one after the other
)

// loadProcess is a running load process.
type loadProcess struct {
	cmd    *exec.Cmd
	stdout bytes.Buffer
	stderr bytes.Buffer
	done   chan struct{} // closed when it has ended, with err set
	err    error
}

// startLoad starts a load process of kind against url.
func startLoad(b *testing.B, url, kind string, count int, token, ca string) *loadProcess {
	b.Helper()
	lp := &loadProcess{cmd: exec.Command(os.Args[0]), done: make(chan struct{})}
	lp.cmd.Env = append(os.Environ(), loadEnv+"="+url, loadKindEnv+"="+kind, fmt.Sprintf("%s=%d", loadCountEnv, count),
		loadTokenEnv+"="+token, loadCAEnv+"="+ca, fmt.Sprintf("%s=%d", loadRateEnv, *submitRate))
	lp.cmd.Stdout, lp.cmd.Stderr = &lp.stdout, &lp.stderr
	if err := lp.cmd.Start(); err != nil {
		b.Fatal(err)
	}
	go func() {
		lp.err = lp.cmd.Wait()
		close(lp.done)
	}()
	b.Cleanup(func() {
		_ = lp.cmd.Process.Kill()
		<-lp.done
	})
	return lp
}

// failed reports whether the load process has ended with an error.
func (lp *loadProcess) failed() bool {
	select {
	case <-lp.done:
		return lp.err != nil
	default:
		return false
	}
}

// wait waits for the load process to end and decodes what it printed into
// out.
func (lp *loadProcess) wait(b *testing.B, out any) {
	b.Helper()
	if <-lp.done; lp.err != nil {
		b.Fatalf("load process: %v: %s", lp.err, lp.stderr.Bytes())
	}
	if err := json.Unmarshal(lp.stdout.Bytes(), out); err != nil {
		b.Fatalf("load process printed %q: %v", lp.stdout.Bytes(), err)
	}
}

// loadResult is what a submit load process prints: each request's latency
// in microseconds and the rate achieved.
type loadResult struct {
	Micros []int64 `json:"micros"`
	Rate   float64 `json:"rate"`
}

// w3Result is what a w3 load process prints.
type w3Result struct {
	Instances int     `json:"instances"`
	Seconds   float64 `json:"seconds"` // to submit every group
}

// sendLoad is the load process: it sends the load the environment names,
// prints its result as JSON and returns the process's exit code.
func sendLoad() int {
	tr := &http.Transport{MaxIdleConnsPerHost: 256}
	defer tr.CloseIdleConnections()
	if ca := os.Getenv(loadCAEnv); ca != "" {
		b, err := os.ReadFile(ca)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
		pool := x509.NewCertPool()
		pool.AppendCertsFromPEM(b)
		tr.TLSClientConfig = &tls.Config{RootCAs: pool}
	}
	cl, err := client.New(os.Getenv(loadEnv), client.WithHTTPClient(&http.Client{Transport: tr}), client.WithToken(os.Getenv(loadTokenEnv)))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	var res any
	switch kind := os.Getenv(loadKindEnv); kind {
	case loadSubmit:
		n, err := strconv.Atoi(os.Getenv(loadCountEnv))
		if err != nil || n < 1 {
			fmt.Fprintf(os.Stderr, "%s: want a positive count, got %q\n", loadCountEnv, os.Getenv(loadCountEnv))
			return 2
		}
		rate, err := strconv.Atoi(os.Getenv(loadRateEnv))
		if err != nil || rate < 1 || rate > 100_000 {
			fmt.Fprintf(os.Stderr, "%s: want 1 to 100000 requests per second, got %q\n", loadRateEnv, os.Getenv(loadRateEnv))
			return 2
		}
		if res, err = submitLoad(cl, n, rate); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	case loadW3:
		if res, err = w3Load(cl); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	default:
		fmt.Fprintf(os.Stderr, "%s: unknown load %q\n", loadKindEnv, kind)
		return 2
	}
	if err := json.NewEncoder(os.Stdout).Encode(res); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// submitLoad submits n requests open loop at rate per second and measures
// each one's latency from when it was due.
func submitLoad(cl *client.Client, n, rate int) (*loadResult, error) {
	interval := time.Second / time.Duration(rate)
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
			return nil, fmt.Errorf("request %d: %w", i, err)
		}
	}
	return &loadResult{Micros: lat, Rate: float64(n) / elapsed.Seconds()}, nil
}

// w3Load submits workload w3's groups one after the other.
func w3Load(cl *client.Client) (*w3Result, error) {
	w, err := simulate.Builtin("w3", 0)
	if err != nil {
		return nil, err
	}
	res := &w3Result{}
	start := time.Now()
	for g, it := range w.Requests {
		svc := scheduler.Service{Request: it.Request, Essential: it.Essential}
		svc.ID = "s"
		if _, err := cl.SubmitGroup(context.Background(), scheduler.Group{ID: fmt.Sprintf("g%d", g), Services: []scheduler.Service{svc}}); err != nil {
			return nil, fmt.Errorf("group %d: %w", g, err)
		}
		res.Instances += it.Request.N()
	}
	res.Seconds = time.Since(start).Seconds()
	return res, nil
}

// BenchmarkW3EndToEnd runs workload w3 through the whole path: 1,000 batch
// groups of 1,000 instances (all essential, one zone constraint each) are
// submitted through the HTTP API, by a second process, to a plane over the
// server's store (bbolt) and a sim back-end of 5,000 nodes, and the clock
// stops when all 1,000,000 instances run. It reports the seconds taken and
// the peak RSS of this process, the server's. Run with -benchtime=1x;
// GOMEMLIMIT sets the soft memory limit, as the server's --memory-limit
// does.
//
// The sub-benchmark etcd3 keeps the state in three etcd members instead:
// one in this process, which hands etcd's lead off as a leading server
// does, and two in processes of their own (etcdCluster), so that
// peak_rss_bytes is that of the leading server, its plane and its
// member, and member_peak_rss_bytes the larger of the two other members'.
// The members run with the servers' Raft timings and default lease.
//
// Where the CPU went during the run, in seconds: server_cpu_s is this
// process's, members_cpu_s the other members' processes', machine_cpu_s
// every CPU's (the load process and everything else on the machine
// included).
func BenchmarkW3EndToEnd(b *testing.B) {
	b.Run("bolt", func(b *testing.B) {
		w3EndToEnd(b, func() store.Store {
			st, err := bolt.Open(filepath.Join(b.TempDir(), "berth.db"), bolt.Options{})
			if err != nil {
				b.Fatal(err)
			}
			return st
		})
	})
	b.Run("etcd3", func(b *testing.B) {
		b.Cleanup(http.DefaultTransport.(*http.Transport).CloseIdleConnections)
		// The servers' default lease: a leader that loses it fails the
		// benchmark (etcdCluster).
		w3EndToEnd(b, func() store.Store { return etcdCluster(b, 0, true) })
	})
}

func w3EndToEnd(b *testing.B, open func() store.Store) {
	serverRuntime(b)
	w, err := simulate.Builtin("w3", 0)
	if err != nil {
		b.Fatal(err)
	}
	pools, err := json.Marshal(w.Nodes)
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		e := newEnvOn(b, open(), map[string]any{"pools": string(pools)}, 0)
		ctx := context.Background()
		total := 0
		for _, it := range w.Requests {
			total += it.Request.N()
		}
		start := time.Now()
		busy0, cpu0, members0 := machineBusy(), processCPU(os.Getpid()), membersCPU()
		load := startLoad(b, e.http.URL, loadW3, 0, e.token, "")
		// The sim back-end's nodes count the instances that exist there;
		// summing them is cheap where listing a million records is not.
		deadline := time.Now().Add(20 * time.Minute)
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
			if b.Failed() {
				b.FailNow()
			}
			if load.failed() {
				load.wait(b, nil)
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
		for {
			c, err := e.plane.Counts(ctx)
			if err != nil {
				b.Fatal(err)
			}
			if c["running"] == total {
				break
			}
			if b.Failed() {
				b.FailNow()
			}
			if c["pending"]+c["scheduled"]+c["creating"] == 0 {
				b.Fatalf("nothing left to launch, yet %d of %d instances run: %v", c["running"], total, c)
			}
			time.Sleep(100 * time.Millisecond)
		}
		elapsed := time.Since(start)
		busy, cpu, memCPU := machineBusy()-busy0, processCPU(os.Getpid())-cpu0, membersCPU()-members0
		var lr w3Result
		load.wait(b, &lr)
		if lr.Instances != total {
			b.Fatalf("the load process submitted %d instances, want %d", lr.Instances, total)
		}
		b.ReportMetric(lr.Seconds, "submit_s")
		b.ReportMetric(elapsed.Seconds(), "running_s")
		b.ReportMetric(float64(total), "instances")
		b.ReportMetric(float64(peakRSS("self")), "peak_rss_bytes")
		// Where the machine's CPU went: this process (the server's
		// plane, its API and its member), the other members, the rest
		// (the load process among it).
		b.ReportMetric(busy, "machine_cpu_s")
		b.ReportMetric(cpu, "server_cpu_s")
		var members int64
		for _, pid := range memberPIDs {
			members = max(members, peakRSS(strconv.Itoa(pid)))
		}
		if members > 0 {
			// The two other servers' members, in processes of their own.
			b.ReportMetric(float64(members), "member_peak_rss_bytes")
			b.ReportMetric(memCPU, "members_cpu_s")
		}
	}
}

// serverRuntime gives this process the Go runtime settings of `berth
// server` with its default configuration (the GC target; GOMEMLIMIT and
// GOGC still apply when set), as the benchmarks measure a server, and puts
// them back at the end.
func serverRuntime(b *testing.B) {
	gc := debug.SetGCPercent(-1)
	debug.SetGCPercent(gc)
	limit := debug.SetMemoryLimit(-1)
	config.Default().SetRuntime()
	b.Cleanup(func() {
		debug.SetGCPercent(gc)
		debug.SetMemoryLimit(limit)
	})
}

// processCPU returns the CPU time, user and system, that process pid has
// used, in seconds, or 0.
func processCPU(pid int) float64 {
	st, err := procfs.ReadStat(pid)
	if err != nil {
		return 0
	}
	return float64(st.Ticks) / procfs.UserHZ
}

// membersCPU returns the CPU time the processes of memberPIDs have used,
// in seconds.
func membersCPU() float64 {
	var sum float64
	for _, pid := range memberPIDs {
		sum += processCPU(pid)
	}
	return sum
}

// machineBusy returns the CPU time all CPUs have spent busy since boot
// (procfs.HostTicks), in seconds, or 0.
func machineBusy() float64 {
	busy, _, err := procfs.HostTicks()
	if err != nil {
		return 0
	}
	return float64(busy) / procfs.UserHZ
}

// peakRSS returns the peak resident set size (VmHWM) of process pid
// ("self": this one), or 0.
func peakRSS(pid string) int64 {
	b, err := os.ReadFile("/proc/" + pid + "/status")
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
