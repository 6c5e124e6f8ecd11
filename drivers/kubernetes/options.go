package kubernetes

import (
	"os"
	"path"
	"time"

	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/berth-dev/berth/driver"
)

// Options configures the kubernetes driver. Every field is also a flag
// --kubernetes-<option>.
type Options struct {
	Kubeconfig   string            `option:"kubeconfig" help:"path of a kubeconfig file; empty: the in-cluster configuration (a pod's service account), or $KUBECONFIG when not in a cluster"`
	Context      string            `option:"context" help:"the kubeconfig context to use (default: its current context)"`
	Namespace    string            `option:"namespace" help:"the namespace Berth's pods, config maps and secrets live in"`
	QPS          float64           `option:"qps" range:"0.01,100000" help:"requests per second to the API server, sustained"`
	Burst        int               `option:"burst" range:"1,100000" help:"requests to the API server in a burst above qps"`
	NodeSelector string            `option:"node_selector" help:"a label selector (e.g. pool=berth,!gpu): only the nodes it matches are Berth's nodes"`
	Bind         bool              `option:"bind" help:"Berth binds each pod to the node it chose (the binding subresource); false leaves placement to the cluster's scheduler, the chosen node a preference, and reports where the pod went"`
	Scheduler    string            `option:"scheduler_name" help:"the pod's schedulerName when bind is true: one no scheduler of the cluster answers to, so that only Berth binds the pod"`
	Logs         bool              `option:"logs" help:"read instance output through pods/log; turn it off where nodes run no kubelet that serves logs (simulated nodes)"`
	StopGrace    time.Duration     `option:"stop_grace" range:"0s,24h" help:"the pod's termination grace period: how long a delete waits after SIGTERM before the kubelet kills it"`
	ForceAfter   time.Duration     `option:"force_after" range:"1ms,24h" help:"how long past its grace period a deleted pod may stay (its node gone, its kubelet silent) before Delete removes it by force"`
	CallTimeout  time.Duration     `option:"call_timeout" range:"1ms,1h" help:"the longest a single API request may take"`
	SyncTimeout  time.Duration     `option:"sync_timeout" range:"1ms,1h" help:"how long Open waits for the first listing of nodes and pods"`
	UserDataPath string            `option:"user_data_path" help:"file in the container that receives the spec's user data (from a secret)"`
	PodLabels    map[string]string `option:"pod_labels" help:"labels added to every pod Berth creates (k=v,k2=v2)"`
}

func defaultOptions() *Options {
	return &Options{
		Namespace:    "default",
		QPS:          50,
		Burst:        100,
		Bind:         true,
		Scheduler:    "berth",
		Logs:         true,
		StopGrace:    10 * time.Second,
		ForceAfter:   30 * time.Second,
		CallTimeout:  30 * time.Second,
		SyncTimeout:  time.Minute,
		UserDataPath: "/berth/user-data",
	}
}

// Validate checks what types cannot; every error names its key.
func (o *Options) Validate() error {
	es := driver.CheckRanges(o)
	if o.Kubeconfig != "" {
		if fi, err := os.Stat(o.Kubeconfig); err != nil {
			es.Add("kubeconfig", "%v", err)
		} else if fi.IsDir() {
			es.Add("kubeconfig", "%s is a directory", o.Kubeconfig)
		}
	}
	if errs := validation.IsDNS1123Label(o.Namespace); len(errs) > 0 {
		es.Add("namespace", "%q: %s", o.Namespace, errs[0])
	}
	if _, err := labels.Parse(o.NodeSelector); err != nil {
		es.Add("node_selector", "%v", err)
	}
	if o.Bind {
		if errs := validation.IsDNS1123Subdomain(o.Scheduler); len(errs) > 0 {
			es.Add("scheduler_name", "%q: %s", o.Scheduler, errs[0])
		}
	}
	if !path.IsAbs(o.UserDataPath) || path.Clean(o.UserDataPath) != o.UserDataPath || o.UserDataPath == "/" {
		es.Add("user_data_path", "%q: must be a clean absolute file path", o.UserDataPath)
	}
	for k, v := range o.PodLabels {
		if errs := validation.IsQualifiedName(k); len(errs) > 0 {
			es.Add("pod_labels."+k, "not a label key: %s", errs[0])
		} else if errs := validation.IsValidLabelValue(v); len(errs) > 0 {
			es.Add("pod_labels."+k, "%q: not a label value: %s", v, errs[0])
		} else if isTagKey(k) {
			es.Add("pod_labels."+k, "the prefixes berth. and berth/ are Berth's own")
		}
	}
	return es.Err()
}
