// Package observe is what the rate_limit handler tells the outside about
// its decisions: placeholders for logs and headers, the rate_limit_exceeded
// event, Prometheus metrics, the statistics of every zone and store in the
// process (zoneStats, storeStats), the fleet view shared through Redis
// (fleetReporter), the denial feed (denialFeed), the node's clock offset
// against Redis (clockWatcher), the Redis side of those three (redisStats),
// and the admin API and dashboard that serve them (adminAPI,
// DashboardHandler).
//
// A handler feeds it through a Handler, made by New at Provision: Decided
// for every decided request, Observer for the limiter's store calls, and
// Cleanup when the configuration is unloaded. The package knows nothing of
// the handler's configuration beyond Config, and imports no part of it.
package observe

import (
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyevents"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/fleetlimit/caddy-fleetlimit/limiter"
)

// exceededEvent is the Caddy event emitted on each denial.
const exceededEvent = "rate_limit_exceeded"

// Config is what a handler tells observe about itself at Provision.
type Config struct {
	// Rules are the handler's zones, in configuration order; each rule's
	// Name is its zone's name.
	Rules []*limiter.Rule
	// Zones tell more of each zone of Rules, in the same order; a zone
	// without an entry has its zero value.
	Zones []ZoneConfig
	// Store is the store the handler's limiter decides through.
	Store limiter.Store
	// StoreKey identifies the store across handlers and config reloads
	// (the key it is pooled by): handlers with the same key share the
	// store's statistics.
	StoreKey string
	// StoreName names the store in metric labels and the admin API. It
	// must not contain a credential.
	StoreName string
	// Memory is this process's memory store when the handler keeps
	// buckets in it (the memory store, or the local fallback buckets of
	// zones with on_error local): the zones' evictions are counted there.
	Memory *limiter.MemoryStore
	// Digest turns client keys into the digests the statistics and
	// events carry.
	Digest limiter.Digester
	// LogKey shows client keys as they are in the statistics and events;
	// otherwise they carry only a one-way digest.
	LogKey bool
	// DisableMetrics turns off the metrics and the statistics (admin API,
	// dashboard and fleet view); placeholders and events stay.
	DisableMetrics bool
}

// ZoneConfig is what a handler tells observe of one zone beyond its rule.
type ZoneConfig struct {
	// Name is the zone's name in metric labels, the statistics, the
	// denial feed and the admin API; "" for its rule's name. The Envoy
	// rate limit service names each of its rules so ("rls/" and the
	// rule's key), since its rules share bucket names.
	Name string
	// Match describes what the zone's own matchers match, from the
	// configuration (never client data); "" when the zone applies to
	// every request its handler sees. The denial feed shows it instead of
	// the request's path unless the handler has log_key.
	Match string
	// Keys returns the bucket keys that a client key's raw value v stands
	// for in the zone: one per key alternative, normalised as the zone
	// normalises keys (its network prefixes, limiter.SourceKey). A ban is
	// lifted by a raw key through it; nil when the zone has no key
	// alternative (one shared bucket).
	Keys func(v string) []string
	// Rules returns the rules of a zone with tiers (a rate or burst from
	// placeholders): one per tier this node compiled, by rate and burst.
	// The key lookup reads a key's bucket under each. nil: the zone has
	// one rule, its Rules entry.
	Rules func() []*limiter.Rule
	// LastRule returns the rule that applied last to a client key (a
	// bucket key) on this node, nil when unknown. nil: the zone's rule.
	LastRule func(key string) *limiter.Rule
	// MaxWaiting is, for a leaky bucket or a soft-shedding token
	// bucket, how many of its requests the handler holds waiting at once
	// (0 otherwise), and Queue tells how many wait now and how many were
	// turned away because they were that many.
	MaxWaiting int64
	Queue      func() (waiting int64, turnedAway uint64)
	// Prefetch tells, for a zone with prefetch, what this node's prefetch
	// did for it (since its configuration loaded); nil otherwise.
	Prefetch func() limiter.PrefetchStats
}

