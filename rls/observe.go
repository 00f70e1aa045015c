package rls

import (
	"slices"
	"strings"
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
// metric key (config.Limit.MetricKey). A request's own limit (an
// override) counts in a zone named, as the reference names its statistics,
// by the domain and the descriptor, but by its entries' keys alone, never
// their values ("rls/api.remote_address/override"; see overrideZoneName),
// with the limits that calls gave it as its tiers. The zones that calls
// make (metric keys with values, overrides) are at most maxCallZones per
// load of the rules: beyond, a metric key counts in its rule's zone, and
// an override in its domain's ("rls/api/override").

// observed is the observe package's share of one load of the rules.
type observed struct {
	h *observe.Handler
	// zones is the zone of each rule that counts, by its limiter rule.
	zones map[*limiter.Rule]*observe.Zone

	mu sync.Mutex
	// detailed holds the zones of metric keys with values of calls (a
	// rule with detailed_metric or value_to_metric), overrides those of
	// requests' own limits by name, the domains' among them; made counts
	// the zones of both that count towards maxCallZones; closed is set
	// once the zones are released.
	detailed  map[string]*observe.Zone
	overrides map[string]*overrideZone
	made      int
	closed    bool
}

// maxCallZones bounds the zones that calls make, the values of calls (see
// config.Limit.MetricKey) and requests' own limits together, for each load
// of the rules, as max_keys bounds keys: beyond it, a rule's decisions
// count in its own zone, and an override's in its domain's.
const maxCallZones = 1000

// overrideZone is the zone of requests' own limits of one name, and the
// limits that applied there: the tiers the key lookup reads a key under.
type overrideZone struct {
	zone  *observe.Zone
	tiers []*limiter.Rule // at most maxOverrideTiers, under observed.mu
}

// maxOverrideTiers bounds the limits an override zone keeps for the key
// lookup: beyond, a new limit is counted in the zone but not listed.
const maxOverrideTiers = 16

// metricKey notes the metric key of request j, whose descriptor's entries
// (c.entries) matched l, when l keeps values of calls in it, or, for a
// request's own limit, its zone's name.
func (c *call) metricKey(l *config.Limit, j int) {
	if l.Override {
		for len(c.onames) <= j {
			c.onames = append(c.onames, "")
		}
		if c.onames[j] == "" {
			c.onames[j] = overrideZoneName(l.Domain, c.entries)
		}
		return
	}
	if !l.MetricHasValues() {
		return
	}
	for len(c.mkeys) <= j {
		c.mkeys = append(c.mkeys, "")
	}
	if c.mkeys[j] == "" {
		c.mkeys[j] = l.MetricKey(c.entries)
	}
}

// overrideZoneName returns the zone name of a request's own limit in
// domain on a descriptor of entries: "rls/", the domain and the entries'
// keys joined by dots, as the reference's statistics name an override but
// without the values, and "/override" ("rls/api.remote_address/override").
// Each key is bounded as client keys are (limiter.ClientKey), and there
// are at most max_entries of them.
func overrideZoneName(domain string, entries []config.Entry) string {
	var buf [128]byte
	name := append(append(buf[:0], "rls/"...), domain...)
	for _, e := range entries {
		name = append(append(name, '.'), limiter.ClientKey(e.Key)...)
	}
	return string(append(name, "/override"...))
}

// domainOverrideName returns the name of the zone where a domain's
// overrides count once the zones of calls reach maxCallZones.
func domainOverrideName(domain string) string { return "rls/" + domain + "/override" }

// zoneOf returns the zone that counts request q of a call in domain, whose
// metric key is mkey ("" for a rule without values in it) and whose
// override zone is named oname ("" for a rule of the configuration): the
// metric key's own, while there is room for it, else the rule's; for a
// request's own limit (a rule without a zone of its own) the override's;
// nil for a rule without a zone.
func (obs *observed) zoneOf(q *limiter.Request, domain, mkey, oname string) *observe.Zone {
	z := obs.zones[q.Rule]
	if z == nil && oname != "" {
		return obs.overrideZone(q.Rule, domain, oname)
	}
	if z == nil || mkey == "" {
		return z
	}
	obs.mu.Lock()
	defer obs.mu.Unlock()
	if dz := obs.detailed[mkey]; dz != nil {
		return dz
	}
	if obs.closed || obs.made >= maxCallZones {
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
	obs.made++
	return dz
}

// overrideZone returns the zone named name that counts a request's own
// limit rule in domain, making it on first use (its domain's once the
// zones of calls reach maxCallZones), and notes rule among its tiers; nil
// once the zones are released.
func (obs *observed) overrideZone(rule *limiter.Rule, domain, name string) *observe.Zone {
	obs.mu.Lock()
	defer obs.mu.Unlock()
	if obs.closed {
		return nil
	}
	oz := obs.overrides[name]
	if oz == nil && obs.made >= maxCallZones {
		name = domainOverrideName(domain)
		oz = obs.overrides[name]
	}
	if oz == nil {
		oz = &overrideZone{}
		z, err := obs.h.AddZone(rule, observe.ZoneConfig{Name: name, Match: strings.TrimPrefix(name, "rls/"), Keys: clientKeys,
			Rules: func() []*limiter.Rule { return obs.tiersOf(oz) }, LastRule: func(string) *limiter.Rule { return obs.onlyTier(oz) }})
		if err != nil {
			return nil
		}
		oz.zone = z
		if obs.overrides == nil {
			obs.overrides = make(map[string]*overrideZone)
		}
		obs.overrides[name] = oz
		if name != domainOverrideName(domain) {
			obs.made++
		}
	}
	oz.note(rule)
	return oz.zone
}

// note adds rule to the zone's tiers unless a limit of the same bucket,
// rate and period is there, or there are maxOverrideTiers.
func (oz *overrideZone) note(rule *limiter.Rule) {
	for _, r := range oz.tiers {
		if r == rule || r.Bucket() == rule.Bucket() && r.Rate() == rule.Rate() && r.Per() == rule.Per() {
			return
		}
	}
	if len(oz.tiers) < maxOverrideTiers {
		oz.tiers = append(oz.tiers, rule)
	}
}

// tiersOf returns a copy of an override zone's tiers.
func (obs *observed) tiersOf(oz *overrideZone) []*limiter.Rule {
	obs.mu.Lock()
	defer obs.mu.Unlock()
	return slices.Clone(oz.tiers)
}

// onlyTier returns the limit that applied last to every key of an
// override zone, which is known only while it has one; nil otherwise.
func (obs *observed) onlyTier(oz *overrideZone) *limiter.Rule {
	obs.mu.Lock()
	defer obs.mu.Unlock()
	if len(oz.tiers) == 1 {
		return oz.tiers[0]
	}
	return nil
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
		var mkey, oname string
		if j < len(c.mkeys) {
			mkey = c.mkeys[j]
		}
		if j < len(c.onames) {
			oname = c.onames[j]
		}
		if z := obs.zoneOf(&c.reqs[j], c.req.GetDomain(), mkey, oname); z != nil {
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
