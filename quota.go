package fleetlimit

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
	// The time zone database, for hosts without one (containers built
	// from scratch): a quota's zone must load on every node.
	_ "time/tzdata"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/fleetlimit/caddy-fleetlimit/limiter"
)

// Quotas by the calendar (`quota <n> per day|week|month [tz <zone>]`). A
// zone with only a quota has it as its rule. A zone with a rate and a
// quota (a plan) gets, at provisioning, a second zone right after it in
// the handler's list, `<name>.quota`, whose rule is the quota: the request
// path decides it whenever its zone applies, on the zone's key and cost,
// in the same store call (all zones of a request are one script call), so
// that a request denied by either is charged to neither. Being a zone of
// its own, it has its own fields, placeholders, metrics and statistics.

// quotaSuffix names a zone's quota when the zone has a rate too.
const quotaSuffix = ".quota"

// hasQuota reports whether the zone is configured with a quota.
func (z *Zone) hasQuota() bool { return z.Quota != 0 || z.QuotaPlaceholder != "" }

// hasRate reports whether the zone is configured with a limit other than a
// quota: a rate, caddy-ratelimit's window and events, or concurrency.
func (z *Zone) hasRate() bool {
	return z.Rate != 0 || z.RatePlaceholder != "" || z.legacyForm() || z.Algorithm == "concurrency" || z.Limit != 0
}

// quotaOnly reports whether the zone's rule is its quota: a quota and no
// other limit (a zone's quota zone is one).
func (z *Zone) quotaOnly() bool { return z.hasQuota() && !z.hasRate() }

// configuredName is the name the zone was configured with: a quota zone's
// is its zone's.
func (z *Zone) configuredName() string {
	if z.quotaOf != nil {
		return z.quotaOf.Name
	}
	return z.Name
}

