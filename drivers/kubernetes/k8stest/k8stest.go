// Package k8stest runs a real Kubernetes control plane for tests: an etcd
// member (Berth's embedded one, in a child process), a kube-apiserver and
// KWOK, which plays the kubelet of fake nodes (their pods turn Running
// without any container). KWOK also plays what the tests need of a
// kubelet beyond that: it serves pod logs from a file (LogsNamespace,
// Cluster.LogsFile), reports container resources so that pods can be
// resized in place, and fails the pull of MissingImage. The binaries are
// built once by .ci/k8s-servers.sh; BinDir says where they are.
//
// A test binary that uses it calls ServeEtcdIfAsked first thing in
// TestMain: the etcd member runs in a copy of the test binary, so that its
// goroutines stay out of the tests' leak checks.
package k8stest

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clientset "k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/berth-dev/berth/internal/freeport"
	"github.com/berth-dev/berth/internal/pkitest"
	"github.com/berth-dev/berth/store/etcd"
)

// Version is the Kubernetes release the servers are built from.
const Version = "v1.37.2"

// envBin names the directory of the binaries; envEtcd asks a test binary
// to be the etcd member instead of running tests.
const (
	envBin  = "BERTH_K8S_BIN"
	envEtcd = "BERTH_K8STEST_ETCD"
)

// FrozenAnnotation on a node makes KWOK leave its status alone, so that a
// test can make it NotReady.
const FrozenAnnotation = "berth.test/frozen"

// BinDir returns the directory holding kube-apiserver, kwok and
// kwok-stages.yaml: $BERTH_K8S_BIN, else the default cache directory of
// .ci/k8s-servers.sh. It fails, saying how to build them, when one is
// missing.
func BinDir() (string, error) {
	dir := os.Getenv(envBin)
	if dir == "" {
		base := os.Getenv("BERTH_CACHE")
		if base == "" {
			home, err := os.UserHomeDir()
			if err != nil {
				return "", err
			}
			base = filepath.Join(home, ".cache", "berth")
		}
		dir = filepath.Join(base, "k8s-"+Version)
	}
	var missing []string
	for _, f := range []string{"kube-apiserver", "kwok", "kwok-stages.yaml"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			missing = append(missing, f)
		}
	}
	if len(missing) > 0 {
		return "", fmt.Errorf("k8stest: %s missing from %s: build them with .ci/k8s-servers.sh (about 15 minutes the first time; "+
			"it builds kube-apiserver %s and kwok from the Go module proxy), or point %s at a directory holding them",
			strings.Join(missing, ", "), dir, Version, envBin)
	}
	return dir, nil
}

// ServeEtcdIfAsked runs an etcd member and exits, when this process was
// started by Start to be one; otherwise it returns at once. The member
// stops when its standard input closes (the parent is gone) or on SIGTERM.
func ServeEtcdIfAsked() {
	spec := os.Getenv(envEtcd)
	if spec == "" {
		return
	}
	parts := strings.Split(spec, "|")
	if len(parts) != 3 {
		fmt.Fprintln(os.Stderr, "k8stest: bad", envEtcd, spec)
		os.Exit(2)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	m, err := etcd.StartMember(ctx, etcd.MemberConfig{Name: "k8stest", Dir: parts[0], ClientURL: parts[1], PeerURL: parts[2], SkipFsync: true})
	cancel()
	if err != nil {
		fmt.Fprintln(os.Stderr, "k8stest: etcd:", err)
		os.Exit(1)
	}
	fmt.Println("etcd ready")
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	gone := make(chan struct{})
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		close(gone)
	}()
	select {
	case <-stop:
	case <-gone:
	case err := <-m.Err():
		fmt.Fprintln(os.Stderr, "k8stest: etcd:", err)
	}
	m.Close()
	os.Exit(0)
}

// Cluster is a running control plane with KWOK.
type Cluster struct {
	// Kubeconfig is the path of a kubeconfig file for the cluster (admin).
	Kubeconfig string
	// Client is an admin client.
	Client clientset.Interface
	// Host is the API server's URL.
	Host string
	// LogsFile is the log of every container of the pods in
	// LogsNamespace, as KWOK serves it (AppendLog writes it).
	LogsFile string

	dir string
	// stopping is closed by Stop, before it takes mu; keeper is KWOK's
	// keeper goroutine (keepKWOK). Lock order: mu is a leaf.
	stopping chan struct{}
	stopOnce sync.Once
	keeper   sync.WaitGroup
	// mu guards procs (the keeper replaces KWOK's).
	mu    sync.Mutex
	procs []*proc
}

