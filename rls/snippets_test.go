package rls

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddyconfig"
	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	ratelimitfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3" // the router filter's typed_config
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	upstreamhttpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"gopkg.in/yaml.v3"
)

// The documentation's snippets (docs/envoy/*.yaml, shown verbatim in
// docs/envoy.md) are tested here: each is valid YAML, its Envoy parts are
// Envoy's v3 messages (protojson rejects any field Envoy would not know),
// and the descriptors its rate limit actions send for a sample request
// are limited by the sample rules (docs/envoy/config).

// snippetDir is where the snippets live.
const snippetDir = "../docs/envoy"

// readSnippet returns a snippet file's content.
func readSnippet(t *testing.T, name string) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(snippetDir, name))
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

// yamlDocs decodes every document of a YAML stream.
func yamlDocs(t *testing.T, text string) []map[string]any {
	t.Helper()
	dec := yaml.NewDecoder(strings.NewReader(text))
	var docs []map[string]any
	for {
		var doc map[string]any
		err := dec.Decode(&doc)
		if errors.Is(err, io.EOF) {
			return docs
		}
		if err != nil {
			t.Fatalf("invalid YAML: %v", err)
		}
		docs = append(docs, doc)
	}
}

// asProto reads a decoded YAML value into an Envoy message, as Envoy reads
// its YAML: through JSON, unknown fields refused.
func asProto(t *testing.T, v any, m proto.Message) {
	t.Helper()
	raw, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	if err := protojson.Unmarshal(raw, m); err != nil {
		t.Fatalf("not a %T: %v", m, err)
	}
}

// dig follows keys (and list indexes, as ints) into a decoded YAML value.
func dig(t *testing.T, v any, path ...any) any {
	t.Helper()
	for _, p := range path {
		switch k := p.(type) {
		case string:
			m, ok := v.(map[string]any)
			if !ok || m[k] == nil {
				t.Fatalf("no %q in %v", k, v)
			}
			v = m[k]
		case int:
			l, ok := v.([]any)
			if !ok || len(l) <= k {
				t.Fatalf("no item %d in %v", k, v)
			}
			v = l[k]
		}
	}
	return v
}

// sampleRequest is the request whose descriptors the tests follow.
type sampleRequest struct {
	remoteAddress string
	headers       map[string]string
}

// descriptorsOf returns the descriptors Envoy's rate limit filter sends
// for req under a route's rate limits: one for each rate limit whose
// actions all produce an entry, in order (the actions the snippets use).
func descriptorsOf(t *testing.T, limits []*routev3.RateLimit, req sampleRequest) []*ratelimitv3.RateLimitDescriptor {
	t.Helper()
	var out []*ratelimitv3.RateLimitDescriptor
	for _, rl := range limits {
		d := &ratelimitv3.RateLimitDescriptor{}
		for _, a := range rl.GetActions() {
			var key, value string
			switch {
			case a.GetRemoteAddress() != nil:
				key, value = "remote_address", req.remoteAddress
			case a.GetGenericKey() != nil:
				key, value = a.GetGenericKey().GetDescriptorKey(), a.GetGenericKey().GetDescriptorValue()
				if key == "" {
					key = "generic_key"
				}
			case a.GetRequestHeaders() != nil:
				h, ok := req.headers[a.GetRequestHeaders().GetHeaderName()]
				if !ok {
					d = nil // Envoy sends no descriptor without the header
				}
				key, value = a.GetRequestHeaders().GetDescriptorKey(), h
			default:
				t.Fatalf("an action this test does not follow: %v", a)
			}
			if d == nil {
				break
			}
			d.Entries = append(d.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: key, Value: value})
		}
		if d != nil {
			out = append(out, d)
		}
	}
	return out
}

