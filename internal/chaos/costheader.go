package chaos

import (
	"cmp"
	"fmt"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/fleetlimit/caddy-fleetlimit/internal/localfleet"
)

// Costs known only after the response: cost_header zones, and an upstream
// that reports each request's cost in a header or a trailer; the bound
// counts each request at its settled cost (docs/design.md, "Costs known
// after the response").

// costHeaderName is the field the upstream reports a request's real cost
// in.
const costHeaderName = "X-Tokens-Used"

// settleLate bounds how long after its response a settlement lands, its
// attempts included (limiter.Settle: 1.25s of waits and three timeouts).
const settleLate = 3 * time.Second

// drawCostHeader gives, from its own stream, a third of the
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

// costHeaderLine is the zone's cost_header subdirective.
func (z *Zone) costHeaderLine() string {
	if z.CostAbort > 0 {
		return fmt.Sprintf("cost_header %s abort %d", costHeaderName, z.CostAbort)
	}
	return "cost_header " + costHeaderName
}

// costSummary describes a zone's cost_header for Summary: "" for none.
func costSummary(z *Zone) string {
	switch {
	case !z.CostHeader:
		return ""
	case z.CostAbort > 0:
		return "+cost_header/abort" + strconv.FormatInt(z.CostAbort, 10)
	}
	return "+cost_header"
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

// decoyCost is what an upstream that reports a cost both ways sends in the
// header before the trailer that carries the real cost: nothing, as an
// answer that has not counted its tokens yet would (and as a client that
// wants the header read first would like).
const decoyCost = 0

// costReport is how the upstream reports each request's real cost: on
// says it does, both that a cost it sends in a trailer it also sends, as
// decoyCost, in the header first.
type costReport struct{ on, both bool }

// upstreamCosts is how the scenario's upstream reports costs: where a zone
// has cost_header, and both ways when the scenario drew it.
func (s *Scenario) upstreamCosts() costReport {
	return costReport{on: s.hasCostHeader(), both: s.HeaderAndTrailer}
}

// report writes the real cost of the request id into the response: the
// header now, or the trailer's announcement now (with the decoy header of
// an upstream that reports both ways) and the returned function writes
// its value after the body.
func (cr costReport) report(w http.ResponseWriter, id string) (after func()) {
	cost, trailer := reportedCost(id)
	v := strconv.FormatInt(cost, 10)
	if !trailer {
		w.Header().Set(costHeaderName, v)
		return func() {}
	}
	w.Header().Set("Trailer", costHeaderName)
	if cr.both {
		w.Header().Set(costHeaderName, strconv.Itoa(decoyCost))
	}
	return func() { w.Header().Set(costHeaderName, v) }
}

// drawCostReport makes, from its own stream, half the
// upstreams of scenarios with a cost_header zone report a cost sent in a
// trailer also in the header first, as decoyCost (the trailer's value is
// the one charged), and gives half the cost_header zones an abort of 1 to
// 60 tokens (below, within and beyond what a settlement may charge).
func (s *Scenario) drawCostReport(r *rand.Rand) {
	s.HeaderAndTrailer = s.hasCostHeader() && r.IntN(2) == 0
	for _, z := range s.Zones {
		if z.CostHeader && r.IntN(2) == 0 {
			z.CostAbort = 1 + r.Int64N(60)
		}
	}
}

// settlementsLost waits for the settlements of the load's last responses
// to land, and returns the tokens each zone's settlements lost (the store
// failed every attempt), summed over the nodes' metrics: what the bound's
// allowance "settlements lost" counts.
func (s *Scenario) settlementsLost(nodes []*localfleet.Node, waited time.Duration) map[string]float64 {
	if !s.hasCostHeader() {
		return nil
	}
	if waited < settleLate {
		time.Sleep(settleLate - waited)
	}
	lost := map[string]float64{}
	for _, n := range nodes {
		m, err := n.Metrics()
		if err != nil {
			continue // a node down: its uncounted losses are the kill's (settledCost)
		}
		for zone, v := range m.By("zone", "caddy_rate_limit_settled_tokens_total", "result", "lost") {
			lost[zone] += v
		}
	}
	return lost
}

// settledCost is what zone z charged request q in the end, given its
// up-front cost: the cost the upstream reported (or, for a stream cut
// before the trailer that carried it, the zone's abort cost), at most the
// up-front cost plus the burst. Where the settlement is uncertain, the
// lesser of the two: the client got no answer from the upstream (the proxy
// may not have read the field), or a node was killed while it was to land
// (a process that dies loses its queued settlements, and its count of lost
// ones; a run with a kill treats Redis' faults so too). A settlement the
// store lost in a Redis fault is counted in the metrics, and allowed for by
// settleLostShare.
func (c *checker) settledCost(z *Zone, q *request, upfront int64) float64 {
	if !z.CostHeader {
		return float64(upfront)
	}
	_, burst := c.s.rule(z, q.client)
	return c.settled(z, q, upfront, burst)
}

// settledQuota is what a cost_header zone's quota counted of request q in
// the end: as settledCost, the difference capped at the quota.
func (c *checker) settledQuota(z *Zone, q *request, upfront int64) float64 {
	if !z.CostHeader {
		return float64(upfront)
	}
	return c.settled(z, q, upfront, z.Quota)
}

// settled is what a cost_header zone settled request q at, its reported
// cost beyond upfront capped at most: the least of what it may have
// settled (costs), or of that and upfront where the settlement itself is
// uncertain.
func (c *checker) settled(z *Zone, q *request, upfront, most int64) float64 {
	settled := int64(math.MaxInt64)
	for _, real := range c.costs(z, q, upfront) {
		if real-upfront > most {
			real = upfront + most
		}
		settled = min(settled, real)
	}
	if q.status == 0 || !q.fromApp || c.inFault(q.sent, q.done.Add(settleLate), 0, 0, c.settleLoss) {
		settled = min(settled, upfront)
	}
	return float64(settled)
}

// costs returns the costs zone z may have read for request q (of up-front
// cost upfront), before any cap: the one the upstream reported, or, where
// it was to come in a trailer that never reached the proxy (a stream cut
// by its client's leaving, a HEAD), the zone's abort charge; both where the
// checker cannot tell which the proxy saw (a stream whose client was to
// hang up but whose proxy did not notice in time, or one its client did
// not read whole).
func (c *checker) costs(z *Zone, q *request, upfront int64) []int64 {
	real, trailer := reportedCost(q.id)
	if !trailer {
		return []int64{real} // read with the status, which the client saw
	}
	abort := c.abortCharge(z, q, upfront)
	switch end := c.o.seen[q.id].end; {
	case end == streamCut || q.head:
		return []int64{abort}
	case end == streamLate || q.err != "":
		return []int64{real, abort}
	}
	return []int64{real}
}

// abortCharge is what a cost_header zone charges request q, of up-front
// cost upfront, whose cost was to come in a trailer that never came, as
// docs/policies.md says: the larger of the zone's abort, the up-front cost
// and what the header reported meanwhile (the decoy of an upstream that
// reports both ways), and by default the most a settlement charges, the
// up-front cost plus the burst (the bucket's, for the zone's quota too).
func (c *checker) abortCharge(z *Zone, q *request, upfront int64) int64 {
	abort := z.CostAbort
	if abort <= 0 {
		_, burst := c.s.rule(z, q.client)
		abort = upfront + burst
	}
	provisional := int64(0)
	if c.s.HeaderAndTrailer {
		provisional = decoyCost
	}
	return max(abort, upfront, provisional)
}

// quotaSettleShare is the allowance of a cost_header zone's quota: what the
// requests in flight at once settled beyond their up-front costs (see
// costHeaderShare), and the tokens of the quota's settlements the nodes
// counted as lost (its zone `<name>.quota`).
func (c *checker) quotaSettleShare(z *Zone, requests []*request) float64 {
	if !z.CostHeader {
		return 0
	}
	return c.inFlightExcess(requests, func(q *request, upfront int64) float64 {
		return c.settledQuota(z, q, upfront) - float64(upfront)
	}, z) + c.o.settleLost[z.Name+".quota"]
}

// settleLoss matches the faults whose lost settlements no metric counts:
// a node killed, and Redis' faults in a run with one.
func (c *checker) settleLoss(kind string) bool {
	if kind == FaultNodeKill {
		return true
	}
	if !c.redisDown(kind) {
		return false
	}
	for _, w := range c.o.windows {
		if w.kind == FaultNodeKill {
			return true
		}
	}
	return false
}

// settleLostShare is the allowance named "settlements lost": the tokens
// of zone z's settlements that the store lost, counted by the nodes (a
// zone's, whichever bucket they were of).
func (c *checker) settleLostShare(z *Zone) float64 {
	if !z.CostHeader {
		return 0
	}
	return c.o.settleLost[z.Name]
}

// settleLag is how long after its response a settlement is taken to land
// outside Redis' faults (inside them: settleLate).
const settleLag = 200 * time.Millisecond

// costHeaderShare is the allowance named "cost_header in flight": a request
// admitted while others of its bucket are in flight (admitted, their
// settlements not landed yet) finds room for their up-front costs only,
// and each of those then settles what it cost beyond (at most a burst: the
// documented bound allows a burst per request in flight). So the bound
// holds with, more, the most that the bucket's requests in flight at once
// settled beyond their up-front costs, each counted from its sending until
// its settlement lands (settleLag after its answer, settleLate in a Redis
// fault).
func (c *checker) costHeaderShare(z *Zone, requests []*request) float64 {
	if !z.CostHeader {
		return 0
	}
	return c.inFlightExcess(requests, func(q *request, upfront int64) float64 {
		return c.settledCost(z, q, upfront) - float64(upfront)
	}, z)
}

// inFlightExcess returns the most that requests in flight at once settled
// beyond their up-front costs (excess), each counted from its sending until
// its settlement lands (settleLag after its answer, settleLate in a Redis
// fault).
func (c *checker) inFlightExcess(requests []*request, excessOf func(q *request, upfront int64) float64, z *Zone) float64 {
	type edge struct {
		at     time.Time
		excess float64
	}
	var edges []edge
	for _, q := range requests {
		if _, ok := c.o.seen[q.id]; !ok {
			continue
		}
		upfront := q.cost
		if z.Cost > 0 {
			upfront = z.Cost
		}
		excess := excessOf(q, upfront)
		if excess <= 0 {
			continue
		}
		end := q.done.Add(settleLag)
		if c.inFault(q.sent, q.done.Add(settleLate), 0, 0, c.redisDown) {
			end = q.done.Add(settleLate)
		}
		edges = append(edges, edge{q.sent, excess}, edge{end, -excess})
	}
	slices.SortFunc(edges, func(a, b edge) int {
		if d := a.at.Compare(b.at); d != 0 {
			return d
		}
		return cmp.Compare(b.excess, a.excess) // starts before ends: overlaps count
	})
	var in, most float64
	for _, e := range edges {
		in += e.excess
		most = max(most, in)
	}
	return most
}
