package fleetlimit

import (
	"fmt"
	"net/http"
	"strconv"

	"github.com/fleetlimit/caddy-fleetlimit/limiter"
)

// headerMode selects the rate limit header fields written on responses.
type headerMode uint8

const (
	headersBoth headerMode = iota
	headersIETF
	headersLegacy
	headersNone
)

// The header field names, in canonical form so they can be set directly.
const (
	hdrPolicy          = "Ratelimit-Policy"
	hdrRateLimit       = "Ratelimit"
	hdrLegacyLimit     = "X-Ratelimit-Limit"
	hdrLegacyRemaining = "X-Ratelimit-Remaining"
	hdrLegacyReset     = "X-Ratelimit-Reset"
)

func parseHeaderMode(s string) (headerMode, error) {
	switch s {
	case "", "both":
		return headersBoth, nil
	case "ietf":
		return headersIETF, nil
	case "legacy":
		return headersLegacy, nil
	case "none":
		return headersNone, nil
	}
	return 0, fmt.Errorf("unknown headers mode %q (want ietf, legacy, both or none)", s)
}

// policyOf returns the RateLimit-Policy value for the rules a request
// applied: every enforced zone's (a dry run sends no fields).
func policyOf(applied []*appliedRule, reqs []limiter.Request) string {
	var buf [256]byte
	b := buf[:0]
	for i, ap := range applied {
		if reqs[i].Rule.DryRun() {
			continue
		}
		if len(b) > 0 {
			b = append(b, ", "...)
		}
		b = append(b, ap.policy...)
	}
	return string(b)
}

// write sets the header fields for the zones that decided a request.
//
// IETF (draft-ietf-httpapi-ratelimit-headers-10): RateLimit-Policy lists
// each zone as `"name";q=<rate>;w=<period in seconds>`, and RateLimit as
// `"name";r=<remaining>;t=<seconds until the bucket is full>`. Legacy: the
// X-RateLimit-* fields report the zone with the least remaining. policy is
// the RateLimit-Policy value: every zone that applies to the request (a
// zone left unconsulted by a cached denial is in the policy but not in
// RateLimit).
func (m headerMode) write(h http.Header, zones []*Zone, applied []*appliedRule, results []limiter.Result, policy string) {
	if m == headersNone || len(zones) == 0 {
		return
	}
	// One array holds every value, and numbers below 100 come from
	// strconv's table: a response's fields cost two or three allocations.
	vals := make([]string, 5)
	if m == headersBoth || m == headersIETF {
		vals[0] = policy
		h[hdrPolicy] = vals[0:1:1]
		var buf [256]byte
		b := buf[:0]
		for i, z := range zones {
			if i > 0 {
				b = append(b, ", "...)
			}
			b = append(b, '"')
			b = append(b, z.Name...)
			b = append(b, `";r=`...)
			b = strconv.AppendInt(b, results[i].Remaining, 10)
			b = append(b, ";t="...)
			b = strconv.AppendInt(b, retryAfterSeconds(results[i].ResetAfter), 10)
		}
		vals[1] = string(b)
		h[hdrRateLimit] = vals[1:2:2]
	}
	if m == headersBoth || m == headersLegacy {
		least := 0
		for i := range results {
			if results[i].Remaining < results[least].Remaining {
				least = i
			}
		}
		vals[2] = applied[least].rateText
		vals[3] = strconv.FormatInt(results[least].Remaining, 10)
		vals[4] = strconv.FormatInt(retryAfterSeconds(results[least].ResetAfter), 10)
		h[hdrLegacyLimit] = vals[2:3:3]
		h[hdrLegacyRemaining] = vals[3:4:4]
		h[hdrLegacyReset] = vals[4:5:5]
	}
}
