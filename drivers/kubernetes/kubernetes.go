package kubernetes

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"slices"
	"sync"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/berth-dev/berth/driver"
)

func init() {
	driver.Register(driver.Define("kubernetes", "pods on the nodes of a Kubernetes cluster", defaultOptions, open))
}

// Driver runs pods on the nodes of one Kubernetes cluster. It is safe for
// concurrent use. Open returns it wrapped with the capabilities the server
// and the options allow (logs, resize); Unwrap gets it back.
type Driver struct {
	opts    Options
	log     *slog.Logger
	core    *core
	http    *http.Client
	nodeSel labels.Selector

	nodes   cache.SharedIndexInformer // the nodes node_selector matches
	pods    cache.SharedIndexInformer // Berth's pods in the namespace, every phase
	allPods cache.SharedIndexInformer // every pod of the cluster not yet ended, stripped, for what nodes have reserved
	stopped cache.SharedIndexInformer // the markers of Berth's stopped instances (config maps) in the namespace

	stopInformers context.CancelFunc
	informers     sync.WaitGroup

	// mu guards closed and preloaded; it is never held across a request.
	mu        sync.Mutex
	closed    bool
	calls     driver.Calls               // background requests of operations in flight
	preloaded map[string]map[string]bool // node -> images Preload pulled there
}

// Index names of the pod informers.
const (
	byID   = "id"
	byNode = "node"
)

// Open connects to the cluster, starts the informers and waits until they
// have listed nodes and pods once (sync_timeout). It returns the driver
// with the logs capability when the logs option is set and the resize
// capability when the server has the pods/resize subresource.
func Open(ctx context.Context, opts *Options, env driver.Env) (driver.Driver, error) {
	d, err := New(ctx, opts, env)
	if err != nil {
		return nil, err
	}
	return d.wrap(ctx), nil
}

func open(ctx context.Context, opts *Options, env driver.Env) (driver.Driver, error) {
	return Open(ctx, opts, env)
}

// New opens the driver as Open does and returns it without the optional
// capabilities that depend on the server and the options.
func New(ctx context.Context, opts *Options, env driver.Env) (*Driver, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	if env.Logger == nil {
		env.Logger = slog.Default()
	}
	cfg, err := restConfig(opts)
	if err != nil {
		return nil, err
	}
	httpClient, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return nil, &driver.FieldError{Path: "kubeconfig", Reason: err.Error()}
	}
	cc, err := newCore(cfg, httpClient)
	if err != nil {
		httpClient.CloseIdleConnections()
		return nil, &driver.FieldError{Path: "kubeconfig", Reason: err.Error()}
	}
	sel, _ := labels.Parse(opts.NodeSelector)
	d := &Driver{opts: *opts, log: env.Logger, core: cc, http: httpClient, nodeSel: sel}

	rc := cc.rc
	d.nodes = cache.NewSharedIndexInformer(cache.NewFilteredListWatchFromClient(rc, "nodes", "", func(o *metav1.ListOptions) {
		o.LabelSelector = opts.NodeSelector
	}), &corev1.Node{}, 0, cache.Indexers{})
	podIndexers := cache.Indexers{byID: indexID, byNode: indexInstanceNode}
	d.pods = cache.NewSharedIndexInformer(cache.NewFilteredListWatchFromClient(rc, "pods", opts.Namespace, func(o *metav1.ListOptions) {
		o.LabelSelector = labelManaged + "=true"
	}), &corev1.Pod{}, 0, podIndexers)
	d.allPods = cache.NewSharedIndexInformer(cache.NewFilteredListWatchFromClient(rc, "pods", "", func(o *metav1.ListOptions) {
		o.FieldSelector = fields.AndSelectors(
			fields.OneTermNotEqualSelector("status.phase", string(corev1.PodSucceeded)),
			fields.OneTermNotEqualSelector("status.phase", string(corev1.PodFailed)),
		).String()
	}), &corev1.Pod{}, 0, cache.Indexers{byNode: indexNode})
	d.stopped = cache.NewSharedIndexInformer(cache.NewFilteredListWatchFromClient(rc, "configmaps", opts.Namespace, func(o *metav1.ListOptions) {
		o.LabelSelector = labelStopped + "=true"
	}), &corev1.ConfigMap{}, 0, cache.Indexers{byID: indexMarkerID})
	if err := d.allPods.SetTransform(stripPod); err != nil {
		httpClient.CloseIdleConnections()
		return nil, err
	}

	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	d.stopInformers = cancel
	for _, inf := range []cache.SharedIndexInformer{d.nodes, d.pods, d.allPods, d.stopped} {
		d.informers.Go(func() { inf.RunWithContext(runCtx) })
	}
	syncCtx, stop := context.WithTimeout(ctx, opts.SyncTimeout)
	defer stop()
	if !cache.WaitForCacheSync(syncCtx.Done(), d.nodes.HasSynced, d.pods.HasSynced, d.allPods.HasSynced, d.stopped.HasSynced) {
		cerr := d.Close(context.Background())
		err := fmt.Errorf("%w: kubernetes: the first listing of nodes and pods did not finish within %s (is the API server at %s reachable, and may Berth list nodes, pods and config maps?)",
			driver.ErrRetryable, opts.SyncTimeout, cfg.Host)
		return nil, errors.Join(err, cerr)
	}
	return d, nil
}

