package kubernetes

import (
	"context"
	"encoding/json"
	"io"
	"net/http"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
)

// core is the driver's client of the core/v1 API: a REST client whose
// scheme knows the core group alone. client-go's clientset would do the
// same through a scheme of every API group, and compiling those groups
// would make the first build of the berth binary several times longer.
type core struct {
	rc     rest.Interface
	params runtime.ParameterCodec
}

// coreScheme knows core/v1 (and the meta/v1 types it uses).
var coreScheme = func() *runtime.Scheme {
	s := runtime.NewScheme()
	if err := corev1.AddToScheme(s); err != nil {
		panic(err)
	}
	metav1.AddToGroupVersion(s, metav1.SchemeGroupVersion)
	return s
}()

func newCore(cfg *rest.Config, hc *http.Client) (*core, error) {
	c := *cfg
	c.GroupVersion = &corev1.SchemeGroupVersion
	c.APIPath = "/api"
	c.NegotiatedSerializer = serializer.NewCodecFactory(coreScheme).WithoutConversion()
	if c.UserAgent == "" {
		c.UserAgent = rest.DefaultKubernetesUserAgent()
	}
	rc, err := rest.RESTClientForConfigAndClient(&c, hc)
	if err != nil {
		return nil, err
	}
	return &core{rc: rc, params: runtime.NewParameterCodec(coreScheme)}, nil
}

func (c *core) createPod(ctx context.Context, ns string, p *corev1.Pod) (*corev1.Pod, error) {
	out := &corev1.Pod{}
	return out, c.rc.Post().Namespace(ns).Resource("pods").VersionedParams(&metav1.CreateOptions{}, c.params).Body(p).Do(ctx).Into(out)
}

func (c *core) getPod(ctx context.Context, ns, name string) (*corev1.Pod, error) {
	out := &corev1.Pod{}
	return out, c.rc.Get().Namespace(ns).Resource("pods").Name(name).Do(ctx).Into(out)
}

func (c *core) deletePod(ctx context.Context, ns, name string, opts metav1.DeleteOptions) error {
	return c.rc.Delete().Namespace(ns).Resource("pods").Name(name).Body(&opts).Do(ctx).Error()
}

func (c *core) bindPod(ctx context.Context, ns string, b *corev1.Binding) error {
	return c.rc.Post().Namespace(ns).Resource("pods").Name(b.Name).SubResource("binding").
		VersionedParams(&metav1.CreateOptions{}, c.params).Body(b).Do(ctx).Error()
}

func (c *core) podLogs(ctx context.Context, ns, name string, opts *corev1.PodLogOptions) (io.ReadCloser, error) {
	return c.rc.Get().Namespace(ns).Resource("pods").Name(name).SubResource("log").VersionedParams(opts, c.params).Stream(ctx)
}

func (c *core) resizePod(ctx context.Context, ns, name string, patch []byte) error {
	return c.rc.Patch(types.StrategicMergePatchType).Namespace(ns).Resource("pods").Name(name).SubResource("resize").
		VersionedParams(&metav1.PatchOptions{}, c.params).Body(patch).Do(ctx).Error()
}

func (c *core) createConfigMap(ctx context.Context, ns string, m *corev1.ConfigMap) error {
	return c.rc.Post().Namespace(ns).Resource("configmaps").VersionedParams(&metav1.CreateOptions{}, c.params).Body(m).Do(ctx).Error()
}

func (c *core) deleteConfigMap(ctx context.Context, ns, name string) error {
	return c.rc.Delete().Namespace(ns).Resource("configmaps").Name(name).Body(&metav1.DeleteOptions{}).Do(ctx).Error()
}

// createMarker creates the config map that marks a stopped instance and
// returns it as made.
func (c *core) createMarker(ctx context.Context, ns string, m *corev1.ConfigMap) (*corev1.ConfigMap, error) {
	out := &corev1.ConfigMap{}
	return out, c.rc.Post().Namespace(ns).Resource("configmaps").VersionedParams(&metav1.CreateOptions{}, c.params).Body(m).Do(ctx).Into(out)
}

func (c *core) getConfigMap(ctx context.Context, ns, name string) (*corev1.ConfigMap, error) {
	out := &corev1.ConfigMap{}
	return out, c.rc.Get().Namespace(ns).Resource("configmaps").Name(name).Do(ctx).Into(out)
}

// deleteMarker deletes a marker if it is still the one of that uid.
func (c *core) deleteMarker(ctx context.Context, ns, name string, uid types.UID) error {
	return c.rc.Delete().Namespace(ns).Resource("configmaps").Name(name).
		Body(&metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}}).Do(ctx).Error()
}

// setOwner makes owner the only owner of the config map or secret
// (resource) name, so that the cluster's garbage collector keeps it as
// long as owner lives.
func (c *core) setOwner(ctx context.Context, ns, resource, name string, owner metav1.OwnerReference) error {
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"ownerReferences": []metav1.OwnerReference{owner}}})
	if err != nil {
		return err
	}
	return c.rc.Patch(types.MergePatchType).Namespace(ns).Resource(resource).Name(name).
		VersionedParams(&metav1.PatchOptions{}, c.params).Body(patch).Do(ctx).Error()
}

func (c *core) createSecret(ctx context.Context, ns string, s *corev1.Secret) error {
	return c.rc.Post().Namespace(ns).Resource("secrets").VersionedParams(&metav1.CreateOptions{}, c.params).Body(s).Do(ctx).Error()
}

func (c *core) deleteSecret(ctx context.Context, ns, name string) error {
	return c.rc.Delete().Namespace(ns).Resource("secrets").Name(name).Body(&metav1.DeleteOptions{}).Do(ctx).Error()
}

// resources lists the core/v1 resources the server offers (discovery of
// the one group the driver uses).
func (c *core) resources(ctx context.Context) (*metav1.APIResourceList, error) {
	out := &metav1.APIResourceList{}
	return out, c.rc.Get().AbsPath("/api/v1").Do(ctx).Into(out)
}
