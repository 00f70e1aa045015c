package fleetlimit

import (
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"strconv"
	"strings"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/fleetlimit/caddy-fleetlimit/limiter"
	"github.com/fleetlimit/caddy-fleetlimit/observe"
)

// Zone is one limit, kept per client key by one of the algorithms (a token
// bucket unless Algorithm says otherwise).
type Zone struct {
	// Name identifies the zone in headers, placeholders and logs, and is
	// part of every bucket's key: zones of the same name share buckets.
	// Letters, digits, `_`, `-` and `.`, at most 64 characters.
	Name string `json:"name"`

	// Key lists placeholder expressions; the client key is the first one
	// that is not empty. Keys longer than 64 bytes or with unusual
	// characters are hashed (SHA-256), so client input cannot grow the
	// store or break a key. When every expression is empty, all such
	// requests share one bucket. Default: `{http.vars.client_ip}` (one
	// bucket per client IP) for a zone in fleetlimit's form (Rate and
	// Per); none for a zone in caddy-ratelimit's form (Window and Events,
	// in the Caddyfile or JSON), so that its requests all share ONE
	// bucket, as they did in that plugin, whose key defaulted to an empty,
	// static string.
	Key []string `json:"key,omitempty"`

	// Algorithm is how the zone counts: `token_bucket` (a bucket of Burst
	// tokens refilled at Rate per Per; forgives bursts), `sliding_window`
	// (at most Rate per window of Per, estimated from two fixed windows;
	// two counters per key), `fixed_window` (at most Rate per window of
	// Per, windows aligned to the clock; one counter), `sliding_log`
	// (exactly at most Rate in any window of Per; memory grows with the
	// limit) or `leaky_bucket` (a shaper: requests over the rate wait for
	// their turn, at most MaxDelay and Burst tokens queued, then proceed
	// at a steady rate). Default: `token_bucket`.
	Algorithm string `json:"algorithm,omitempty"`

	// Rate is how many tokens are refilled every Per (the window
	// algorithms: how many per window of Per). Required (or Events).
	Rate int64 `json:"rate,omitempty"`

	// Per is the refill period of Rate tokens, or the window. Required
	// (or Window).
	Per caddy.Duration `json:"per,omitempty"`

	// Burst is the bucket's capacity, the most a client can spend at
	// once (leaky bucket: the most tokens queued). Token and leaky bucket
	// only. Default: Rate.
	Burst int64 `json:"burst,omitempty"`

	// MaxDelay is the longest a leaky bucket lets a request wait for its
	// turn. Default: as long as the queue (Burst) allows.
	MaxDelay caddy.Duration `json:"max_delay,omitempty"`

	// Window is mholt/caddy-ratelimit's form of the period: at most
	// Events in any Window (a sliding log unless Algorithm says
	// otherwise). Use Window and Events instead of Rate and Per.
	Window caddy.Duration `json:"window,omitempty"`

	// Events is mholt/caddy-ratelimit's form of the limit: at most Events
	// requests in any Window.
	Events int64 `json:"events,omitempty"`

	// IPv4Prefix makes client keys that are IPv4 addresses share a bucket
	// per network of this many bits (ipv4_prefix 24: one limit per /24).
	// Default: 32 (one bucket per address).
	IPv4Prefix int `json:"ipv4_prefix,omitempty"`

	// IPv6Prefix makes client keys that are IPv6 addresses share a bucket
	// per network of this many bits: with ipv6_prefix 64, a client
	// rotating through the addresses of its /64 gets one limit. Default:
	// 128 (one bucket per address).
	IPv6Prefix int `json:"ipv6_prefix,omitempty"`

	// Cost is how many tokens a request takes: an integer, or a
	// placeholder expression that yields one (a request for which it is
	// not a non-negative integer gets status 400). Default: 1.
	Cost string `json:"cost,omitempty"`

	// OnError is what the zone does when Redis cannot decide (down, hung
	// beyond the timeout, out of memory, refusing the credentials, or the
	// circuit breaker open): `local` decides on a bucket in this node's
	// memory with the zone's rate and burst divided by the fleet's size
	// (see FleetSize), so the limit stays on; `deny` rejects the request
	// with 503 and Retry-After (fail closed, for abuse-sensitive routes
	// such as login); `allow` lets it pass unlimited (fail open). The
	// memory store never fails. Default: `local`.
	OnError string `json:"on_error,omitempty"`

	// FleetSize is how many nodes share the zone's limit, for the `local`
	// policy: each node's fallback bucket gets 1/FleetSize of the rate and
	// burst, so the fleet stays about within the limit while Redis is
	// away. Default: the nodes the fleet view saw in the last 10 seconds
	// (this one included), or 1 when it has seen no other (or metrics are
	// disabled).
	FleetSize int64 `json:"fleet_size,omitempty"`

	// MatcherSetsRaw limits the zone to matching requests. Default: all
	// requests that reach the handler.
	MatcherSetsRaw caddyhttp.RawMatcherSets `json:"match,omitempty" caddy:"namespace=http.matchers"`

	rule       *limiter.Rule
	matchers   caddyhttp.MatcherSets
	keys       []keyExpr
	cost       int64  // the static cost, when costExpr is empty
	costExpr   string // placeholder expression of a dynamic cost
	policy     string // this zone's RateLimit-Policy list member
	rateText   string // the zone's rate, for X-RateLimit-Limit
	errDenied  error
	errNever   error
	errBadCost error
	obs        *observe.Zone // placeholders and stats
}

