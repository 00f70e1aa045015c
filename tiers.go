package fleetlimit

import (
	"cmp"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/caddyserver/caddy/v2"

	"github.com/fleetlimit/caddy-fleetlimit/limiter"
)

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
	tier     uint16 // its number in the zone's rule cache (lasttier.go)
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
