package fleetlimit

import (
	"errors"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/fleetlimit/caddy-fleetlimit/limiter"
)

// Every check of the configuration as written, before anything is set up:
// the handler's, its Redis settings' and each zone's, all named validate. A
// mistake in one setting is a *settingError, so that the Caddyfile adapter
// reports the line that gave it.

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

// validateCompat checks caddy-ratelimit's options and its rate_limits (for
// Handler.validate).
func (h *Handler) validateCompat() error {
	if _, err := jitterShare(h.Jitter); err != nil {
		return inSetting("jitter", err)
	}
	if h.SweepInterval < 0 {
		return inSetting("sweep_interval", errors.New("sweep_interval must not be negative"))
	}
	if len(h.RateLimits) == 0 {
		return nil
	}
	if len(h.Zones) > 0 && !h.fromRateLimits {
		return errors.New(`both "rate_limits" (caddy-ratelimit's form of the zones) and "zones" (fleetlimit's) are set; ` +
			`give every zone in one of them`)
	}
	for _, name := range slices.Sorted(maps.Keys(h.RateLimits)) {
		z, err := h.RateLimits[name].zone(name)
		if err == nil {
			err = z.validate()
		}
		if err != nil {
			return fmt.Errorf("rate_limits %q: %w", name, err)
		}
	}
	return nil
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

// Validate checks the connection settings as rate_limit does before it
// connects (without expanding placeholders or reading TLS files).
func (c *RedisConfig) Validate() error { return c.validate() }

// validate checks the connection settings as configured (before {env.*}
// placeholders are expanded). The Caddyfile adapter calls it at the end of
// the redis block, and provisioning before connecting.
func (c *RedisConfig) validate() error {
	servers := c.Address != "" || len(c.Addresses) > 0
	switch {
	case !servers && c.SentinelMaster == "":
		return inSetting("address", errors.New("address is required: a server, a Cluster's nodes, or a Sentinel master and its sentinels"))
	case c.SentinelMaster != "" && len(c.SentinelAddresses) == 0:
		return inSetting("sentinel", errors.New("a Sentinel master needs at least one sentinel address"))
	case c.SentinelMaster != "" && servers:
		return inSetting("sentinel", errors.New("give either sentinels or server addresses, not both: the sentinels find the master"))
	case c.SentinelMaster != "" && c.Cluster:
		return inSetting("cluster", errors.New("cluster and sentinel exclude each other: a Cluster has no Sentinel"))
	case c.DB < 0:
		return inSetting("db", errors.New("db must not be negative"))
	case c.DB != 0 && (c.Cluster || len(c.Addresses) > 0):
		return inSetting("db", errors.New("a Cluster has only db 0"))
	case c.Protocol != 0 && c.Protocol != 2 && c.Protocol != 3:
		return inSetting("protocol", fmt.Errorf("protocol must be 2 or 3, got %d", c.Protocol))
	}
	if err := limiter.CheckKeyPrefix(c.KeyPrefix); err != nil {
		return inSetting("key_prefix", err)
	}
	for _, s := range redisDurations {
		if *s.field(c) < 0 {
			return inSetting(s.name, fmt.Errorf("%s must not be negative", s.name))
		}
	}
	for _, s := range redisCounts {
		if *s.field(c) < 0 {
			return inSetting(s.name, fmt.Errorf("%s must not be negative", s.name))
		}
	}
	if c.TLS != nil {
		if err := c.TLS.validate(); err != nil {
			return fmt.Errorf("tls: %w", err)
		}
	}
	return nil
}

// validate checks the TLS settings without reading the files.
func (t *RedisTLS) validate() error {
	switch {
	case t.Cert != "" && t.Key == "":
		return inSetting("cert", errors.New("a client certificate needs both cert and key"))
	case t.Key != "" && t.Cert == "":
		return inSetting("key", errors.New("a client certificate needs both cert and key"))
	}
	return nil
}

// zoneNameRE is what a zone's name may be.
var zoneNameRE = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,64}$`)

// validate checks the zone as configured. The Caddyfile adapter calls it at
// the end of the zone block, and the handler's validate before provisioning;
// a mistake in one setting is a *settingError, and the caller adds the
// zone's name.
func (z *Zone) validate() error {
	if !zoneNameRE.MatchString(z.configuredName()) {
		return inSetting("name", errors.New("name must be 1 to 64 letters, digits, '_', '-' or '.'"))
	}
	if err := z.validateQuota(); err != nil {
		return err
	}
	if err := z.validatePolicies(); err != nil {
		return err
	}
	// The failure policy is compiled into the rule: checked first, so
	// that its mistakes name their own setting.
	if _, err := limiter.ParsePolicy(z.OnError); err != nil {
		return inSetting("on_error", fmt.Errorf("on_error must be allow, deny or local, got %q", z.OnError))
	}
	if z.FleetSize < 0 {
		return inSetting("fleet_size", limiter.ErrBadFleetSize)
	}
	rule, err := z.compileRule(z.standIn())
	if err != nil {
		return inSetting("rule", err)
	}
	for _, p := range []struct {
		name       string
		bits, most int
	}{{"ipv4_prefix", z.IPv4Prefix, 32}, {"ipv6_prefix", z.IPv6Prefix, 128}} {
		if p.bits < 0 || p.bits > p.most {
			return inSetting(p.name, fmt.Errorf("%s must be 1 to %d, got %d", p.name, p.most, p.bits))
		}
	}
	for _, e := range z.Key {
		if strings.TrimSpace(e) == "" {
			return inSetting("key", errors.New("key expressions must not be empty"))
		}
		if err := validatePlaceholders(e); err != nil {
			return inSetting("key", fmt.Errorf("key %q is not a valid placeholder expression: %w", e, err))
		}
	}
	if _, err := parseExempt(z.Exempt); err != nil {
		return inSetting("exempt", err)
	}
	return z.validateCost(rule)
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
		if err := validatePlaceholders(e); err != nil {
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

// validatePolicies checks the settings that depend on the algorithm: the
// limit in its forms, placeholders, concurrency's limit and lease,
// soft_shed, reserve, count_status and ban.
func (z *Zone) validatePolicies() error {
	alg, err := limiter.ParseAlgorithm(z.Algorithm)
	if err != nil {
		return inSetting("algorithm", err)
	}
	if err := validateCostHeaderAbort(z.CostHeader, z.CostHeaderAbort); err != nil {
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
		if err := validatePlaceholders(p.expr); err != nil {
			return inSetting(p.setting, fmt.Errorf("%s %q is not a valid placeholder expression: %w", p.setting, p.expr, err))
		}
	}
	if err := z.validateSoftShed(alg); err != nil {
		return err
	}
	if z.Reserve != "" {
		if err := validateReserve(z.Reserve); err != nil {
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
		if err := validateCostHeader(z.CostHeader, alg); err != nil {
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
		return inSetting("cost_header", validateCostHeader(z.CostHeader, limiter.Concurrency))
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

// validateCost checks the zone's cost: a static one, which must fit in the
// rule's burst, or a placeholder expression.
func (z *Zone) validateCost(rule *limiter.Rule) error {
	switch c := strings.TrimSpace(z.Cost); {
	case c == "":
	case rule.Algorithm() == limiter.Concurrency:
		return inSetting("cost", errors.New("a concurrency zone takes no cost: a request holds one slot"))
	case strings.ContainsAny(c, "{}"):
		if err := validatePlaceholders(c); err != nil {
			return inSetting("cost", fmt.Errorf("cost %q is not a valid placeholder expression: %w", c, err))
		}
	default:
		n, err := strconv.ParseInt(c, 10, 64)
		if err != nil || n <= 0 {
			return inSetting("cost", fmt.Errorf("cost must be a positive integer or a placeholder, got %q", c))
		}
		if n > rule.Burst() && z.BurstPlaceholder == "" && z.RatePlaceholder == "" {
			return inSetting("cost", fmt.Errorf("cost %d exceeds burst %d, so no request could ever pass", n, rule.Burst()))
		}
	}
	return nil
}

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

// validateCostHeader checks a zone's cost_header: a header field name, on a
// token bucket zone or a quota.
func validateCostHeader(name string, alg limiter.Algorithm) error {
	if alg != limiter.TokenBucket && alg != limiter.Quota {
		return fmt.Errorf("cost_header applies to token_bucket zones and quotas only, not %s: only a bucket or a quota can owe what a response cost beyond its up-front cost", alg)
	}
	if !validFieldName(name) {
		return fmt.Errorf("cost_header %q is not a header field name", name)
	}
	return nil
}

// validateCostHeaderAbort checks a zone's abort charge: a positive number of
// tokens, on a zone with cost_header (0: the default).
func validateCostHeaderAbort(name string, abort int64) error {
	switch {
	case abort < 0:
		return fmt.Errorf("cost_header_abort must be a positive number of tokens, got %d", abort)
	case abort > 0 && name == "":
		return errors.New("cost_header_abort applies to a zone with cost_header")
	}
	return nil
}

// validateReserve checks a zone's reserve as configured: a percentage or a
// placeholder expression.
func validateReserve(s string) error {
	if strings.ContainsAny(s, "{}") {
		if err := validatePlaceholders(s); err != nil {
			return fmt.Errorf("reserve %q is not a valid placeholder expression: %w", s, err)
		}
		return nil
	}
	if _, ok := parseReserve(s); !ok {
		return fmt.Errorf("reserve must be a whole percentage from 0 to 99 (30 or 30%%) or a placeholder, got %q", s)
	}
	return nil
}

// validate checks the ban.
func (b *ZoneBan) validate() error {
	ms := caddy.Duration(time.Millisecond)
	switch {
	case b.Duration < ms || b.Duration%ms != 0:
		return errors.New("ban duration must be a positive whole number of milliseconds")
	case b.After < 1:
		return errors.New("ban needs a positive number of denials: ban <duration> after <n> in <window>")
	case b.Window < ms || b.Window%ms != 0:
		return errors.New("ban window must be a positive whole number of milliseconds")
	}
	return nil
}

// validatePlaceholders reports an expression whose braces do not form
// placeholders: every '{' must close with a '}' around a non-empty name,
// without nesting. (A stray brace would make every request's value wrong.)
func validatePlaceholders(e string) error {
	open := -1
	for i := 0; i < len(e); i++ {
		switch e[i] {
		case '{':
			if open >= 0 {
				return errors.New("nested '{'")
			}
			open = i
		case '}':
			if open < 0 {
				return errors.New("'}' without '{'")
			}
			if i == open+1 {
				return errors.New("empty placeholder {}")
			}
			open = -1
		}
	}
	if open >= 0 {
		return errors.New("'{' without '}'")
	}
	return nil
}

// validFieldName reports whether s is an HTTP field name (RFC 9110's token).
func validFieldName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return true
}
