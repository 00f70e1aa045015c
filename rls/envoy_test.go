package rls

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"go.uber.org/zap/zaptest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// The test harness: the app started in process on a loopback port, and an
// "Envoy emulator" that calls it as Envoy's rate limit filter does, with
// go-control-plane's v3 types, one unary call per request, and the
// filter's default deadline of 20ms.

// userConfig, the rules of several tests, is domain api with a rule of 3 per
// hour for each user.
const userConfig = `
domain: api
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 3}
`

// envoyTimeout is the deadline Envoy's rate limit filter gives a call.
const envoyTimeout = 20 * time.Millisecond

// startApp provisions and starts an App with the rules of the YAML files
// (file name to content) on a free loopback port, adjusted by configure
// before it is provisioned, and stops it when the test ends.
func startApp(t *testing.T, files map[string]string, configure func(*App)) *App {
	t.Helper()
	dir := t.TempDir()
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	a := &App{ConfigDir: dir, Listen: []string{"127.0.0.1:0"}}
	if configure != nil {
		configure(a)
	}
	// Through JSON, as Caddy loads it.
	raw, err := json.Marshal(a)
	if err != nil {
		t.Fatal(err)
	}
	loaded := new(App)
	if err := json.Unmarshal(raw, loaded); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	t.Cleanup(cancel)
	// Caddy's logger without a configuration is a development one, which
	// writes a stack trace with every warning (a store failure): not what
	// a running Caddy does, and slow enough to miss 20ms deadlines.
	loaded.logger = zaptest.NewLogger(t)
	if err := loaded.Provision(ctx); err != nil {
		t.Fatalf("provisioning: %v", err)
	}
	t.Cleanup(func() { _ = loaded.Cleanup() })
	if err := loaded.Start(); err != nil {
		t.Fatalf("starting: %v", err)
	}
	t.Cleanup(func() { _ = loaded.Stop() })
	return loaded
}

// addr returns the address of the app's i-th server.
func (a *App) addr(i int) string { return a.servers[i].ln.Addr().String() }

// envoy is a client that calls the service as Envoy's filter does.
type envoy struct {
	t      *testing.T
	client rlsv3.RateLimitServiceClient
	conn   *grpc.ClientConn
	// timeout is each call's deadline: Envoy's 20ms, unless a test that
	// checks answers rather than time gives a loaded machine more.
	timeout time.Duration
}

// newEnvoy connects to addr in plaintext HTTP/2, as Envoy's cluster with
// http2_protocol_options does, and waits until it is connected.
func newEnvoy(t *testing.T, addr string, opts ...grpc.DialOption) *envoy {
	t.Helper()
	if len(opts) == 0 {
		opts = []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	}
	conn, err := grpc.NewClient(addr, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	e := &envoy{t: t, client: rlsv3.NewRateLimitServiceClient(conn), conn: conn, timeout: envoyTimeout}
	// Envoy keeps its connection to the service open: the first call of
	// a test should not pay for connecting.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := e.client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{}); err == nil {
		t.Fatal("an empty request was answered")
	}
	return e
}

// call makes one call with the emulator's deadline.
func (e *envoy) call(req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	ctx, cancel := context.WithTimeout(context.Background(), e.timeout)
	defer cancel()
	return e.client.ShouldRateLimit(ctx, req)
}

// must makes one call that must be answered.
func (e *envoy) must(domain string, ds ...*ratelimitv3.RateLimitDescriptor) *rlsv3.RateLimitResponse {
	e.t.Helper()
	resp, err := e.call(&rlsv3.RateLimitRequest{Domain: domain, Descriptors: ds})
	if err != nil {
		e.t.Fatalf("call to domain %s: %v", domain, err)
	}
	if len(resp.Statuses) != len(ds) {
		e.t.Fatalf("%d statuses for %d descriptors", len(resp.Statuses), len(ds))
	}
	return resp
}

// desc builds a descriptor of key, value pairs ("k", "v", "k2", "v2").
func desc(kv ...string) *ratelimitv3.RateLimitDescriptor {
	d := &ratelimitv3.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

// hits sets a descriptor's own hits_addend.
func hits(d *ratelimitv3.RateLimitDescriptor, n uint64) *ratelimitv3.RateLimitDescriptor {
	d.HitsAddend = wrapperspb.UInt64(n)
	return d
}

// answerCodes returns the overall code and the statuses' codes, as one string
// ("OVER_LIMIT: OK OVER_LIMIT").
func answerCodes(resp *rlsv3.RateLimitResponse) string {
	s := resp.OverallCode.String() + ":"
	for _, st := range resp.Statuses {
		s += " " + st.Code.String()
	}
	return s
}

// remaining returns the statuses' limit_remaining.
func remaining(resp *rlsv3.RateLimitResponse) []uint32 {
	out := make([]uint32, len(resp.Statuses))
	for i, st := range resp.Statuses {
		out[i] = st.LimitRemaining
	}
	return out
}

// freshWindow waits, if the current window of unit ends within the next
// few seconds, until the next one starts, so that a test's counts fall in
// one fixed window.
func freshWindow(unit time.Duration) {
	const room = 5 * time.Second
	if left := unit - time.Duration(time.Now().UnixNano())%unit; left < room {
		time.Sleep(left + 10*time.Millisecond)
	}
}
