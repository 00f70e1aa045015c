package fleetlimit

import (
	"errors"
	"net/netip"
	"time"

	"github.com/fleetlimit/caddy-fleetlimit/limiter"
)

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
