// Command egcheck plays Envoy against Envoy Gateway's control plane and
// rate_limit_rls: it fetches the routes Envoy Gateway serves Envoy over
// xDS, reads the rate limit actions it put on them, builds the descriptors
// those actions make Envoy send for a sample request, and calls
// ShouldRateLimit with them over mutual TLS until the answer is
// OVER_LIMIT. It also prints the RateLimitConfig Envoy Gateway serves its
// rate limit service, which rate_limit_rls decides from. run.sh starts the
// processes; egcheck is its last step.
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	ratelimitcommonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	ratelimitfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

const (
	routeType     = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration"
	rateLimitType = "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig"
)

func main() {
	certs := flag.String("certs", "", "the certs directory of `envoy-gateway certgen --local` (envoy/, envoy-rate-limit/)")
	xds := flag.String("xds", "127.0.0.1:18000", "Envoy Gateway's xDS server for Envoy")
	rlxds := flag.String("ratelimit-xds", "127.0.0.1:18001", "Envoy Gateway's xDS server for its rate limit service")
	cluster := flag.String("gateway", "default/eg", "the Gateway (namespace/name) whose Envoy egcheck plays")
	rls := flag.String("rls", "", "rate_limit_rls' mutual TLS address")
	rlsName := flag.String("rls-name", "envoy-ratelimit.envoy-gateway-system", "the name rate_limit_rls' certificate must carry (Envoy Gateway's: *.envoy-gateway-system)")
	header := flag.String("header", "x-user-id=alice", "the sample request's header, name=value")
	calls := flag.Int("calls", 10, "the most calls to send")
	flag.Parse()
	if err := run(*certs, *xds, *rlxds, *cluster, *rls, *rlsName, *header, *calls); err != nil {
		fmt.Fprintln(os.Stderr, "egcheck:", err)
		os.Exit(1)
	}
}

func run(certs, xds, rlxds, cluster, rls, rlsName, header string, calls int) error {
	name, value, ok := strings.Cut(header, "=")
	if !ok || certs == "" || rls == "" {
		return errors.New("-certs, -rls and -header name=value are required")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	envoy, err := dial(ctx, xds, filepath.Join(certs, "envoy"), "envoy-gateway")
	if err != nil {
		return err
	}
	defer envoy.Close()
	routes, err := fetch(ctx, envoy, &corev3.Node{Id: "egcheck", Cluster: cluster}, routeType)
	if err != nil {
		return fmt.Errorf("routes from %s: %w", xds, err)
	}
	domain, limits, err := routeRateLimits(routes)
	if err != nil {
		return err
	}
	request := map[string]string{strings.ToLower(name): value}
	var descriptors []*ratelimitcommonv3.RateLimitDescriptor
	for _, l := range limits {
		d, err := descriptor(l, request)
		if err != nil {
			return err
		}
		descriptors = append(descriptors, d)
	}
	fmt.Printf("Envoy Gateway's route sends domain %q, descriptors %s\n", domain, show(descriptors))

	limiter, err := dial(ctx, rlxds, filepath.Join(certs, "envoy-rate-limit"), "envoy-gateway")
	if err != nil {
		return err
	}
	defer limiter.Close()
	configs, err := fetch(ctx, limiter, &corev3.Node{Id: "envoy-ratelimit"}, rateLimitType)
	if err != nil {
		return fmt.Errorf("rate limit config from %s: %w", rlxds, err)
	}
	for _, c := range configs {
		var rc rlsconfv3.RateLimitConfig
		if err := c.UnmarshalTo(&rc); err != nil {
			return err
		}
		fmt.Printf("Envoy Gateway's RateLimitConfig: %s\n", protojson.Format(&rc))
	}

	conn, err := dial(ctx, rls, filepath.Join(certs, "envoy"), rlsName)
	if err != nil {
		return err
	}
	defer conn.Close()
	return shouldRateLimit(ctx, rlsv3.NewRateLimitServiceClient(conn), domain, descriptors, calls)
}

// dial connects with mutual TLS as Envoy and Envoy Gateway's rate limit
// service do: the client certificate and the CA from dir.
func dial(ctx context.Context, addr, dir, serverName string) (*grpc.ClientConn, error) {
	cert, err := tls.LoadX509KeyPair(filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key"))
	if err != nil {
		return nil, err
	}
	ca, err := os.ReadFile(filepath.Join(dir, "ca.crt"))
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(ca) {
		return nil, fmt.Errorf("no certificate in %s", filepath.Join(dir, "ca.crt"))
	}
	creds := credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{cert}, RootCAs: pool, ServerName: serverName, MinVersion: tls.VersionTLS13})
	return grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
}

// fetch asks an aggregated xDS stream for every resource of one type, as
// node, and returns the first answer that has any.
func fetch(ctx context.Context, conn *grpc.ClientConn, node *corev3.Node, typeURL string) ([]*anypb.Any, error) {
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	stream, err := discoveryv3.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(ctx, grpc.WaitForReady(true))
	if err != nil {
		return nil, err
	}
	req := &discoveryv3.DiscoveryRequest{Node: node, TypeUrl: typeURL}
	if err := stream.Send(req); err != nil {
		return nil, err
	}
	for {
		resp, err := stream.Recv()
		if err != nil {
			return nil, err
		}
		if len(resp.Resources) > 0 {
			return resp.Resources, nil
		}
		req = &discoveryv3.DiscoveryRequest{TypeUrl: typeURL, VersionInfo: resp.VersionInfo, ResponseNonce: resp.Nonce}
		if err := stream.Send(req); err != nil {
			return nil, err
		}
	}
}

