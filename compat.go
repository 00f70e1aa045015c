package fleetlimit

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// What is here only for mholt/caddy-ratelimit's sake: its options and its
// JSON form of the zones, which fleetlimit accepts so that that plugin's
// configurations load unchanged (its Caddyfile forms are parsed by
// UnmarshalCaddyfile, its window and events by Zone.compileRule).

// LegacyDistributed is caddy-ratelimit's distributed block, kept only so
// that its configurations load.
type LegacyDistributed struct {
	// ReadInterval is how often that plugin read the other instances'
	// states from storage. Ignored: Redis is read on every decision.
	ReadInterval caddy.Duration `json:"read_interval,omitempty"`
	// WriteInterval is how often that plugin wrote its state to storage.
	// Ignored: Redis is written on every decision.
	WriteInterval caddy.Duration `json:"write_interval,omitempty"`
	// PurgeAge is how old that plugin let a stored state grow before
	// deleting it. Ignored: every bucket in Redis expires when full.
	PurgeAge caddy.Duration `json:"purge_age,omitempty"`
}

// LegacyRateLimit is one zone of mholt/caddy-ratelimit's JSON form (see
// Handler.RateLimits), with that plugin's field names.
type LegacyRateLimit struct {
	// MatcherSetsRaw limits the zone to matching requests. Default: all
	// requests that reach the handler.
	MatcherSetsRaw caddyhttp.RawMatcherSets `json:"match,omitempty" caddy:"namespace=http.matchers"`

	// Key is a placeholder expression naming the client. Default: none,
	// so one bucket is shared by every request of the zone, as in that
	// plugin (whose key defaulted to the empty, static string).
	Key string `json:"key,omitempty"`

	// Window is the sliding window: a Caddy duration, in nanoseconds or
	// a string such as "1m". Required.
	Window caddy.Duration `json:"window,omitempty"`

	// MaxEvents is the most requests admitted in any Window. Required,
	// at least 1.
	MaxEvents int64 `json:"max_events,omitempty"`

	// IPv4Prefix makes keys that are IPv4 addresses share a bucket per
	// network of this many bits, as Zone.IPv4Prefix. Default: 32.
	IPv4Prefix int `json:"ipv4_prefix,omitempty"`

	// IPv6Prefix makes keys that are IPv6 addresses share a bucket per
	// network of this many bits, as Zone.IPv6Prefix. Default: 128.
	IPv6Prefix int `json:"ipv6_prefix,omitempty"`
}

// provisionCompat turns caddy-ratelimit's rate_limits into zones, and warns
// about what that plugin's users would otherwise miss: options accepted
// only so that its configurations load, and the ones whose meaning changed.
func (h *Handler) provisionCompat() error {
	h.jitterShare, _ = jitterShare(h.Jitter)
	if err := h.translateRateLimits(); err != nil {
		return err
	}
	if h.Distributed != nil {
		h.logger.Warn("rate_limit: the 'distributed' block of caddy-ratelimit is accepted and ignored: " +
			"fleetlimit shares every bucket through Redis, exactly, with no read or write intervals; add a redis block to share limits across nodes")
	}
	if len(h.Storage) > 0 {
		h.logger.Warn("rate_limit: 'storage' (caddy-ratelimit's distributed state) is accepted and ignored: " +
			"fleetlimit keeps shared buckets in Redis; configure the redis block instead")
	}
	if !h.legacyForm() {
		return nil
	}
	if h.Jitter > 1 {
		j := strconv.FormatFloat(h.Jitter, 'f', -1, 64)
		h.logger.Warn("rate_limit: jitter " + j + " adds up to " + j + "% of the wait to Retry-After; " +
			"caddy-ratelimit read it as up to " + j + " times the wait. fleetlimit adds at most the whole wait (jitter 1); " +
			"write jitter " + strconv.FormatFloat(h.Jitter/100, 'f', -1, 64) + " to keep this reading and silence this warning")
	}
	if h.LogDenials == "" {
		h.logger.Warn("rate_limit: denials are logged at debug level; caddy-ratelimit logged every one at info " +
			"(\"rate limit exceeded\" with zone, wait and remote_ip). For log-based bans such as fail2ban, set log_denials info " +
			"(at most one line per key and zone a second); set log_denials debug to keep this and silence this warning")
	}
	return nil
}

// legacyForm reports whether the configuration is written in
// caddy-ratelimit's form: its rate_limits, or a zone with window and events.
func (h *Handler) legacyForm() bool {
	if len(h.RateLimits) > 0 {
		return true
	}
	for _, z := range h.Zones {
		if z != nil && z.legacyForm() {
			return true
		}
	}
	return false
}

// translateRateLimits turns caddy-ratelimit's rate_limits into zones, in
// the order of their names.
func (h *Handler) translateRateLimits() error {
	if len(h.RateLimits) == 0 {
		return nil
	}
	names := slices.Sorted(maps.Keys(h.RateLimits))
	h.Zones = make([]*Zone, 0, len(names))
	for _, name := range names {
		z, err := h.RateLimits[name].zone(name)
		if err != nil {
			return fmt.Errorf("rate_limits %q: %w", name, err)
		}
		h.Zones = append(h.Zones, z)
	}
	h.fromRateLimits = true
	return nil
}

// zone returns the fleetlimit zone of one of caddy-ratelimit's zones: at
// most max_events in any window (a sliding log), with its matchers, key
// and prefixes; no key is one bucket for all.
func (rl *LegacyRateLimit) zone(name string) (*Zone, error) {
	switch {
	case rl == nil:
		return nil, errors.New("the zone is empty")
	case !zoneNameRE.MatchString(name):
		return nil, errors.New("a zone name must be 1 to 64 letters, digits, '_', '-' or '.' (it names metrics, headers and Redis keys)")
	case rl.Window <= 0:
		return nil, errors.New("window must be a positive duration")
	case rl.MaxEvents <= 0:
		return nil, errors.New("max_events must be at least 1")
	}
	z := &Zone{
		Name:           name,
		Window:         rl.Window,
		Events:         rl.MaxEvents,
		IPv4Prefix:     rl.IPv4Prefix,
		IPv6Prefix:     rl.IPv6Prefix,
		MatcherSetsRaw: rl.MatcherSetsRaw,
	}
	if strings.TrimSpace(rl.Key) != "" {
		z.Key = []string{rl.Key}
	}
	return z, nil
}
