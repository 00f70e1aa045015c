package envoygateway

import (
	"bufio"
	"bytes"
	"encoding/json"
	"os"
	"strings"
	"testing"

	egv1a1 "github.com/envoyproxy/gateway/api/v1alpha1"
	"github.com/envoyproxy/gateway/api/v1alpha1/validation"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/util/strategicpatch"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

// snippetPath is the Envoy Gateway snippet docs/envoy.md shows.
const snippetPath = "../../docs/envoy/envoy-gateway.yaml"

// rateLimitContainer is the name Envoy Gateway gives the rate limit
// container of its Deployment (its ratelimit.InfraName), which the
// snippet's patch must name to replace its command.
const rateLimitContainer = "envoy-ratelimit"

// strictEnvoyGateway decodes an EnvoyGateway configuration as Envoy
// Gateway's config.DecodeBytes does (a scheme holding EnvoyGateway alone,
// its group, version and kind checked), but strict: Envoy Gateway's own
// decoder drops a field it does not know without a word, so a misspelt
// field would silently do nothing there, and here it fails.
func strictEnvoyGateway(data []byte) (*egv1a1.EnvoyGateway, error) {
	return decodeEnvoyGateway(data, serializer.EnableStrict)
}

// decodeEnvoyGateway is Envoy Gateway's config.DecodeBytes with the codec
// factory's options added.
func decodeEnvoyGateway(data []byte, opts ...serializer.CodecFactoryOptionsMutator) (*egv1a1.EnvoyGateway, error) {
	scheme := runtime.NewScheme()
	scheme.AddKnownTypes(egv1a1.GroupVersion, &egv1a1.EnvoyGateway{})
	obj, gvk, err := serializer.NewCodecFactory(scheme, opts...).UniversalDeserializer().Decode(data, nil, nil)
	if err != nil {
		return nil, err
	}
	if gvk.GroupVersion() != egv1a1.GroupVersion || gvk.Kind != egv1a1.KindEnvoyGateway {
		return nil, &unexpectedKind{gvk.String()}
	}
	return obj.(*egv1a1.EnvoyGateway), nil
}

type unexpectedKind struct{ gvk string }

func (e *unexpectedKind) Error() string { return "not an EnvoyGateway: " + e.gvk }

// snippetDocs splits the snippet into its YAML documents: Envoy Gateway's
// ConfigMap and the Caddyfile's, each decoded strictly as a ConfigMap.
func snippetDocs(t *testing.T, text []byte) []corev1.ConfigMap {
	t.Helper()
	var maps []corev1.ConfigMap
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(text)))
	for {
		doc, err := r.Read()
		if err != nil {
			break
		}
		if len(bytes.TrimSpace(doc)) == 0 {
			continue
		}
		var cm corev1.ConfigMap
		if err := yaml.UnmarshalStrict(doc, &cm); err != nil {
			t.Fatalf("a document of the snippet is not a ConfigMap: %v", err)
		}
		if cm.Kind != "ConfigMap" || cm.APIVersion != "v1" {
			t.Fatalf("document %q is %s %s, want v1 ConfigMap", cm.Name, cm.APIVersion, cm.Kind)
		}
		maps = append(maps, cm)
	}
	return maps
}

// snippetGateway is the snippet's EnvoyGateway configuration, decoded
// strictly, with Envoy Gateway's defaults set and its own validation
// passed, as its server loads a config file.
func snippetGateway(t *testing.T, text []byte) *egv1a1.EnvoyGateway {
	t.Helper()
	docs := snippetDocs(t, text)
	if len(docs) != 2 {
		t.Fatalf("%d documents, want Envoy Gateway's ConfigMap and the Caddyfile's", len(docs))
	}
	data, ok := docs[0].Data["envoy-gateway.yaml"]
	if !ok {
		t.Fatalf("ConfigMap %q has no envoy-gateway.yaml", docs[0].Name)
	}
	eg, err := strictEnvoyGateway([]byte(data))
	if err != nil {
		t.Fatalf("Envoy Gateway's types refuse the snippet: %v", err)
	}
	eg.SetEnvoyGatewayDefaults()
	if err := validation.ValidateEnvoyGateway(eg); err != nil {
		t.Fatalf("Envoy Gateway's validation refuses the snippet: %v", err)
	}
	return eg
}