// Handler is one provisioned handler's share of the observability. Make it
// with New; release it with Cleanup.
type Handler struct {
	ctx      caddy.Context
	events   *caddyevents.App // nil when there is no events app
	logKey   bool
	digest   limiter.Digester
	zones    []*Zone
	observer *limiterObserver // nil unless the store is Redis and metrics are on
	store    *storeStats      // nil with metrics disabled
	storeKey string           // the storeRegistry reference held
	cfg      Config           // as New had it, for AddZone

	mu   sync.Mutex
	held []heldZone // the zoneRegistry references held
}

// heldZone is a zoneRegistry reference a Handler holds, with the handler's
// own description of the zone in its stats.
type heldZone struct {
	stats *zoneStats
	info  *zoneInfo
}

// Zone is one zone's share of a Handler.
type Zone struct {
	name  string
	rule  *limiter.Rule
	cfg   ZoneConfig
	limit any // the zone's rate, as the limit placeholder's value (boxed once)
	stats *zoneStats
}

// New prepares the placeholders and events of a handler's zones and,
// unless metrics are disabled, registers the metrics and takes references
// to the zones' and the store's statistics (released by Cleanup).
func New(ctx caddy.Context, cfg Config) (*Handler, error) {
	h := &Handler{ctx: ctx, logKey: cfg.LogKey, digest: cfg.Digest, zones: make([]*Zone, len(cfg.Rules))}
	// The http app loads the events app before its handlers, so it is
	// there whenever the handler runs in a server.
	if app, err := ctx.AppIfConfigured("events"); err == nil {
		h.events, _ = app.(*caddyevents.App)
	}
	for i, rule := range cfg.Rules {
		h.zones[i] = &Zone{
			name:  rule.Name(),
			rule:  rule,
			limit: strconv.FormatInt(rule.Rate(), 10),
		}
		if i < len(cfg.Zones) {
			h.zones[i].cfg = cfg.Zones[i]
			if n := cfg.Zones[i].Name; n != "" {
				h.zones[i].name = n
			}
		}
	}
	if cfg.DisableMetrics {
		return h, nil
	}
	if err := h.loadStats(ctx, cfg); err != nil {
		_ = h.Cleanup()
		return nil, err
	}
	return h, nil
}

// loadStats registers the metrics and takes the stats references.
func (h *Handler) loadStats(ctx caddy.Context, cfg Config) error {
	if err := registerMetrics(ctx.GetMetricsRegistry()); err != nil {
		return err
	}
	ss, err := loadStoreStats(cfg.StoreKey, cfg.StoreName, cfg.Store)
	if err != nil {
		return err
	}
	h.store, h.storeKey = ss, cfg.StoreKey
	h.cfg = cfg
	observer := &limiterObserver{store: ss}
	for _, z := range h.zones {
		if err := h.holdZone(ctx, z); err != nil {
			return err
		}
		observer.rules = append(observer.rules, z.rule)
		observer.zones = append(observer.zones, z.stats)
	}
	if ss.redis != nil {
		h.observer = observer
	}
	return nil
}

// holdZone takes a reference to the statistics of zone z on the handler's
// store, with the handler's description of it.
func (h *Handler) holdZone(ctx caddy.Context, z *Zone) error {
	cfg := h.cfg
	zs, err := loadZoneStats(z.name, h.store)
	if err != nil {
		return err
	}
	info := &zoneInfo{
		alg:      z.rule.Algorithm().String(),
		maxDelay: z.rule.MaxDelay(),
		shedPct:  shedPercent(z.rule),
		rate:     z.rule.Rate(),
		per:      z.rule.Per(),
		burst:    z.rule.Burst(),
		onError:  z.rule.OnError().String(),
		logKey:   cfg.LogKey,
		digest:   cfg.Digest,
		memory:   cfg.Memory,
		buckets:  []string{z.rule.Bucket()},
		keys:     z.cfg.Keys,
		rule:     z.rule,
		tiers:    z.cfg.Rules,
		lastRule: z.cfg.LastRule,
		queue:    z.cfg.Queue,
		prefetch: z.cfg.Prefetch,
		maxWait:  z.cfg.MaxWaiting,
		server:   ctx.Value(caddyhttp.ServerCtxKey),
	}
	if b := z.rule.LocalBucket(); b != "" {
		info.buckets = append(info.buckets, b)
	}
	if pct, d := z.rule.SoftShed(); pct > 0 {
		info.maxDelay = d
	}
	// The stats describe the zone as this handler configured it while it
	// is the newest handler holding them; Cleanup takes the description
	// back (see zoneStats).
	zs.hold(info)
	h.mu.Lock()
	h.held = append(h.held, heldZone{stats: zs, info: info})
	h.mu.Unlock()
	z.stats = zs
	return nil
}

