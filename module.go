// Package fleetlimit is a Caddy HTTP handler, rate_limit, that gives a whole
// fleet of Caddy nodes one global rate limit per client: every decision is
// one atomic Lua script in a shared Redis (or, with no Redis configured, the
// same arithmetic in process memory). The limiter itself lives in package
// limiter; this package is the Caddy glue.
package fleetlimit

import (
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/fleetlimit/caddy-fleetlimit/limiter"
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

	// Jitter adds, at random, up to this share of the wait to
	// Retry-After, so that denied clients do not all come back at once:
	// 0.2 and 20 both mean up to 20% (caddy-ratelimit's option). Default:
	// none.
	Jitter float64 `json:"jitter,omitempty"`

	// SweepInterval is how often the memory store drops idle buckets
	// (caddy-ratelimit's option). The store is shared by the whole
	// process: the value of the configuration that creates it holds.
	// Default: 1m.
	SweepInterval caddy.Duration `json:"sweep_interval,omitempty"`

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

	obs      *handlerObs // placeholders, events, metrics (observe.go)
	headers  headerMode
	limiter  *limiter.Limiter
	poolKey  string
	localKey string // the memory store of local fallback buckets, if any
	logger   *zap.Logger
	anyMatch bool // some zone has matchers
	policy   string
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
	// SentinelMaster is the master name that Redis Sentinel monitors;
	// with it, SentinelAddresses list the sentinels, which tell the
	// client where the master is, also after a failover.
	SentinelMaster    string   `json:"sentinel_master,omitempty"`
	SentinelAddresses []string `json:"sentinel_addresses,omitempty"`
	// SentinelUsername and SentinelPassword authenticate to the sentinels
	// ({env.*} placeholders are expanded; never logged).
	SentinelUsername string `json:"sentinel_username,omitempty"`
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
	// Timeout bounds each decision; when it runs out the request passes
	// (fails open). Default: 25ms.
	Timeout caddy.Duration `json:"timeout,omitempty"`
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
	// ReadInterval, WriteInterval and PurgeAge are that plugin's timings.
	ReadInterval  caddy.Duration `json:"read_interval,omitempty"`
	WriteInterval caddy.Duration `json:"write_interval,omitempty"`
	PurgeAge      caddy.Duration `json:"purge_age,omitempty"`
}

// RedisTLS configures TLS to Redis.
type RedisTLS struct {
	// CA is a PEM file of the certificate authorities to trust. Default:
	// the system's.
	CA string `json:"ca,omitempty"`
	// Cert and Key are PEM files of a client certificate, for servers
	// that require one.
	Cert string `json:"cert,omitempty"`
	Key  string `json:"key,omitempty"`
	// ServerName is the name to verify in the server's certificate.
	// Default: the host of the address.
	ServerName string `json:"server_name,omitempty"`
	// InsecureSkipVerify accepts any server certificate. For tests only.
	InsecureSkipVerify bool `json:"insecure_skip_verify,omitempty"`
}

// Zone is one limit: a token bucket per client key.
type Zone struct {
	// Name identifies the zone in headers, placeholders and logs, and is
	// part of every bucket's key: zones of the same name share buckets.
	// Letters, digits, `_`, `-` and `.`, at most 64 characters.
	Name string `json:"name"`

	// Key lists placeholder expressions; the client key is the first one
	// that is not empty. Default: `{http.vars.client_ip}`. Keys longer
	// than 64 bytes or with unusual characters are hashed (SHA-256), so
	// client input cannot grow the store or break a key. When every
	// expression is empty, all such requests share one bucket.
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

	// Window and Events are mholt/caddy-ratelimit's form of a limit: at
	// most Events in any Window (a sliding log unless Algorithm says
	// otherwise). Use them instead of Rate and Per.
	Window caddy.Duration `json:"window,omitempty"`
	Events int64          `json:"events,omitempty"`

	// IPv4Prefix and IPv6Prefix make client keys that are IP addresses
	// share a bucket per network: with ipv6_prefix 64, a client rotating
	// through the addresses of its /64 gets one limit. Default: 32 and
	// 128 (one bucket per address).
	IPv4Prefix int `json:"ipv4_prefix,omitempty"`
	IPv6Prefix int `json:"ipv6_prefix,omitempty"`

	// Cost is how many tokens a request takes: an integer, or a
	// placeholder expression that yields one (a request for which it is
	// not a non-negative integer gets status 400). Default: 1.
	Cost string `json:"cost,omitempty"`

	// OnError is what the zone does when Redis cannot decide (down, slow
	// beyond the timeout, or the circuit breaker open): `allow` lets the
	// request pass (fail open), `deny` rejects it with 503 and
	// Retry-After (fail closed, for abuse-sensitive routes such as
	// login), `local` decides on a bucket in this node's memory with the
	// zone's rate and burst divided by FleetSize. Default: `allow`.
	OnError string `json:"on_error,omitempty"`

	// FleetSize is how many nodes share the zone's limit, for the `local`
	// policy: each node's fallback bucket gets 1/FleetSize of the rate and
	// burst, so the fleet stays about within the limit while Redis is
	// away. Default: 1.
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
	obs        *zoneObs // placeholders and stats (observe.go)
}