// TestEnvoyGatewayTypesTakeSnippet: the EnvoyGateway configuration in the
// snippet decodes strictly into Envoy Gateway's own API types, passes its
// validation, and its rateLimitDeployment, applied as Envoy Gateway
// applies it to the rate limit Deployment it renders, runs Caddy on the
// mounted Caddyfile with Envoy Gateway's certificates kept.
func TestEnvoyGatewayTypesTakeSnippet(t *testing.T) {
	text, err := os.ReadFile(snippetPath)
	if err != nil {
		t.Fatal(err)
	}
	eg := snippetGateway(t, text)
	if eg.Provider.Type != egv1a1.ProviderTypeKubernetes || eg.Provider.Kubernetes == nil {
		t.Fatalf("provider %q, want Kubernetes", eg.Provider.Type)
	}
	if eg.RateLimit == nil || eg.RateLimit.Backend.Type != egv1a1.RedisBackendType {
		t.Fatal("no Redis rate limit backend: Envoy Gateway would deploy no rate limit service")
	}
	spec := eg.Provider.Kubernetes.RateLimitDeployment
	if spec == nil || spec.Container == nil || spec.Container.Image == nil || *spec.Container.Image != "registry.example.com/caddy-fleetlimit:latest" {
		t.Fatalf("rateLimitDeployment %+v, want the Caddy image", spec)
	}

	got := renderRateLimitDeployment(t, spec)
	c := got.Spec.Template.Spec.Containers[0]
	if c.Name != rateLimitContainer || c.Image != *spec.Container.Image {
		t.Fatalf("container %q image %q", c.Name, c.Image)
	}
	if cmd := strings.Join(c.Command, " "); cmd != "caddy run --config /etc/caddy/Caddyfile --adapter caddyfile" {
		t.Fatalf("command %q, want Caddy on the mounted Caddyfile", cmd)
	}
	mounts := map[string]string{}
	for _, m := range c.VolumeMounts {
		mounts[m.Name] = m.MountPath
	}
	if mounts["certs"] != "/certs" || mounts["caddyfile"] != "/etc/caddy" || mounts["data"] != "/data" {
		t.Fatalf("mounts %v, want Envoy Gateway's certificates at /certs, the Caddyfile at /etc/caddy, data at /data", mounts)
	}
	var caddyfileMap string
	for _, v := range got.Spec.Template.Spec.Volumes {
		if v.Name == "caddyfile" && v.ConfigMap != nil {
			caddyfileMap = v.ConfigMap.Name
		}
	}
	if docs := snippetDocs(t, text); caddyfileMap != docs[1].Name || docs[1].Data["Caddyfile"] == "" {
		t.Fatalf("the caddyfile volume is ConfigMap %q, want %q holding a Caddyfile", caddyfileMap, docs[1].Name)
	}
	env := map[string]bool{}
	for _, e := range c.Env {
		env[e.Name] = true
	}
	for _, name := range []string{"XDG_CONFIG_HOME", "XDG_DATA_HOME", "CONFIG_GRPC_XDS_SERVER_URL", "GRPC_SERVER_TLS_CERT", "REDIS_URL"} {
		if !env[name] {
			t.Errorf("the container has no %s", name)
		}
	}
}

// TestEnvoyGatewaySnippetMisspeltFieldFails: a misspelt field anywhere in
// the override fails the strict decoding, in Envoy Gateway's own config
// as in the Deployment patch it carries, where Envoy Gateway's loader and
// its patch would let it pass and do nothing.
func TestEnvoyGatewaySnippetMisspeltFieldFails(t *testing.T) {
	text, err := os.ReadFile(snippetPath)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ field, typo string }{
		{"rateLimitDeployment:", "rateLimitDeploy:"},
		{"volumeMounts:", "volumeMount:"},
		{"mountPath: /etc/caddy", "mountpath: /etc/caddy"},
		{"command: [", "commands: ["},
	} {
		if !bytes.Contains(text, []byte(c.field)) {
			t.Fatalf("the snippet has no %q", c.field)
		}
		bad := bytes.Replace(text, []byte(c.field), []byte(c.typo), 1)
		docs := snippetDocs(t, bad)
		data := []byte(docs[0].Data["envoy-gateway.yaml"])
		if _, err := decodeEnvoyGateway(data); err != nil {
			t.Fatalf("%s: Envoy Gateway's own decoder refuses it: %v", c.typo, err)
		}
		eg, err := strictEnvoyGateway(data)
		if err == nil {
			_, err = patchRateLimitDeployment(eg.Provider.Kubernetes.RateLimitDeployment)
		}
		if err == nil || !strings.Contains(err.Error(), strings.TrimSuffix(strings.Fields(c.typo)[0], ":")) {
			t.Errorf("%s: got %v, want an error naming the unknown field", c.typo, err)
		}
		t.Logf("%s refused: %v", c.typo, err)
	}
}

