// Package fleetlimit is a Caddy HTTP handler, rate_limit, that gives a whole
// fleet of Caddy nodes one global rate limit per client: every decision is
// one atomic Lua script in a shared Redis (or, with no Redis configured, the
// same arithmetic in process memory). The limiter itself lives in package
// limiter, and what the handler reports (placeholders, events, metrics,
// statistics, the admin API and dashboard) in package observe; this package
// is the Caddy module: the Handler with its Zones and RedisConfig, the
// Caddyfile directive (Handler.UnmarshalCaddyfile), the checks of a
// configuration (Handler.Validate) and the request path
// (Handler.ServeHTTP).
package fleetlimit

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
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
	// process: the shortest interval of the handlers using it sets it.
	// Default: 1m.
	SweepInterval caddy.Duration `json:"sweep_interval,omitempty"`

	// MaxKeys bounds how many buckets this node keeps in memory: the
	// memory store's, and the local fallback buckets of zones with
	// on_error local. When it is reached, a new key evicts the bucket
	// closest to full among a few sampled (a full bucket loses nothing;
	// another lets its client start again from a full bucket, once), so a
	// flood of new keys cannot grow the node's memory. The denial counts
	// and bans of zones with a ban count too (a ban in force is evicted
	// last). The store is shared by the whole process: the smallest
	// max_keys of the handlers using it bounds all their buckets,
	// whatever order they were provisioned in, and a handler without one
	// never raises it. About 100 B of heap per bucket; the default,
	// 500000 (when no handler sets one), keeps the store under about
	// 100 MB of memory, garbage collection included.
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

	// Exempt lists clients that no zone of the handler limits: IP
	// addresses (`192.0.2.7`, `::1`), CIDR networks (`10.0.0.0/8`) or
	// `private_ranges`. The address matched is Caddy's client IP, the
	// `{client_ip}` placeholder: the connection's peer, or, from a proxy
	// that the server's `trusted_proxies` name, the client it forwards
	// for. An exempt request is counted under the outcome `exempt` in
	// each zone that applies to it, costs no store call, and gets no rate
	// limit fields. Zones have their own Exempt too. Default: none.
	Exempt []string `json:"exempt,omitempty"`

	obs     *observe.Handler // placeholders, events, metrics and stats
	exempt  exemptSet        // Exempt, parsed
	denials denialLog        // how denials are logged (log_denials)
	// denyAsError: a denial is returned as a handler error, because
	// something may see the error (see provisionDenialAnswer); else the
	// handler writes the 429 itself.
	denyAsError bool
	// dryRunLog throttles the log lines of dry-run zones (nil: none).
	dryRunLog *denialThrottle
	now       func() time.Time // the clock of the denial log's seconds
	// jitterShare is Jitter read as a share of the wait.
	jitterShare float64
	headers     headerMode
	limiter     *limiter.Limiter
	// live is limiter once provisioned, for the stats that other
	// goroutines read (the admin API may read them while it provisions).
	live     *atomic.Pointer[limiter.Limiter]
	poolKey  string
	localKey string       // the memory store of local fallback buckets, if any
	memory   *memoryStore // the pooled memory store, when this handler uses it (its settings)
	logger   *zap.Logger
	digest   limiter.Digester // client keys' digests in logs, stats and events
	anyMatch bool             // some zone has matchers
	// policy is the RateLimit-Policy of a request that every zone applies
	// to, unless varyPolicy: some zone's rule comes from placeholders or
	// is a dry run.
	policy     string
	varyPolicy bool
	// fromRateLimits: Zones were translated from RateLimits by Provision.
	fromRateLimits bool
}

// CaddyModule returns the Caddy module information.
func (Handler) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.rate_limit",
		New: func() caddy.Module { return new(Handler) },
	}
}

// Provision checks the configuration (validate), then sets up the zones,
// the store, the observability and the limiter.
func (h *Handler) Provision(ctx caddy.Context) error {
	if h.logger == nil { // tests may set their own
		h.logger = ctx.Logger()
	}
	if err := h.validate(); err != nil {
		return err
	}
	if err := h.provisionDigester(ctx); err != nil {
		return err
	}
	h.headers, _ = parseHeaderMode(h.Headers)
	if err := h.provisionDenials(); err != nil {
		return err
	}
	h.provisionDenialAnswer(ctx)
	if err := h.provisionCompat(); err != nil {
		return err
	}
	h.exempt, _ = parseExempt(h.Exempt) // validated
	if err := h.provisionZones(ctx); err != nil {
		return err
	}
	h.provisionDryRun()
	store, key, err := h.provisionStore()
	if err != nil {
		return err
	}
	h.poolKey = key
	opt, err := h.limiterOptions()
	if err != nil {
		return err
	}
	if err := h.provisionObservability(ctx, store, opt.Local); err != nil {
		return err
	}
	opt.Observer = h.obs.Observer()
	opt.FleetSize = h.obs.FleetSize
	h.limiter = limiter.New(store, opt)
	h.live.Store(h.limiter)
	h.publishZones() // for the Envoy rate limit service (LookupZone)
	return nil
}