// defaultKey is the key of a zone that names none: the client's IP address
// (as Caddy determines it, honouring trusted_proxies).
const defaultKey = "{http.vars.client_ip}"

// exceededPlaceholder names the zone that denied a request.
const exceededPlaceholder = "http.rate_limit.exceeded.name"

var zoneNameRE = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,64}$`)

// CaddyModule returns the Caddy module information.
func (Handler) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.rate_limit",
		New: func() caddy.Module { return new(Handler) },
	}
}

// Provision sets up the zones and the store.
func (h *Handler) Provision(ctx caddy.Context) error {
	h.logger = ctx.Logger()
	mode, err := parseHeaderMode(h.Headers)
	if err != nil {
		return err
	}
	h.headers = mode
	if err := h.provisionCompat(); err != nil {
		return err
	}
	if len(h.Zones) == 0 {
		return errors.New("rate_limit: at least one zone is required")
	}
	seen := make(map[string]bool, len(h.Zones))
	policies := make([]string, 0, len(h.Zones))
	for i, z := range h.Zones {
		if z == nil {
			return fmt.Errorf("rate_limit: zone %d is empty", i)
		}
		if seen[z.Name] {
			return fmt.Errorf("rate_limit: duplicate zone name %q", z.Name)
		}
		seen[z.Name] = true
		if err := z.provision(ctx); err != nil {
			return fmt.Errorf("rate_limit: zone %q: %w", z.Name, err)
		}
		h.anyMatch = h.anyMatch || len(z.matchers) > 0
		policies = append(policies, z.policy)
	}
	h.policy = strings.Join(policies, ", ")

	store, key, err := h.provisionStore()
	if err != nil {
		return err
	}
	h.poolKey = key
	opt := limiter.Options{Log: h.logger}
	if h.Redis != nil {
		// A new configuration starts with an empty cache: its rules
		// may differ.
		opt.Cache = limiter.NewDenyCache(h.Redis.DenyCacheSize)
	}
	for _, z := range h.Zones {
		if z.rule.OnError == limiter.PolicyLocal && opt.Local == nil {
			// The fallback buckets live in this node's memory store,
			// which outlives reloads like the Redis client does.
			local, err := loadMemoryStore(time.Duration(h.SweepInterval))
			if err != nil {
				return err
			}
			h.localKey, opt.Local = memoryPoolKey, local
		}
	}
	if err := h.provisionObservability(ctx, store, &opt); err != nil {
		return err
	}
	h.limiter = limiter.New(store, opt)
	return nil
}

func (z *Zone) provision(ctx caddy.Context) error {
	if !zoneNameRE.MatchString(z.Name) {
		return errors.New("name must be 1 to 64 letters, digits, '_', '-' or '.'")
	}
	rule, err := z.compileRule()
	if err != nil {
		return err
	}
	z.rule = rule
	if z.IPv4Prefix < 0 || z.IPv4Prefix > 32 || z.IPv6Prefix < 0 || z.IPv6Prefix > 128 {
		return errors.New("ipv4_prefix must be 0 to 32 and ipv6_prefix 0 to 128")
	}
	policy, err := limiter.ParsePolicy(z.OnError)
	if err != nil {
		return err
	}
	if z.FleetSize < 0 {
		return limiter.ErrBadFleetSize
	}
	if err := rule.SetFailurePolicy(policy, max(1, z.FleetSize)); err != nil {
		return err
	}

	exprs := z.Key
	if len(exprs) == 0 {
		exprs = []string{defaultKey}
	}
	z.keys = make([]keyExpr, 0, len(exprs))
	for _, e := range exprs {
		if strings.TrimSpace(e) == "" {
			return errors.New("key expressions must not be empty")
		}
		if err := checkPlaceholders(e); err != nil {
			return fmt.Errorf("key %q: %w", e, err)
		}
		z.keys = append(z.keys, newKeyExpr(e))
	}

	switch c := strings.TrimSpace(z.Cost); {
	case c == "":
		z.cost = 1
	case strings.ContainsAny(c, "{}"):
		if err := checkPlaceholders(c); err != nil {
			return fmt.Errorf("cost %q: %w", c, err)
		}
		z.costExpr = c
	default:
		n, err := strconv.ParseInt(c, 10, 64)
		if err != nil || n <= 0 {
			return fmt.Errorf("cost %q is neither a positive integer nor a placeholder", c)
		}
		if n > rule.Burst {
			return fmt.Errorf("cost %d exceeds burst %d: no request could ever pass", n, rule.Burst)
		}
		z.cost = n
	}

	if z.MatcherSetsRaw != nil {
		mods, err := ctx.LoadModule(z, "MatcherSetsRaw")
		if err != nil {
			return fmt.Errorf("loading matchers: %w", err)
		}
		if err := z.matchers.FromInterface(mods); err != nil {
			return err
		}
	}

	z.rateText = strconv.FormatInt(rule.Rate, 10)
	z.policy = `"` + z.Name + `";q=` + strconv.FormatInt(rule.Rate, 10) + ";w=" + strconv.FormatInt(rule.Window(), 10)
	z.errDenied = fmt.Errorf("rate limit exceeded in zone %q", z.Name)
	z.errNever = fmt.Errorf("request cost exceeds the burst of zone %q", z.Name)
	z.errBadCost = fmt.Errorf("zone %q: request cost is not a non-negative integer", z.Name)
	return nil
}

// provisionStore returns the shared store for this configuration, creating
// it on first use, and the pool key to release it with.
func (h *Handler) provisionStore() (limiter.Store, string, error) {
	if h.Redis == nil {
		s, err := loadMemoryStore(time.Duration(h.SweepInterval))
		return s, memoryPoolKey, err
	}
	opt, err := h.Redis.options()
	if err != nil {
		return nil, "", err
	}
	key := opt.poolKey()
	v, _, err := stores.LoadOrNew(key, func() (caddy.Destructor, error) {
		s, err := limiter.NewRedisStore(opt.RedisOptions)
		if err != nil {
			return nil, err
		}
		return redisStore{s}, nil
	})
	if err != nil {
		return nil, "", fmt.Errorf("rate_limit: redis: %w", err)
	}
	return v.(redisStore).RedisStore, key, nil
}

// loadMemoryStore returns this process's memory store, shared by every
// handler and configuration (release it with stores.Delete(memoryPoolKey)).
func loadMemoryStore(sweep time.Duration) (*limiter.MemoryStore, error) {
	v, _, err := stores.LoadOrNew(memoryPoolKey, func() (caddy.Destructor, error) {
		return memoryStore{limiter.NewMemoryStore(time.Minute, nil)}, nil
	})
	if err != nil {
		return nil, err
	}
	return v.(memoryStore).MemoryStore, nil
}

// Validate checks the configuration after provisioning.
func (h *Handler) Validate() error {
	if h.limiter == nil {
		return errors.New("rate_limit: not provisioned")
	}
	return nil
}

// Cleanup releases the stores; the last handler using one closes it.
func (h *Handler) Cleanup() error {
	err := h.cleanupObservability() // first: it may stop a reporter using the store
	for _, key := range []string{h.poolKey, h.localKey} {
		if key != "" {
			if _, e := stores.Delete(key); e != nil {
				err = e
			}
		}
	}
	return err
}

// maxInlineZones is how many zones a request can have without the handler
// allocating its scratch space.
const maxInlineZones = 8

// scratch is the space one request's decision works in, recycled so that
// a decision allocates nothing for it.
type scratch struct {
	reqs    [maxInlineZones]limiter.Request
	results [maxInlineZones]limiter.Result
	zones   [maxInlineZones]*Zone
}

var scratchPool = sync.Pool{New: func() any { return new(scratch) }}

// ServeHTTP decides the request against every zone that applies to it, and
// passes it on when every zone admits it.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	sc := scratchPool.Get().(*scratch)
	pass, err := h.limit(w, r, sc)
	*sc = scratch{} // drop the keys and zones it refers to
	scratchPool.Put(sc)
	if !pass {
		return err
	}
	return next.ServeHTTP(w, r)
}

// limit decides a request, writes the rate limit fields, and reports
// whether it may pass, or the error that answers it.
func (h *Handler) limit(w http.ResponseWriter, r *http.Request, sc *scratch) (bool, error) {
	repl := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer)
	reqs, zones := sc.reqs[:0], sc.zones[:0]
	for _, z := range h.Zones {
		if len(z.matchers) > 0 {
			ok, err := z.matchers.AnyMatchWithError(r)
			if err != nil {
				return false, caddyhttp.Error(http.StatusInternalServerError, err)
			}
			if !ok {
				continue
			}
		}
		cost, ok := z.costOf(repl)
		if !ok {
			return false, caddyhttp.Error(http.StatusBadRequest, z.errBadCost)
		}
		reqs = append(reqs, limiter.Request{Rule: z.rule, Key: z.keyOf(r, repl), Cost: cost})
		zones = append(zones, z)
	}
	if len(reqs) == 0 {
		return true, nil
	}
	results := sc.results[:]
	if len(reqs) > len(results) {
		results = make([]limiter.Result, len(reqs))
	}
	results = results[:len(reqs)]

	outcome := h.limiter.Decide(r.Context(), reqs, results)
	h.observe(repl, outcome, reqs, zones, results)
	switch outcome {
	case limiter.FailedOpen:
		return true, nil
	case limiter.FailedClosed:
		return false, h.unavailable(w, results)
	}
	// The policy names every zone that applies; the current state only
	// the zones that were consulted.
	policy := h.policy
	if len(zones) != len(h.Zones) {
		policy = policyOf(zones)
	}
	reqs, zones, results = known(reqs, zones, results)
	h.headers.write(w.Header(), zones, results, policy)
	if outcome == limiter.Admitted || outcome == limiter.LocalAdmitted {
		if err := h.wait(w, r, zones, results); err != nil {
			return false, err
		}
		return true, nil
	}
	return false, h.deny(w, repl, reqs, zones, results)
}

// errUnavailable is the error of a request rejected because the store
// failed and a zone's policy is deny.
var errUnavailable = errors.New("rate limit store unavailable; the zone fails closed")

// unavailable answers a request that a zone with the deny policy rejected
// because the store failed: 503, and Retry-After for when the store may be
// back (the circuit breaker's cooldown, at least a second).
func (h *Handler) unavailable(w http.ResponseWriter, results []limiter.Result) error {
	var retry time.Duration
	for _, res := range results {
		if !res.Allowed {
			retry = max(retry, res.RetryAfter)
		}
	}
	w.Header()["Retry-After"] = []string{strconv.FormatInt(max(1, retryAfterSeconds(retry)), 10)}
	return caddyhttp.Error(http.StatusServiceUnavailable, errUnavailable)
}

// deny answers a request that a zone denied: Retry-After for the latest
// moment any denying zone can admit it, the exceeded placeholder, and a 429
// handler error.
func (h *Handler) deny(w http.ResponseWriter, repl *caddy.Replacer, reqs []limiter.Request, zones []*Zone, results []limiter.Result) error {
	var first *Zone
	var retry time.Duration
	never := false
	for i, res := range results {
		if res.Allowed { // Unknown results are Allowed too
			continue
		}
		if first == nil {
			first = zones[i]
		}
		if res.RetryAfter == limiter.Never {
			never = true
			first = zones[i]
		}
		retry = max(retry, res.RetryAfter)
		if ce := h.logger.Check(zap.DebugLevel, "rate limit exceeded"); ce != nil {
			ce.Write(zap.String("zone", zones[i].Name), h.keyField(reqs[i].Key),
				zap.Int64("cost", reqs[i].Cost), zap.Duration("retry_after", res.RetryAfter))
		}
	}
	repl.Set(exceededPlaceholder, first.Name)
	if never {
		return denial(first.errNever)
	}
	w.Header()["Retry-After"] = []string{strconv.FormatInt(retryAfterSeconds(h.jitter(retry)), 10)}
	return denial(first.errDenied)
}

// denial returns the 429 handler error of a denied request. It is what
// caddyhttp.Error builds, less the stack walk for its trace: a flood is
// mostly denials, so they should cost little.
func denial(err error) error {
	return caddyhttp.HandlerError{
		ID:         errorID(),
		StatusCode: http.StatusTooManyRequests,
		Err:        err,
		Trace:      "caddy-fleetlimit.(*Handler).deny",
	}
}

// errorID returns 9 random characters identifying an error in logs, as
// caddyhttp.Error's IDs do.
func errorID() string {
	const alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
	var b [9]byte
	n := rand.Uint64()
	for i := range b {
		b[i] = alphabet[n%36]
		n /= 36
	}
	return string(b[:])
}

// known drops, in place, the zones that a cached denial left unconsulted.
func known(reqs []limiter.Request, zones []*Zone, results []limiter.Result) ([]limiter.Request, []*Zone, []limiter.Result) {
	n := 0
	for i := range results {
		if !results[i].Unknown {
			reqs[n], zones[n], results[n] = reqs[i], zones[i], results[i]
			n++
		}
	}
	return reqs[:n], zones[:n], results[:n]
}

// retryAfterSeconds rounds a wait up to whole seconds, so that a client that
// obeys Retry-After is never early.
func retryAfterSeconds(d time.Duration) int64 {
	return int64((d + time.Second - 1) / time.Second)
}

func (h *Handler) keyField(key string) zap.Field {
	if h.LogKey {
		return zap.String("key", key)
	}
	return zap.String("key_digest", limiter.KeyDigest(key))
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

// redisOptions are the resolved connection settings of a RedisConfig.
type redisOptions struct {
	limiter.RedisOptions
	tlsID []any // the TLS settings, for the pool key
}

func (c *RedisConfig) options() (redisOptions, error) {
	repl := caddy.NewReplacer()
	expand := func(v string) string { return repl.ReplaceKnown(v, "") }
	expandAll := func(vs []string) []string {
		out := make([]string, len(vs))
		for i, v := range vs {
			out[i] = expand(v)
		}
		return out
	}
	o := redisOptions{RedisOptions: limiter.RedisOptions{
		Address:           expand(c.Address),
		Addresses:         expandAll(c.Addresses),
		Cluster:           c.Cluster,
		SentinelMaster:    c.SentinelMaster,
		SentinelAddresses: expandAll(c.SentinelAddresses),
		SentinelUsername:  expand(c.SentinelUsername),
		SentinelPassword:  expand(c.SentinelPassword),
		Username:          expand(c.Username),
		Password:          expand(c.Password),
		DB:                c.DB,
		Protocol:          c.Protocol,
		DisableIdentity:   c.DisableIdentity,
		PoolSize:          c.PoolSize,
		Pipelines:         c.Pipelines,
		DialTimeout:       time.Duration(c.DialTimeout),
		KeyPrefix:         c.KeyPrefix,
		Timeout:           time.Duration(c.Timeout),

		BreakerFailures: c.BreakerFailures,
		BreakerCooldown: time.Duration(c.BreakerCooldown),
	}}
	switch {
	case o.Address == "" && len(o.Addresses) == 0 && o.SentinelMaster == "":
		return o, errors.New("rate_limit: redis: address is required")
	case o.SentinelMaster != "" && len(o.SentinelAddresses) == 0:
		return o, errors.New("rate_limit: redis: sentinel_master needs sentinel_addresses")
	case o.SentinelMaster != "" && (o.Address != "" || len(o.Addresses) > 0):
		return o, errors.New("rate_limit: redis: give either sentinels or server addresses, not both")
	case o.DB < 0:
		return o, errors.New("rate_limit: redis: db must not be negative")
	case o.Timeout < 0 || o.DialTimeout < 0:
		return o, errors.New("rate_limit: redis: timeout must not be negative")
	case o.BreakerFailures < 0 || o.BreakerCooldown < 0:
		return o, errors.New("rate_limit: redis: breaker_failures and breaker_cooldown must not be negative")
	case o.PoolSize < 0:
		return o, errors.New("rate_limit: redis: pool_size must not be negative")
	case o.Pipelines < 0:
		return o, errors.New("rate_limit: redis: pipelines must not be negative")
	case o.Protocol != 0 && o.Protocol != 2 && o.Protocol != 3:
		return o, errors.New("rate_limit: redis: protocol must be 2 or 3")
	case (o.Cluster || len(o.Addresses) > 0) && o.DB != 0:
		return o, errors.New("rate_limit: redis: a Cluster has only db 0")
	}
	if o.KeyPrefix == "" {
		o.KeyPrefix = "rl:"
	}
	if o.Timeout == 0 {
		o.Timeout = 25 * time.Millisecond
	}
	if c.TLS != nil {
		cfg, err := c.TLS.config()
		if err != nil {
			return o, fmt.Errorf("rate_limit: redis: tls: %w", err)
		}
		o.TLS = cfg
		o.tlsID = []any{c.TLS.CA, c.TLS.Cert, c.TLS.Key, c.TLS.ServerName, c.TLS.InsecureSkipVerify}
	}
	return o, nil
}

// config builds the TLS configuration, reading the files.
func (t *RedisTLS) config() (*tls.Config, error) {
	cfg := &tls.Config{
		MinVersion:         tls.VersionTLS12,
		ServerName:         t.ServerName,
		InsecureSkipVerify: t.InsecureSkipVerify, //nolint:gosec // the operator's explicit choice, for tests
	}
	if t.CA != "" {
		pem, err := os.ReadFile(t.CA)
		if err != nil {
			return nil, fmt.Errorf("reading ca: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("no certificate found in ca file %s", t.CA)
		}
		cfg.RootCAs = pool
	}
	if (t.Cert == "") != (t.Key == "") {
		return nil, errors.New("a client certificate needs both cert and key")
	}
	if t.Cert != "" {
		pair, err := tls.LoadX509KeyPair(t.Cert, t.Key)
		if err != nil {
			return nil, fmt.Errorf("loading client certificate: %w", err)
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	return cfg, nil
}

// poolKey identifies a connection configuration without revealing its
// secrets.
func (o redisOptions) poolKey() string {
	b, _ := json.Marshal([]any{o.Address, o.Addresses, o.Cluster, o.SentinelMaster, o.SentinelAddresses,
		o.SentinelUsername, o.SentinelPassword, o.Username, o.Password, o.DB, o.Protocol, o.DisableIdentity,
		o.PoolSize, o.Pipelines, o.DialTimeout, o.KeyPrefix, o.Timeout, o.BreakerFailures, o.BreakerCooldown, o.tlsID})
	sum := sha256.Sum256(b)
	return "redis:" + hex.EncodeToString(sum[:])
}

// stores holds the stores shared by handlers across config reloads.
var stores = caddy.NewUsagePool()

const memoryPoolKey = "memory"

type memoryStore struct{ *limiter.MemoryStore }

func (s memoryStore) Destruct() error { return s.Close() }

type redisStore struct{ *limiter.RedisStore }

func (s redisStore) Destruct() error { return s.Close() }

// Interface guards
var (
	_ caddy.Provisioner           = (*Handler)(nil)
	_ caddy.Validator             = (*Handler)(nil)
	_ caddy.CleanerUpper          = (*Handler)(nil)
	_ caddyhttp.MiddlewareHandler = (*Handler)(nil)
)