// checkFilterAndActions checks a ratelimit HTTP filter and a virtual
// host's rate limits against the sample rules: the filter asks domain edge
// within Envoy's 20ms; a request with an API key sends a descriptor for
// its address and one for its key; the key's 5 a minute run out, all or
// nothing, and the address's bucket is not charged for the denied calls.
func checkFilterAndActions(t *testing.T, filter *hcmv3.HttpFilter, vhost *routev3.VirtualHost) *ratelimitfilterv3.RateLimit {
	t.Helper()
	if filter.GetName() != "envoy.filters.http.ratelimit" {
		t.Fatalf("filter %q", filter.GetName())
	}
	rl := new(ratelimitfilterv3.RateLimit)
	if err := filter.GetTypedConfig().UnmarshalTo(rl); err != nil {
		t.Fatal(err)
	}
	if rl.GetDomain() != "edge" || rl.GetTimeout().AsDuration() != envoyTimeout {
		t.Fatalf("filter asks domain %q within %v, want edge within 20ms", rl.GetDomain(), rl.GetTimeout().AsDuration())
	}

	a := startApp(t, map[string]string{"edge.yaml": readSnippet(t, "config/edge.yaml")}, nil)
	e := patientEnvoy(t, a.addr(0))
	keyed := descriptorsOf(t, vhost.GetRateLimits(), sampleRequest{"192.0.2.7", map[string]string{"x-api-key": "k1"}})
	if len(keyed) != 2 {
		t.Fatalf("%d descriptors for a request with an API key, want 2", len(keyed))
	}
	freshWindow(time.Minute)
	resp := e.must(rl.GetDomain(), keyed...)
	for i, want := range []uint32{100, 5} {
		if got := resp.Statuses[i].GetCurrentLimit().GetRequestsPerUnit(); got != want ||
			resp.Statuses[i].GetCurrentLimit().GetUnit() != rlsv3.RateLimitResponse_RateLimit_MINUTE {
			t.Fatalf("descriptor %d %v met %d a %v, want %d a minute", i, keyed[i], got,
				resp.Statuses[i].GetCurrentLimit().GetUnit(), want)
		}
	}
	for range 4 {
		e.must(rl.GetDomain(), keyed...)
	}
	if got := answerCodes(e.must(rl.GetDomain(), keyed...)); got != "OVER_LIMIT: OK OVER_LIMIT" {
		t.Fatalf("the key's sixth call in a minute: %s, want OVER_LIMIT: OK OVER_LIMIT", got)
	}
	bare := descriptorsOf(t, vhost.GetRateLimits(), sampleRequest{"192.0.2.7", nil})
	if len(bare) != 1 {
		t.Fatalf("%d descriptors for a request without an API key, want 1", len(bare))
	}
	if got := remaining(e.must(rl.GetDomain(), bare...)); got[0] != 100-5-1 {
		t.Fatalf("the address has %d left, want 94: the denied call charged it", got[0])
	}
	return rl
}

// TestSnippetEnvoyBootstrap: the bootstrap is Envoy's; its filter asks
// the rate_limit_service cluster, an HTTP/2 one, and its actions' descriptors
// meet the sample rules.
func TestSnippetEnvoyBootstrap(t *testing.T) {
	docs := yamlDocs(t, readSnippet(t, "bootstrap.yaml"))
	boot := new(bootstrapv3.Bootstrap)
	asProto(t, docs[0], boot)
	hcm := new(hcmv3.HttpConnectionManager)
	if err := boot.GetStaticResources().GetListeners()[0].GetFilterChains()[0].GetFilters()[0].GetTypedConfig().UnmarshalTo(hcm); err != nil {
		t.Fatal(err)
	}
	rl := checkFilterAndActions(t, hcm.GetHttpFilters()[0], hcm.GetRouteConfig().GetVirtualHosts()[0])
	if last := hcm.GetHttpFilters()[len(hcm.GetHttpFilters())-1].GetName(); last != "envoy.filters.http.router" {
		t.Errorf("the last filter is %q, want the router", last)
	}
	cluster := rl.GetRateLimitService().GetGrpcService().GetEnvoyGrpc().GetClusterName()
	i := slices.IndexFunc(boot.GetStaticResources().GetClusters(), func(c *clusterv3.Cluster) bool {
		return c.GetName() == cluster
	})
	if i < 0 {
		t.Fatalf("the filter asks cluster %q, which the bootstrap does not define", cluster)
	}
	opts := new(upstreamhttpv3.HttpProtocolOptions)
	raw := boot.GetStaticResources().GetClusters()[i].GetTypedExtensionProtocolOptions()["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"]
	if err := raw.UnmarshalTo(opts); err != nil || opts.GetExplicitHttpConfig().GetHttp2ProtocolOptions() == nil {
		t.Fatalf("cluster %s does not speak HTTP/2, which gRPC needs: %v", cluster, err)
	}
}

