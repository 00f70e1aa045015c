package rls

import (
	"fmt"
	"math"
	"sync"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"

	fleetlimit "github.com/fleetlimit/caddy-fleetlimit"
	"github.com/fleetlimit/caddy-fleetlimit/limiter"
	"github.com/fleetlimit/caddy-fleetlimit/rls/config"
)

// rule is a rule of the configuration (or a request's own limit) made
// ready to decide.
type rule struct {
	limit *config.Limit
	// lim decides the rule's buckets; nil for an unlimited rule and for
	// one of 0 requests per unit, which admits nothing and needs no store.
	lim *limiter.Rule
	// current is the current_limit of the rule's statuses: shared by
	// every response, never changed. Nil for an unlimited rule.
	current *rlsv3.RateLimitResponse_RateLimit
	// zoneKey, for a rule that spends a rate_limit zone's buckets, is
	// the zone's bucket key of a value; nil for the others.
	zoneKey func(value string) string
}

// never reports whether the rule admits nothing (0 requests per unit).
func (r *rule) never() bool { return r.lim == nil && !r.limit.Unlimited }

// soft reports whether the rule's denial alone denies no request: shadow
// mode (it never does) or quota mode (only with all the request's other
// quota rules).
func (r *rule) soft() bool { return r.limit.ShadowMode || r.limit.QuotaMode }

// rules holds the rules of one loaded configuration, compiled, and the
// requests' own limits (overrides) compiled on first use.
type rules struct {
	cfg       *config.Config
	byLimit   map[*config.Limit]*rule
	policy    limiter.Policy
	fleetSize int64
	// store is the service's store: a zone's buckets must live there.
	store limiter.Store

	mu        sync.Mutex
	overrides map[overrideKey]*rule

	// obs shows the rules' decisions; nil until
	// observeRules.
	obs *observed
}

// overrideKey identifies a request's own limit: the same domain, rate and
// unit compile to the same rule.
type overrideKey struct {
	domain string
	rate   uint32
	unit   config.Unit
}

// maxOverrides bounds the overrides kept compiled; beyond it, each call
// compiles its own, so that callers cannot grow memory with rates.
const maxOverrides = 1024

// compileRules compiles every rule of cfg with the failure policy and the
// fleet size of its local fallback buckets; a rule with a zone takes the
// zone's rule, which must keep its buckets in store.
func compileRules(cfg *config.Config, policy limiter.Policy, fleetSize int64, store limiter.Store) (*rules, error) {
	rs := &rules{cfg: cfg, byLimit: make(map[*config.Limit]*rule), policy: policy, fleetSize: fleetSize,
		store: store, overrides: make(map[overrideKey]*rule)}
	for _, l := range cfg.Limits() {
		r, err := rs.compile(l)
		if err != nil {
			return nil, fmt.Errorf("%s: rule %s: %w", l.Source, l.FullKey, err)
		}
		rs.byLimit[l] = r
	}
	return rs, nil
}

// compile makes a rule ready to decide.
func (rs *rules) compile(l *config.Limit) (*rule, error) {
	r := &rule{limit: l}
	switch {
	case l.Unlimited:
		return r, nil
	case l.Zone != "":
		return rs.zoneRule(l)
	}
	r.current = &rlsv3.RateLimitResponse_RateLimit{
		Name: l.Name, RequestsPerUnit: l.RequestsPerUnit, Unit: rlsv3.RateLimitResponse_RateLimit_Unit(l.Unit),
	}
	if l.RequestsPerUnit == 0 {
		return r, nil
	}
	lim, err := limiter.NewRule(limiter.RuleConfig{
		Name:      bucketName(l.Domain, l.Unit, l.Algorithm),
		Algorithm: l.Algorithm,
		Rate:      int64(l.RequestsPerUnit),
		Per:       l.Unit.Duration(),
		Burst:     l.Burst,
		OnError:   rs.policy,
		FleetSize: rs.fleetSize,
		// Shadow and quota rules count, but their denial alone denies
		// nothing: the service decides what it means for the request.
		DryRun: l.ShadowMode || l.QuotaMode,
	})
	if err != nil {
		return nil, fmt.Errorf("%d per %s: %w", l.RequestsPerUnit, l.Unit, err)
	}
	r.lim = lim
	return r, nil
}

// zoneRule returns the rule of a limit that spends a rate_limit zone's
// buckets: the zone's own rule, its policy and all, on the zone's keys.
func (rs *rules) zoneRule(l *config.Limit) (*rule, error) {
	if l.ShadowMode || l.QuotaMode {
		return nil, fmt.Errorf("zone %q: a rule with a zone decides as the zone does; shadow_mode and quota_mode do not apply (give the zone dry_run)", l.Zone)
	}
	z, err := fleetlimit.LookupZone(l.Zone)
	if err != nil {
		return nil, err
	}
	if z.Store != rs.store {
		return nil, fmt.Errorf("rate_limit zone %q keeps its buckets in another store than this service: "+
			"give rate_limit_rls the zone's redis settings (or, for the memory store, none)", l.Zone)
	}
	return &rule{limit: l, lim: z.Rule, zoneKey: z.Key, current: currentLimit(l.Name, z.Rule)}, nil
}

// currentLimit is the current_limit of a zone's rule: its rate per its
// period, in the largest unit that divides the period, with the multiplier
// that makes it (10 per 30s: 10 per 30 SECOND).
func currentLimit(name string, r *limiter.Rule) *rlsv3.RateLimitResponse_RateLimit {
	cur := &rlsv3.RateLimitResponse_RateLimit{Name: name, RequestsPerUnit: uint32(min(r.Rate(), math.MaxUint32))}
	for _, u := range []config.Unit{config.UnitYear, config.UnitMonth, config.UnitWeek, config.UnitDay,
		config.UnitHour, config.UnitMinute, config.UnitSecond} {
		if per := r.Per(); per >= u.Duration() && per%u.Duration() == 0 {
			cur.Unit = rlsv3.RateLimitResponse_RateLimit_Unit(u)
			if n := per / u.Duration(); n > 1 {
				cur.UnitMultiplier = wrapperspb.UInt32(uint32(min(n, math.MaxUint32)))
			}
			return cur
		}
	}
	cur.Unit = rlsv3.RateLimitResponse_RateLimit_SECOND // under a second: 1 SECOND, rounded up
	return cur
}

// of returns the compiled rule of a limit that Match returned.
func (rs *rules) of(l *config.Limit) *rule { return rs.byLimit[l] }

// override returns the compiled rule of a request's own limit, which
// Config.Override returned.
func (rs *rules) override(l *config.Limit) (*rule, error) {
	k := overrideKey{l.Domain, l.RequestsPerUnit, l.Unit}
	rs.mu.Lock()
	r := rs.overrides[k]
	rs.mu.Unlock()
	if r != nil {
		return r, nil
	}
	r, err := rs.compile(l)
	if err != nil {
		return nil, err
	}
	rs.mu.Lock()
	if len(rs.overrides) < maxOverrides {
		rs.overrides[k] = r
	}
	rs.mu.Unlock()
	return r, nil
}
