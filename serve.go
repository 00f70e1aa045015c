package fleetlimit

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap/zapcore"

	"github.com/fleetlimit/caddy-fleetlimit/limiter"
	"github.com/fleetlimit/caddy-fleetlimit/observe"
)

// The request path: what a request asks of each zone that applies to it,
// decided in one go, and the answer: passed on (after a wait, when a zone
// delays it), denied with 429, or 503 when the store failed closed.

// statusClientClosed is the status logged for a request whose client went
// away before it was decided (nginx's 499, as Caddy's reverse proxy uses).
const statusClientClosed = 499

// maxInlineZones is how many zones a request can have without the handler
// allocating its scratch space.
const maxInlineZones = 8

// zoneDecision is one zone's part in a request's decision: the zone, the
// rule the request applies in it, what was asked of the limiter (rule,
// key, cost, reserve; the slot once decided) and its answer. The zone's
// observer is zone.obs.
type zoneDecision struct {
	zone    *Zone
	applied *appliedRule
	req     limiter.Request
	res     limiter.Result
}

// scratch is the space one request's decision works in, recycled so that
// a decision allocates nothing for it.
type scratch struct {
	decisions [maxInlineZones]zoneDecision
	// The lists that the limiter and the observer take, built from the
	// decisions (see views).
	reqs    [maxInlineZones]limiter.Request
	results [maxInlineZones]limiter.Result
	obs     [maxInlineZones]*observe.Zone

	// A decision, kept for what happens after the response (see hold).
	heldList []zoneDecision
	outcome  limiter.Outcome
	// held: a zone holds something until the response is written (a
	// concurrency slot, a charge that count_status may give back, or one
	// that cost_header settles).
	held, countStatus, costHeader bool
}

// scratchPool recycles the scratch space of decisions.
var scratchPool = sync.Pool{New: func() any { return new(scratch) }}

// views returns the lists that the limiter and the observer take for the
// decisions: their requests, room for their results, and their zones'
// observers (in the scratch arrays, or beyond them).
func (sc *scratch) views(ds []zoneDecision) ([]limiter.Request, []limiter.Result, []*observe.Zone) {
	reqs, results, obs := sc.reqs[:0], sc.results[:0], sc.obs[:0]
	for i := range ds {
		reqs = append(reqs, ds[i].req)
		results = append(results, limiter.Result{})
		obs = append(obs, ds[i].zone.obs)
	}
	return reqs, results, obs
}

// limit decides a request, writes the rate limit fields, and reports
// whether it may pass, or the error that answers it.
func (h *Handler) limit(w http.ResponseWriter, r *http.Request, sc *scratch) (bool, error) {
	repl := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer)
	ds, err := h.decisions(r, repl, sc.decisions[:0])
	if err != nil {
		return false, err
	}
	if len(ds) == 0 {
		return true, nil
	}
	reqs, results, obs := sc.views(ds)
	outcome := h.limiter.Decide(r.Context(), reqs, results)
	if outcome == limiter.Canceled {
		// The client went away before the decision: neither a decision
		// nor a store failure, and nobody to answer.
		return false, caddyhttp.Error(statusClientClosed, r.Context().Err())
	}
	for i := range ds {
		ds[i].req, ds[i].res = reqs[i], results[i] // Decide gives slots to concurrency requests
	}
	admitted := outcome == limiter.Allowed || outcome == limiter.LocalAllowed
	var den denier // the zone that answers a denial
	exceeded := ""
	if !admitted && outcome != limiter.FailedOpen && outcome != limiter.FailedClosed {
		den = h.denierOf(ds)
		exceeded = den.zone.Name
	}
	h.obs.Decided(r, repl, outcome, obs, reqs, results, exceeded)
	h.logDecisions(r, ds, den)
	switch {
	case outcome == limiter.FailedOpen:
		return true, nil
	case outcome == limiter.FailedClosed:
		return false, h.unavailable(w, ds)
	case !admitted:
		return false, h.deny(w, den, shown(ds), h.policyFor(ds))
	}
	return h.admit(w, r, sc, outcome, ds)
}

