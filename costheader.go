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

// cost_header: a token bucket zone whose requests' real cost is known only
// once the upstream answered (an LLM's tokens used) admits a request on its
// up-front cost, reads the real cost from a response header (at
// WriteHeader) or trailer (at the end of the body), and settles the
// difference after the response (limiter.Settle): one more store call,
// queued like a refund, never on the response's path. A response that
// ended before it reported its cost (its client left, its stream was
// aborted, a HEAD) settles on the zone's abort charge (unfinishedCost).

// checkCostHeader checks a zone's cost_header: a header field name, on a
// token bucket zone or a quota.
func checkCostHeader(name string, alg limiter.Algorithm) error {
	if alg != limiter.TokenBucket && alg != limiter.Quota {
		return fmt.Errorf("cost_header applies to token_bucket zones and quotas only, not %s: only a bucket or a quota can owe what a response cost beyond its up-front cost", alg)
	}
	if !validFieldName(name) {
		return fmt.Errorf("cost_header %q is not a header field name", name)
	}
	return nil
}

// checkCostHeaderAbort checks a zone's abort charge: a positive number of
// tokens, on a zone with cost_header (0: the default).
func checkCostHeaderAbort(name string, abort int64) error {
	switch {
	case abort < 0:
		return fmt.Errorf("cost_header_abort must be a positive number of tokens, got %d", abort)
	case abort > 0 && name == "":
		return errors.New("cost_header_abort applies to a zone with cost_header")
	}
	return nil
}

// costHeaderName returns the response field the zone reads its real cost
// from: its own cost_header, or, for a quota beside a rate, its zone's.
func (z *Zone) costHeaderName() string {
	if z.quotaOf != nil {
		return z.quotaOf.CostHeader
	}
	return z.CostHeader
}

// costHeaderAbort returns the zone's abort charge: its own
// CostHeaderAbort, or, for a quota beside a rate, its zone's.
func (z *Zone) costHeaderAbort() int64 {
	if z.quotaOf != nil {
		return z.quotaOf.CostHeaderAbort
	}
	return z.CostHeaderAbort
}

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

// validFieldName reports whether s is an HTTP field name (RFC 9110's token).
func validFieldName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return true
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
