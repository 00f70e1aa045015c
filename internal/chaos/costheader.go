package chaos

import (
	"hash/fnv"
	"math"
	"math/rand/v2"
	"net/http"
	"strconv"
	"time"
)

// Costs known only after the response: some token bucket zones take
// `cost_header X-Tokens-Used`, and the upstream reports in that field (the
// header, or a trailer after the body) a cost of its own choosing for each
// request: often more than the up-front cost, sometimes less, now and then
// 2^63-1. The zone settles the difference after the response, at most its
// burst. The bound then counts each request at its settled cost, with the
// allowance that docs/policies.md names: a key's requests in flight at
// once may each report up to a burst beyond their up-front cost before the
// bucket, in debt, denies the key.

// costHeaderName is the field the upstream reports a request's real cost
// in.
const costHeaderName = "X-Tokens-Used"

// settleLate bounds how long after its response a settlement lands, its
// attempts included (limiter.Settle: 1.25s of waits and three timeouts).
const settleLate = 3 * time.Second

// drawCostHeader gives, from its own stream (features.go), a third of the
// token bucket zones cost_header. Zones the victim, the exempt client's
// twin or a refunded client rely on stay as they are: a cost reported
// beyond the up-front one would deny those clients, which must not be.
func (s *Scenario) drawCostHeader(r *rand.Rand) {
	for zi, z := range s.Zones {
		if z.Algorithm != TokenBucket || len(z.CountStatus) > 0 || s.onVictimTarget(zi) || s.onExemptTarget(zi) || s.onRefundedTarget(zi) {
			continue
		}
		z.CostHeader = r.IntN(3) == 0
	}
}

// onRefundedTarget reports whether zone zi applies to a target of the
// client whose every response count_status gives back.
func (s *Scenario) onRefundedTarget(zi int) bool {
	for _, c := range s.Clients {
		if c.Kind != KindRefunded {
			continue
		}
		for _, t := range c.Targets {
			if hasZone(s.Targets[t], zi) {
				return true
			}
		}
	}
	return false
}

// hasCostHeader reports whether a zone of the scenario has cost_header.
func (s *Scenario) hasCostHeader() bool {
	for _, z := range s.Zones {
		if z.CostHeader {
			return true
		}
	}
	return false
}

// reportedCost is the real cost the upstream reports for the request id,
// and whether in a trailer: a function of the id alone, so that the
// checker knows it too. Mostly 0 to 7, sometimes 34 to 40, one in 32
// 2^63-1.
func reportedCost(id string) (cost int64, trailer bool) {
	h := fnv.New64a()
	_, _ = h.Write([]byte(id))
	x := h.Sum64()
	trailer = x>>8&1 == 1
	switch v := x % 32; {
	case v == 31:
		return math.MaxInt64, trailer
	case v >= 24:
		return 10 + int64(v), trailer
	default:
		return int64(v % 8), trailer
	}
}

// reportCost writes the real cost of the request id into the response:
// the header now, or the trailer's announcement now and the returned
// function writes its value after the body.
func reportCost(w http.ResponseWriter, id string) (after func()) {
	cost, trailer := reportedCost(id)
	v := strconv.FormatInt(cost, 10)
	if !trailer {
		w.Header().Set(costHeaderName, v)
		return func() {}
	}
	w.Header().Set("Trailer", costHeaderName)
	return func() { w.Header().Set(costHeaderName, v) }
}

// settledCost is what zone z charged request q in the end, given its
// up-front cost: the cost the upstream reported, at most the up-front cost
// plus the burst. Where the settlement is uncertain (the client got no
// answer from the upstream, so the proxy may not have read the field; or
// Redis was down while it was to land, and it may have been lost, which
// the documented bound leaves out), the lesser of the two.
func (c *checker) settledCost(z *Zone, q *request, upfront int64) float64 {
	if !z.CostHeader {
		return float64(upfront)
	}
	real, _ := reportedCost(q.id)
	_, burst := c.s.rule(z, q.client)
	settled := upfront
	if real-upfront > burst {
		settled = upfront + burst
	} else {
		settled = real
	}
	if q.status == 0 || !q.fromApp || c.inFault(q.sent, q.done.Add(settleLate), 0, 0, c.redisDown) {
		settled = min(settled, upfront)
	}
	return float64(settled)
}

// costHeaderShare is the allowance named "cost_header in flight": each
// request of the bucket in flight at once may report up to a burst beyond
// its up-front cost before the bucket's debt denies the key. The most in
// flight at once is at most the workers of the bucket's clients.
func (c *checker) costHeaderShare(z *Zone, requests []*request) float64 {
	if !z.CostHeader {
		return 0
	}
	seen := map[*Client]bool{}
	var share float64
	for _, q := range requests {
		if seen[q.client] {
			continue
		}
		seen[q.client] = true
		_, burst := c.s.rule(z, q.client)
		share += float64(q.client.Workers) * float64(burst)
	}
	return share
}
