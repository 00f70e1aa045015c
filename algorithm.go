package fleetlimit

import (
	"errors"
	"net/netip"
	"time"

	"github.com/fleetlimit/caddy-fleetlimit/limiter"
)

// compileRule builds the zone's rule from its algorithm and limit, in
// either form: rate and per, or caddy-ratelimit's window and events.
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
	switch {
	case z.Burst != 0 && alg != limiter.TokenBucket && alg != limiter.LeakyBucket:
		return nil, errors.New("burst applies to token_bucket and leaky_bucket only (a window algorithm admits rate per window)")
	case z.MaxDelay != 0 && alg != limiter.LeakyBucket:
		return nil, errors.New("max_delay applies to leaky_bucket only")
	}
	return limiter.NewAlgorithmRule(z.Name, alg, rate, per, z.Burst, time.Duration(z.MaxDelay))
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