// provisionZones provisions every zone (caddy-ratelimit's rate_limits
// among them, once translated) and the handler's RateLimit-Policy field.
func (h *Handler) provisionZones(ctx caddy.Context) error {
	h.expandQuotas()
	policies := make([]string, 0, len(h.Zones))
	for _, z := range h.Zones {
		z.allDryRun = h.DryRun
		if err := z.provision(ctx); err != nil {
			return fmt.Errorf("zone %q: %w", z.Name, err)
		}
		h.anyMatch = h.anyMatch || len(z.matchers) > 0
		h.varyPolicy = h.varyPolicy || z.rules != nil || z.rule.DryRun() || z.base.calendar
		if !z.rule.DryRun() {
			policies = append(policies, z.base.policy)
		}
	}
	h.policy = strings.Join(policies, ", ")
	return nil
}

// limiterOptions returns the limiter's options: the deny cache of a Redis
// store, and the memory store of the local fallback buckets when a zone
// has the local policy.
func (h *Handler) limiterOptions() (limiter.Options, error) {
	opt := limiter.Options{Log: h.logger}
	if h.Redis != nil {
		// A new configuration starts with an empty cache: its rules
		// may differ.
		opt.Cache = limiter.NewDenyCache(limiter.DenyCacheOptions{Size: h.Redis.DenyCacheSize})
	}
	for _, z := range h.Zones {
		if z.rule.OnError() == limiter.PolicyLocal && opt.Local == nil {
			// The fallback buckets live in this node's memory store,
			// which outlives reloads like the Redis client does.
			local, err := h.loadMemoryStore()
			if err != nil {
				return opt, err
			}
			h.localKey, opt.Local = memoryPoolKey, local
		}
	}
	return opt, nil
}

// provisionObservability sets up the placeholders, events, metrics and
// statistics of the handler and its zones (released by Cleanup).
func (h *Handler) provisionObservability(ctx caddy.Context, store, local limiter.Store) error {
	rules := make([]*limiter.Rule, len(h.Zones))
	zones := make([]observe.ZoneConfig, len(h.Zones))
	live := new(atomic.Pointer[limiter.Limiter])
	h.live = live
	for i, z := range h.Zones {
		rules[i], zones[i] = z.rule, z.observeConfig()
		if n, _ := z.rule.Prefetch(); n > 0 {
			zones[i].Prefetch = func() limiter.PrefetchStats {
				if l := live.Load(); l != nil {
					return l.PrefetchStats(z.rule)
				}
				return limiter.PrefetchStats{}
			}
		}
	}
	obs, err := observe.New(ctx, observe.Config{
		Rules:          rules,
		Zones:          zones,
		Store:          store,
		StoreKey:       h.poolKey,
		StoreName:      h.storeName(),
		Memory:         memoryOf(store, local),
		Digest:         h.digest,
		LogKey:         h.LogKey,
		DisableMetrics: h.DisableMetrics,
	})
	if err != nil {
		return err
	}
	h.obs = obs
	for i, z := range h.Zones {
		z.obs = obs.Zone(i)
	}
	return nil
}

// memoryOf returns the memory store among a handler's store and its store
// of local fallback buckets, or nil.
func memoryOf(stores ...limiter.Store) *limiter.MemoryStore {
	for _, s := range stores {
		if m, ok := s.(*limiter.MemoryStore); ok {
			return m
		}
	}
	return nil
}

// Validate checks the configuration as Provision does before it sets
// anything up (validate), and the settings that Provision resolves from
// the environment: the placeholders of key_digest_secret and the Redis TLS
// files. Caddy calls it after Provision; alone, it refuses what Provision
// would refuse, except matchers, whose modules only Provision loads.
func (h *Handler) Validate() error {
	if err := h.validate(); err != nil {
		return err
	}
	if h.KeyDigestSecret != "" {
		if _, err := h.digestSecret(); err != nil {
			return err
		}
	}
	if h.Redis != nil {
		if _, err := h.Redis.options(); err != nil {
			return err
		}
	}
	return nil
}

// Cleanup releases the stores; the last handler using one closes it.
func (h *Handler) Cleanup() error {
	h.withdrawZones()
	var err error
	if h.limiter != nil {
		h.limiter.Close() // gives back prefetched spares while the store is open
	}
	if h.obs != nil {
		err = h.obs.Cleanup() // first: it may stop a reporter using the store
	}
	h.releaseMemorySettings()
	for _, key := range []string{h.poolKey, h.localKey} {
		if key != "" {
			if _, e := stores.Delete(key); e != nil {
				err = e
			}
		}
	}
	return err
}

// ServeHTTP decides the request against every zone that applies to it, and
// passes it on when every zone admits it.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	sc := scratchPool.Get().(*scratch)
	pass, err := h.limit(w, r, sc)
	if pass && sc.held {
		return h.serveHeld(w, r, next, sc)
	}
	if sc.held {
		// Admitted, but ended before it was passed on (its client left
		// while a leaky bucket delayed it): give back what it holds.
		h.release(sc, statusClientClosed, nil)
	}
	*sc = scratch{} // drop the keys and zones it refers to
	scratchPool.Put(sc)
	if !pass {
		return err
	}
	return next.ServeHTTP(w, r)
}

// Interface guards
var (
	_ caddy.Provisioner           = (*Handler)(nil)
	_ caddy.Validator             = (*Handler)(nil)
	_ caddy.CleanerUpper          = (*Handler)(nil)
	_ caddyhttp.MiddlewareHandler = (*Handler)(nil)
)