// validateQuota checks the zone's quota settings, and that a zone with
// only a quota takes none of the settings of a rate.
func (z *Zone) validateQuota() error {
	if !z.hasQuota() {
		if z.QuotaPer != "" || z.QuotaTZ != "" {
			return inSetting("quota", errors.New("quota_per and quota_tz need a quota"))
		}
		return nil
	}
	switch {
	case z.Quota != 0 && z.QuotaPlaceholder != "":
		return inSetting("quota", errors.New("give quota as a number or as a placeholder, not both"))
	case z.Quota < 0 || z.Quota > limiter.MaxQuota:
		return inSetting("quota", fmt.Errorf("quota must be a whole number from 1 to 2^40, got %d", z.Quota))
	}
	if e := z.QuotaPlaceholder; e != "" {
		if !strings.Contains(e, "{") {
			return inSetting("quota", fmt.Errorf("quota placeholder %q names no placeholder", e))
		}
		if err := checkPlaceholders(e); err != nil {
			return inSetting("quota", fmt.Errorf("quota %q is not a valid placeholder expression: %w", e, err))
		}
	}
	if _, err := limiter.ParsePeriod(z.QuotaPer); err != nil {
		return inSetting("quota", fmt.Errorf("quota needs a period: per day, week or month, got %q", z.QuotaPer))
	}
	if _, err := quotaLocation(z.QuotaTZ); err != nil {
		return inSetting("quota", err)
	}
	if c, err := strconv.ParseInt(strings.TrimSpace(z.Cost), 10, 64); err == nil && z.Quota > 0 && c > z.Quota {
		return inSetting("quota", fmt.Errorf("cost %d exceeds quota %d, so no request could ever pass", c, z.Quota))
	}
	if !z.quotaOnly() {
		return nil
	}
	switch {
	case z.Algorithm != "":
		return inSetting("algorithm", errors.New("a zone with only a quota takes no algorithm (add a rate for one)"))
	case z.Burst != 0 || z.BurstPlaceholder != "":
		return inSetting("burst", errors.New("a zone with only a quota takes no burst (add a rate for one)"))
	case z.Per != 0:
		return inSetting("rate", errors.New("a zone with only a quota takes no rate period"))
	case z.Prefetch != 0:
		return inSetting("prefetch", errors.New("prefetch applies to token_bucket and fixed_window, not to a quota"))
	case z.MaxDelay != 0:
		return inSetting("max_delay", limiter.ErrMaxDelayNotApplicable)
	}
	return nil
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

// validateQuotaNames checks that no zone has the name a zone's quota is
// reported by.
func (h *Handler) validateQuotaNames() error {
	names := make(map[string]*Zone, len(h.Zones))
	for _, z := range h.Zones {
		if z != nil {
			names[z.Name] = z
		}
	}
	for i, z := range h.Zones {
		if z == nil || z.quotaOf != nil || !z.hasQuota() || z.quotaOnly() {
			continue
		}
		if other, ok := names[z.Name+quotaSuffix]; ok && other.quotaOf != z {
			return inSetting(zoneSetting(i), fmt.Errorf("zone %q: its quota is reported as zone %q, the name of another zone", z.Name, z.Name+quotaSuffix))
		}
	}
	return nil
}

// expandQuotas places, right after each zone that has a rate and a quota,
// the zone of its quota (once: Provision runs once per handler).
func (h *Handler) expandQuotas() {
	for i := 0; i < len(h.Zones); i++ {
		z := h.Zones[i]
		if !z.hasQuota() || z.quotaOnly() || (i+1 < len(h.Zones) && h.Zones[i+1].quotaOf == z) {
			continue
		}
		q := &Zone{
			Name:  z.Name + quotaSuffix,
			Quota: z.Quota, QuotaPlaceholder: z.QuotaPlaceholder, QuotaPer: z.QuotaPer, QuotaTZ: z.QuotaTZ,
			// What the quota shares with its zone: the key (for the
			// admin API's lookups; a request's is its zone's), whether
			// a response counts, the failure policy, the dry run.
			Key: z.Key, IPv4Prefix: z.IPv4Prefix, IPv6Prefix: z.IPv6Prefix,
			CountStatus: z.CountStatus, OnError: z.OnError, FleetSize: z.FleetSize, DryRun: z.DryRun,
			quotaOf: z,
		}
		h.Zones = append(h.Zones[:i+1], append([]*Zone{q}, h.Zones[i+1:]...)...)
		i++
	}
}

// quotaDecision returns the decision of a zone's quota for a request whose
// zone's decision is zd: the same key and cost.
func (z *Zone) quotaDecision(zd *zoneDecision, repl *caddy.Replacer) (zoneDecision, error) {
	ap, err := z.applied(repl)
	if err != nil {
		return zoneDecision{}, err
	}
	return zoneDecision{zone: z, applied: ap, req: limiter.Request{Rule: ap.rule, Key: zd.req.Key, Cost: zd.req.Cost}}, nil
}

// quotaApplied returns the rule of a quota from a placeholder (tiers).
func (z *Zone) quotaApplied(repl *caddy.Replacer) (*appliedRule, error) {
	n, err := z.limitValue(repl, "quota", z.QuotaPlaceholder)
	if err != nil {
		return nil, err
	}
	return z.rules.get(n, 0)
}

// periodSeconds is a quota's w in RateLimit-Policy: the length in seconds
// of the calendar period the request was decided in, or, when the zone was
// not consulted, of the period this node's clock is in.
func periodSeconds(d *zoneDecision) int64 {
	p := d.res.Period
	if p <= 0 {
		s, e := d.req.Rule.PeriodAt(time.Now())
		p = e.Sub(s)
	}
	return int64(p / time.Second)
}

// unmarshalQuota sets up quota <n|placeholder> per day|week|month
// [tz <zone>].
func (z *Zone) unmarshalQuota(d *caddyfile.Dispenser) error {
	args := d.RemainingArgs()
	if (len(args) != 3 && len(args) != 5) || args[1] != "per" || (len(args) == 5 && args[3] != "tz") {
		return d.Errf("zone %q: quota takes: quota <n|placeholder> per day|week|month [tz <IANA zone>]", z.Name)
	}
	if strings.Contains(args[0], "{") {
		z.QuotaPlaceholder = args[0]
	} else {
		n, err := positiveInt("quota", args[0], 64)
		if err != nil {
			return d.Errf("zone %q: %v", z.Name, err)
		}
		if n > limiter.MaxQuota {
			return d.Errf("zone %q: quota must be at most 2^40 per period, got %s", z.Name, args[0])
		}
		z.Quota = n
	}
	if _, err := limiter.ParsePeriod(args[2]); err != nil {
		return d.Errf("zone %q: %v", z.Name, err)
	}
	z.QuotaPer = args[2]
	if len(args) == 5 {
		if _, err := quotaLocation(args[4]); err != nil {
			return d.Errf("zone %q: %v", z.Name, err)
		}
		z.QuotaTZ = args[4]
	}
	return nil
}
