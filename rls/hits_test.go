package rls

import (
	"slices"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
)

// hitsConfig has a user rule of 10 per hour and a token bucket of 10 per
// hour.
const hitsConfig = `
domain: api
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 10}
  - key: tokens
    rate_limit: {unit: hour, requests_per_unit: 10, algorithm: token_bucket}
`

// TestHitsAddend: the request's hits_addend charges every descriptor (0
// counts as 1), a descriptor's own overrides it, and 0 there only looks.
func TestHitsAddend(t *testing.T) {
	scenarioStores(t, map[string]string{"api.yaml": hitsConfig}, func(t *testing.T, e *envoy) {
		freshWindow(time.Hour)
		call := func(req *rlsv3.RateLimitRequest) *rlsv3.RateLimitResponse {
			t.Helper()
			req.Domain = "api"
			resp, err := e.call(req)
			if err != nil {
				t.Fatal(err)
			}
			return resp
		}
		resp := call(&rlsv3.RateLimitRequest{HitsAddend: 3, Descriptors: []*ratelimitv3.RateLimitDescriptor{
			desc("user", "a"), hits(desc("user", "b"), 0), hits(desc("user", "c"), 5),
		}})
		if got := remaining(resp); !slices.Equal(got, []uint32{7, 10, 5}) {
			t.Fatalf("hits 3, 0 and 5: remaining %v, want [7 10 5]", got)
		}
		// Over what is left: denied, nothing charged.
		resp = call(&rlsv3.RateLimitRequest{Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("user", "a"), hits(desc("user", "c"), 6)}})
		if got := answerCodes(resp); got != "OVER_LIMIT: OK OVER_LIMIT" || resp.Statuses[0].LimitRemaining != 7 {
			t.Fatalf("6 hits on 5 left: %s %v, want OVER_LIMIT with a still at 7", got, remaining(resp))
		}
		// Two descriptors on one bucket count together: 3 + 3 of 5 left.
		resp = call(&rlsv3.RateLimitRequest{HitsAddend: 3, Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("user", "c"), desc("user", "c")}})
		if got := answerCodes(resp); got != "OVER_LIMIT: OVER_LIMIT OVER_LIMIT" {
			t.Fatalf("3 + 3 hits on one bucket of 5 left: %s, want OVER_LIMIT", got)
		}
		resp = call(&rlsv3.RateLimitRequest{HitsAddend: 2, Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("user", "c"), desc("user", "c")}})
		if got := remaining(resp); answerCodes(resp) != "OK: OK OK" || !slices.Equal(got, []uint32{1, 1}) {
			t.Fatalf("2 + 2 hits on one bucket of 5 left: %s %v, want OK with 1 left", answerCodes(resp), got)
		}
	})
}

// TestNegativeHits: a descriptor with is_negative_hits gives its hits
// back, on a fixed window and on a token bucket, once the call passes.
func TestNegativeHits(t *testing.T) {
	scenarioStores(t, map[string]string{"api.yaml": hitsConfig}, func(t *testing.T, e *envoy) {
		freshWindow(time.Hour)
		for _, key := range []string{"user", "tokens"} {
			e.must("api", hits(desc(key, "n"), 8))
			give := hits(desc(key, "n"), 5)
			give.IsNegativeHits = true
			e.must("api", give)
			// The refund runs beside the answer: wait for it.
			deadline := time.Now().Add(5 * time.Second)
			for {
				resp := e.must("api", hits(desc(key, "n"), 0))
				left := resp.Statuses[0].LimitRemaining
				if left >= 7 {
					if left > 7 {
						t.Fatalf("%s: %d left after 8 taken and 5 given back, want 7", key, left)
					}
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("%s: %d left after 8 taken and 5 given back, want 7", key, left)
				}
				time.Sleep(5 * time.Millisecond)
			}
		}
	})
}

// TestOverride: a descriptor's own limit takes the place of the
// configuration's, in the same bucket as the configuration's rule of the
// same unit; an unknown domain ignores it.
func TestOverride(t *testing.T) {
	scenarioStores(t, map[string]string{"api.yaml": hitsConfig}, func(t *testing.T, e *envoy) {
		freshWindow(time.Hour)
		own := func() *ratelimitv3.RateLimitDescriptor {
			d := desc("user", "o")
			d.Limit = &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 2, Unit: typev3.RateLimitUnit_HOUR}
			return d
		}
		for i, want := range []string{"OK: OK", "OK: OK", "OVER_LIMIT: OVER_LIMIT"} {
			resp := e.must("api", own())
			if got := answerCodes(resp); got != want || resp.Statuses[0].CurrentLimit.GetRequestsPerUnit() != 2 {
				t.Fatalf("call %d: %s %v, want %s at 2 per hour", i, got, resp.Statuses[0].CurrentLimit, want)
			}
		}
		// The configuration's 10 per hour counts the same bucket: 2 taken.
		if resp := e.must("api", desc("user", "o")); resp.Statuses[0].LimitRemaining != 7 {
			t.Fatalf("the configuration's rule after 2 overridden calls: %d left, want 7", resp.Statuses[0].LimitRemaining)
		}
		// An overriding limit on a key without a rule counts too.
		d := desc("nokey", "x")
		d.Limit = &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1, Unit: typev3.RateLimitUnit_HOUR}
		if got := answerCodes(e.must("api", d)); got != "OK: OK" {
			t.Fatalf("override without a rule, first: %s", got)
		}
		if got := answerCodes(e.must("api", d)); got != "OVER_LIMIT: OVER_LIMIT" {
			t.Fatalf("override without a rule, second: %s", got)
		}
		if got := answerCodes(e.must("unknown", d)); got != "OK: OK" {
			t.Fatalf("override in an unknown domain: %s", got)
		}
	})
}
