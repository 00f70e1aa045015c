package fleetlimit

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/fleetlimit/caddy-fleetlimit/limiter"
)

// compileRule builds the zone's rule from its algorithm, its limit (rate and
// burst, as a request's placeholders or the configuration give them; in
// caddy-ratelimit's form, window and events), its policies and its failure
// policy.
func (z *Zone) compileRule(rate, burst int64) (*limiter.Rule, error) {
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
		Refunds:   len(z.CountStatus) > 0,

		Prefetch:     z.Prefetch,
		PrefetchHold: time.Duration(z.PrefetchHold),
	})
}

// standIn returns the rate and burst of the zone's own rule: as
// configured, with 1 for a rate and the default for a burst that come
// from placeholders (each request compiles its own; this one validates the
// rest of the zone).
func (z *Zone) standIn() (rate, burst int64) {
	rate, burst = z.Rate, z.Burst
	if z.RatePlaceholder != "" {
		rate = 1
	}
	if z.BurstPlaceholder != "" {
		burst = 0
	}
	return rate, burst
}

// validatePolicies checks the settings that depend on the algorithm: the
// limit in its forms, placeholders, concurrency's limit and lease,
// reserve, count_status and ban.
func (z *Zone) validatePolicies() error {
	alg, err := limiter.ParseAlgorithm(z.Algorithm)
	if err != nil {
		return inSetting("algorithm", err)
	}
	if alg == limiter.Concurrency {
		return z.validateConcurrency()
	}
	switch {
	case z.Limit != 0:
		return inSetting("limit", errors.New("limit applies to algorithm concurrency only (a rate zone takes rate)"))
	case z.Lease != 0:
		return inSetting("lease", limiter.ErrLeaseNotApplicable)
	case z.Rate == 0 && z.RatePlaceholder == "" && z.Events == 0 && z.Window == 0:
		return inSetting("rate", errors.New("rate is required: a rate per period (or a window and its events)"))
	case z.Rate != 0 && z.RatePlaceholder != "":
		return inSetting("rate", errors.New("give rate as a number or as a placeholder, not both"))
	case z.Burst != 0 && z.BurstPlaceholder != "":
		return inSetting("burst", errors.New("give burst as a number or as a placeholder, not both"))
	case z.BurstPlaceholder != "" && alg != limiter.TokenBucket && alg != limiter.LeakyBucket:
		return inSetting("burst", limiter.ErrBurstNotApplicable)
	case (z.RatePlaceholder != "" || z.BurstPlaceholder != "") && z.legacyForm():
		return inSetting("rate", errors.New("a placeholder rate needs rate <placeholder> <duration>, not window and events"))
	}
	for _, p := range []struct{ setting, expr string }{{"rate", z.RatePlaceholder}, {"burst", z.BurstPlaceholder}} {
		if p.expr == "" {
			continue
		}
		if !strings.Contains(p.expr, "{") {
			return inSetting(p.setting, fmt.Errorf("%s placeholder %q names no placeholder", p.setting, p.expr))
		}
		if err := checkPlaceholders(p.expr); err != nil {
			return inSetting(p.setting, fmt.Errorf("%s %q is not a valid placeholder expression: %w", p.setting, p.expr, err))
		}
	}
	if z.Reserve != "" {
		if err := checkReserve(z.Reserve); err != nil {
			return inSetting("reserve", err)
		}
	}
	if len(z.CountStatus) > 0 {
		if alg == limiter.LeakyBucket {
			return inSetting("count_status", errors.New("count_status does not apply to leaky_bucket: a shaped request has already waited its turn"))
		}
		if _, err := parseStatusSet(z.CountStatus); err != nil {
			return inSetting("count_status", err)
		}
	}
	if z.Ban != nil {
		if err := z.Ban.validate(); err != nil {
			return inSetting("ban", err)
		}
	}
	return nil
}

// validateConcurrency checks a concurrency zone: a limit, and none of the
// rate algorithms' settings.
func (z *Zone) validateConcurrency() error {
	switch {
	case z.Limit <= 0:
		return inSetting("limit", errors.New("a concurrency zone needs limit <n>: how many requests of a key may be in flight at once"))
	case z.Rate != 0 || z.RatePlaceholder != "" || z.Per != 0 || z.legacyForm():
		return inSetting("rate", errors.New("a concurrency zone takes limit <n>, not a rate"))
	case z.Burst != 0 || z.BurstPlaceholder != "":
		return inSetting("burst", limiter.ErrBurstNotApplicable)
	case z.Reserve != "":
		return inSetting("reserve", errors.New("reserve applies to the rate algorithms, not concurrency"))
	case len(z.CountStatus) > 0:
		return inSetting("count_status", errors.New("count_status does not apply to concurrency: a slot is always given back"))
	case z.Lease != 0 && (z.Lease < caddy.Duration(time.Millisecond) || z.Lease%caddy.Duration(time.Millisecond) != 0):
		return inSetting("lease", limiter.ErrBadLease)
	}
	if z.Ban != nil {
		if err := z.Ban.validate(); err != nil {
			return inSetting("ban", err)
		}
	}
	return nil
}

// networkOf returns the network of an IP address key, as a prefix of the
// given length (an IPv4 address v4 bits, an IPv6 address v6 bits; 0 leaves
// that family alone). Keys that are not IP addresses are returned as they
// are.
func networkOf(key string, v4, v6 int) string {
	addr, err := netip.ParseAddr(key)
	if err != nil {
		return key
	}
	addr = addr.Unmap()
	bits := v6
	if addr.Is4() {
		bits = v4
	}
	if bits == 0 || bits == addr.BitLen() {
		return key
	}
	p, err := addr.Prefix(bits)
	if err != nil {
		return key
	}
	return p.String()
}
