package rls

import (
	"sync"

	"github.com/caddyserver/caddy/v2"

	"github.com/fleetlimit/caddy-fleetlimit/limiter"
	"github.com/fleetlimit/caddy-fleetlimit/observe"
	"github.com/fleetlimit/caddy-fleetlimit/rls/config"
)

// What users see of the service: each rule of the configuration that
// counts is a zone of the observe package, named "rls/" and the rule's key
// ("rls/api.remote_address"), so that the metrics, the statistics and
// dashboard, the denial feed and the key lookup of the admin API show it
// as they show a rate_limit zone. The names come from the configuration
// only, unless a rule asks for the values of calls in its statistics
// (detailed_metric, value_to_metric): such a rule counts in a zone per
// metric key (config.Limit.MetricKey), at most maxDetailedZones. A
// request's own limit (an override) has no zone and is not counted there.

// observed is the observe package's share of one load of the rules.
type observed struct {
	h *observe.Handler
	// zones is the zone of each rule that counts, by its limiter rule.
	zones map[*limiter.Rule]*observe.Zone

	mu sync.Mutex
	// detailed holds the zones of metric keys with values of calls (a
	// rule with detailed_metric or value_to_metric), at most
	// maxDetailedZones; closed is set once the zones are released.
	detailed map[string]*observe.Zone
	closed   bool
}

// maxDetailedZones bounds the zones that the values of calls make (see
// config.Limit.MetricKey), for each load of the rules, as max_keys bounds
// keys: beyond it, such a rule's decisions count in its own zone.
const maxDetailedZones = 1000

// metricKey notes the metric key of request j, whose descriptor's entries
// (c.entries) matched l, when l keeps values of calls in it.
func (c *call) metricKey(l *config.Limit, j int) {
	if l.Override || !l.MetricHasValues() {
		return
	}
	for len(c.mkeys) <= j {
		c.mkeys = append(c.mkeys, "")
	}
	if c.mkeys[j] == "" {
		c.mkeys[j] = l.MetricKey(c.entries)
	}
}

// zoneOf returns the zone that counts request q, whose metric key is mkey
// ("" for a rule without values in it): the metric key's own, while there
// is room for it, else the rule's; nil for a rule without a zone.
func (obs *observed) zoneOf(q *limiter.Request, mkey string) *observe.Zone {
	z := obs.zones[q.Rule]
	if z == nil || mkey == "" {
		return z
	}
	obs.mu.Lock()
	defer obs.mu.Unlock()
	if dz := obs.detailed[mkey]; dz != nil {
		return dz
	}
	if obs.closed || len(obs.detailed) >= maxDetailedZones {
		return z
	}
	dz, err := obs.h.AddZone(q.Rule, observe.ZoneConfig{Name: "rls/" + mkey, Match: mkey, Keys: clientKeys})
	if err != nil {
		return z
	}
	if obs.detailed == nil {
		obs.detailed = make(map[string]*observe.Zone)
	}
	obs.detailed[mkey] = dz
	return dz
}

// observeRules gives the rules of rs their zones, on the store that base
// describes; release them with releaseObserved.
func (rs *rules) observeRules(ctx caddy.Context, base observe.Config) error {
	cfg := base
	var order []*limiter.Rule
	seen := make(map[*limiter.Rule]bool)
	for _, l := range rs.cfg.Limits() {
		r := rs.byLimit[l]
		if r == nil || r.lim == nil || seen[r.lim] {
			continue // unlimited or 0 per unit: nothing counts
		}
		seen[r.lim] = true
		z := observe.ZoneConfig{Name: "rls/" + l.FullKey, Match: l.FullKey, Keys: clientKeys}
		if r.zoneKey != nil {
			zoneKey := r.zoneKey
			z.Keys = func(v string) []string { return []string{zoneKey(v)} }
		}
		order = append(order, r.lim)
		cfg.Rules = append(cfg.Rules, r.lim)
		cfg.Zones = append(cfg.Zones, z)
	}
	h, err := observe.New(ctx, cfg)
	if err != nil {
		return err
	}
	obs := &observed{h: h, zones: make(map[*limiter.Rule]*observe.Zone, len(order))}
	for i, lim := range order {
		obs.zones[lim] = h.Zone(i)
	}
	rs.obs = obs
	return nil
}

// clientKeys returns the bucket key of a descriptor's client key as the
// admin API's key lookup takes it: its entries as the service joins them
// ("user=alice&path=%2Fx"), bounded as the service bounds them.
func clientKeys(v string) []string { return []string{limiter.ClientKey(v)} }

// releaseObserved releases the zones of rs (see observe.Handler.Cleanup).
func (rs *rules) releaseObserved() error {
	if rs == nil || rs.obs == nil {
		return nil
	}
	rs.obs.mu.Lock()
	rs.obs.closed = true
	rs.obs.mu.Unlock()
	return rs.obs.h.Cleanup()
}

// record tells the observe package how the call's requests were decided:
// out is the call's outcome.
func (c *call) record(obs *observed, out limiter.Outcome) {
	if obs == nil || len(c.results) != len(c.reqs) {
		return
	}
	c.ozones, c.oreqs, c.ores = c.ozones[:0], c.oreqs[:0], c.ores[:0]
	for j := range c.reqs {
		var mkey string
		if j < len(c.mkeys) {
			mkey = c.mkeys[j]
		}
		if z := obs.zoneOf(&c.reqs[j], mkey); z != nil {
			c.ozones = append(c.ozones, z)
			c.oreqs = append(c.oreqs, c.reqs[j])
			c.ores = append(c.ores, c.results[j])
		}
	}
	if len(c.ozones) == 0 {
		return
	}
	obs.h.DecidedCall(observe.Call{Method: "ShouldRateLimit", Host: c.req.GetDomain()}, out, c.ozones, c.oreqs, c.ores)
}