// renderRateLimitDeployment is the rate limit Deployment as Envoy Gateway
// renders it (its ratelimit.ResourceRender: the container named
// envoy-ratelimit running /bin/ratelimit, the certificates from Secret
// envoy-rate-limit at /certs, the environment the reference reads, the
// override's image, mounts, volumes and variables added), with the
// override's patch applied as Envoy Gateway's utils.MergeWithPatch applies
// it, then decoded strictly.
func renderRateLimitDeployment(t *testing.T, spec *egv1a1.KubernetesDeploymentSpec) *appsv1.Deployment {
	t.Helper()
	d, err := patchRateLimitDeployment(spec)
	if err != nil {
		t.Fatal(err)
	}
	if n := len(d.Spec.Template.Spec.Containers); n != 1 {
		t.Fatalf("%d containers after the patch, want Envoy Gateway's one", n)
	}
	return d
}

// patchRateLimitDeployment renders the Deployment and applies the patch;
// an unknown field in the patch is an error.
func patchRateLimitDeployment(spec *egv1a1.KubernetesDeploymentSpec) (*appsv1.Deployment, error) {
	env := []corev1.EnvVar{
		{Name: "CONFIG_TYPE", Value: "GRPC_XDS_SOTW"},
		{Name: "CONFIG_GRPC_XDS_SERVER_URL", Value: "envoy-gateway:18001"},
		{Name: "CONFIG_GRPC_XDS_NODE_ID", Value: rateLimitContainer},
		{Name: "GRPC_SERVER_USE_TLS", Value: "true"},
		{Name: "GRPC_SERVER_TLS_CERT", Value: "/certs/tls.crt"},
		{Name: "GRPC_SERVER_TLS_KEY", Value: "/certs/tls.key"},
		{Name: "GRPC_SERVER_TLS_CA_CERT", Value: "/certs/ca.crt"},
		{Name: "CONFIG_GRPC_XDS_SERVER_USE_TLS", Value: "true"},
		{Name: "CONFIG_GRPC_XDS_CLIENT_TLS_CERT", Value: "/certs/tls.crt"},
		{Name: "CONFIG_GRPC_XDS_CLIENT_TLS_KEY", Value: "/certs/tls.key"},
		{Name: "CONFIG_GRPC_XDS_SERVER_TLS_CACERT", Value: "/certs/ca.crt"},
		{Name: "FORCE_START_WITHOUT_INITIAL_CONFIG", Value: "true"},
		{Name: "REDIS_URL", Value: "redis:6379"},
	}
	mounts := []corev1.VolumeMount{{Name: "certs", MountPath: "/certs", ReadOnly: true}}
	volumes := []corev1.Volume{{Name: "certs", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "envoy-rate-limit"}}}}
	image := "docker.io/envoyproxy/ratelimit"
	if c := spec.Container; c != nil {
		if c.Image != nil {
			image = *c.Image
		}
		env = append(env, c.Env...)
		mounts = append(mounts, c.VolumeMounts...)
	}
	if spec.Pod != nil {
		volumes = append(volumes, spec.Pod.Volumes...)
	}
	d := appsv1.Deployment{
		TypeMeta: metav1.TypeMeta{APIVersion: "apps/v1", Kind: "Deployment"},
		Spec: appsv1.DeploymentSpec{Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
			Containers: []corev1.Container{{
				Name: rateLimitContainer, Image: image, Command: []string{"/bin/ratelimit"},
				Env: env, VolumeMounts: mounts,
			}},
			Volumes: volumes,
		}}},
	}
	if spec.Patch == nil {
		return &d, nil
	}
	if spec.Patch.Type != nil && *spec.Patch.Type != egv1a1.StrategicMerge {
		return nil, &unexpectedKind{"patch type " + string(*spec.Patch.Type)}
	}
	original, err := json.Marshal(d)
	if err != nil {
		return nil, err
	}
	patched, err := strategicpatch.StrategicMergePatch(original, spec.Patch.Value.Raw, appsv1.Deployment{})
	if err != nil {
		return nil, err
	}
	var out appsv1.Deployment
	if err := yaml.UnmarshalStrict(patched, &out); err != nil {
		return nil, err
	}
	return &out, nil
}
