package fleetlimit

import (
	"sync"
	"time"

	"github.com/fleetlimit/caddy-fleetlimit/limiter"
	"github.com/fleetlimit/caddy-fleetlimit/observe"
)

// A request's state: what it asks of each zone and the limiter's answer
// (zoneDecision), the zone that answers a denial (denier), and the space
// its decision works in (scratch).

// maxInlineZones is how many zones a request can have without the handler
// allocating its scratch space.
const maxInlineZones = 8

// zoneDecision is one zone's part in a request's decision: the zone, the
// rule the request applies in it, what was asked of the limiter (rule,
// key, cost, reserve; the slot once decided) and its answer. The zone's
// observer is zone.obs.
type zoneDecision struct {
	zone    *Zone
	applied *appliedRule
	req     limiter.Request
	res     limiter.Result
}

// denier is what answers a denied request: the zone whose error it is
// (the first that denied, or one that no wait will satisfy), and the wait
// until every denying zone can admit it (jitter included).
type denier struct {
	zone  *Zone
	retry time.Duration
	never bool  // a zone's cost exceeds its burst: no wait helps
	err   error // the error, when not the zone's own denial
}

// scratch is the space one request's decision works in, recycled so that
// a decision allocates nothing for it.
type scratch struct {
	decisions [maxInlineZones]zoneDecision
	// The lists that the limiter and the observer take, built from the
	// decisions (see views).
	reqs    [maxInlineZones]limiter.Request
	results [maxInlineZones]limiter.Result
	obs     [maxInlineZones]*observe.Zone

	// A decision, kept for what happens after the response (see hold).
	heldList []zoneDecision
	outcome  limiter.Outcome
	// held: a zone holds something until the response is written (a
	// concurrency slot, a charge that count_status may give back, or one
	// that cost_header settles).
	held, countStatus, costHeader bool
}

// scratchPool recycles the scratch space of decisions.
var scratchPool = sync.Pool{New: func() any { return new(scratch) }}
