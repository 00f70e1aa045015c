package fleetlimit

import (
	"cmp"
	"errors"
	"fmt"
	"hash/maphash"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	// The time zone database, for hosts without one (containers built
	// from scratch): a quota's zone must load on every node.
	_ "time/tzdata"

	"github.com/caddyserver/caddy/v2"

	"github.com/fleetlimit/caddy-fleetlimit/limiter"
)

// A zone's rules: the one its configuration gives (a rate, caddy-ratelimit's
// window and events, concurrency or a calendar quota), those its placeholders
// give a request (tiers, kept compiled in a ruleCache), the tier that applied
// last to a key, and a request's reserve.

// compileRule builds the zone's rule from its algorithm, its limit (rate and
// burst, as a request's placeholders or the configuration give them; in
// caddy-ratelimit's form, window and events), its policies and its failure
// policy.
func (z *Zone) compileRule(rate, burst int64) (*limiter.Rule, error) {
	if z.quotaOnly() {
		return z.compileQuota(rate)
	}
	alg, err := limiter.ParseAlgorithm(z.Algorithm)
	if err != nil {
		return nil, err
	}
	per := time.Duration(z.Per)
	if z.Window != 0 || z.Events != 0 {
		if z.Rate != 0 || z.Per != 0 {
			return nil, errors.New("give either rate or window and events, not both")
		}
		if z.Window <= 0 || z.Events <= 0 {
			return nil, errors.New("window and events must both be positive")
		}
		if z.Algorithm == "" {
			// That plugin's meaning: at most events in any window.
			alg = limiter.SlidingLog
		}
		rate, per = z.Events, time.Duration(z.Window)
	}
	policy, err := limiter.ParsePolicy(z.OnError)
	if err != nil {
		return nil, err
	}
	if alg == limiter.Concurrency {
		rate = z.Limit
	}
	return limiter.NewRule(limiter.RuleConfig{
		Name:      z.Name,
		Algorithm: alg,
		Rate:      rate,
		Per:       per,
		Burst:     burst,
		MaxDelay:  time.Duration(z.MaxDelay),
		Lease:     time.Duration(z.Lease),
		OnError:   policy,
		FleetSize: z.FleetSize,
		DryRun:    z.DryRun || z.allDryRun,
		Ban:       z.Ban.limiterBan(),
		Refunds:   len(z.CountStatus) > 0 || z.CostHeader != "",

		Prefetch:     z.Prefetch,
		PrefetchHold: time.Duration(z.PrefetchHold),

		SoftShed:         z.SoftShed,
		SoftShedMaxDelay: time.Duration(z.SoftShedMaxDelay),
	})
}

// standIn returns the rate and burst of the zone's own rule: as
// configured, with 1 for a rate and the default for a burst that come
// from placeholders (each request compiles its own; this one validates the
// rest of the zone).
func (z *Zone) standIn() (rate, burst int64) {
	if z.quotaOnly() {
		if z.QuotaPlaceholder != "" {
			return 1, 0
		}
		return z.Quota, 0
	}
	rate, burst = z.Rate, z.Burst
	if z.RatePlaceholder != "" {
		rate = 1
	}
	if z.BurstPlaceholder != "" {
		burst = 0
	}
	return rate, burst
}

// quotaLocation loads a quota's time zone: an IANA name, "" for UTC.
// "Local" is refused: nodes would each count by their own zone.
func quotaLocation(name string) (*time.Location, error) {
	if name == "Local" {
		return nil, errors.New(`quota time zone "Local" would differ between nodes: name an IANA zone such as Europe/Berlin`)
	}
	loc, err := time.LoadLocation(name)
	if err != nil {
		return nil, fmt.Errorf("unknown quota time zone %q: want an IANA name such as Europe/Berlin or America/New_York", name)
	}
	return loc, nil
}

// compileQuota compiles the rule of a zone whose limit is its quota, n per
// period, with the zone's policies.
func (z *Zone) compileQuota(n int64) (*limiter.Rule, error) {
	period, err := limiter.ParsePeriod(z.QuotaPer)
	if err != nil {
		return nil, err
	}
	loc, err := quotaLocation(z.QuotaTZ)
	if err != nil {
		return nil, err
	}
	policy, err := limiter.ParsePolicy(z.OnError)
	if err != nil {
		return nil, err
	}
	return limiter.NewRule(limiter.RuleConfig{
		Name:      z.Name,
		Algorithm: limiter.Quota,
		Rate:      n,
		Period:    period,
		Location:  loc,
		OnError:   policy,
		FleetSize: z.FleetSize,
		DryRun:    z.DryRun || z.allDryRun,
		Ban:       z.Ban.limiterBan(),
		Refunds:   len(z.CountStatus) > 0,
	})
}