// defaultKey is the key of a zone in fleetlimit's form (rate and per) that
// names none: the client's IP address (as Caddy determines it, honouring
// trusted_proxies). A zone in caddy-ratelimit's form has none: one bucket.
const defaultKey = "{http.vars.client_ip}"

// zoneNameRE is what a zone's name may be.
var zoneNameRE = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,64}$`)

// validate checks the zone as configured. The Caddyfile adapter calls it at
// the end of the zone block, and the handler's validate before provisioning;
// a mistake in one setting is a *settingError, and the caller adds the
// zone's name.
func (z *Zone) validate() error {
	if !zoneNameRE.MatchString(z.Name) {
		return inSetting("name", errors.New("name must be 1 to 64 letters, digits, '_', '-' or '.'"))
	}
	if z.Rate == 0 && z.Events == 0 && z.Window == 0 {
		return inSetting("rate", errors.New("rate is required: a rate per period (or a window and its events)"))
	}
	// The failure policy is compiled into the rule: checked first, so
	// that its mistakes name their own setting.
	if _, err := limiter.ParsePolicy(z.OnError); err != nil {
		return inSetting("on_error", fmt.Errorf("on_error must be allow, deny or local, got %q", z.OnError))
	}
	if z.FleetSize < 0 {
		return inSetting("fleet_size", limiter.ErrBadFleetSize)
	}
	rule, err := z.compileRule()
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
		if err := checkPlaceholders(e); err != nil {
			return inSetting("key", fmt.Errorf("key %q is not a valid placeholder expression: %w", e, err))
		}
	}
	return z.validateCost(rule)
}

// validateCost checks the zone's cost: a static one, which must fit in the
// rule's burst, or a placeholder expression.
func (z *Zone) validateCost(rule *limiter.Rule) error {
	switch c := strings.TrimSpace(z.Cost); {
	case c == "":
	case strings.ContainsAny(c, "{}"):
		if err := checkPlaceholders(c); err != nil {
			return inSetting("cost", fmt.Errorf("cost %q is not a valid placeholder expression: %w", c, err))
		}
	default:
		n, err := strconv.ParseInt(c, 10, 64)
		if err != nil || n <= 0 {
			return inSetting("cost", fmt.Errorf("cost must be a positive integer or a placeholder, got %q", c))
		}
		if n > rule.Burst() {
			return inSetting("cost", fmt.Errorf("cost %d exceeds burst %d, so no request could ever pass", n, rule.Burst()))
		}
	}
	return nil
}

// provision compiles the zone's rule, keys, cost and matchers, and the
// header values and errors it answers with.
func (z *Zone) provision(ctx caddy.Context) error {
	if err := z.validate(); err != nil {
		return err
	}
	rule, err := z.compileRule()
	if err != nil {
		return err
	}
	z.rule = rule
	z.provisionKeys()
	z.provisionCost()
	if z.MatcherSetsRaw != nil {
		mods, err := ctx.LoadModule(z, "MatcherSetsRaw")
		if err != nil {
			return fmt.Errorf("loading matchers: %w", err)
		}
		if err := z.matchers.FromInterface(mods); err != nil {
			return err
		}
	}

	z.rateText = strconv.FormatInt(rule.Rate(), 10)
	z.policy = `"` + z.Name + `";q=` + strconv.FormatInt(rule.Rate(), 10) + ";w=" + strconv.FormatInt(rule.Window(), 10)
	z.errDenied = fmt.Errorf("rate limit exceeded in zone %q", z.Name)
	z.errNever = fmt.Errorf("request cost exceeds the burst of zone %q", z.Name)
	z.errBadCost = fmt.Errorf("zone %q: request cost is not a non-negative integer", z.Name)
	return nil
}

// provisionKeys compiles the zone's validated key expressions.
func (z *Zone) provisionKeys() {
	exprs := z.Key
	if len(exprs) == 0 && !z.legacyForm() {
		// caddy-ratelimit's form keeps no key: one shared bucket.
		exprs = []string{defaultKey}
	}
	z.keys = make([]keyExpr, 0, len(exprs))
	for _, e := range exprs {
		z.keys = append(z.keys, newKeyExpr(e))
	}
}

// provisionCost compiles the zone's validated cost: a static one, or a
// placeholder expression.
func (z *Zone) provisionCost() {
	switch c := strings.TrimSpace(z.Cost); {
	case c == "":
		z.cost = 1
	case strings.ContainsAny(c, "{}"):
		z.costExpr = c
	default:
		z.cost, _ = strconv.ParseInt(c, 10, 64)
	}
}

// legacyForm reports whether the zone gives its limit in caddy-ratelimit's
// form, window and events.
func (z *Zone) legacyForm() bool {
	return z.Window != 0 || z.Events != 0
}

// keyOf returns the zone's bounded client key for a request.
func (z *Zone) keyOf(r *http.Request, repl *caddy.Replacer) string {
	for _, k := range z.keys {
		if v := k.eval(r, repl); v != "" {
			if z.IPv4Prefix != 0 || z.IPv6Prefix != 0 {
				v = networkOf(v, z.IPv4Prefix, z.IPv6Prefix)
			}
			return limiter.ClientKey(v)
		}
	}
	return ""
}

// costOf returns the request's cost in this zone; false when a dynamic cost
// is not a non-negative integer.
func (z *Zone) costOf(repl *caddy.Replacer) (int64, bool) {
	if z.costExpr == "" {
		return z.cost, true
	}
	n, err := strconv.ParseInt(strings.TrimSpace(repl.ReplaceKnown(z.costExpr, "")), 10, 64)
	return n, err == nil && n >= 0
}