// AddZone adds a zone after New: rule's decisions, named and described by
// cfg (Name required). The Envoy rate limit service adds one per value of
// a rule with detailed_metric, as calls bring them, up to a bound of its
// own. Cleanup releases it with the others. With metrics disabled the
// zone counts nothing.
func (h *Handler) AddZone(rule *limiter.Rule, cfg ZoneConfig) (*Zone, error) {
	z := &Zone{name: cfg.Name, rule: rule, cfg: cfg, limit: strconv.FormatInt(rule.Rate(), 10)}
	if h.store == nil {
		return z, nil
	}
	if err := h.holdZone(h.ctx, z); err != nil {
		return nil, err
	}
	return z, nil
}

// Zone returns the share of the i-th zone of Config.Rules.
func (h *Handler) Zone(i int) *Zone { return h.zones[i] }

// FleetSize returns how many nodes share the handler's Redis store lately:
// those the fleet view saw in the 10 seconds before its last successful
// report (kept while Redis is away: the fleet does not shrink because
// Redis does), and 1 when it has seen no other node, or has no fleet view
// (the memory store, or metrics disabled). It is the divisor of the local
// fallback buckets of zones without fleet_size (limiter.Options.FleetSize).
func (h *Handler) FleetSize() int64 {
	if h.store == nil || h.store.fleet == nil {
		return 1
	}
	return max(1, h.store.fleet.nodes.Load())
}

// Observer returns what the handler's limiter should report its store
// calls and deny cache hits to (limiter.Options.Observer), or nil when
// nothing needs them.
func (h *Handler) Observer() limiter.Observer {
	if h.observer == nil {
		return nil
	}
	return h.observer
}

// Cleanup releases the stats references and the handler's description of
// its zones there (the stats describe a zone as the newest handler still
// holding them configured it); the last handler with a zone drops its
// statistics and metric series, and the last with a store stops its fleet
// reporter. Call it before the store itself is released. Caddy calls it on
// the handlers of a configuration that failed to load as well, which gives
// the stats back to the configuration still running.
func (h *Handler) Cleanup() error {
	var err error
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, hz := range h.held {
		hz.stats.release(hz.info)
		if _, e := zoneRegistry.Delete(zoneKey{hz.stats.name, hz.stats.store.key}); e != nil {
			err = e
		}
	}
	if h.storeKey != "" {
		if _, e := storeRegistry.Delete(h.storeKey); e != nil {
			err = e
		}
	}
	h.held, h.storeKey = nil, ""
	return err
}

