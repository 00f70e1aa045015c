// Package fleetlimit is a Caddy HTTP handler, rate_limit, that gives a whole
// fleet of Caddy nodes one global rate limit per client: every decision is
// one atomic Lua script in a shared Redis (or, with no Redis configured, the
// same arithmetic in process memory). The limiter itself lives in package
// limiter, and what the handler reports (placeholders, events, metrics,
// statistics, the admin API and dashboard) in package observe; this package
// is the Caddy module: its configuration (config.go, zone.go,
// redisconfig.go, caddyfile.go, compat.go), provisioning and the request
// path (handler.go, stores.go, keyexpr.go, headers.go).
package fleetlimit

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/fleetlimit/caddy-fleetlimit/limiter"
	"github.com/fleetlimit/caddy-fleetlimit/observe"
)

func init() {
	caddy.RegisterModule(Handler{})
}

// Handler limits the rate of requests per client, in one or more zones. A
// request passes only if every zone that applies to it admits it, and a
// request denied by any zone is charged to none. With a Redis store every
// Caddy node that points at the same Redis shares one bucket per client and
// zone, so a client gets the limit once across the fleet.
//
// Denied requests get status 429 as a handler error, so `handle_errors` can
// shape the response; the placeholder `{http.rate_limit.exceeded.name}`
// names the zone that denied. Every response a zone decided carries the
// IETF `RateLimit-Policy` and `RateLimit` fields and/or the legacy
// `X-RateLimit-*` fields, and a denial carries `Retry-After`.
type Handler struct {
	// Redis shares the buckets through a Redis server. Without it the
	// buckets live in this process's memory (one node's limit).
	Redis *RedisConfig `json:"redis,omitempty"`

	// Zones are the limits, decided in this order. At least one is
	// required.
	Zones []*Zone `json:"zones,omitempty"`

	// Headers chooses the rate limit header fields on responses: `ietf`
	// (RateLimit-Policy and RateLimit, draft-ietf-httpapi-ratelimit-headers),
	// `legacy` (X-RateLimit-Limit, -Remaining, -Reset), `both` or `none`.
	// Default: `both`.
	Headers string `json:"headers,omitempty"`

	// LogKey writes client keys into logs as they are. By default logs
	// carry only a one-way digest of the key, since keys are often API
	// keys or user ids.
	LogKey bool `json:"log_key,omitempty"`

	// KeyDigestSecret keys the digests that logs, statistics and events
	// carry instead of client keys (HMAC-SHA256), so that nobody without
	// it can reverse a digest by hashing candidate keys, such as every
	// IPv4 address. {env.*} placeholders are expanded; it is never logged.
	// Nodes with the same secret give the same digests. Default: a secret
	// generated once and kept in Caddy's storage (shared by the nodes that
	// share the storage).
	KeyDigestSecret string `json:"key_digest_secret,omitempty"`

	// Jitter adds, at random, up to a share of the wait to Retry-After,
	// so that denied clients do not all come back at once. A number from
	// 0 to 1 is that share (0.2: up to 20%; 1: up to the whole wait); a
	// whole number from 2 to 100 is a percentage (20: up to 20%), the
	// reading fleetlimit has always had. Every other number is refused:
	// between 1 and 2, and for fractions above 1, the two readings meet
	// (1.01 would be 101% as a share and 1.01% as a percentage), so no
	// accepted value sits on a cliff. The Caddyfile also takes an explicit
	// percentage, `20%` or `1.5%`, and writes it here as a share.
	// caddy-ratelimit read every number as a multiple of the wait (20 was
	// up to 20 times the wait); a configuration in that plugin's form with
	// jitter above 1 gets a warning at start saying what it means now.
	// Default: none.
	Jitter float64 `json:"jitter,omitempty"`

	// LogDenials is how denied requests are logged: `debug` (every
	// denial, at debug level), `info` (at info level, at most one line
	// per key and zone per second, and at most 1024 lines a second in
	// all, then one line counting those left out, so that a flood cannot
	// flood the log) or `off`.
	// A line is "rate limit exceeded" with the fields of caddy-ratelimit's
	// line, which logged every denial at info (`zone`, `wait`,
	// `remote_ip`, and `key` with log_key), so that fail2ban-style
	// filters keep matching with `info`, and fleetlimit's own
	// (`key_digest` unless log_key, `cost`, `retry_after`). Default:
	// `debug`.
	LogDenials string `json:"log_denials,omitempty"`

	// RateLimits is mholt/caddy-ratelimit's JSON form of the zones, an
	// object of zone name to limit, accepted unchanged so that that
	// plugin's JSON configurations load. At provisioning each becomes a
	// zone with that plugin's meaning (at most max_events in any window:
	// the sliding_log algorithm; its matchers, key and prefixes), in the
	// order of their names, sorted (that plugin ordered them by how
	// strict they were; fleetlimit decides every zone of a request at
	// once and names the first zone in that order that denied). Not with
	// Zones: a configuration gives its zones one way or the other.
	// Everything else of the handler (redis, headers, log_denials...)
	// applies to them as to Zones.
	RateLimits map[string]*LegacyRateLimit `json:"rate_limits,omitempty"`

	// SweepInterval is how often the memory store drops idle buckets
	// (caddy-ratelimit's option). The store is shared by the whole
	// process: the configuration loaded last sets it. Default: 1m.
	SweepInterval caddy.Duration `json:"sweep_interval,omitempty"`

	// MaxKeys bounds how many buckets this node keeps in memory: the
	// memory store's, and the local fallback buckets of zones with
	// on_error local. When it is reached, a new key evicts the bucket
	// closest to full among a few sampled (a full bucket loses nothing;
	// another lets its client start again from a full bucket, once), so a
	// flood of new keys cannot grow the node's memory. The store is
	// shared by the whole process: the configuration loaded last sets it.
	// About 100 B of heap per bucket; the default, 500000, keeps the
	// store under about 100 MB of memory, garbage collection included.
	MaxKeys int `json:"max_keys,omitempty"`

	// Distributed is caddy-ratelimit's distributed mode, accepted so that
	// its Caddyfiles load unchanged, and ignored with a warning:
	// fleetlimit shares state through Redis (the redis block), exactly.
	Distributed *LegacyDistributed `json:"distributed,omitempty"`

	// Storage is caddy-ratelimit's storage module for its distributed
	// mode: accepted and ignored with a warning, like Distributed.
	Storage json.RawMessage `json:"storage,omitempty"`

	// DisableMetrics turns off this handler's Prometheus metrics and its
	// statistics in the admin API (dashboard and fleet view included).
	// Placeholders, events and logs stay. Default: metrics on.
	DisableMetrics bool `json:"disable_metrics,omitempty"`

	// DryRun makes every zone a dry run (see Zone.DryRun): the limits
	// decide and count, deny nothing and send no rate limit fields, so
	// that a new configuration can be watched before it is enforced.
	DryRun bool `json:"dry_run,omitempty"`

	obs     *observe.Handler // placeholders, events, metrics and stats
	denials denialLog        // how denials are logged (log_denials)
	// dryRunLog throttles the log lines of dry-run zones (nil: none).
	dryRunLog *denialThrottle
	now       func() time.Time // the clock of the denial log's seconds
	// jitterShare is Jitter read as a share of the wait.
	jitterShare float64
	headers     headerMode
	limiter     *limiter.Limiter
	poolKey     string
	localKey    string       // the memory store of local fallback buckets, if any
	memory      *memoryStore // the pooled memory store, when this handler uses it (its settings)
	logger      *zap.Logger
	digest      limiter.Digester // client keys' digests in logs, stats and events
	anyMatch    bool             // some zone has matchers
	// policy is the RateLimit-Policy of a request that every zone applies
	// to, unless varyPolicy: some zone's rule comes from placeholders or
	// is a dry run.
	policy     string
	varyPolicy bool
}