// TestSnippetIstio: the EnvoyFilter's patches are an HTTP filter and a
// virtual host's rate limits, whose descriptors meet the sample rules.
func TestSnippetIstio(t *testing.T) {
	doc := yamlDocs(t, readSnippet(t, "istio-envoyfilter.yaml"))[0]
	if doc["kind"] != "EnvoyFilter" || doc["apiVersion"] != "networking.istio.io/v1alpha3" {
		t.Fatalf("not an EnvoyFilter: %v %v", doc["apiVersion"], doc["kind"])
	}
	patches := dig(t, doc, "spec", "configPatches").([]any)
	var filter *hcmv3.HttpFilter
	var vhost *routev3.VirtualHost
	for i := range patches {
		switch dig(t, patches[i], "applyTo") {
		case "HTTP_FILTER":
			filter = new(hcmv3.HttpFilter)
			asProto(t, dig(t, patches[i], "patch", "value"), filter)
		case "VIRTUAL_HOST":
			vhost = new(routev3.VirtualHost)
			asProto(t, dig(t, patches[i], "patch", "value"), vhost)
		}
	}
	if filter == nil || vhost == nil {
		t.Fatal("the EnvoyFilter patches no HTTP_FILTER or no VIRTUAL_HOST")
	}
	checkFilterAndActions(t, filter, vhost)
}

// egEnvironment is what Envoy Gateway's rate limit Deployment sets (its
// defaults), which the snippet's Caddyfile reads.
var egEnvironment = map[string]string{
	"CONFIG_GRPC_XDS_SERVER_URL":        "envoy-gateway:18001",
	"CONFIG_GRPC_XDS_NODE_ID":           "envoy-ratelimit",
	"CONFIG_GRPC_XDS_CLIENT_TLS_CERT":   "/certs/tls.crt",
	"CONFIG_GRPC_XDS_CLIENT_TLS_KEY":    "/certs/tls.key",
	"CONFIG_GRPC_XDS_SERVER_TLS_CACERT": "/certs/ca.crt",
	"GRPC_SERVER_TLS_CERT":              "/certs/tls.crt",
	"GRPC_SERVER_TLS_KEY":               "/certs/tls.key",
	"GRPC_SERVER_TLS_CA_CERT":           "/certs/ca.crt",
	"REDIS_URL":                         "redis.redis-system.svc.cluster.local:6379",
}

