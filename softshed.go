package fleetlimit

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/fleetlimit/caddy-fleetlimit/limiter"
)

// Soft shedding (soft_shed): a token bucket zone that delays the requests
// it admits once a key has used more than a share of its burst, rather
// than letting the key run into denials. The limiter computes the delay
// in the decision (limiter/softshed.go); the handler holds the request in
// the zone's waiting room for it, as it holds a leaky bucket's request for
// its turn (serve.go, waiting.go).

// errSoftShedAlgorithm: soft_shed on a zone that is not a token bucket.
var errSoftShedAlgorithm = errors.New("soft_shed applies to token_bucket only (a zone with rate, not window and events or a quota alone)")

// validateSoftShed checks the zone's soft shed, for its algorithm alg.
func (z *Zone) validateSoftShed(alg limiter.Algorithm) error {
	switch {
	case z.SoftShed == 0 && z.SoftShedMaxDelay == 0:
		return nil
	case z.SoftShed == 0:
		return inSetting("soft_shed", errors.New("soft_shed_max_delay needs soft_shed <percent>"))
	case alg != limiter.TokenBucket || z.legacyForm() || z.quotaOnly():
		return inSetting("soft_shed", errSoftShedAlgorithm)
	case z.SoftShed < 1 || z.SoftShed > 99:
		return inSetting("soft_shed", fmt.Errorf("soft_shed must be a whole percentage from 1 to 99, got %d", z.SoftShed))
	case z.SoftShedMaxDelay < 0 || time.Duration(z.SoftShedMaxDelay) > limiter.MaxSoftShedDelay:
		return inSetting("soft_shed", fmt.Errorf("soft_shed's max delay must be positive and at most %s, got %s",
			limiter.MaxSoftShedDelay, time.Duration(z.SoftShedMaxDelay)))
	}
	return nil
}

// unmarshalSoftShed sets up soft_shed <percent> [<max_delay>].
func (z *Zone) unmarshalSoftShed(d *caddyfile.Dispenser) error {
	args := d.RemainingArgs()
	if len(args) < 1 || len(args) > 2 {
		return d.Errf("zone %q: soft_shed takes: soft_shed <percent> [<max_delay>]", z.Name)
	}
	pct, err := strconv.ParseInt(strings.TrimSuffix(args[0], "%"), 10, 64)
	if err != nil || pct < 1 || pct > 99 {
		return d.Errf("zone %q: soft_shed must be a whole percentage from 1 to 99, got %q", z.Name, args[0])
	}
	z.SoftShed = pct
	if len(args) == 2 {
		dur, err := caddy.ParseDuration(args[1])
		if err != nil || dur <= 0 || dur > limiter.MaxSoftShedDelay {
			return d.Errf("zone %q: soft_shed's max delay must be a positive duration of at most %s, got %q",
				z.Name, limiter.MaxSoftShedDelay, args[1])
		}
		z.SoftShedMaxDelay = caddy.Duration(dur)
	}
	return nil
}

// shedOnlyCounted reports whether a zone's delay is a dry run's soft shed:
// counted (as the delay it would ask), never waited for.
func shedOnlyCounted(d *zoneDecision) bool {
	return d.zone.SoftShed > 0 && d.req.Rule.DryRun()
}