// routeRateLimits finds the route that carries rate limits: Envoy
// Gateway puts them in the rate limit filter's per-route config, with the
// domain the filter sends.
func routeRateLimits(configs []*anypb.Any) (string, []*routev3.RateLimit, error) {
	for _, a := range configs {
		var rc routev3.RouteConfiguration
		if err := a.UnmarshalTo(&rc); err != nil {
			return "", nil, err
		}
		for _, vh := range rc.VirtualHosts {
			for _, r := range vh.Routes {
				for filter, cfg := range r.TypedPerFilterConfig {
					var per ratelimitfilterv3.RateLimitPerRoute
					if cfg.UnmarshalTo(&per) != nil || len(per.RateLimits) == 0 {
						continue
					}
					fmt.Printf("route %q: filter %q, per-route rate limits %s\n", r.Name, filter, protojson.Format(&per))
					return per.Domain, per.RateLimits, nil
				}
				if len(r.GetRoute().GetRateLimits()) > 0 {
					return "", nil, fmt.Errorf("route %q has route-level rate limits, which egcheck does not read", r.Name)
				}
			}
		}
	}
	return "", nil, errors.New("no route carries rate limits")
}

// descriptor is what Envoy's rate limit filter makes of one rate limit's
// actions for a request with these headers: the actions Envoy Gateway
// uses for header matches and its route and rule keys.
func descriptor(l *routev3.RateLimit, headers map[string]string) (*ratelimitcommonv3.RateLimitDescriptor, error) {
	d := new(ratelimitcommonv3.RateLimitDescriptor)
	for _, a := range l.Actions {
		var e ratelimitcommonv3.RateLimitDescriptor_Entry
		switch s := a.ActionSpecifier.(type) {
		case *routev3.RateLimit_Action_GenericKey_:
			e.Key, e.Value = s.GenericKey.DescriptorKey, s.GenericKey.DescriptorValue
			if e.Key == "" {
				e.Key = "generic_key"
			}
		case *routev3.RateLimit_Action_RequestHeaders_:
			v, ok := headers[strings.ToLower(s.RequestHeaders.HeaderName)]
			if !ok {
				return nil, fmt.Errorf("the sample request has no header %q", s.RequestHeaders.HeaderName)
			}
			e.Key, e.Value = s.RequestHeaders.DescriptorKey, v
		default:
			return nil, fmt.Errorf("action %T: egcheck evaluates generic_key and request_headers only", s)
		}
		d.Entries = append(d.Entries, &e)
	}
	return d, nil
}

// shouldRateLimit waits, checking without a charge (hits_addend 0), until
// the service has the rule (its status carries a limit), then charges one
// hit a call until it is answered OVER_LIMIT.
func shouldRateLimit(ctx context.Context, c rlsv3.RateLimitServiceClient, domain string, descriptors []*ratelimitcommonv3.RateLimitDescriptor, calls int) error {
	call := func(check bool) (*rlsv3.RateLimitResponse, error) {
		ds := make([]*ratelimitcommonv3.RateLimitDescriptor, len(descriptors))
		for i, d := range descriptors {
			ds[i] = proto.Clone(d).(*ratelimitcommonv3.RateLimitDescriptor)
			if check {
				ds[i].HitsAddend = wrapperspb.UInt64(0)
			}
		}
		callCtx, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
		defer cancel()
		return c.ShouldRateLimit(callCtx, &rlsv3.RateLimitRequest{Domain: domain, Descriptors: ds})
	}
	for i := 0; ; i++ {
		resp, err := call(true)
		if err == nil && len(resp.Statuses) > 0 && resp.Statuses[0].CurrentLimit != nil {
			fmt.Printf("rate_limit_rls has the rule after %d checks\n", i+1)
			break
		}
		if i == 100 {
			return fmt.Errorf("rate_limit_rls has no rule for the descriptors after %d checks: %v %v", i+1, resp, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	for i := 1; i <= calls; i++ {
		resp, err := call(false)
		if err != nil {
			return fmt.Errorf("call %d: %w", i, err)
		}
		st := resp.Statuses[0]
		fmt.Printf("call %d: %s (limit %d per %s, remaining %d)\n", i, resp.OverallCode,
			st.GetCurrentLimit().GetRequestsPerUnit(), st.GetCurrentLimit().GetUnit(), st.LimitRemaining)
		if resp.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT {
			return nil
		}
	}
	return fmt.Errorf("no OVER_LIMIT in %d calls", calls)
}

func show(ds []*ratelimitcommonv3.RateLimitDescriptor) string {
	var s []string
	for _, d := range ds {
		var e []string
		for _, x := range d.Entries {
			e = append(e, x.Key+"="+x.Value)
		}
		s = append(s, "["+strings.Join(e, ", ")+"]")
	}
	return strings.Join(s, " ")
}