type proc struct {
	name  string
	cmd   *exec.Cmd
	log   string
	stdin io.Closer
	out   *bufio.Reader // its standard output, when start was given env
	// logFile is closed by wait, which closes done once the child ended.
	logFile *os.File
	done    chan struct{}
}

// Start starts etcd, kube-apiserver and KWOK with their files in dir (a
// test's temporary directory) and waits until the API server is ready.
// The caller must call Stop, also when Start fails halfway (Start stops
// what it started then).
func Start(ctx context.Context, dir string) (c *Cluster, err error) {
	bin, err := BinDir()
	if err != nil {
		return nil, err
	}
	c = &Cluster{dir: dir, stopping: make(chan struct{})}
	defer func() {
		if err != nil {
			c.Stop()
			c = nil
		}
	}()

	// etcd, in a copy of this binary.
	clientPort, err := freeport.Take()
	if err != nil {
		return c, err
	}
	peerPort, err := freeport.Take()
	if err != nil {
		return c, err
	}
	etcdURL := fmt.Sprintf("http://127.0.0.1:%d", clientPort)
	self, err := os.Executable()
	if err != nil {
		return c, err
	}
	ep, err := c.start("etcd", self, nil, []string{envEtcd + "=" + filepath.Join(dir, "etcd") + "|" + etcdURL + "|" + fmt.Sprintf("http://127.0.0.1:%d", peerPort)})
	if err != nil {
		return c, err
	}
	if err := waitLine(ctx, ep.out, "etcd ready"); err != nil {
		return c, err
	}

	// Certificates, keys and the admin token. The API server and KWOK's
	// kubelet API serve the one certificate; clients trust its CA.
	ca := pkitest.NewCA("k8stest CA")
	serving := ca.Server("127.0.0.1", "localhost")
	if err := pkitest.WriteFiles(dir, map[string][]byte{"serving.crt": serving.CertPEM, "serving.key": serving.KeyPEM}); err != nil {
		return c, err
	}
	certFile, keyFile := filepath.Join(dir, "serving.crt"), filepath.Join(dir, "serving.key")
	saKey := filepath.Join(dir, "sa.key")
	if err := writeKey(saKey); err != nil {
		return c, err
	}
	token := hexToken()
	tokens := filepath.Join(dir, "tokens.csv")
	if err := os.WriteFile(tokens, []byte(token+",admin,admin-uid,system:masters\n"), 0o600); err != nil {
		return c, err
	}
	port, err := freeport.Take()
	if err != nil {
		return c, err
	}
	c.Host = fmt.Sprintf("https://127.0.0.1:%d", port)
	args := []string{
		"--etcd-servers=" + etcdURL,
		"--bind-address=127.0.0.1",
		"--advertise-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(port),
		"--tls-cert-file=" + certFile,
		"--tls-private-key-file=" + keyFile,
		"--cert-dir=" + filepath.Join(dir, "certs"),
		"--service-account-issuer=https://kubernetes.default.svc",
		"--service-account-key-file=" + saKey,
		"--service-account-signing-key-file=" + saKey,
		"--token-auth-file=" + tokens,
		// Tests only: every authenticated request is allowed.
		"--authorization-mode=AlwaysAllow",
		"--anonymous-auth=false",
		// No controller manager makes service account tokens.
		"--disable-admission-plugins=ServiceAccount",
		"--service-cluster-ip-range=10.96.0.0/16",
		"--endpoint-reconciler-type=none",
		"--enable-priority-and-fairness=false",
		"--profiling=false",
		"--v=0",
	}
	api, err := c.start("kube-apiserver", filepath.Join(bin, "kube-apiserver"), args, nil)
	if err != nil {
		return c, err
	}
	if err := c.waitReady(ctx, api, ca.Pool(), token); err != nil {
		return c, err
	}

	c.Kubeconfig = filepath.Join(dir, "kubeconfig")
	kc := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: k8stest
  cluster:
    server: %s
    certificate-authority-data: %s
users:
- name: admin
  user:
    token: %s
contexts:
- name: k8stest
  context: {cluster: k8stest, user: admin}
current-context: k8stest
`, c.Host, b64(ca.CertPEM), token)
	if err := os.WriteFile(c.Kubeconfig, []byte(kc), 0o600); err != nil {
		return c, err
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", c.Kubeconfig)
	if err != nil {
		return c, err
	}
	cfg.QPS, cfg.Burst = 500, 1000
	c.Client, err = clientset.NewForConfig(cfg)
	if err != nil {
		return c, err
	}

	// KWOK's own server plays the kubelet's API on every node (the API
	// server reaches it at the node's address and kubelet port, over TLS,
	// without checking the certificate since it is given no CA for
	// kubelets): it serves the logs of pods in LogsNamespace from LogsFile.
	c.LogsFile = filepath.Join(dir, "pod.log")
	if err := os.WriteFile(c.LogsFile, nil, 0o600); err != nil {
		return c, err
	}
	stages, err := os.ReadFile(filepath.Join(bin, "kwok-stages.yaml"))
	if err != nil {
		return c, err
	}
	kept, ok := withoutStage(string(stages), "pod-ready")
	if !ok {
		return c, fmt.Errorf("k8stest: %s has no stage pod-ready to replace; rebuild it with .ci/k8s-servers.sh", filepath.Join(bin, "kwok-stages.yaml"))
	}
	config := filepath.Join(dir, "kwok.yaml")
	extra := fmt.Sprintf(extraConfig, LogsNamespace, c.LogsFile, NoResizeLabel, NoResizeLabel, MissingImage)
	if err := os.WriteFile(config, []byte(kept+"---\n"+extra), 0o600); err != nil {
		return c, err
	}
	kwokPort, err := freeport.Take()
	if err != nil {
		return c, err
	}
	if err := c.keepKWOK(filepath.Join(bin, "kwok"), []string{
		"--kubeconfig=" + c.Kubeconfig,
		"--config=" + config,
		"--manage-all-nodes=true",
		"--disregard-status-with-annotation-selector=" + FrozenAnnotation + "=true",
		"--node-ip=127.0.0.1",
		"--node-port=" + strconv.Itoa(kwokPort),
		"--tls-cert-file=" + certFile,
		"--tls-private-key-file=" + keyFile,
	}); err != nil {
		return c, err
	}
	return c, nil
}

// kwokRestarts bounds how often keepKWOK starts KWOK again.
const kwokRestarts = 5

// keepKWOK starts KWOK, and starts it again whenever it ends before Stop,
// up to kwokRestarts times: KWOK v0.8.0 can die at start-up of a race of
// its own ("fatal error: concurrent map writes" in its CEL evaluation),
// and it keeps no state that a new process would lack (the API server
// holds it all). The log of an ended run is kept as kwok.log.N; Logs
// gives the current one's. One goroutine, started here, waits for every
// KWOK process in turn, so that a restart during a test starts none that
// the test's leak check would see.
func (c *Cluster) keepKWOK(path string, args []string) error {
	p, err := c.launch("kwok", path, args, nil)
	if err != nil {
		return err
	}
	c.keeper.Add(1)
	go func() {
		defer c.keeper.Done()
		for n := 1; ; n++ {
			p.wait()
			select {
			case <-c.stopping:
				return
			default:
			}
			if n > kwokRestarts {
				return
			}
			_ = os.Rename(p.log, p.log+"."+strconv.Itoa(n))
			c.mu.Lock()
			c.procs = slices.DeleteFunc(c.procs, func(q *proc) bool { return q == p })
			c.mu.Unlock()
			next, err := c.launch("kwok", path, args, nil)
			if err != nil {
				return
			}
			p = next
		}
	}()
	return nil
}

// LogsNamespace is the namespace whose pods' logs KWOK serves, from
// Cluster.LogsFile.
const LogsNamespace = "logs"

// MissingImage is the image KWOK's nodes fail to pull; they "run" any
// other.
const MissingImage = "registry.example/missing:1"

// NoResizeLabel on a pod makes its node report no container resources,
// as a kubelet without in-place resize.
const NoResizeLabel = "k8stest/no-resize"

// extraConfig is KWOK's configuration beside the stages of
// .ci/k8s-servers.sh (a format string: the logs namespace, the logs file,
// NoResizeLabel twice, MissingImage):
//
//   - ClusterLogs: the logs of every pod in the logs namespace are the
//     one file, in the container runtime's log format, followed.
//   - Stage pod-ready replaces KWOK's own (dropped from the stages of
//     .ci/k8s-servers.sh): the same, and a running pod's container
//     statuses report the resources of its spec, as a kubelet that
//     resizes pods in place does (the API server takes a resize only from
//     a node that reports them). A pod labelled NoResizeLabel is left
//     without them, as on a kubelet that cannot resize.
//   - Stage pod-resources: after a resize, the container statuses report
//     the new amounts (the kubelet's "applied").
//   - Stage pod-image-missing: a pod of MissingImage stays Pending with
//     ErrImagePull, as a kubelet reports an image that does not exist.
const extraConfig = `apiVersion: kwok.x-k8s.io/v1alpha1
kind: ClusterLogs
metadata:
  name: berth-test-logs
spec:
  selector:
    matchNamespaces: [%q]
  logs:
  - logsFile: %q
    follow: true
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: pod-ready
spec:
  resourceRef:
    apiGroup: v1
    kind: Pod
  selector:
    matchExpressions:
    - key: '.metadata.deletionTimestamp'
      operator: 'DoesNotExist'
    - key: '.status.phase'
      operator: 'In'
      values:
      - 'Pending'
    - key: '.status.conditions.[] | select( .type == "Ready" ) | .status'
      operator: 'NotIn'
      values:
      - 'True'
  next:
    statusTemplate: |
      {{ $now := Now }}
      {{ $noResize := false }}
      {{ with .metadata.labels }}{{ if index . "%s" }}{{ $noResize = true }}{{ end }}{{ end }}

      conditions:
      - lastTransitionTime: {{ $now | Quote }}
        status: "True"
        type: Initialized
      - lastTransitionTime: {{ $now | Quote }}
        status: "True"
        type: Ready
      - lastTransitionTime: {{ $now | Quote }}
        status: "True"
        type: ContainersReady
      {{ range .spec.readinessGates }}
      - lastTransitionTime: {{ $now | Quote }}
        status: "True"
        type: {{ .conditionType | Quote }}
      {{ end }}

      containerStatuses:
      {{ range $c := .spec.containers }}
      - image: {{ $c.image | Quote }}
        name: {{ $c.name | Quote }}
        ready: true
        restartCount: 0
        state:
          running:
            startedAt: {{ $now | Quote }}
        {{ if and (not $noResize) $c.resources }}
        resources:
      {{ YAML $c.resources 2 }}
        {{ end }}
      {{ end }}

      initContainerStatuses:
      {{ range .spec.initContainers }}
      - image: {{ .image | Quote }}
        name: {{ .name | Quote }}
        ready: true
        restartCount: 0
        {{ if eq .restartPolicy "Always" }}
        started: true
        state:
          running:
            startedAt: {{ $now | Quote }}
        {{ else }}
        state:
          terminated:
            exitCode: 0
            finishedAt: {{ $now | Quote }}
            reason: Completed
            startedAt: {{ $now | Quote }}
        {{ end }}
      {{ end }}
      {{ $hostIPs := NodeIPsWith .spec.nodeName }}
      {{ with $hostIPs }}
      hostIP: {{ index . 0 | Quote }}
      hostIPs:
      {{ range . }}
      - ip: {{ . | Quote }}
      {{ end }}
      {{ end }}
      {{ $podIPs := PodIPsWith .spec.nodeName ( or .spec.hostNetwork false ) ( or .metadata.uid "" ) ( or .metadata.name "" ) ( or .metadata.namespace "" ) }}
      {{ with $podIPs }}
      podIP: {{ index . 0 | Quote }}
      podIPs:
      {{ range . }}
      - ip: {{ . | Quote }}
      {{ end }}
      {{ end }}
      phase: Running
      startTime: {{ $now | Quote }}
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: pod-resources
spec:
  resourceRef:
    apiGroup: v1
    kind: Pod
  selector:
    matchExpressions:
    - key: '.metadata.deletionTimestamp'
      operator: 'DoesNotExist'
    - key: '.status.phase'
      operator: 'In'
      values: ['Running']
    - key: '.spec.containers[0].resources.limits'
      operator: 'Exists'
    - key: '.metadata.labels["%s"]'
      operator: 'DoesNotExist'
    - key: '[.spec.containers[].resources] == [.status.containerStatuses[]?.resources]'
      operator: 'In'
      values: ['false']
  next:
    # KWOK patches the status as JSON: the list is replaced, so each
    # container's status is written whole, as pod-ready left it.
    statusTemplate: |
      {{ $root := . }}
      containerStatuses:
      {{ range $index, $item := .spec.containers }}
      {{ $origin := index $root.status.containerStatuses $index }}
      - name: {{ $item.name | Quote }}
        image: {{ $origin.image | Quote }}
        ready: {{ $origin.ready }}
        restartCount: {{ $origin.restartCount }}
        state:
      {{ YAML $origin.state 2 }}
        resources:
      {{ YAML $item.resources 2 }}
      {{ end }}
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: pod-image-missing
spec:
  resourceRef:
    apiGroup: v1
    kind: Pod
  # Chosen over pod-ready (weight 0), which matches the same pods.
  weight: 1000
  selector:
    matchExpressions:
    - key: '.metadata.deletionTimestamp'
      operator: 'DoesNotExist'
    - key: '.status.phase'
      operator: 'In'
      values: ['Pending']
    - key: '.spec.containers[].image'
      operator: 'In'
      values: [%q]
  next:
    statusTemplate: |
      containerStatuses:
      {{ range .spec.containers }}
      - name: {{ .name | Quote }}
        image: {{ .image | Quote }}
        ready: false
        restartCount: 0
        state:
          waiting:
            reason: ErrImagePull
            message: "failed to pull image: not found"
      {{ end }}
`

// withoutStage returns the YAML documents of stages without the stage
// named name, and whether it was there.
func withoutStage(stages, name string) (string, bool) {
	var out []string
	found := false
	for doc := range strings.SplitSeq(stages, "\n---\n") {
		doc = strings.TrimPrefix(doc, "---\n")
		if strings.Contains(doc, "\n  name: "+name+"\n") {
			found = true
			continue
		}
		if strings.TrimSpace(doc) != "" {
			out = append(out, doc)
		}
	}
	return "---\n" + strings.Join(out, "\n---\n") + "\n", found
}

// AppendLog adds a line to LogsFile as a container runtime writes it
// (stream is "stdout" or "stderr").
func (c *Cluster) AppendLog(stream, line string) error {
	f, err := os.OpenFile(c.LogsFile, os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(f, "%s %s F %s\n", time.Now().UTC().Format(time.RFC3339Nano), stream, line)
	return errors.Join(err, f.Close())
}

// start starts a child in its own process group, which dies with the test
// process (Pdeathsig) and which Stop kills whole, and waits for it in a
// goroutine of its own.
func (c *Cluster) start(name, path string, args, env []string) (*proc, error) {
	p, err := c.launch(name, path, args, env)
	if err != nil {
		return nil, err
	}
	go p.wait()
	return p, nil
}

// errStopping refuses a child started while Stop runs.
var errStopping = errors.New("k8stest: the cluster is stopping")

// launch starts a child as start does; the caller calls its wait. It
// starts nothing once Stop has begun.
func (c *Cluster) launch(name, path string, args, env []string) (*proc, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	select {
	case <-c.stopping:
		return nil, errStopping
	default:
	}
	logPath := filepath.Join(c.dir, name+".log")
	logFile, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(path, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stderr = logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	var out io.ReadCloser
	var stdin io.WriteCloser
	if env != nil {
		if out, err = cmd.StdoutPipe(); err != nil {
			logFile.Close()
			return nil, err
		}
		if stdin, err = cmd.StdinPipe(); err != nil {
			logFile.Close()
			return nil, err
		}
	} else {
		cmd.Stdout = logFile
	}
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return nil, fmt.Errorf("k8stest: start %s: %w", name, err)
	}
	p := &proc{name: name, cmd: cmd, log: logPath, logFile: logFile, stdin: stdin, done: make(chan struct{})}
	if out != nil {
		p.out = bufio.NewReader(out)
	}
	c.procs = append(c.procs, p)
	return p, nil
}

// wait waits for the child to end, then closes done.
func (p *proc) wait() {
	_ = p.cmd.Wait()
	p.logFile.Close()
	close(p.done)
}

// waitLine waits until r gives line (the child is up) or ctx ends.
func waitLine(ctx context.Context, r *bufio.Reader, line string) error {
	got := make(chan error, 1)
	go func() {
		for {
			s, err := r.ReadString('\n')
			if strings.TrimSpace(s) == line {
				got <- nil
				_, _ = io.Copy(io.Discard, r)
				return
			}
			if err != nil {
				got <- fmt.Errorf("k8stest: the child ended before it said %q", line)
				return
			}
		}
	}()
	select {
	case err := <-got:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// waitReady polls /readyz, trusting roots, until the API server (process
// api) answers ok.
func (c *Cluster) waitReady(ctx context.Context, api *proc, roots *x509.CertPool, token string) error {
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}}
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: tr, Timeout: 5 * time.Second}
	var last string
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, c.Host+"/readyz", nil)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := hc.Do(req)
		if err == nil {
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			last = fmt.Sprintf("%s: %s", resp.Status, bytes.TrimSpace(body))
		} else {
			last = err.Error()
		}
		select {
		case <-api.done:
			return fmt.Errorf("k8stest: kube-apiserver exited: %s", tail(api.log))
		case <-ctx.Done():
			return fmt.Errorf("k8stest: kube-apiserver not ready (%s): %w; its log: %s", last, ctx.Err(), tail(api.log))
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// Stop kills KWOK, the API server and etcd, each with its process group,
// and waits for them.
func (c *Cluster) Stop() {
	c.stopOnce.Do(func() { close(c.stopping) })
	defer c.keeper.Wait()
	c.mu.Lock()
	defer c.mu.Unlock()
	for i := len(c.procs) - 1; i >= 0; i-- {
		p := c.procs[i]
		if p.stdin != nil {
			p.stdin.Close()
		}
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(10 * time.Second):
			_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
			<-p.done
		}
		// Whatever of the group outlived its leader.
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	}
	c.procs = nil
}

// Logs returns the end of a child's log ("etcd", "kube-apiserver",
// "kwok"), for failure messages.
func (c *Cluster) Logs(name string) string { return tail(filepath.Join(c.dir, name+".log")) }

func tail(path string) string {
	b, _ := os.ReadFile(path)
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}

// NodeShape is what AddNodes gives each node.
type NodeShape struct {
	CPU    string // e.g. "4"
	Memory string // e.g. "8Gi"
	Pods   int    // default 110
	GPUs   int
	Labels map[string]string
}

// AddNodes creates n fake nodes named prefix-0, prefix-1... managed by
// KWOK, and waits until each is Ready.
func (c *Cluster) AddNodes(ctx context.Context, prefix string, n int, shape NodeShape) ([]string, error) {
	if shape.Pods == 0 {
		shape.Pods = 110
	}
	res := corev1.ResourceList{
		corev1.ResourceCPU:              resource.MustParse(shape.CPU),
		corev1.ResourceMemory:           resource.MustParse(shape.Memory),
		corev1.ResourcePods:             *resource.NewQuantity(int64(shape.Pods), resource.DecimalSI),
		corev1.ResourceEphemeralStorage: resource.MustParse("100Gi"),
	}
	if shape.GPUs > 0 {
		res["nvidia.com/gpu"] = *resource.NewQuantity(int64(shape.GPUs), resource.DecimalSI)
	}
	var names []string
	for i := range n {
		name := fmt.Sprintf("%s-%d", prefix, i)
		labels := map[string]string{"type": "kwok", "kubernetes.io/hostname": name}
		for k, v := range shape.Labels {
			labels[k] = v
		}
		node := &corev1.Node{
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels, Annotations: map[string]string{
				"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"}},
			Status: corev1.NodeStatus{Allocatable: res, Capacity: res},
		}
		if _, err := c.Client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return nil, err
		}
		names = append(names, name)
	}
	for _, name := range names {
		if err := c.waitNode(ctx, name); err != nil {
			return nil, err
		}
	}
	return names, nil
}

func (c *Cluster) waitNode(ctx context.Context, name string) error {
	for {
		n, err := c.Client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err == nil {
			for _, cond := range n.Status.Conditions {
				if cond.Type == corev1.NodeReady && cond.Status == corev1.ConditionTrue {
					return nil
				}
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("k8stest: node %s never became Ready (last error %v); kwok's log: %s", name, err, c.Logs("kwok"))
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// CreateNamespace makes a namespace (the cluster has no controller that
// would delete one, so tests keep theirs).
func (c *Cluster) CreateNamespace(ctx context.Context, name string) error {
	_, err := c.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		return nil
	}
	return err
}

// writeKey writes a new ECDSA key (the service accounts' signing key).
func writeKey(path string) error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return err
	}
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}), 0o600)
}

func hexToken() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return fmt.Sprintf("%x", b)
}

func b64(b []byte) string { return base64.StdEncoding.EncodeToString(b) }
