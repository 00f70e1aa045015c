package fleetlimit

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/fleetlimit/caddy-fleetlimit/limiter"
)

// Validation of the configuration as written: the handler's checks, the
// checks of a zone's settings that depend on its algorithm, and the
// setting errors that let the Caddyfile adapter name a mistake's line.
// (Zone.validate is in zone.go, RedisConfig.validate in redisconfig.go.)

// settingError is a mistake in one setting, named as the Caddyfile and the
// JSON name it, so that the Caddyfile adapter can report the line that gave
// it. The validate methods return it for mistakes that one setting makes.
type settingError struct {
	setting string
	err     error
}

// Error returns the mistake, without the setting's name.
func (e *settingError) Error() string { return e.err.Error() }

// Unwrap returns the mistake.
func (e *settingError) Unwrap() error { return e.err }

// inSetting marks err as a mistake in the named setting.
func inSetting(setting string, err error) error {
	return &settingError{setting: setting, err: err}
}

// setting is one setting of a config struct S, by the name that the JSON
// and the Caddyfile give it: where in S it is.
type setting[S, T any] struct {
	name  string
	field func(*S) *T
}

// oneOf lists names for an error: "a, b or c".
func oneOf(names []string) string {
	switch len(names) {
	case 0:
		return ""
	case 1:
		return names[0]
	}
	return strings.Join(names[:len(names)-1], ", ") + " or " + names[len(names)-1]
}

// headerModes and denialLevels are the values that headers and
// log_denials take.
var (
	headerModes  = []string{"ietf", "legacy", "both", "none"}
	denialLevels = []string{"info", "debug", "off"}
)

// validate checks the configuration as written, before provisioning: the
// handler's settings, its Redis settings and every zone. Provision calls
// it first, and the Caddyfile adapter at the end of the directive (and the
// validate methods of the redis and zone blocks at their ends), so that a
// Caddyfile's mistake comes with its line. A mistake in one setting is a
// *settingError.
func (h *Handler) validate() error {
	if _, err := parseHeaderMode(h.Headers); err != nil {
		return inSetting("headers", fmt.Errorf("unknown headers mode %q (want %s)", h.Headers, oneOf(headerModes)))
	}
	if _, err := parseDenialLevel(h.LogDenials); err != nil {
		return inSetting("log_denials", fmt.Errorf("unknown log_denials %q (want %s)", h.LogDenials, oneOf(denialLevels)))
	}
	if h.MaxKeys < 0 {
		return inSetting("max_keys", errors.New("max_keys must not be negative"))
	}
	if _, err := parseExempt(h.Exempt); err != nil {
		return inSetting("exempt", err)
	}
	if err := h.validateCompat(); err != nil {
		return err
	}
	if h.Redis != nil {
		if err := h.Redis.validate(); err != nil {
			return inSetting("redis", fmt.Errorf("redis: %w", err))
		}
	}
	if len(h.Zones) == 0 && len(h.RateLimits) == 0 {
		return errors.New("at least one zone is required")
	}
	seen := make(map[string]bool, len(h.Zones))
	for i, z := range h.Zones {
		at := zoneSetting(i)
		switch {
		case z == nil:
			return inSetting(at, fmt.Errorf("zone %d is empty", i))
		case seen[z.Name]:
			return inSetting(at, fmt.Errorf("zone %q is defined twice", z.Name))
		}
		seen[z.Name] = true
		if err := z.validate(); err != nil {
			return inSetting(at, fmt.Errorf("zone %q: %w", z.Name, err))
		}
	}
	return h.validateQuotaNames()
}

// zoneSetting names the i-th zone as a setting, for settingError.
func zoneSetting(i int) string { return "zones." + strconv.Itoa(i) }

// validatePolicies checks the settings that depend on the algorithm: the
// limit in its forms, placeholders, concurrency's limit and lease,
// soft_shed, reserve, count_status and ban.
func (z *Zone) validatePolicies() error {
	alg, err := limiter.ParseAlgorithm(z.Algorithm)
	if err != nil {
		return inSetting("algorithm", err)
	}
	if err := checkCostHeaderAbort(z.CostHeader, z.CostHeaderAbort); err != nil {
		return inSetting("cost_header_abort", err)
	}
	if alg == limiter.Concurrency {
		return z.validateConcurrency()
	}
	switch {
	case z.Limit != 0:
		return inSetting("limit", errors.New("limit applies to algorithm concurrency only (a rate zone takes rate)"))
	case z.Lease != 0:
		return inSetting("lease", limiter.ErrLeaseNotApplicable)
	case z.MaxWaiting < 0:
		return inSetting("max_waiting", errors.New("max_waiting must not be negative"))
	case z.MaxWaiting != 0 && alg != limiter.LeakyBucket && z.SoftShed == 0:
		return inSetting("max_waiting", errors.New("max_waiting applies to leaky_bucket and soft_shed zones only"))
	case z.Rate == 0 && z.RatePlaceholder == "" && z.Events == 0 && z.Window == 0 && !z.hasQuota():
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
	if err := z.validateSoftShed(alg); err != nil { // softshed.go
		return err
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
	if z.CostHeader != "" {
		switch {
		case z.legacyForm() && z.Algorithm == "":
			alg = limiter.SlidingLog // window and events: that plugin's meaning
		case z.quotaOnly():
			alg = limiter.Quota
		}
		if err := checkCostHeader(z.CostHeader, alg); err != nil {
			return inSetting("cost_header", err)
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
	case z.SoftShed != 0 || z.SoftShedMaxDelay != 0:
		return inSetting("soft_shed", errSoftShedAlgorithm)
	case z.CostHeader != "":
		return inSetting("cost_header", checkCostHeader(z.CostHeader, limiter.Concurrency))
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
