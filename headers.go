package fleetlimit

import (
	"fmt"
	"net/http"
	"strconv"
	"time"
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
	hdrRetryAfter      = "Retry-After"
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
// applied: every enforced zone's (a dry run sends no fields). Not inlined:
// its buffer would enlarge the request path's stack frame even when the
// policy does not vary (see Handler.limit).
//
//go:noinline
func policyOf(ds []zoneDecision) string {
	var buf [256]byte
	b := buf[:0]
	for i := range ds {
		if ds[i].req.Rule.DryRun() {
			continue
		}
		if len(b) > 0 {
			b = append(b, ", "...)
		}
		b = append(b, ds[i].applied.policy...)
		if ds[i].applied.calendar {
			b = strconv.AppendInt(b, periodSeconds(&ds[i]), 10)
		}
	}
	return string(b)
}

// noRetryAfter is write's retryAfter when the response has no Retry-After.
const noRetryAfter int64 = -1

// write sets the header fields for the zones that decided a request, and
// Retry-After (whole seconds) unless retryAfter is noRetryAfter: a denial
// sends it whatever the mode.
//
// IETF (draft-ietf-httpapi-ratelimit-headers-10): RateLimit-Policy lists
// each zone as `"name";q=<rate>;w=<period in seconds>`, and RateLimit as
// `"name";r=<remaining>;t=<seconds until the bucket is full>`. Legacy: the
// X-RateLimit-* fields report the zone with the least remaining. policy is
// the RateLimit-Policy value: every zone that applies to the request (a
// zone left unconsulted by a cached denial is in the policy but not in
// RateLimit).
func (m headerMode) write(h http.Header, ds []zoneDecision, policy string, retryAfter int64) {
	ietf := m == headersBoth || m == headersIETF
	legacy := m == headersBoth || m == headersLegacy
	if len(ds) == 0 {
		ietf, legacy = false, false
	}
	n := 0
	if ietf {
		n += 2
	}
	if legacy {
		n += 3
	}
	if retryAfter != noRetryAfter {
		n++
	}
	if n == 0 {
		return
	}
	// Two allocations whatever the fields: one array holds the values,
	// and one string the text of those built here (each value a part of
	// it).
	vals := make([]string, n)
	var buf [256]byte
	b := buf[:0]
	rateLimit := 0 // the RateLimit value is b[:rateLimit]
	if ietf {
		for i := range ds {
			if i > 0 {
				b = append(b, ", "...)
			}
			b = append(b, '"')
			b = append(b, ds[i].zone.Name...)
			b = append(b, `";r=`...)
			b = strconv.AppendInt(b, ds[i].res.Remaining, 10)
			b = append(b, ";t="...)
			b = strconv.AppendInt(b, retryAfterSeconds(ds[i].res.ResetAfter), 10)
		}
		rateLimit = len(b)
	}
	least := 0
	remaining, reset := rateLimit, rateLimit // X-RateLimit-Remaining is b[rateLimit:remaining], -Reset b[remaining:reset]
	if legacy {
		for i := range ds {
			if ds[i].res.Remaining < ds[least].res.Remaining {
				least = i
			}
		}
		b = strconv.AppendInt(b, ds[least].res.Remaining, 10)
		remaining = len(b)
		b = strconv.AppendInt(b, retryAfterSeconds(ds[least].res.ResetAfter), 10)
		reset = len(b)
	}
	if retryAfter != noRetryAfter {
		b = strconv.AppendInt(b, retryAfter, 10)
	}
	text := string(b)
	i := 0
	if ietf {
		vals[0], vals[1] = policy, text[:rateLimit]
		h[hdrPolicy], h[hdrRateLimit] = vals[0:1:1], vals[1:2:2]
		i = 2
	}
	if legacy {
		vals[i], vals[i+1], vals[i+2] = ds[least].applied.rateText, text[rateLimit:remaining], text[remaining:reset]
		h[hdrLegacyLimit], h[hdrLegacyRemaining], h[hdrLegacyReset] = vals[i:i+1:i+1], vals[i+1:i+2:i+2], vals[i+2:i+3:i+3]
		i += 3
	}
	if retryAfter != noRetryAfter {
		vals[i] = text[reset:]
		h[hdrRetryAfter] = vals[i : i+1 : i+1]
	}
}

// periodSeconds is a quota's w in RateLimit-Policy: the length in seconds
// of the calendar period the request was decided in, or, when the zone was
// not consulted, of the period this node's clock is in.
func periodSeconds(d *zoneDecision) int64 {
	p := d.res.Period
	if p <= 0 {
		s, e := d.req.Rule.PeriodAt(time.Now())
		p = e.Sub(s)
	}
	return int64(p / time.Second)
}