// RedisConfig connects the handler to Redis. Handlers with the same
// connection settings share one client, which survives config reloads.
type RedisConfig struct {
	// Address is the server's host:port.
	Address string `json:"address,omitempty"`
	// Addresses are the seed nodes of a Redis Cluster (any reachable
	// node will do; the client discovers the rest).
	Addresses []string `json:"addresses,omitempty"`
	// Cluster selects Redis Cluster with a single seed Address. Several
	// addresses always mean a Cluster.
	Cluster bool `json:"cluster,omitempty"`
	// SentinelMaster is the master name that Redis Sentinel monitors:
	// set, the sentinels of SentinelAddresses tell the client where the
	// master is, also after a failover (instead of Address).
	SentinelMaster string `json:"sentinel_master,omitempty"`
	// SentinelAddresses are the sentinels' host:port, with
	// SentinelMaster ({env.*} placeholders are expanded).
	SentinelAddresses []string `json:"sentinel_addresses,omitempty"`
	// SentinelUsername is the ACL user on the sentinels, if they need one
	// ({env.*} placeholders are expanded).
	SentinelUsername string `json:"sentinel_username,omitempty"`
	// SentinelPassword authenticates to the sentinels ({env.*}
	// placeholders are expanded). It is never logged.
	SentinelPassword string `json:"sentinel_password,omitempty"`
	// Username is the ACL user; {env.*} placeholders are expanded.
	Username string `json:"username,omitempty"`
	// Password authenticates; {env.*} placeholders are expanded. It is
	// never logged.
	Password string `json:"password,omitempty"`
	// DB is the database number (not with a Cluster). Default: 0.
	DB int `json:"db,omitempty"`
	// TLS encrypts every connection (servers and sentinels).
	TLS *RedisTLS `json:"tls,omitempty"`
	// PoolSize is the most connections per Redis server and node.
	// Default: pipelines + 2 (one per pipeline, and two for the rest:
	// script loads, health checks, the fleet view).
	PoolSize int `json:"pool_size,omitempty"`
	// Pipelines is how many round trips to Redis a node keeps in flight at
	// once. The decisions that arrive while they are all out wait and go
	// together in the next one, as one script call. Default: 1, the least
	// CPU per decision on the node and in Redis; raise it for a distant
	// Redis, where a decision would otherwise wait up to a long round trip
	// for the one in flight.
	Pipelines int `json:"pipelines,omitempty"`
	// DialTimeout bounds opening a connection. Default: 1s.
	DialTimeout caddy.Duration `json:"dial_timeout,omitempty"`
	// Protocol is the RESP version, 2 or 3. Default: 3, falling back to 2
	// when the server does not speak 3.
	Protocol int `json:"protocol,omitempty"`
	// DisableIdentity skips CLIENT SETINFO on connect, for proxies and
	// managed services that reject it (use with protocol 2 for those that
	// reject HELLO too).
	DisableIdentity bool `json:"disable_identity,omitempty"`
	// KeyPrefix starts every key the limiter writes. Default: `rl:`.
	KeyPrefix string `json:"key_prefix,omitempty"`
	// Timeout is how long a decision waits for Redis, counted in the time
	// this node was able to run, before each zone applies its on_error
	// policy. A node whose CPUs are saturated reads Redis' replies late,
	// and a Redis that has been answering slowly lately is given the time
	// it has been taking: neither is a failure, and the decision waits
	// (up to MaxWait) rather than letting requests through. Default: 25ms.
	Timeout caddy.Duration `json:"timeout,omitempty"`
	// MaxWait is the most a decision waits for Redis in wall time however
	// starved the node (a node frozen meanwhile first gets Timeout of
	// running time; never more than twice MaxWait). Default: 1s.
	MaxWait caddy.Duration `json:"max_wait,omitempty"`
	// DenyCacheSize is how many denied buckets each node remembers, to
	// deny a flood on them without asking Redis until a token can be
	// there again (exact: tokens cannot appear sooner). Default: 65536.
	DenyCacheSize int `json:"deny_cache_size,omitempty"`
	// BreakerFailures is how many consecutive failed round trips to Redis
	// (however many decisions each carried) open the circuit breaker,
	// after which Redis is not called for
	// BreakerCooldown and every zone applies its failure policy at once.
	// Default: 5.
	BreakerFailures int `json:"breaker_failures,omitempty"`
	// BreakerCooldown is how long an open breaker keeps decisions away
	// from Redis; then one request probes it, and its success closes the
	// breaker. Default: 1s.
	BreakerCooldown caddy.Duration `json:"breaker_cooldown,omitempty"`
}

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

// RedisTLS configures TLS to Redis.
type RedisTLS struct {
	// CA is a PEM file of the certificate authorities to trust. Default:
	// the system's.
	CA string `json:"ca,omitempty"`
	// Cert is a PEM file of a client certificate, for servers that
	// require one; with Key. Read again at every config load, so that a
	// certificate rotated in place is used after a reload.
	Cert string `json:"cert,omitempty"`
	// Key is the PEM file of Cert's private key.
	Key string `json:"key,omitempty"`
	// ServerName is the name to verify in the server's certificate.
	// Default: the host of the address.
	ServerName string `json:"server_name,omitempty"`
	// InsecureSkipVerify accepts any server certificate. For tests only.
	InsecureSkipVerify bool `json:"insecure_skip_verify,omitempty"`
}

// CaddyModule returns the Caddy module information.
func (Handler) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.rate_limit",
		New: func() caddy.Module { return new(Handler) },
	}
}

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
	return nil
}

// zoneSetting names the i-th zone as a setting, for settingError.
func zoneSetting(i int) string { return "zones." + strconv.Itoa(i) }
