package fleetlimit

import (
	"cmp"
	"errors"
	"math/rand/v2"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/fleetlimit/caddy-fleetlimit/limiter"
	"github.com/fleetlimit/caddy-fleetlimit/observe"
)

// The request path: a request's zones decided together, then the rate
// limit fields, a denial's answer, a leaky bucket's wait.

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
	ds := sc.decisions[:0]
	ex := h.newExemption(r)
	for _, z := range h.Zones {
		if z.quotaOf != nil {
			// A zone's quota: decided with its zone, on its key and cost.
			if n := len(ds); n > 0 && ds[n-1].zone == z.quotaOf {
				d, err := z.quotaDecision(&ds[n-1], repl)
				if err != nil {
					return false, caddyhttp.Error(http.StatusInternalServerError, err)
				}
				ds = append(ds, d)
			}
			continue
		}
		if len(z.matchers) > 0 {
			ok, err := z.matchers.AnyMatchWithError(r)
			if err != nil {
				return false, caddyhttp.Error(http.StatusInternalServerError, err)
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
		cost, ok := z.costOf(repl)
		if !ok {
			return false, caddyhttp.Error(http.StatusBadRequest, z.errBadCost)
		}
		ap, err := z.applied(repl)
		if err != nil {
			return false, caddyhttp.Error(http.StatusInternalServerError, err)
		}
		reserve, err := z.reserveOf(repl)
		if err != nil {
			return false, caddyhttp.Error(http.StatusInternalServerError, err)
		}
		key := z.keyOf(r, repl)
		if z.lastTier != nil {
			z.lastTier.note(key, ap.tier) // lasttier.go
		}
		ds = append(ds, zoneDecision{zone: z, applied: ap,
			req: limiter.Request{Rule: ap.rule, Key: key, Cost: cost, Reserve: reserve}})
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
	// Before shown() drops the zones a cached denial left unconsulted.
	admitted := outcome == limiter.Allowed || outcome == limiter.LocalAllowed
	var den denier // the zone that answers a denial
	exceeded := ""
	if !admitted && outcome != limiter.FailedOpen && outcome != limiter.FailedClosed {
		den = denierOf(ds)
		exceeded = den.zone.Name
	}
	h.obs.Decided(r, repl, outcome, obs, reqs, results, exceeded)
	h.logDryRuns(r, ds)
	h.logBanStarts(r, ds)
	switch outcome {
	case limiter.FailedOpen:
		return true, nil
	case limiter.FailedClosed:
		return false, h.unavailable(w, ds)
	}
	var place *roomPlace // the request's place in a waiting room
	if admitted {
		if d := delayOf(ds); d != nil {
			if place = d.zone.room.enter(d.req.Key); place == nil {
				// No place for it: turned away, and charged nothing.
				h.giveBack(outcome, ds)
				return false, h.deny(w, r, denier{zone: d.zone, retry: d.res.Delay, err: d.zone.errWaiting}, shown(ds), policyOf(ds))
			}
		}
		sc.hold(outcome, ds)
	}
	// The policy names every enforced zone that applies; the current
	// state only the zones that were consulted.
	policy := h.policy
	if h.varyPolicy || len(ds) != len(h.Zones) {
		policy = policyOf(ds)
	}
	reported := shown(ds)
	if !admitted {
		return false, h.deny(w, r, den, reported, policy)
	}
	h.headers.write(w.Header(), reported, policy, noRetryAfter)
	if place != nil {
		defer place.leave()
		if err := h.wait(w, r, reported, place); err != nil {
			return false, err
		}
	}
	return true, nil
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

// denier is what answers a denied request: the zone whose error it is
// (the first that denied, or one that no wait will satisfy), and the wait
// until every denying zone can admit it.
type denier struct {
	zone  *Zone
	retry time.Duration
	never bool  // a zone's cost exceeds its burst: no wait helps
	err   error // the error, when not the zone's own denial
}

// denierOf returns the denier of a request that zones denied.
func denierOf(ds []zoneDecision) denier {
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
	return d
}

// deny answers a request that the zones of den denied: the rate limit
// fields, Retry-After for the latest moment any denying zone can admit it,
// the log lines of log_denials, and a 429: a handler error, or written
// here when nothing would see the error (see provisionDenialAnswer), in
// which case it returns nil.
func (h *Handler) deny(w http.ResponseWriter, r *http.Request, den denier, ds []zoneDecision, policy string) error {
	first := den.zone
	err, retryAfter := cmp.Or(den.err, first.errDenied), noRetryAfter
	if den.never {
		h.logDenials(r, ds, den.retry)
		err = first.errNever
	} else {
		wait := h.jitter(den.retry)
		h.logDenials(r, ds, wait)
		retryAfter = retryAfterSeconds(wait)
		for i := range ds {
			if ds[i].res.Banned && ds[i].zone == first {
				err = first.errBanned
				break
			}
		}
	}
	h.headers.write(w.Header(), ds, policy, retryAfter)
	if h.denials.asError {
		return denial(err)
	}
	w.WriteHeader(http.StatusTooManyRequests)
	return nil
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

// keyField is a client key as logs carry it: its digest, or with log_key
// the key itself.
func (h *Handler) keyField(key string) zap.Field {
	if h.LogKey {
		return zap.String("key", key)
	}
	return zap.String("key_digest", h.digest.Digest(key))
}

// hdrDelay reports how long a leaky bucket held the request, in
// milliseconds.
const hdrDelay = "X-Ratelimit-Delay"

// errClientGone ends a request whose client left while it waited for its
// turn in a leaky bucket, or for a soft shed's delay.
var errClientGone = errors.New("client went away while waiting for its turn")

// delayOf returns the decision of the zone (a leaky bucket, or a token
// bucket that sheds softly) that delays an admitted request longest; nil
// when none delays it.
func delayOf(ds []zoneDecision) *zoneDecision {
	var longest *zoneDecision
	for i := range ds {
		if ds[i].zone.room != nil && !shedOnlyCounted(&ds[i]) && ds[i].res.Delay > 0 &&
			(longest == nil || ds[i].res.Delay > longest.res.Delay) {
			longest = &ds[i]
		}
	}
	return longest
}

// turnOf returns how long the leaky bucket zones of an admitted request
// delay it: the longest wait no waiting room cuts short.
func turnOf(ds []zoneDecision) time.Duration {
	var turn time.Duration
	for i := range ds {
		if ds[i].req.Rule.Algorithm() == limiter.LeakyBucket {
			turn = max(turn, ds[i].res.Delay)
		}
	}
	return turn
}

// wait holds an admitted request in its place for its turn when a leaky
// bucket zone delayed it (or for its delay, when a zone sheds softly), and
// releases it early if the client goes away: it keeps its charge, unless a
// count_status zone does not count its 499 (see ServeHTTP). When the room
// takes its place back for another key, a soft shed's delay ends there,
// and the request waits only for its leaky buckets' turn, if any.
func (h *Handler) wait(w http.ResponseWriter, r *http.Request, ds []zoneDecision, place *roomPlace) error {
	d := delayOf(ds)
	if d == nil {
		return nil
	}
	delay := d.res.Delay
	w.Header()[hdrDelay] = []string{delayMillis(delay)}
	if ce := h.logger.Check(zap.DebugLevel, "rate limit delayed request"); ce != nil {
		ce.Write(zap.String("zone", d.zone.Name), zap.Duration("delay", delay))
	}
	start := time.Now()
	t := time.NewTimer(delay)
	defer t.Stop()
	cut := place.cut
	for {
		select {
		case <-t.C:
			return nil
		case <-cut:
			waited := time.Since(start)
			turn := turnOf(ds)
			if ce := h.logger.Check(zap.DebugLevel, "rate limit delay cut short for another key's place"); ce != nil {
				ce.Write(zap.String("zone", d.zone.Name), zap.Duration("waited", waited), zap.Duration("turn", turn))
			}
			if waited >= turn {
				w.Header()[hdrDelay] = []string{delayMillis(waited)}
				return nil
			}
			w.Header()[hdrDelay] = []string{delayMillis(turn)}
			t.Reset(turn - waited)
			cut = nil
		case <-r.Context().Done():
			return caddyhttp.Error(499, errClientGone)
		}
	}
}

// delayMillis is a delay in X-RateLimit-Delay: whole milliseconds, rounded
// up.
func delayMillis(d time.Duration) string {
	return strconv.FormatInt(int64((d+time.Millisecond-1)/time.Millisecond), 10)
}
