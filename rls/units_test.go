package rls

import (
	"slices"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// longUnitsConfig has the reference's long units with its default fixed
// windows, one of them beyond 2,097,151 requests per unit.
const longUnitsConfig = `
domain: billing
descriptors:
  - key: tenant
    rate_limit:
      unit: month
      requests_per_unit: 4000000
  - key: plan
    rate_limit:
      unit: year
      requests_per_unit: 5000000
  - key: seat
    rate_limit:
      unit: week
      requests_per_unit: 3
`

// referenceReset is the reference server's duration_until_reset for a
// unit of sec seconds at now: its windows start at the multiples of the
// unit since the Unix epoch, and it reports whole seconds
// (utils.CalculateReset).
func referenceReset(sec int64, now time.Time) time.Duration {
	return time.Duration(sec-now.Unix()%sec) * time.Second
}

// TestLongUnits: a month (30 days), a year (365 days) and a week, with 4,000,000
// and 5,000,000 requests per unit, load unchanged and count as the
// reference counts them: the same windows (duration_until_reset within the
// second the reference rounds to), counts and limit_remaining, on the
// memory store and on Redis.
func TestLongUnits(t *testing.T) {
	scenarioStores(t, map[string]string{"billing.yaml": longUnitsConfig}, func(t *testing.T, e *envoy) {
		check := func(what string, d *ratelimitv3.RateLimitDescriptor, wantCode rlsv3.RateLimitResponse_Code,
			wantLeft uint32, unit rlsv3.RateLimitResponse_RateLimit_Unit, perUnit uint32, sec int64) {
			t.Helper()
			before := time.Now()
			resp := e.must("billing", d)
			after := time.Now()
			st := resp.Statuses[0]
			if resp.OverallCode != wantCode || st.Code != wantCode || st.LimitRemaining != wantLeft {
				t.Fatalf("%s: %s with %d left, want %s with %d", what, answerCodes(resp), st.LimitRemaining, wantCode, wantLeft)
			}
			if st.CurrentLimit.GetUnit() != unit || st.CurrentLimit.GetRequestsPerUnit() != perUnit {
				t.Fatalf("%s: current_limit %v, want %d per %s", what, st.CurrentLimit, perUnit, unit)
			}
			// The reference's answer, at some instant of the call, in
			// whole seconds: ours is exact, so at most a second less.
			got := st.DurationUntilReset.AsDuration()
			hi, lo := referenceReset(sec, before), referenceReset(sec, after)
			if lo > hi { // a window ended during the call
				lo = 0
			}
			if got > hi || got <= lo-time.Second {
				t.Fatalf("%s: duration_until_reset %s, want the reference's %s to %s, less at most a second", what, got, lo, hi)
			}
		}
		const monthS, yearS, weekS = 30 * 86400, 365 * 86400, 7 * 86400
		freshWindow(time.Minute) // the windows end at whole minutes too
		month, year := rlsv3.RateLimitResponse_RateLimit_MONTH, rlsv3.RateLimitResponse_RateLimit_YEAR
		check("2,500,000 of a month's 4,000,000", hits(desc("tenant", "acme"), 2_500_000), rlsv3.RateLimitResponse_OK, 1_500_000, month, 4_000_000, monthS)
		check("1,500,001 more", hits(desc("tenant", "acme"), 1_500_001), rlsv3.RateLimitResponse_OVER_LIMIT, 0, month, 4_000_000, monthS)
		check("a look", hits(desc("tenant", "acme"), 0), rlsv3.RateLimitResponse_OK, 1_500_000, month, 4_000_000, monthS)
		check("the last 1,500,000", hits(desc("tenant", "acme"), 1_500_000), rlsv3.RateLimitResponse_OK, 0, month, 4_000_000, monthS)
		check("one more", desc("tenant", "acme"), rlsv3.RateLimitResponse_OVER_LIMIT, 0, month, 4_000_000, monthS)
		check("another tenant", desc("tenant", "other"), rlsv3.RateLimitResponse_OK, 3_999_999, month, 4_000_000, monthS)
		check("4,000,000 of a year's 5,000,000", hits(desc("plan", "gold"), 4_000_000), rlsv3.RateLimitResponse_OK, 1_000_000, year, 5_000_000, yearS)
		week := rlsv3.RateLimitResponse_RateLimit_WEEK
		var left []uint32
		for range 3 {
			left = append(left, e.must("billing", desc("seat", "s1")).Statuses[0].LimitRemaining)
		}
		if !slices.Equal(left, []uint32{2, 1, 0}) {
			t.Fatalf("3 per week: %v left, want [2 1 0]", left)
		}
		check("a week's 4th", desc("seat", "s1"), rlsv3.RateLimitResponse_OVER_LIMIT, 0, week, 3, weekS)
	})
}
