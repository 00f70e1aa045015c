package fleetlimit

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"strconv"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap/zapcore"

	"github.com/fleetlimit/caddy-fleetlimit/limiter"
)

// The answer to a decided request: the rate limit fields that a response
// carries for the zones that decided it (headerMode.write), and the 429 of
// a denial (Handler.deny) or the 503 of a store that failed closed
// (Handler.unavailable).

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

// policyFor returns the RateLimit-Policy of a request's decisions. The
// policy names every enforced zone that applies (the current state, only
// the zones that were consulted): the handler's own, unless some zone does
// not apply or varies by request.
func (h *Handler) policyFor(ds []zoneDecision) string {
	if h.varyPolicy || len(ds) != len(h.Zones) {
		return policyOf(ds)
	}
	return h.policy
}

// shown returns the decisions whose state a response reports: those
// consulted (a cached denial leaves the others unconsulted) that are
// enforced (a dry run sends no fields). The list is a copy when any zone
// is left out, so that the decision's own stays whole for what follows
// the response.
func shown(ds []zoneDecision) []zoneDecision {
	all := true
	for i := range ds {
		if ds[i].res.Unknown || ds[i].req.Rule.DryRun() {
			all = false
			break
		}
	}
	if all {
		return ds
	}
	var out []zoneDecision
	for i := range ds {
		if !ds[i].res.Unknown && !ds[i].req.Rule.DryRun() {
			out = append(out, ds[i])
		}
	}
	return out
}

// retryAfterSeconds rounds a wait up to whole seconds, so that a client that
// obeys Retry-After is never early.
func retryAfterSeconds(d time.Duration) int64 {
	return int64((d + time.Second - 1) / time.Second)
}

// A denial: the zone that answers it (denier), its wait with jitter, and
// its error, returned to Caddy or written here.

// denierOf returns the denier of a request that zones denied, its wait
// with the handler's jitter (none when no wait helps).
func (h *Handler) denierOf(ds []zoneDecision) denier {
	var d denier
	for i := range ds {
		res := &ds[i].res
		if res.Allowed { // Unknown results are Allowed too
			continue
		}
		if d.zone == nil {
			d.zone = ds[i].zone
		}
		if res.RetryAfter == limiter.Never {
			d.never = true
			d.zone = ds[i].zone
		}
		d.retry = max(d.retry, res.RetryAfter)
	}
	if !d.never {
		d.retry = h.jitter(d.retry)
	}
	return d
}

// jitterShare returns the share of the wait that a Jitter value adds at
// most: a number from 0 to 1 is that share, a whole number from 2 to 100 a
// percentage. Other numbers are refused, since between 1 and 2 (and for
// fractions above 1) a share and a percentage cannot be told apart.
func jitterShare(j float64) (float64, error) {
	switch {
	case j >= 0 && j <= 1:
		return j, nil
	case j >= 2 && j <= 100 && j == math.Trunc(j):
		return j / 100, nil
	}
	return 0, fmt.Errorf("jitter %s is neither a share (0 to 1) nor a whole percentage (2 to 100); "+
		"for a fractional percentage write a share (0.015) or, in the Caddyfile, a percentage (1.5%%)",
		strconv.FormatFloat(j, 'f', -1, 64))
}

// jitter adds up to the handler's jitter share of retry, at random.
func (h *Handler) jitter(retry time.Duration) time.Duration {
	if h.jitterShare <= 0 || retry <= 0 {
		return retry
	}
	return retry + time.Duration(rand.Float64()*h.jitterShare*float64(retry))
}

// deny answers a request that the zones of den denied: the rate limit
// fields, Retry-After for the latest moment any denying zone can admit it,
// and a 429: a handler error, or written here when nothing would see the
// error (see provisionDenialAnswer), in which case it returns nil.
func (h *Handler) deny(w http.ResponseWriter, den denier, ds []zoneDecision, policy string) error {
	first := den.zone
	err, retryAfter := cmp.Or(den.err, first.errDenied), noRetryAfter
	if den.never {
		err = first.errNever
	} else {
		retryAfter = retryAfterSeconds(den.retry)
		for i := range ds {
			if ds[i].res.Banned && ds[i].zone == first {
				err = first.errBanned
				break
			}
		}
	}
	h.headers.write(w.Header(), ds, policy, retryAfter)
	if h.denyAsError {
		return denial(err)
	}
	w.WriteHeader(http.StatusTooManyRequests)
	return nil
}

// provisionDenialAnswer decides how the handler answers a denial.
//
// Returned as a handler error, a denial goes through Caddy's error path:
// the server sets the {http.error.*} placeholders, runs the handle_errors
// routes, logs the error (at debug level below 500) and writes the status.
// That path costs a denial more CPU than the decision itself: before it
// checks the log level, the server encodes the whole request for its
// error logger (zap's lazy With is forced by the duration field added to
// it), and it copies the request for the error's context. So when nothing
// could see the error, the handler writes the status itself, the same
// response Caddy would write: no body, the rate limit fields and
// Retry-After. Something could see it when the server has handle_errors
// routes, when an enclosing subroute has errors routes, when the HTTP app
// counts handler errors in its metrics (caddy_http_request_errors_total),
// or when the logs are at debug level (the server's error log line). The
// handler is provisioned inside its server, so all of this is known here;
// handlers provisioned outside a server (tests) return errors.
func (h *Handler) provisionDenialAnswer(ctx caddy.Context) {
	srv, _ := ctx.Value(caddyhttp.ServerCtxKey).(*caddyhttp.Server)
	asError := srv == nil || srv.Errors != nil && len(srv.Errors.Routes) > 0 ||
		h.logger.Core().Enabled(zapcore.DebugLevel)
	for _, m := range ctx.Modules() {
		switch m := m.(type) {
		case *caddyhttp.App:
			asError = asError || m.Metrics != nil
		case *caddyhttp.Subroute:
			asError = asError || m.Errors != nil && len(m.Errors.Routes) > 0
		}
	}
	h.denyAsError = asError
}

// denial returns the 429 handler error of a denied request. It is what
// caddyhttp.Error builds, less the stack walk for its trace: a flood is
// mostly denials, so they should cost little.
func denial(err error) error {
	return caddyhttp.HandlerError{
		ID:         errorID(),
		StatusCode: http.StatusTooManyRequests,
		Err:        err,
		Trace:      "caddy-fleetlimit.(*Handler).deny",
	}
}

// errorID returns 9 random characters identifying an error in logs, as
// caddyhttp.Error's IDs do.
func errorID() string {
	const alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
	var b [9]byte
	n := rand.Uint64()
	for i := range b {
		b[i] = alphabet[n%36]
		n /= 36
	}
	return string(b[:])
}

// errUnavailable is the error of a request rejected because the store
// failed and a zone's policy is deny.
var errUnavailable = errors.New("rate limit store unavailable; the zone fails closed")

// unavailable answers a request that a zone with the deny policy rejected
// because the store failed: 503, and Retry-After for when the store may be
// back (the circuit breaker's cooldown, at least a second).
func (h *Handler) unavailable(w http.ResponseWriter, ds []zoneDecision) error {
	var retry time.Duration
	for i := range ds {
		if res := &ds[i].res; !res.Allowed {
			retry = max(retry, res.RetryAfter)
		}
	}
	w.Header()["Retry-After"] = []string{strconv.FormatInt(max(1, retryAfterSeconds(retry)), 10)}
	return caddyhttp.Error(http.StatusServiceUnavailable, errUnavailable)
}
