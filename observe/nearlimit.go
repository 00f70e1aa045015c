package observe

import "github.com/fleetlimit/caddy-fleetlimit/limiter"

// Near-limit figures: admitted requests that left their bucket nearly
// empty, so that an alert can fire before denials start.

// nearLimitFifths is the share of a bucket's capacity, in fifths, below
// which an admitted request counts as near the limit: less than 20% left.
const nearLimitFifths = 1

// nearLimit reports whether a request admitted by rule left the bucket
// less than nearLimitFifths fifths of its capacity: the burst of a token or
// leaky bucket, the limit of a window or of a concurrency zone. Integer
// arithmetic: remaining < capacity/5 exactly.
func nearLimit(rule *limiter.Rule, res *limiter.Result) bool {
	c := rule.Burst()
	return c > 0 && res.Remaining*5 < c*nearLimitFifths
}

// Exempted counts a request the zone left alone because its client is
// exempt: the outcome `exempt` in the metrics and the stats. The handler
// calls it instead of deciding the zone.
func (z *Zone) Exempted() {
	if z.stats != nil {
		z.stats.exempted()
	}
}
