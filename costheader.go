package fleetlimit

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
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
// queued like a refund, never on the response's path.

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

// costHeaderName returns the response field the zone reads its real cost
// from: its own cost_header, or, for a quota beside a rate, its zone's.
func (z *Zone) costHeaderName() string {
	if z.quotaOf != nil {
		return z.quotaOf.CostHeader
	}
	return z.CostHeader
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

// costRecorder reads the cost headers of a response's zones: from the
// header when the status is written, and from the trailers once the body
// is (a trailer wins over the header).
type costRecorder struct {
	*caddyhttp.ResponseWriterWrapper
	names []string // the zones' cost headers, canonical, each once
	costs []int64  // per name: the cost reported
	found []bool   // per name: whether one was
	wrote bool     // the header was read
}

// newCostRecorder wraps w to read the cost headers of the zones in ds.
func newCostRecorder(w http.ResponseWriter, ds []zoneDecision) *costRecorder {
	c := &costRecorder{ResponseWriterWrapper: &caddyhttp.ResponseWriterWrapper{ResponseWriter: w}}
	for i := range ds {
		if n := ds[i].zone.costHeader; n != "" && c.index(n) < 0 {
			c.names = append(c.names, n)
		}
	}
	c.costs, c.found = make([]int64, len(c.names)), make([]bool, len(c.names))
	return c
}

// index returns the position of the cost header name, or -1.
func (c *costRecorder) index(name string) int {
	for i, n := range c.names {
		if n == name {
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
	for i, n := range c.names {
		c.costs[i], c.found[i] = parseCost(h[n])
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

// readTrailers reads the costs that the trailers carry, once the handler
// has returned (or panicked: a stream aborted): a field set with
// http.TrailerPrefix, or one that the header announced in Trailer.
func (c *costRecorder) readTrailers() {
	if !c.wrote {
		return // no response: the up-front cost stands
	}
	h := c.Header()
	for i, n := range c.names {
		if v, ok := parseCost(h[http.TrailerPrefix+n]); ok {
			c.costs[i], c.found[i] = v, true
		} else if announced(h, n) {
			if v, ok := parseCost(h[n]); ok {
				c.costs[i], c.found[i] = v, true
			}
		}
	}
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

// cost returns the real cost reported in the header name, and whether
// one was.
func (c *costRecorder) cost(name string) (int64, bool) {
	if c == nil {
		return 0, false
	}
	if i := c.index(name); i >= 0 && c.found[i] {
		return c.costs[i], true
	}
	return 0, false
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