// zoneOutcome returns what a request's outcome was in one zone, and false
// when the zone did not decide it: a zone counts a request it let through
// only if the request passed, and a request that another zone rejected is
// not counted in a zone that would have let it through.
//
//	Allowed        every zone: allowed
//	Denied         the zones that denied: denied
//	FailedOpen     every zone: failed_open
//	FailedClosed   the zones whose policy is deny: failed_closed
//	LocalAllowed   zones with the local policy: local_allowed; others failed_open
//	LocalDenied    the local zones that denied: local_denied
//
// A zone whose client is exempt does not decide the request at all: the
// handler counts it with Zone.Exempted.
//
// Whatever the request's outcome, a zone that denied because the key is
// banned counts banned, and a dry-run zone that would have denied counts
// dry_run_denied (it let the request through, and was not charged).
func zoneOutcome(outcome limiter.Outcome, rule *limiter.Rule, res *limiter.Result) (limiter.Outcome, bool) {
	local := rule.OnError() == limiter.PolicyLocal && rule.LocalBucket() != ""
	switch {
	case res.DryRun:
		return limiter.DryRunDenied, true
	case res.Banned:
		return limiter.Banned, true
	}
	switch outcome {
	case limiter.Allowed, limiter.FailedOpen:
		return outcome, true
	case limiter.Denied:
		return limiter.Denied, !res.Allowed && !res.Unknown
	case limiter.FailedClosed:
		return limiter.FailedClosed, rule.OnError() == limiter.PolicyDeny
	case limiter.LocalAllowed:
		if local {
			return limiter.LocalAllowed, true
		}
		return limiter.FailedOpen, true
	case limiter.LocalDenied:
		return limiter.LocalDenied, local && !res.Allowed
	}
	return 0, false
}

// Decided records a request's decision: zones[i] (the handler's, from
// Zone) decided reqs[i] with results[i], and outcome is the request's. It
// sets the zones' placeholders, counts the metrics and stats, records each
// zone's denial (or dry-run zone's would-be denial) in the denial feed and
// the top denied keys and networks, counts the admissions that left a
// bucket near its limit and those a soft shed delayed, and emits the
// rate_limit_exceeded event of each zone that denied. Call it on every decided request, with every
// zone that applied, including those a cached denial left unconsulted
// (their results are Unknown). r is the request decided; exceeded names
// the zone that answers its denial ({http.rate_limit.exceeded.name}), ""
// when it was not denied.
func (h *Handler) Decided(r *http.Request, repl *caddy.Replacer, outcome limiter.Outcome, zones []*Zone, reqs []limiter.Request, results []limiter.Result, exceeded string) {
	h.decided(httpOrigin{r}, repl, outcome, zones, reqs, results, exceeded)
}

// Call is where a decision that no HTTP request asked for came from: an
// Envoy rate limit service's call. The denial feed shows Method and Host
// as it shows a request's, and the zone's Match as its route.
type Call struct {
	// Method names the call ("ShouldRateLimit").
	Method string
	// Host is what the call is about: the rate limit domain.
	Host string
}

// DecidedCall records the decision of a call, as Decided records a
// request's: the metrics and statistics of zones, their denials in the
// denial feed and the top denied keys, the near-limit counts and the
// rate_limit_exceeded event. A call has no client address (its caller is a
// proxy), so it adds no denied network, and no placeholders.
func (h *Handler) DecidedCall(c Call, outcome limiter.Outcome, zones []*Zone, reqs []limiter.Request, results []limiter.Result) {
	h.decided(c, nil, outcome, zones, reqs, results, "")
}

// origin is what a decision's denial feed entry tells of where it came
// from: an HTTP request (httpOrigin) or a Call.
type origin interface {
	fill(dr *denialRequest, lookIP bool)
}

// httpOrigin is an HTTP request as an origin.
type httpOrigin struct{ r *http.Request }

func (o httpOrigin) fill(dr *denialRequest, lookIP bool) {
	dr.method, dr.host = o.r.Method, o.r.Host
	if o.r.URL != nil {
		dr.path = o.r.URL.Path // kept only with log_key (see denial.fill)
	}
	if lookIP {
		dr.ip = clientAddr(o.r)
	}
}

func (c Call) fill(dr *denialRequest, _ bool) { dr.method, dr.host = c.Method, c.Host }