// decisions appends to ds what a request asks of each zone that applies
// to it: its matchers match, and its exempt lists leave the client in. A
// zone's quota follows its zone, on its key and cost.
func (h *Handler) decisions(r *http.Request, repl *caddy.Replacer, ds []zoneDecision) ([]zoneDecision, error) {
	ex := h.newExemption(r)
	for _, z := range h.Zones {
		if z.quotaOf != nil {
			if n := len(ds); n > 0 && ds[n-1].zone == z.quotaOf {
				d, err := z.quotaDecision(&ds[n-1], repl)
				if err != nil {
					return ds, caddyhttp.Error(http.StatusInternalServerError, err)
				}
				ds = append(ds, d)
			}
			continue
		}
		if len(z.matchers) > 0 {
			ok, err := z.matchers.AnyMatchWithError(r)
			if err != nil {
				return ds, caddyhttp.Error(http.StatusInternalServerError, err)
			}
			if !ok {
				continue
			}
		}
		if ex.of(z) {
			// Left out of the decision: no store call, no fields.
			z.obs.Exempted()
			continue
		}
		d, err := z.decision(r, repl)
		if err != nil {
			return ds, err
		}
		ds = append(ds, d)
	}
	return ds, nil
}

// decision returns what a request asks of the zone: its rule, key, cost
// and reserve. A cost, rule or reserve that its placeholders cannot give
// is the error that answers the request.
func (z *Zone) decision(r *http.Request, repl *caddy.Replacer) (zoneDecision, error) {
	cost, ok := z.costOf(repl)
	if !ok {
		return zoneDecision{}, caddyhttp.Error(http.StatusBadRequest, z.errBadCost)
	}
	ap, err := z.applied(repl)
	if err != nil {
		return zoneDecision{}, caddyhttp.Error(http.StatusInternalServerError, err)
	}
	reserve, err := z.reserveOf(repl)
	if err != nil {
		return zoneDecision{}, caddyhttp.Error(http.StatusInternalServerError, err)
	}
	key := z.keyOf(r, repl)
	if z.lastTier != nil {
		z.lastTier.note(key, ap.tier)
	}
	return zoneDecision{zone: z, applied: ap,
		req: limiter.Request{Rule: ap.rule, Key: key, Cost: cost, Reserve: reserve}}, nil
}

// quotaDecision returns the decision of a zone's quota for a request whose
// zone's decision is zd: the same key and cost.
func (z *Zone) quotaDecision(zd *zoneDecision, repl *caddy.Replacer) (zoneDecision, error) {
	ap, err := z.applied(repl)
	if err != nil {
		return zoneDecision{}, err
	}
	return zoneDecision{zone: z, applied: ap, req: limiter.Request{Rule: ap.rule, Key: zd.req.Key, Cost: zd.req.Cost}}, nil
}

// admit passes an admitted request on: it notes what the request's zones
// hold until its response (scratch.hold), writes the rate limit fields,
// and holds the request for the wait a zone asked. A request that finds no
// place in that zone's waiting room is turned away after all, and charged
// nothing.
func (h *Handler) admit(w http.ResponseWriter, r *http.Request, sc *scratch, outcome limiter.Outcome, ds []zoneDecision) (bool, error) {
	var place *roomPlace // the request's place in a waiting room
	if d := delayOf(ds); d != nil {
		if place = d.zone.room.enter(d.req.Key); place == nil {
			h.refundAll(outcome, ds)
			den := denier{zone: d.zone, retry: h.jitter(d.res.Delay), err: d.zone.errWaiting}
			return false, h.deny(w, den, shown(ds), policyOf(ds))
		}
	}
	sc.hold(outcome, ds)
	reported := shown(ds)
	h.headers.write(w.Header(), reported, h.policyFor(ds), noRetryAfter)
	if place != nil {
		defer place.leave()
		if err := h.wait(w, r, reported, place); err != nil {
			return false, err
		}
	}
	return true, nil
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

// denier is what answers a denied request: the zone whose error it is
// (the first that denied, or one that no wait will satisfy), and the wait
// until every denying zone can admit it (jitter included).
type denier struct {
	zone  *Zone
	retry time.Duration
	never bool  // a zone's cost exceeds its burst: no wait helps
	err   error // the error, when not the zone's own denial
}

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