// restConfig builds the client configuration from the options.
func restConfig(opts *Options) (*rest.Config, error) {
	var cfg *rest.Config
	var err error
	switch {
	case opts.Kubeconfig != "" || opts.Context != "" || os.Getenv("KUBERNETES_SERVICE_HOST") == "":
		rules := clientcmd.NewDefaultClientConfigLoadingRules()
		if opts.Kubeconfig != "" {
			rules.ExplicitPath = opts.Kubeconfig
		}
		cfg, err = clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{CurrentContext: opts.Context}).ClientConfig()
		if err != nil {
			return nil, &driver.FieldError{Path: "kubeconfig", Reason: err.Error()}
		}
	default:
		cfg, err = rest.InClusterConfig()
		if err != nil {
			return nil, &driver.FieldError{Path: "kubeconfig", Reason: "in-cluster configuration: " + err.Error()}
		}
	}
	cfg = rest.CopyConfig(cfg)
	cfg.QPS = float32(opts.QPS)
	cfg.Burst = opts.Burst
	cfg.UserAgent = "berth"
	return cfg, nil
}

// wrap returns d with the optional capabilities the options and the server
// allow.
func (d *Driver) wrap(ctx context.Context) driver.Driver {
	logs := d.opts.Logs
	resize := d.serverResizes(ctx)
	switch {
	case logs && resize:
		return logsResizer{d}
	case logs:
		return logsOnly{d}
	case resize:
		return resizeOnly{d}
	}
	return d
}

// Unwrap returns the *Driver behind a driver Open returned, or nil.
func Unwrap(dd driver.Driver) *Driver {
	switch v := dd.(type) {
	case *Driver:
		return v
	case logsOnly:
		return v.Driver
	case resizeOnly:
		return v.Driver
	case logsResizer:
		return v.Driver
	}
	return nil
}

// serverResizes reports whether the server offers pods/resize (in-place
// resize of a pod's resources).
func (d *Driver) serverResizes(ctx context.Context) bool {
	list, err := d.core.resources(ctx)
	if err != nil {
		d.log.Warn("kubernetes: the server's resources could not be listed; no resize", "error", err)
		return false
	}
	return slices.ContainsFunc(list.APIResources, func(r metav1.APIResource) bool { return r.Name == "pods/resize" })
}

// Close stops the informers, abandons the requests of operations still in
// flight and closes the connections. Pods keep running.
func (d *Driver) Close(ctx context.Context) error {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return nil
	}
	d.closed = true
	d.calls.Cancel()
	d.mu.Unlock()
	d.stopInformers()
	done := make(chan struct{})
	go func() {
		d.informers.Wait()
		d.calls.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-ctx.Done():
		return fmt.Errorf("%w: kubernetes: close: %w", driver.ErrTimeout, ctx.Err())
	}
	d.http.CloseIdleConnections()
	return nil
}

// callCtx bounds one request made for a capability call by call_timeout.
func (d *Driver) callCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, d.opts.CallTimeout)
}

func indexID(obj any) ([]string, error) {
	p, ok := obj.(*corev1.Pod)
	if !ok || isPreload(p) {
		return nil, nil
	}
	return []string{idOf(p)}, nil
}

