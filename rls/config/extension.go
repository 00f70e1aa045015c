package config

import (
	"errors"
	"fmt"

	"github.com/fleetlimit/caddy-fleetlimit/limiter"
)

// checkExtensions checks the keys that go beyond the reference (algorithm,
// burst, zone) and returns how the rule counts: limiter.FixedWindow unless
// it names an algorithm. A rule that names one must make a valid rule of
// the limiter at its rate, which is checked here so that the mistake is
// reported where it is written.
func (rl *rawRateLimit) checkExtensions(fullKey string, unit Unit) (limiter.Algorithm, error) {
	switch {
	case rl.hasZone:
		return defaultAlgorithm, rl.checkZone()
	case rl.unlimited && rl.hasAlgorithm:
		return 0, fmt.Errorf("%s: an unlimited rule counts nothing: remove algorithm", place(rl.algorithmAt, rl.at))
	case rl.unlimited && rl.hasBurst:
		return 0, fmt.Errorf("%s: an unlimited rule counts nothing: remove burst", place(rl.burstAt, rl.at))
	case rl.hasBurst && rl.burst <= 0:
		return 0, fmt.Errorf("%s: %w", place(rl.burstAt, rl.at), limiter.ErrBadBurst)
	case rl.hasBurst && !rl.hasAlgorithm:
		return 0, fmt.Errorf("%s: %w; without algorithm a rule counts in fixed windows",
			place(rl.burstAt, rl.at), limiter.ErrBurstNotApplicable)
	case !rl.hasAlgorithm:
		return defaultAlgorithm, nil
	}
	at := place(rl.algorithmAt, rl.at)
	if rl.algorithm == "" {
		return 0, fmt.Errorf("%s: algorithm is empty (want token_bucket, leaky_bucket, fixed_window, sliding_window or sliding_log)", at)
	}
	alg, err := limiter.ParseAlgorithm(rl.algorithm)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", at, err)
	}
	if alg == limiter.Concurrency {
		return 0, fmt.Errorf("%s: algorithm concurrency needs the end of each request, which Envoy's rate limit filter never reports", at)
	}
	_, err = limiter.NewRule(limiter.RuleConfig{
		Name: fullKey, Algorithm: alg, Rate: int64(rl.requestsPerUnit), Per: unit.Duration(), Burst: rl.burst,
	})
	if err != nil {
		if rl.hasBurst && (errors.Is(err, limiter.ErrBurstNotApplicable) || errors.Is(err, limiter.ErrTooLarge)) {
			at = place(rl.burstAt, rl.at)
		}
		return 0, fmt.Errorf("%s: algorithm %s at %d per %s: %w", at, alg, rl.requestsPerUnit, unit, err)
	}
	return alg, nil
}

// checkZone checks a rule that spends a Caddy zone's bucket: it names the
// zone and gives no rate of its own, which would contradict the zone's.
func (rl *rawRateLimit) checkZone() error {
	at := place(rl.zoneAt, rl.at)
	if rl.zone == "" {
		return fmt.Errorf("%s: zone is empty: it names a rate_limit zone of the Caddy configuration", at)
	}
	for _, k := range []struct {
		name  string
		given bool
	}{
		{"unit", rl.hasUnit}, {"requests_per_unit", rl.hasRequests}, {"unlimited", rl.unlimited},
		{"algorithm", rl.hasAlgorithm}, {"burst", rl.hasBurst},
	} {
		if k.given {
			return fmt.Errorf("%s: a rule with a zone counts at the zone's rate: remove %s", at, k.name)
		}
	}
	return nil
}
