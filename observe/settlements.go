package observe

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/fleetlimit/caddy-fleetlimit/limiter"
)

// Settlements of cost_header zones (limiter.Settle): counted per zone in
// the stats and in
//
//	caddy_rate_limit_settlements_total{zone,result}        counter
//	caddy_rate_limit_settled_tokens_total{zone,result}     counter
//
// where result is charged, refunded or lost (the store failed every
// attempt of a charge, or the one of a refund). They are not resolved per
// zone in advance: settlements are not on the request path.

// The results of a settlement, as labelled.
var settleResults = [3]string{"charged", "refunded", "lost"}

// settleResult returns the label of a settlement of tokens that failed
// with err (nil: applied).
func settleResult(tokens int64, err error) string {
	switch {
	case err != nil:
		return settleResults[2]
	case tokens < 0:
		return settleResults[1]
	}
	return settleResults[0]
}

// newSettleMetrics returns the settlement counters (see initMetrics).
func newSettleMetrics() (settlements, tokens *prometheus.CounterVec) {
	return newCounterVec("settlements_total",
			"Settlements of cost_header zones after the response, per zone, by result: charged (the real cost exceeded the up-front one), refunded (it fell short), or lost (the store failed every attempt).",
			"zone", "result"),
		newCounterVec("settled_tokens_total",
			"Tokens that cost_header zones settled after the response, per zone, by result: charged, refunded, or lost.",
			"zone", "result")
}

// deleteSettleSeries deletes a zone's settlement series.
func deleteSettleSeries(zone string) {
	for _, r := range settleResults {
		metrics.settlements.DeleteLabelValues(zone, r)
		metrics.settledTokens.DeleteLabelValues(zone, r)
	}
}

// settledOne counts a settlement of the zone.
func (z *zoneStats) settledOne(tokens int64, err error) {
	if err != nil {
		z.settlementsLost.Add(1)
	} else {
		z.settlements.Add(1)
	}
	result := settleResult(tokens, err)
	metrics.settlements.WithLabelValues(z.name, result).Inc()
	metrics.settledTokens.WithLabelValues(z.name, result).Add(float64(max(tokens, -tokens)))
}

// Settled counts a zone's settlement (limiter.SettleObserver).
func (o *limiterObserver) Settled(rule *limiter.Rule, tokens int64, err error) {
	if z := o.zoneOf(rule); z != nil {
		z.settledOne(tokens, err)
	}
}

// Interface guard.
var _ limiter.SettleObserver = (*limiterObserver)(nil)