func indexNode(obj any) ([]string, error) {
	p, ok := obj.(*corev1.Pod)
	if !ok || p.Spec.NodeName == "" {
		return nil, nil
	}
	return []string{p.Spec.NodeName}, nil
}

// indexInstanceNode indexes Berth's instance pods (not preload pods) by
// node.
func indexInstanceNode(obj any) ([]string, error) {
	if p, ok := obj.(*corev1.Pod); ok && isPreload(p) {
		return nil, nil
	}
	return indexNode(obj)
}

func indexMarkerID(obj any) ([]string, error) {
	m, ok := obj.(*corev1.ConfigMap)
	if !ok || m.Labels[labelID] == "" {
		return nil, nil
	}
	return []string{m.Labels[labelID]}, nil
}

// stripPod keeps of a pod only what counts towards its node's reservation,
// so that the cluster-wide pod cache stays small.
func stripPod(obj any) (any, error) {
	p, ok := obj.(*corev1.Pod)
	if !ok {
		return obj, nil
	}
	s := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: p.Namespace, UID: p.UID, ResourceVersion: p.ResourceVersion},
		Spec:       corev1.PodSpec{NodeName: p.Spec.NodeName, Overhead: p.Spec.Overhead},
		Status:     corev1.PodStatus{Phase: p.Status.Phase},
	}
	strip := func(cs []corev1.Container) []corev1.Container {
		out := make([]corev1.Container, len(cs))
		for i, c := range cs {
			out[i] = corev1.Container{Resources: corev1.ResourceRequirements{Requests: c.Resources.Requests, Limits: c.Resources.Limits}, RestartPolicy: c.RestartPolicy}
			for _, port := range c.Ports {
				if port.HostPort > 0 {
					out[i].Ports = append(out[i].Ports, corev1.ContainerPort{HostPort: port.HostPort, Protocol: port.Protocol})
				}
			}
		}
		return out
	}
	s.Spec.Containers = strip(p.Spec.Containers)
	s.Spec.InitContainers = strip(p.Spec.InitContainers)
	return s, nil
}

// SharedBackend: the cluster is named by its API server, and every server
// with the same options reaches the same pods.
func (d *Driver) SharedBackend() bool { return true }

// Interface guards: a missing method is a compile error.
var (
	_ driver.Driver          = (*Driver)(nil)
	_ driver.SharedBackend   = (*Driver)(nil)
	_ driver.SharedBackend   = logsResizer{}
	_ driver.ImageLister     = (*Driver)(nil)
	_ driver.EventWatcher    = (*Driver)(nil)
	_ driver.FeatureReporter = (*Driver)(nil)
	_ driver.SpecChecker     = (*Driver)(nil)
	_ driver.Stopper         = (*Driver)(nil)
	_ driver.Starter         = (*Driver)(nil)
	_ driver.Preloader       = (*Driver)(nil)
	_ driver.LogReader       = logsOnly{}
	_ driver.Resizer         = resizeOnly{}
	_ driver.LogReader       = logsResizer{}
	_ driver.Resizer         = logsResizer{}
)

// The driver with the capabilities that depend on the options and the
// server: each type adds exactly the methods it names, so that
// driver.Capabilities tells the truth.
type (
	logsOnly    struct{ *Driver }
	resizeOnly  struct{ *Driver }
	logsResizer struct{ *Driver }
)

// Logs copies the pod's output; see Driver.logs.
func (w logsOnly) Logs(ctx context.Context, id string, opts driver.LogOptions, stdout, stderr io.Writer) error {
	return w.logs(ctx, id, opts, stdout, stderr)
}

// Logs copies the pod's output; see Driver.logs.
func (w logsResizer) Logs(ctx context.Context, id string, opts driver.LogOptions, stdout, stderr io.Writer) error {
	return w.logs(ctx, id, opts, stdout, stderr)
}

// Resize resizes the pod in place; see Driver.resize.
func (w resizeOnly) Resize(ctx context.Context, id string, r driver.Resources) error {
	return w.resize(ctx, id, r)
}

// Resize resizes the pod in place; see Driver.resize.
func (w logsResizer) Resize(ctx context.Context, id string, r driver.Resources) error {
	return w.resize(ctx, id, r)
}
