package fleetlimit

import (
	"context"
	"net/http"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/fleetlimit/caddy-fleetlimit/limiter"
)

// What happens after the response: a concurrency zone releases the request's
// slot, and a count_status zone gives back the charge of a response it
// does not count. Both are queued to the store like any decision and never
// hold the response.

// hold records, for an admitted request, what its zones hold until the
// response is written.
func (sc *scratch) hold(outcome limiter.Outcome, ds []zoneDecision) {
	for i := range ds {
		if !charged(&ds[i].req, &ds[i].res) {
			continue
		}
		if ds[i].req.Rule.Algorithm() == limiter.Concurrency {
			sc.held = true
		}
		if ds[i].zone.countStatus {
			sc.held, sc.countStatus = true, true
		}
	}
	if sc.held {
		sc.outcome, sc.heldList = outcome, ds
	}
}

// charged reports whether an admitted request's zone was charged: it was
// consulted, and is not a dry run that would have denied (it charges
// nothing then).
func charged(q *limiter.Request, res *limiter.Result) bool {
	return !res.Unknown && !res.DryRun && q.Cost > 0
}

// statusUnknown is the status of a request passed on whose client left
// before any status was written: a count_status zone keeps its charge
// (strict: the upstream may have done the work, and a client must not get
// work for free by hanging up).
const statusUnknown = -1

// serveHeld passes on a request whose zones hold something until its
// response is written, and then releases it, whatever happens: an error,
// a panic, a client that went away.
func (h *Handler) serveHeld(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler, sc *scratch) (err error) {
	var rec *statusRecorder
	if sc.countStatus {
		rec = &statusRecorder{ResponseWriterWrapper: &caddyhttp.ResponseWriterWrapper{ResponseWriter: w}}
		w = rec
	}
	finished := false
	defer func() {
		status := http.StatusInternalServerError // a panic
		if rec != nil && finished {
			status = responseStatus(rec, err)
			if r.Context().Err() != nil && (rec.status == 0 || rec.status == statusClientClosed) {
				// The client left before the upstream's status (Caddy
				// writes 499 for it, or nothing): what the upstream
				// made of the request is unknown.
				status = statusUnknown
			}
		}
		h.release(sc, status)
		*sc = scratch{}
		scratchPool.Put(sc)
	}()
	err = next.ServeHTTP(w, r)
	finished = true
	return err
}

// release gives back what the request's zones held: every concurrency
// zone's slot, and the charge of each count_status zone that does not
// count status. It runs in the background, bounded by the store's
// timeout; a failure leaves the charge (strict) and is counted.
func (h *Handler) release(sc *scratch, status int) {
	var reqs []limiter.Request
	var results []limiter.Result
	for i := range sc.heldList {
		q, res, z := &sc.heldList[i].req, &sc.heldList[i].res, sc.heldList[i].zone
		if !charged(q, res) {
			continue
		}
		if q.Rule.Algorithm() == limiter.Concurrency || (z.countStatus && status != statusUnknown && !z.counted.has(status)) {
			reqs, results = append(reqs, *q), append(results, *res)
		}
	}
	h.refundLater(sc.outcome, reqs, results)
}

// giveBack gives back every charge of an admitted request that is not
// passed on after all (a leaky bucket's wait room was full).
func (h *Handler) giveBack(outcome limiter.Outcome, ds []zoneDecision) {
	var reqs []limiter.Request
	var results []limiter.Result
	for i := range ds {
		if charged(&ds[i].req, &ds[i].res) {
			reqs, results = append(reqs, ds[i].req), append(results, ds[i].res)
		}
	}
	h.refundLater(outcome, reqs, results)
}

// refundLater refunds reqs in the background, bounded by the store's
// timeout; a failure leaves the charge (strict) and is counted.
func (h *Handler) refundLater(outcome limiter.Outcome, reqs []limiter.Request, results []limiter.Result) {
	if len(reqs) == 0 {
		return
	}
	go func() {
		if err := h.limiter.Refund(context.Background(), outcome, reqs, results); err != nil {
			if ce := h.logger.Check(zap.DebugLevel, "rate limit refund dropped; the charge stays"); ce != nil {
				ce.Write(zap.String("zone", reqs[0].Rule.Name()), zap.Error(err))
			}
		}
	}()
}
