package fleetlimit

import (
	"net/http"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/fleetlimit/caddy-fleetlimit/limiter"
	"github.com/fleetlimit/caddy-fleetlimit/observe"
)

// The request path: what a request asks of each zone that applies to it
// (its zoneDecision), decided in one go, observed, logged and answered:
// passed on (after a wait, when a zone delays it), denied with 429, or 503
// when the store failed closed.

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
