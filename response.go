package fleetlimit

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/fleetlimit/caddy-fleetlimit/limiter"
)

// What a request's zones hold until its response is written, and what
// follows it: a concurrency zone's slot released, a count_status zone's
// charge refunded when it does not count the status (statusRecorder), and a
// cost_header zone's real cost settled (costRecorder). All are queued to the
// store like any decision and never hold the response.

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

// statusClientClosed is the status logged for a request whose client went
// away before it was decided (nginx's 499, as Caddy's reverse proxy uses).
const statusClientClosed = 499

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

// refundAll refunds every charge of an admitted request that is not
// passed on after all (a leaky bucket's wait room was full).
func (h *Handler) refundAll(outcome limiter.Outcome, ds []zoneDecision) {
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

// count_status: a zone that counts only responses of some statuses charges
// every request before it passes and gives the charge back once the
// response's status is not one it counts.

// statusSet is a set of HTTP statuses, 100 to 599.
type statusSet [10]uint64

// parseStatusSet parses count_status values: codes (401) and classes (4xx).
func parseStatusSet(vals []string) (statusSet, error) {
	var s statusSet
	if len(vals) == 0 {
		return s, errors.New("count_status needs at least one status code or class (401, 4xx)")
	}
	for _, v := range vals {
		if len(v) == 3 && v[1:] == "xx" && v[0] >= '1' && v[0] <= '5' {
			base := int(v[0]-'0') * 100
			for c := base; c < base+100; c++ {
				s.add(c)
			}
			continue
		}
		n, err := strconv.Atoi(v)
		if err != nil || n < 100 || n > 599 {
			return s, fmt.Errorf("count_status takes status codes from 100 to 599 and classes 1xx to 5xx, got %q", v)
		}
		s.add(n)
	}
	return s, nil
}

func (s *statusSet) add(code int) { s[code/64] |= 1 << (code % 64) }

// has reports whether code is in the set.
func (s *statusSet) has(code int) bool {
	return code >= 0 && code < 640 && s[code/64]&(1<<(code%64)) != 0
}

// statusRecorder remembers the status a response was written with.
type statusRecorder struct {
	*caddyhttp.ResponseWriterWrapper
	status int
}

// WriteHeader records the first final status.
func (w *statusRecorder) WriteHeader(code int) {
	if w.status == 0 && code >= 200 {
		w.status = code
	}
	w.ResponseWriterWrapper.WriteHeader(code)
}

// Write records an implicit 200.
func (w *statusRecorder) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriterWrapper.Write(b)
}

// ReadFrom records an implicit 200 before the body is copied.
func (w *statusRecorder) ReadFrom(r io.Reader) (int64, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriterWrapper.ReadFrom(r)
}

// responseStatus returns the status a request was answered with: the one
// written, else the handler error's (what Caddy's error handling starts
// from), else 200.
func responseStatus(w *statusRecorder, err error) int {
	if w.status != 0 {
		return w.status
	}
	if err != nil {
		if he, ok := errors.AsType[caddyhttp.HandlerError](err); ok && he.StatusCode != 0 {
			return he.StatusCode
		}
		return http.StatusInternalServerError
	}
	return http.StatusOK
}

// cost_header: a zone whose requests' real cost is known only once the
// upstream answered (an LLM's tokens used) admits a request on its up-front
// cost, reads the real cost from a response header (at WriteHeader) or
// trailer (at the end of the body), and settles the difference after the
// response (limiter.Settle). A response that ended before it reported its
// cost settles on the zone's abort charge (unfinishedCost).

// unfinishedCost returns what the request of decision ds[i] pays when its
// response ended before it reported its cost (provisional: what the
// header reported meanwhile, or 0): the larger of that, its up-front cost
// and the zone's abort charge, by default the up-front cost plus the
// zone's burst (a quota beside a rate takes its zone's burst, the
// decision before it; a quota alone its quota). Settle caps it at the
// up-front cost plus the burst.
func unfinishedCost(ds []zoneDecision, i int, provisional int64) int64 {
	d := &ds[i]
	upfront := max(d.req.Cost, 0)
	abort := d.zone.costAbort
	if abort <= 0 {
		burst := d.req.Rule.Burst()
		if q := d.zone.quotaOf; q != nil && i > 0 && ds[i-1].zone == q {
			burst = ds[i-1].req.Rule.Burst()
		}
		abort = satAdd(upfront, burst)
	}
	return max(abort, upfront, provisional)
}