// Limits from placeholders (rate_placeholder, burst_placeholder): each
// request's rule comes from its own values, compiled once per distinct
// value and kept in a bounded cache per zone.

// appliedRule is a zone's rule as a request applies it, with the response
// field values that report it.
type appliedRule struct {
	rule     *limiter.Rule
	policy   string // the zone's member of RateLimit-Policy (a quota's: up to its w's value)
	rateText string // X-RateLimit-Limit
	// calendar: a quota, whose w is the length of the request's period
	// (see appendPolicy).
	calendar bool
	tier     uint16 // its number in the zone's ruleCache (see lastTiers)
}

// newApplied returns the rule of zone name with its field values:
// `"name";q=<rate>;w=<period in seconds>`, and for a concurrency zone
// `"name";q=<limit>` (slots have no period).
func newApplied(name string, rule *limiter.Rule) *appliedRule {
	rate := strconv.FormatInt(rule.Rate(), 10)
	policy := `"` + name + `";q=` + rate
	switch rule.Algorithm() {
	case limiter.Concurrency:
	case limiter.Quota:
		return &appliedRule{rule: rule, policy: policy + ";w=", rateText: rate, calendar: true}
	default:
		policy += ";w=" + strconv.FormatInt(rule.Window(), 10)
	}
	return &appliedRule{rule: rule, policy: policy, rateText: rate}
}

// maxLimitValue is the largest rate or burst a placeholder may give.
const maxLimitValue = 1_000_000_000

// defaultRuleCacheSize is how many rules a zone keeps compiled for the
// distinct values of its placeholders.
const defaultRuleCacheSize = 1024

// ruleCache holds a zone's rules compiled for the values its placeholders
// gave, at most size of them: past that, a new value evicts an arbitrary
// one (map order), so a flood of distinct values costs a compilation each,
// never memory without bound.
type ruleCache struct {
	mu    sync.RWMutex
	m     map[[2]int64]*cachedRule
	size  int
	build func(rate, burst int64) (*limiter.Rule, error)
	name  string
	seq   uint16 // the last tier number given (under mu)
}

// cachedRule is a compiled rule, or why the values cannot make one.
type cachedRule struct {
	applied *appliedRule
	err     error
}

// get returns the rule for rate and burst (0: the rule's default).
func (c *ruleCache) get(rate, burst int64) (*appliedRule, error) {
	k := [2]int64{rate, burst}
	c.mu.RLock()
	e, ok := c.m[k]
	c.mu.RUnlock()
	if !ok {
		e = &cachedRule{}
		rule, err := c.build(rate, burst)
		if err != nil {
			e.err = fmt.Errorf("zone %q: rate %d and burst %d make no rule: %w", c.name, rate, burst, err)
		} else {
			e.applied = newApplied(c.name, rule)
		}
		c.mu.Lock()
		if e.applied != nil {
			c.seq++
			e.applied.tier = c.seq
		}
		for old := range c.m {
			if len(c.m) < c.size {
				break
			}
			delete(c.m, old)
		}
		c.m[k] = e
		c.mu.Unlock()
	}
	return e.applied, e.err
}

// all returns the rules the cache holds, by rate and burst.
func (c *ruleCache) all() []*limiter.Rule {
	c.mu.RLock()
	defer c.mu.RUnlock()
	out := make([]*limiter.Rule, 0, len(c.m))
	for _, e := range c.m {
		if e.applied != nil {
			out = append(out, e.applied.rule)
		}
	}
	slices.SortFunc(out, func(a, b *limiter.Rule) int {
		return cmp.Or(cmp.Compare(a.Rate(), b.Rate()), cmp.Compare(a.Burst(), b.Burst()))
	})
	return out
}

// byTier returns the rule of tier number id, or nil when the cache no
// longer holds it.
func (c *ruleCache) byTier(id uint16) *limiter.Rule {
	c.mu.RLock()
	defer c.mu.RUnlock()
	for _, e := range c.m {
		if e.applied != nil && e.applied.tier == id {
			return e.applied.rule
		}
	}
	return nil
}

// len returns how many rules the cache holds.
func (c *ruleCache) len() int {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return len(c.m)
}

// applied returns the rule a request applies: the zone's own, or for a
// zone whose rate or burst comes from a placeholder the one its values
// make. A value that is not a whole number from 1 to 1,000,000,000 is an
// error naming the zone and the value, which is never used.
func (z *Zone) applied(repl *caddy.Replacer) (*appliedRule, error) {
	if z.rules == nil {
		return z.base, nil
	}
	if z.quotaOnly() {
		return z.quotaApplied(repl)
	}
	rate, burst := z.Rate, z.Burst
	var err error
	if z.RatePlaceholder != "" {
		if rate, err = z.limitValue(repl, "rate", z.RatePlaceholder); err != nil {
			return nil, err
		}
	}
	if z.BurstPlaceholder != "" {
		if burst, err = z.limitValue(repl, "burst", z.BurstPlaceholder); err != nil {
			return nil, err
		}
	}
	return z.rules.get(rate, burst)
}