// decided is Decided for a request or a call; repl is nil for a call.
func (h *Handler) decided(src origin, repl *caddy.Replacer, outcome limiter.Outcome, zones []*Zone, reqs []limiter.Request, results []limiter.Result, exceeded string) {
	ph := placeholders{exceeded: exceeded}
	var now time.Time
	if h.store != nil {
		now = time.Now()
	}
	sec := now.Unix()
	var (
		where    denialRequest // the origin's part, once looked up
		ipLooked bool
	)
	for i, z := range zones {
		res := &results[i]
		if !res.Unknown && repl != nil { // zone names are unique in a handler
			ph.add(z, &reqs[i], res)
		}
		o, ok := zoneOutcome(outcome, z.rule, res)
		if !ok {
			continue
		}
		denied := o == limiter.Denied || o == limiter.LocalDenied || o == limiter.Banned
		if st := z.stats; st != nil {
			st.count(o, sec)
			if o == limiter.Allowed && !res.Unknown && nearLimit(reqs[i].Rule, res) {
				st.nearedLimit()
			}
			if res.Delay > 0 && (o == limiter.Allowed || o == limiter.LocalAllowed) && shedPercent(reqs[i].Rule) > 0 {
				st.shed(res.Delay)
			}
			if denied || o == limiter.DryRunDenied {
				if !ipLooked {
					src.fill(&where, true)
					ipLooked = true
				}
				h.recordDenial(&where, z, &reqs[i], res, now, denied)
			}
		}
		if denied && h.events != nil && h.events.ShouldEmit(exceededEvent) {
			h.emitExceeded(z, &reqs[i], res, o == limiter.LocalDenied)
		}
		if o == limiter.DryRunDenied && h.events != nil && h.events.ShouldEmit(dryRunEvent) {
			h.emitPolicyEvent(dryRunEvent, z, &reqs[i], res)
		}
		if res.BanStarted && h.events != nil && h.events.ShouldEmit(bannedEvent) {
			h.emitPolicyEvent(bannedEvent, z, &reqs[i], res)
		}
	}
	if repl != nil {
		ph.register(repl)
	}
}

// recordDenial records a zone's denial, or a dry-run zone's would-be
// denial, at time now of a request or call from where (its method, host,
// path and client address): in the store's denial feed, and, if it
// denied, in the zone's top denied keys and networks.
func (h *Handler) recordDenial(where *denialRequest, z *Zone, req *limiter.Request, res *limiter.Result, now time.Time, denied bool) {
	st := z.stats
	if denied {
		sec := now.Unix()
		st.top.add(req.Key, sec)
		if k, ok := keyOfNetwork(where.ip); ok {
			st.nets.addBytes(k.bytes(), sec)
		}
	}
	dr := denialRequest{
		at:     now,
		zone:   z.name,
		key:    req.Key,
		method: where.method,
		host:   where.host,
		path:   where.path,
		route:  z.cfg.Match,
		ip:     where.ip,
		logKey: h.logKey,
		digest: h.digest,
		banned: res.Banned,
		dryRun: res.DryRun,
	}
	st.store.feed.record(&dr)
}

// emitExceeded emits the rate_limit_exceeded event of a zone's denial. Its
// data: zone, key_digest (and key, only with log_key), cost, retry_after
// (whole seconds, rounded up like the Retry-After field; absent when the
// cost exceeds the burst, so no wait helps) and local (decided on this
// node's fallback bucket while the store failed). Handlers run
// synchronously, in the request.
func (h *Handler) emitExceeded(z *Zone, req *limiter.Request, res *limiter.Result, local bool) {
	data := map[string]any{
		"zone":       z.name,
		"key_digest": h.digest.Digest(req.Key),
		"cost":       req.Cost,
		"local":      local,
	}
	if h.logKey {
		data["key"] = req.Key
	}
	if res.RetryAfter != limiter.Never {
		data["retry_after"] = retryAfterSeconds(res.RetryAfter)
	}
	h.events.Emit(h.ctx, exceededEvent, data)
}

// retryAfterSeconds rounds a wait up to whole seconds, as the handler's
// Retry-After field does.
func retryAfterSeconds(d time.Duration) int64 {
	return int64((d + time.Second - 1) / time.Second)
}
