package fleetlimit

import (
	"context"
	"net/http"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/fleetlimit/caddy-fleetlimit/limiter"
)

// What happens after the response: a concurrency zone releases the request's
// slot, a count_status zone gives back the charge of a response it does not
// count, and a cost_header zone settles the response's real cost
// (costheader.go). All are queued to the store like any decision and never
// hold the response.

// hold records, for an admitted request, what its zones hold until the
// response is written.
func (sc *scratch) hold(outcome limiter.Outcome, ds []zoneDecision) {
	for i := range ds {
		if ds[i].zone.costHeader != "" && settled(&ds[i].res) {
			sc.held, sc.costHeader = true, true
		}
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

// settled reports whether a cost_header zone's real cost is to be settled
// after the response: it was consulted and charged its up-front cost, 0
// included (a dry run that would have denied charged nothing).
func settled(res *limiter.Result) bool {
	return !res.Unknown && !res.DryRun
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
	var costs *costRecorder
	if sc.costHeader {
		costs = newCostRecorder(w, sc.heldList)
		w = costs
	}
	finished := false
	defer func() {
		if costs != nil {
			// Also after a panic (a stream aborted when its client
			// left): what the response reported by then stands, and
			// what it had yet to report is paid for (costUnfinished).
			costs.finish(!finished || r.Context().Err() != nil || r.Method == http.MethodHead)
		}
		status := http.StatusInternalServerError // a panic before any status
		if rec != nil {
			if finished || rec.status != 0 {
				// The status written is the status, whatever followed
				// it: a stream that reverse_proxy aborted (a panic of
				// http.ErrAbortHandler) when its client left mid-body
				// was answered with it.
				status = responseStatus(rec, err)
			}
			if r.Context().Err() != nil && (rec.status == 0 || rec.status == statusClientClosed) {
				// The client left before the upstream's status (Caddy
				// writes 499 for it, or nothing): what the upstream
				// made of the request is unknown.
				status = statusUnknown
			}
		}
		h.release(sc, status, costs)
		*sc = scratch{}
		scratchPool.Put(sc)
	}()
	err = next.ServeHTTP(w, r)
	finished = true
	return err
}

// release gives back what the request's zones held: every concurrency
// zone's slot, and the charge of each count_status zone that does not
// count status; and settles the real cost that the response reported to
// each cost_header zone (costs) that counts it, or its abort charge when
// the response ended before reporting it. It runs in the
// background, bounded by the store's timeout; a failed refund leaves the
// charge (strict) and is counted, a failed settlement is sent again, then
// counted.
func (h *Handler) release(sc *scratch, status int, costs *costRecorder) {
	var reqs, settle []limiter.Request
	var results, settleRes []limiter.Result
	var real []int64
	for i := range sc.heldList {
		q, res, z := &sc.heldList[i].req, &sc.heldList[i].res, sc.heldList[i].zone
		refunded := z.countStatus && status != statusUnknown && !z.counted.has(status)
		if z.costHeader != "" && !refunded && settled(res) {
			n, st := costs.cost(z.costHeader)
			if st == costUnfinished {
				n = unfinishedCost(sc.heldList, i, n)
			}
			if st != costNone {
				settle, settleRes, real = append(settle, *q), append(settleRes, *res), append(real, n)
			}
		}
		if !charged(q, res) {
			continue
		}
		if q.Rule.Algorithm() == limiter.Concurrency || refunded {
			reqs, results = append(reqs, *q), append(results, *res)
		}
	}
	h.refundLater(sc.outcome, reqs, results)
	h.settleLater(sc.outcome, settle, settleRes, real)
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