// TestSnippetEnvoyGateway: the rateLimitDeployment override runs Caddy on
// the ConfigMap's Caddyfile, which, with Envoy Gateway's environment,
// subscribes to its xDS server as envoyproxy/ratelimit would, serves
// mutual TLS on 8081 and answers the health check on 8080.
func TestSnippetEnvoyGateway(t *testing.T) {
	docs := yamlDocs(t, readSnippet(t, "envoy-gateway.yaml"))
	if len(docs) != 2 {
		t.Fatalf("%d documents, want Envoy Gateway's ConfigMap and the Caddyfile's", len(docs))
	}
	eg := yamlDocs(t, dig(t, docs[0], "data", "envoy-gateway.yaml").(string))[0]
	deploy := dig(t, eg, "provider", "kubernetes", "rateLimitDeployment")
	if image := dig(t, deploy, "container", "image").(string); image == "" {
		t.Fatal("no image")
	}
	command := dig(t, deploy, "patch", "value", "spec", "template", "spec", "containers", 0)
	if dig(t, command, "name") != "envoy-ratelimit" {
		t.Fatalf("the patch changes container %v, not Envoy Gateway's envoy-ratelimit", dig(t, command, "name"))
	}
	args := strings.Join(func() (s []string) {
		for _, a := range dig(t, command, "command").([]any) {
			s = append(s, a.(string))
		}
		return s
	}(), " ")
	if args != "caddy run --config /etc/caddy/Caddyfile --adapter caddyfile" {
		t.Fatalf("command %q", args)
	}
	if dig(t, deploy, "container", "volumeMounts", 0, "mountPath") != "/etc/caddy" ||
		dig(t, deploy, "pod", "volumes", 0, "configMap", "name") != dig(t, docs[1], "metadata", "name") {
		t.Fatal("the Caddyfile's ConfigMap is not mounted at /etc/caddy")
	}

	for k, v := range egEnvironment {
		t.Setenv(k, v)
	}
	caddyfile := dig(t, docs[1], "data", "Caddyfile").(string)
	out, warnings, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(caddyfile), nil)
	if err != nil || len(warnings) > 0 {
		t.Fatalf("the Caddyfile does not adapt: %v %v", err, warnings)
	}
	var cfg struct {
		Apps struct {
			RLS  App             `json:"rate_limit_rls"`
			HTTP json.RawMessage `json:"http"`
		} `json:"apps"`
	}
	if err := json.Unmarshal(out, &cfg); err != nil {
		t.Fatal(err)
	}
	a := &cfg.Apps.RLS
	if err := a.Validate(); err != nil {
		t.Fatal(err)
	}
	x := a.XDS
	if x == nil || x.Address != "envoy-gateway:18001" || x.NodeID != "envoy-ratelimit" || x.TLS == nil ||
		x.TLS.CertFile != "/certs/tls.crt" || x.TLS.KeyFile != "/certs/tls.key" || x.TLS.CAFile != "/certs/ca.crt" {
		t.Fatalf("xds %+v, want Envoy Gateway's server, node and mutual TLS", x)
	}
	if a.TLS == nil || !slices.Equal(a.TLS.Listen, []string{":8081"}) || a.TLS.ClientCAFile != "/certs/ca.crt" || len(a.Listen) > 0 {
		t.Fatalf("tls %+v, want mutual TLS on :8081 alone", a.TLS)
	}
	if a.Redis == nil || a.Redis.Address != egEnvironment["REDIS_URL"] {
		t.Fatalf("redis %+v, want REDIS_URL", a.Redis)
	}
	if !bytes.Contains(cfg.Apps.HTTP, []byte(`":8080"`)) || !bytes.Contains(cfg.Apps.HTTP, []byte(`"/healthcheck"`)) {
		t.Fatalf("no health check on :8080: %s", cfg.Apps.HTTP)
	}
}

// TestSnippetsInDocs: docs/envoy.md shows every snippet verbatim, and each
// YAML block of the README's Envoy section is an excerpt of one (its
// indentation aside).
func TestSnippetsInDocs(t *testing.T) {
	names := []string{"config/edge.yaml", "bootstrap.yaml", "istio-envoyfilter.yaml", "envoy-gateway.yaml"}
	doc, err := os.ReadFile("../docs/envoy.md")
	if err != nil {
		t.Fatal(err)
	}
	var all []string
	for _, name := range names {
		s := readSnippet(t, name)
		all = append(all, s)
		if !strings.Contains(string(doc), "```yaml\n"+s+"```\n") {
			t.Errorf("docs/envoy.md does not show %s verbatim", name)
		}
	}
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	section, _, _ := strings.Cut(string(readme)[strings.Index(string(readme), "## Envoy"):][3:], "\n## ")
	blocks := regexp.MustCompile("(?s)```yaml\n(.*?)```").FindAllStringSubmatch(section, -1)
	if len(blocks) == 0 {
		t.Fatal("the README's Envoy section shows no YAML")
	}
	for _, b := range blocks {
		if !slices.ContainsFunc(all, func(s string) bool { return isExcerpt(b[1], s) }) {
			t.Errorf("the README's block is no snippet's excerpt:\n%s", b[1])
		}
	}
}

// isExcerpt reports whether block's lines are consecutive lines of text
// with one indentation taken off them all.
func isExcerpt(block, text string) bool {
	want := strings.Split(strings.TrimSuffix(block, "\n"), "\n")
	lines := strings.Split(text, "\n")
	for i := 0; i+len(want) <= len(lines); i++ {
		indent := len(lines[i]) - len(strings.TrimLeft(lines[i], " "))
		ok := true
		for j, w := range want {
			l := lines[i+j]
			if !strings.HasPrefix(l, strings.Repeat(" ", indent)) && strings.TrimSpace(l) != "" || strings.TrimPrefix(l, strings.Repeat(" ", indent)) != w {
				ok = false
				break
			}
		}
		if ok {
			return true
		}
	}
	return false
}
