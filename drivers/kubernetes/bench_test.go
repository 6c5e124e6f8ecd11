package kubernetes_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clientset "k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/drivers/kubernetes/k8stest"
)

// Benchmark figures: benchPods pods on benchNodes KWOK nodes, from
// benchWorkers goroutines, at benchQPS requests per second (burst the
// same) for both ways.
const (
	benchPods    = 1000
	benchNodes   = 100
	benchWorkers = 32
	benchQPS     = 200
)

// BenchmarkCreate1000 creates 1,000 pods on 100 KWOK nodes through the
// driver (Create, then Advance until the pod runs), and the same 1,000
// straight with client-go at the same QPS (create, bind, then wait until
// an informer-free poll sees every pod running), and reports both times
// and their ratio. Each pod costs two requests either way (create and
// bind), so the QPS sets the floor: 2,000 requests at 200/s, 10 s.
//
//	go test -run '^$' -bench Create1000 -benchtime 1x ./drivers/kubernetes/
func BenchmarkCreate1000(b *testing.B) {
	needCluster(b)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	names, err := cluster.AddNodes(ctx, "bench", benchNodes, k8stest.NodeShape{CPU: "64", Memory: "256Gi", Labels: map[string]string{"pool": "bench"}})
	if err != nil {
		b.Fatal(err)
	}
	for _, ns := range []string{"bench-driver", "bench-direct"} {
		if err := cluster.CreateNamespace(ctx, ns); err != nil {
			b.Fatal(err)
		}
	}
	for range b.N {
		viaDriver := benchDriver(ctx, b, names)
		direct := benchDirect(ctx, b, names)
		b.ReportMetric(viaDriver.Seconds(), "driver-s")
		b.ReportMetric(direct.Seconds(), "client-go-s")
		b.ReportMetric(viaDriver.Seconds()/direct.Seconds(), "ratio")
	}
}

func benchDriver(ctx context.Context, b *testing.B, names []string) time.Duration {
	def, _ := driver.Lookup("kubernetes")
	d, err := def.Open(ctx, map[string]any{"kubeconfig": cluster.Kubeconfig, "namespace": "bench-driver", "logs": false,
		"qps": benchQPS, "burst": benchQPS, "node_selector": "pool=bench", "stop_grace": "0s"}, driver.Env{})
	if err != nil {
		b.Fatal(err)
	}
	defer d.Close(context.Background())
	defer clearNamespace(b, "bench-driver")
	start := time.Now()
	run(b, func(i int) error {
		op, err := d.Create(ctx, names[i%len(names)], &driver.Spec{Name: fmt.Sprintf("p%d", i), Image: "registry.example/app:1",
			Resources: driver.Resources{CPU: 100, Memory: 64 * driver.MiB}, Tags: map[string]string{driver.TagManaged: "true", driver.TagCluster: "bench"}})
		if err == nil {
			_, err = driver.Drive(ctx, op)
		}
		return err
	})
	return time.Since(start)
}

// benchResources are the requests and limits of the pods the driver makes
// in the benchmark, given to the direct ones too: the test's KWOK reports
// the container resources of pods that have them (one more status write
// each), so both sides carry the same pods.
var benchResources = corev1.ResourceRequirements{
	Limits:   corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m"), corev1.ResourceMemory: resource.MustParse("64Mi")},
	Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m"), corev1.ResourceMemory: resource.MustParse("64Mi")},
}

func benchDirect(ctx context.Context, b *testing.B, names []string) time.Duration {
	cfg, err := clientcmd.BuildConfigFromFlags("", cluster.Kubeconfig)
	if err != nil {
		b.Fatal(err)
	}
	cfg.QPS, cfg.Burst = benchQPS, benchQPS
	cs, err := clientset.NewForConfig(cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer clearNamespace(b, "bench-direct")
	pods := cs.CoreV1().Pods("bench-direct")
	start := time.Now()
	run(b, func(i int) error {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("p%d", i)}, Spec: corev1.PodSpec{SchedulerName: "berth",
			Containers: []corev1.Container{{Name: "main", Image: "registry.example/app:1", Resources: benchResources}}}}
		made, err := pods.Create(ctx, p, metav1.CreateOptions{})
		if err != nil {
			return err
		}
		return pods.Bind(ctx, &corev1.Binding{ObjectMeta: metav1.ObjectMeta{Name: made.Name, UID: made.UID},
			Target: corev1.ObjectReference{Kind: "Node", Name: names[i%len(names)]}}, metav1.CreateOptions{})
	})
	for {
		list, err := pods.List(ctx, metav1.ListOptions{FieldSelector: "status.phase=Running"})
		if err != nil {
			b.Fatal(err)
		}
		if len(list.Items) == benchPods {
			return time.Since(start)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// run calls fn for 0..benchPods-1 from benchWorkers goroutines.
func run(b *testing.B, fn func(i int) error) {
	next := make(chan int)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var first error
	for range benchWorkers {
		wg.Go(func() {
			for i := range next {
				if err := fn(i); err != nil {
					mu.Lock()
					if first == nil {
						first = err
					}
					mu.Unlock()
				}
			}
		})
	}
	for i := range benchPods {
		next <- i
	}
	close(next)
	wg.Wait()
	if first != nil {
		b.Fatal(first)
	}
}

// clearNamespace deletes every pod of ns and waits until they are gone.
func clearNamespace(b *testing.B, ns string) {
	ctx := context.Background()
	zero := int64(0)
	if err := cluster.Client.CoreV1().Pods(ns).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: &zero}, metav1.ListOptions{}); err != nil {
		b.Fatal(err)
	}
	for {
		list, err := cluster.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err == nil && len(list.Items) == 0 {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}