// satAdd returns a + b for non-negative a and b, at most math.MaxInt64.
func satAdd(a, b int64) int64 {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

// parseCost parses a reported cost: a non-negative integer (one too large
// for int64 counts as the largest, which the settlement caps at the
// burst), and false for anything else (the up-front cost then stands).
func parseCost(vals []string) (int64, bool) {
	if len(vals) == 0 {
		return 0, false
	}
	v := strings.TrimSpace(vals[0])
	if v == "" || v[0] == '-' || v[0] == '+' {
		return 0, false
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if errors.Is(err, strconv.ErrRange) {
		return math.MaxInt64, true
	}
	return n, err == nil
}

// costState is what a response told of its real cost.
type costState uint8

const (
	// costNone: the response reported no cost; the up-front cost stands.
	costNone costState = iota
	// costReported: the header or a trailer reported the cost.
	costReported
	// costUnfinished: the response ended before it reported its cost
	// (its client left, its stream was aborted, a trailer it announced
	// never came): the request pays its zone's abort charge.
	costUnfinished
)

// costField is what a response reports in one cost header.
type costField struct {
	name      string   // canonical
	header    []string // its values in the header, as the status was written
	announced bool     // the header announced it as a trailer
	cost      int64    // the cost reported; when unfinished, the header's provisional one (or 0)
	state     costState
}

// costRecorder reads the cost headers of a response's zones: from the
// header when the status is written, and from the trailers once the body
// is (a trailer wins over the header).
type costRecorder struct {
	*caddyhttp.ResponseWriterWrapper
	fields []costField // each zone's cost header once
	wrote  bool        // the header was read
}

// newCostRecorder wraps w to read the cost headers of the zones in ds.
func newCostRecorder(w http.ResponseWriter, ds []zoneDecision) *costRecorder {
	c := &costRecorder{ResponseWriterWrapper: &caddyhttp.ResponseWriterWrapper{ResponseWriter: w}}
	for i := range ds {
		if n := ds[i].zone.costHeader; n != "" && c.index(n) < 0 {
			c.fields = append(c.fields, costField{name: n})
		}
	}
	return c
}

// index returns the position of the cost header name, or -1.
func (c *costRecorder) index(name string) int {
	for i := range c.fields {
		if c.fields[i].name == name {
			return i
		}
	}
	return -1
}

// readHeader reads the costs from the header, once, as it is written.
func (c *costRecorder) readHeader() {
	if c.wrote {
		return
	}
	c.wrote = true
	h := c.Header()
	for i := range c.fields {
		f := &c.fields[i]
		f.header, f.announced = h[f.name], announced(h, f.name)
		if v, ok := parseCost(f.header); ok {
			f.cost, f.state = v, costReported
		}
	}
}

// WriteHeader reads the costs of a final status's header.
func (c *costRecorder) WriteHeader(code int) {
	if code >= 200 {
		c.readHeader()
	}
	c.ResponseWriterWrapper.WriteHeader(code)
}

// Write reads the costs before an implicit 200.
func (c *costRecorder) Write(b []byte) (int, error) {
	c.readHeader()
	return c.ResponseWriterWrapper.Write(b)
}

// ReadFrom reads the costs before the body is copied.
func (c *costRecorder) ReadFrom(r io.Reader) (int64, error) {
	c.readHeader()
	return c.ResponseWriterWrapper.ReadFrom(r)
}

// finish reads the costs that the trailers carry, once the handler has
// returned or panicked, and settles what each field reported: a trailer
// wins over the header. unfinished tells that the body, and so any
// trailer, did not come in full: the client left, the handler panicked
// (reverse_proxy aborts a stream so), or the request is a HEAD (its
// response has no body). Its fields are then costUnfinished unless a
// trailer came, or the header reported the cost and announced no trailer
// to replace it.
func (c *costRecorder) finish(unfinished bool) {
	h := c.Header()
	for i := range c.fields {
		f := &c.fields[i]
		if v, ok := trailerCost(h, f); ok && c.wrote {
			f.cost, f.state = v, costReported
			continue
		}
		if unfinished && (f.state != costReported || f.announced) {
			if f.state != costReported {
				f.cost = 0
			}
			f.state = costUnfinished
		}
	}
}

// trailerCost returns the cost a trailer of field f reported: one set with
// http.TrailerPrefix, or the announced field's values beyond the
// header's (reverse_proxy adds a trailer's values after the header's under
// the same name; a handler may also replace them).
func trailerCost(h http.Header, f *costField) (int64, bool) {
	if v, ok := parseCost(h[http.TrailerPrefix+f.name]); ok {
		return v, true
	}
	if !f.announced {
		return 0, false
	}
	vals := h[f.name]
	switch {
	case len(vals) > len(f.header) && slices.Equal(vals[:len(f.header)], f.header):
		return parseCost(vals[len(f.header):])
	case !slices.Equal(vals, f.header):
		return parseCost(vals)
	}
	return 0, false // the header's values, unchanged: no trailer came
}

// announced reports whether the header h announces the trailer name.
func announced(h http.Header, name string) bool {
	for _, v := range h["Trailer"] {
		for f := range strings.SplitSeq(v, ",") {
			if http.CanonicalHeaderKey(strings.TrimSpace(f)) == name {
				return true
			}
		}
	}
	return false
}

// cost returns what the response reported in the header name: the cost
// and costReported, the header's provisional cost (or 0) and
// costUnfinished, or costNone.
func (c *costRecorder) cost(name string) (int64, costState) {
	if c == nil {
		return 0, costNone
	}
	if i := c.index(name); i >= 0 {
		return c.fields[i].cost, c.fields[i].state
	}
	return 0, costNone
}

// settleLater settles, in the background, the real costs of the zones of
// a request admitted with outcome (limiter.Settle: a charge sent again a
// few times when the store fails, then counted as lost).
func (h *Handler) settleLater(outcome limiter.Outcome, reqs []limiter.Request, results []limiter.Result, real []int64) {
	if len(reqs) == 0 {
		return
	}
	go func() {
		for i := range reqs {
			st, err := h.limiter.Settle(context.Background(), outcome, reqs[i], results[i], real[i])
			if err != nil {
				if ce := h.logger.Check(zap.DebugLevel, "rate limit settlement not applied"); ce != nil {
					ce.Write(zap.String("zone", reqs[i].Rule.Name()), zap.Int64("tokens", st.Tokens),
						zap.Int("attempts", st.Attempts), zap.Error(err))
				}
			}
		}
	}()
}
