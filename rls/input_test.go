package rls

import (
	"math"
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestBadInput sends what no Envoy sends: each call is refused with a
// status that says what is wrong, and charges nothing (the user's bucket is
// still full afterwards).
func TestBadInput(t *testing.T) {
	scenarioStores(t, map[string]string{"api.yaml": userConfig}, func(t *testing.T, e *envoy) {
		freshWindow(time.Hour)
		user := func() *ratelimitv3.RateLimitDescriptor { return desc("user", "alice") }
		many := make([]*ratelimitv3.RateLimitDescriptor, 10_000)
		for i := range many {
			many[i] = user()
		}
		long := desc("user", strings.Repeat("x", defaultMaxEntryBytes+1))
		wide := desc()
		for range defaultMaxEntries + 1 {
			wide.Entries = append(wide.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: "user", Value: "alice"})
		}
		cases := []struct {
			name string
			req  *rlsv3.RateLimitRequest
			code codes.Code
			msg  string
		}{
			{"empty domain", &rlsv3.RateLimitRequest{Descriptors: []*ratelimitv3.RateLimitDescriptor{user()}},
				codes.InvalidArgument, "domain must not be empty"},
			{"no descriptors", &rlsv3.RateLimitRequest{Domain: "api"}, codes.InvalidArgument, "descriptor list must not be empty"},
			{"10,000 descriptors", &rlsv3.RateLimitRequest{Domain: "api", Descriptors: many}, codes.InvalidArgument, "10000 descriptors"},
			{"1 MB value", &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{
				user(), desc("user", strings.Repeat("v", 1<<20))}}, codes.ResourceExhausted, "larger than max"},
			{"a value above max_entry_bytes", &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{user(), long}},
				codes.InvalidArgument, "longer than 4096 bytes"},
			{"too many entries", &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{user(), wide}},
				codes.InvalidArgument, "17 entries"},
			{"negative hits_addend (as uint64)", &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{
				user(), hits(user(), math.MaxUint64)}}, codes.InvalidArgument, "hits_addend"},
			{"huge hits_addend", &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{
				user(), hits(user(), 1<<40)}}, codes.InvalidArgument, "hits_addend"},
			{"negative request hits_addend (as uint32)", &rlsv3.RateLimitRequest{Domain: "api", HitsAddend: math.MaxUint32,
				Descriptors: []*ratelimitv3.RateLimitDescriptor{user()}}, codes.InvalidArgument, "hits_addend"},
			{"an override without a unit", &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{
				user(), {Entries: user().Entries, Limit: &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 5}}}},
				codes.InvalidArgument, "descriptor 1"},
		}
		for _, c := range cases {
			_, err := e.call(c.req)
			if s, _ := status.FromError(err); s.Code() != c.code || !strings.Contains(s.Message(), c.msg) {
				t.Errorf("%s: %v, want %s saying %q", c.name, err, c.code, c.msg)
			}
		}
		// Nothing was charged: alice's bucket is full.
		if resp := e.must("api", user()); resp.Statuses[0].LimitRemaining != 2 {
			t.Fatalf("after the bad calls, alice has %d left after one call, want 2: a bad call charged", resp.Statuses[0].LimitRemaining)
		}
		// An unknown domain is no error: OK, as the reference.
		if got := answerCodes(e.must("unknown", user())); got != "OK: OK" {
			t.Fatalf("unknown domain: %s", got)
		}
	})
}
