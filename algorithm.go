package fleetlimit

import (
	"errors"
	"net/netip"
	"time"

	"github.com/fleetlimit/caddy-fleetlimit/limiter"
)

// compileRule builds the zone's rule from its algorithm, its limit, in
// either form (rate and per, or caddy-ratelimit's window and events), and
// its failure policy.
func (z *Zone) compileRule() (*limiter.Rule, error) {
	alg, err := limiter.ParseAlgorithm(z.Algorithm)
	if err != nil {
		return nil, err
	}
	rate, per := z.Rate, time.Duration(z.Per)
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
	return limiter.NewRule(limiter.RuleConfig{
		Name:      z.Name,
		Algorithm: alg,
		Rate:      rate,
		Per:       per,
		Burst:     z.Burst,
		MaxDelay:  time.Duration(z.MaxDelay),
		OnError:   policy,
		FleetSize: z.FleetSize,
	})
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