// quotaApplied returns the rule of a quota from a placeholder (tiers).
func (z *Zone) quotaApplied(repl *caddy.Replacer) (*appliedRule, error) {
	n, err := z.limitValue(repl, "quota", z.QuotaPlaceholder)
	if err != nil {
		return nil, err
	}
	return z.rules.get(n, 0)
}

// limitValue evaluates a rate or burst placeholder expression.
func (z *Zone) limitValue(repl *caddy.Replacer, what, expr string) (int64, error) {
	v := strings.TrimSpace(repl.ReplaceKnown(expr, ""))
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 1 || n > maxLimitValue {
		return 0, fmt.Errorf("zone %q: %s %s gave %s: want a whole number from 1 to 1000000000", z.Name, what, expr, quoteValue(v))
	}
	return n, nil
}

// quoteValue quotes a value from a request for an error message, cut to
// 64 bytes.
func quoteValue(v string) string {
	if len(v) > 64 {
		return strconv.Quote(v[:64]) + "..."
	}
	return strconv.Quote(v)
}

// lastTierSlots is how many keys the table remembers at most.
const lastTierSlots = 4096

// tierBits is how many low bits of a slot hold the tier's number.
const tierBits = 16

// lastTiers is one zone's table of the tier that applied last to a key,
// for the admin API's key lookup (a bucket does not say which tier charged
// it). It is lossy and fixed: a slot per hash of the key holds the key's
// hash and the tier's number, one atomic store per request, nothing
// allocated; a key whose slot a later key took is unknown, as is a key
// this node did not decide.
type lastTiers struct {
	seed  maphash.Seed
	slots [lastTierSlots]atomic.Uint64
}

// newLastTiers returns an empty table.
func newLastTiers() *lastTiers { return &lastTiers{seed: maphash.MakeSeed()} }

// note records that tier applied to key. Slot 0 means empty: a hash whose
// high bits are all zero is not remembered.
func (t *lastTiers) note(key string, tier uint16) {
	h := maphash.String(t.seed, key)
	t.slots[h%lastTierSlots].Store(h&^(1<<tierBits-1) | uint64(tier))
}

// last returns the number of the tier that applied last to key, and false
// when the table does not know.
func (t *lastTiers) last(key string) (uint16, bool) {
	h := maphash.String(t.seed, key)
	v := t.slots[h%lastTierSlots].Load()
	if v == 0 || v&^(1<<tierBits-1) != h&^(1<<tierBits-1) {
		return 0, false
	}
	return uint16(v), true
}

// lastRule returns the rule that applied last to key on this node, or nil
// when it is unknown: the zone's own rule for a zone without tiers.
func (z *Zone) lastRule(key string) *limiter.Rule {
	if z.rules == nil {
		return z.rule
	}
	id, ok := z.lastTier.last(key)
	if !ok {
		return nil
	}
	return z.rules.byTier(id)
}

// Priority shedding (reserve): the share of a zone's capacity a request must
// leave after its charge.

// parseReserve parses a reserve: a whole percentage from 0 to 99, with or
// without `%`.
func parseReserve(s string) (int64, bool) {
	s = strings.TrimSuffix(strings.TrimSpace(s), "%")
	n, err := strconv.ParseInt(s, 10, 64)
	return n, err == nil && n >= 0 && n <= 99
}

// provisionReserve compiles a zone's validated reserve.
func (z *Zone) provisionReserve() {
	z.reserve, z.reserveExpr = 0, ""
	if s := strings.TrimSpace(z.Reserve); strings.ContainsAny(s, "{}") {
		z.reserveExpr = s
	} else if s != "" {
		z.reserve, _ = parseReserve(s)
	}
}

// reserveOf returns a request's reserve in the zone: a placeholder's value
// that is not a whole percentage from 0 to 99 is an error naming the zone
// and the value.
func (z *Zone) reserveOf(repl *caddy.Replacer) (int64, error) {
	if z.reserveExpr == "" {
		return z.reserve, nil
	}
	v := strings.TrimSpace(repl.ReplaceKnown(z.reserveExpr, ""))
	n, ok := parseReserve(v)
	if !ok {
		return 0, fmt.Errorf("zone %q: reserve %s gave %s: want a whole percentage from 0 to 99", z.Name, z.reserveExpr, quoteValue(v))
	}
	return n, nil
}
