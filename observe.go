package fleetlimit

import (
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyevents"

	"github.com/fleetlimit/caddy-fleetlimit/limiter"
)

// What a handler tells the outside about its decisions: placeholders for
// logs and headers, the rate_limit_exceeded event, Prometheus metrics
// (metrics.go) and the statistics of the admin API (stats.go, admin.go).

// exceededEvent is the Caddy event emitted on each denial.
const exceededEvent = "rate_limit_exceeded"

// handlerObs is a handler's share of the observability.
type handlerObs struct {
	ctx      caddy.Context
	events   *caddyevents.App // nil when there is no events app
	store    *storeStats      // nil with metrics disabled
	storeKey string           // the storeRegistry reference held
	zoneKeys []string         // the zoneRegistry references held
}

// zoneObs is a zone's share.
type zoneObs struct {
	remainingKey string // the placeholder http.rate_limit.<zone>.remaining
	limitKey     string // the placeholder http.rate_limit.<zone>.limit
	limit        any    // the zone's rate, as the limit placeholder's value (boxed once)
	stats        *zoneStats
}

// provisionObservability prepares the placeholders and events, and unless
// metrics are disabled, registers the metrics and takes references to the
// zones' and the store's stats (released by cleanupObservability). It sets
// the limiter's observer in opt.
func (h *Handler) provisionObservability(ctx caddy.Context, store limiter.Store, opt *limiter.Options) error {
	h.obs = &handlerObs{ctx: ctx}
	// The http app loads the events app before its handlers, so it is
	// there whenever this handler runs in a server.
	if app, err := ctx.AppIfConfigured("events"); err == nil {
		h.obs.events, _ = app.(*caddyevents.App)
	}
	for _, z := range h.Zones {
		z.obs = &zoneObs{
			remainingKey: "http.rate_limit." + z.Name + ".remaining",
			limitKey:     "http.rate_limit." + z.Name + ".limit",
			limit:        strconv.FormatInt(z.rule.Rate, 10),
		}
	}
	if h.DisableMetrics {
		return nil
	}
	if err := registerMetrics(ctx.GetMetricsRegistry()); err != nil {
		return err
	}
	ss, err := loadStoreStats(h.poolKey, h.storeName(), store)
	if err != nil {
		return err
	}
	h.obs.store, h.obs.storeKey = ss, h.poolKey
	observer := &limiterObserver{store: ss}
	for _, z := range h.Zones {
		zs, err := loadZoneStats(z.Name)
		if err != nil {
			return err
		}
		h.obs.zoneKeys = append(h.obs.zoneKeys, z.Name)
		zs.info.Store(&zoneInfo{
			alg:     z.rule.Algorithm.String(),
			rate:    z.rule.Rate,
			per:     z.rule.Per,
			burst:   z.rule.Burst,
			onError: z.rule.OnError.String(),
			logKey:  h.LogKey,
		})
		zs.store.Store(ss)
		if ss.fleet != nil {
			ss.fleet.link(zs)
		}
		z.obs.stats = zs
		observer.rules = append(observer.rules, z.rule)
		observer.zones = append(observer.zones, zs)
	}
	if ss.redis != nil {
		opt.Observer = observer
	}
	return nil
}

// cleanupObservability releases the stats references.
func (h *Handler) cleanupObservability() error {
	if h.obs == nil {
		return nil
	}
	var err error
	for _, name := range h.obs.zoneKeys {
		if _, e := zoneRegistry.Delete(name); e != nil {
			err = e
		}
	}
	if h.obs.storeKey != "" {
		if _, e := storeRegistry.Delete(h.obs.storeKey); e != nil {
			err = e
		}
	}
	h.obs.zoneKeys, h.obs.storeKey = nil, ""
	return err
}

// storeName names the handler's store in metric labels and the admin API:
// the servers it talks to (from the configuration, placeholders
// unexpanded; never a credential), or "memory".
func (h *Handler) storeName() string {
	c := h.Redis
	if c == nil {
		return "memory"
	}
	var name string
	switch {
	case c.SentinelMaster != "":
		name = "sentinel:" + c.SentinelMaster
	case c.Cluster || len(c.Addresses) > 0:
		addrs := c.Addresses
		if c.Address != "" {
			addrs = append([]string{c.Address}, addrs...)
		}
		name = "cluster:" + strings.Join(addrs, ",")
	default:
		name = "redis:" + c.Address
	}
	if c.DB != 0 {
		name += "/" + strconv.Itoa(c.DB)
	}
	return name
}

// zoneOutcome returns what a request's outcome was in one zone, and false
// when the zone did not decide it: a zone counts a request it let through
// only if the request passed, and a request that another zone rejected is
// not counted in a zone that would have let it through.
//
//	Admitted       every zone: allowed
//	Denied         the zones that denied: denied
//	FailedOpen     every zone: failed_open
//	FailedClosed   the zones whose policy is deny: failed_closed
//	LocalAdmitted  zones with the local policy: local_allowed; others failed_open
//	LocalDenied    the local zones that denied: local_denied
func zoneOutcome(outcome limiter.Outcome, rule *limiter.Rule, res *limiter.Result) (limiter.Outcome, bool) {
	local := rule.OnError == limiter.PolicyLocal && rule.Local != nil
	switch outcome {
	case limiter.Admitted, limiter.FailedOpen:
		return outcome, true
	case limiter.Denied:
		return limiter.Denied, !res.Allowed && !res.Unknown
	case limiter.FailedClosed:
		return limiter.FailedClosed, rule.OnError == limiter.PolicyDeny
	case limiter.LocalAdmitted:
		if local {
			return limiter.LocalAdmitted, true
		}
		return limiter.FailedOpen, true
	case limiter.LocalDenied:
		return limiter.LocalDenied, local && !res.Allowed
	}
	return 0, false
}

// observe records a decision: the zones' placeholders, the metrics and
// stats, and the rate_limit_exceeded event of each zone that denied. It
// runs on every decided request, before known() drops the zones a cached
// denial left unconsulted.
func (h *Handler) observe(repl *caddy.Replacer, outcome limiter.Outcome, reqs []limiter.Request, zones []*Zone, results []limiter.Result) {
	var sec int64
	if h.obs.store != nil {
		sec = time.Now().Unix()
	}
	for i, z := range zones {
		res := &results[i]
		if !res.Unknown {
			repl.Set(z.obs.remainingKey, res.Remaining)
			repl.Set(z.obs.limitKey, z.obs.limit)
		}
		o, ok := zoneOutcome(outcome, z.rule, res)
		if !ok {
			continue
		}
		denied := o == limiter.Denied || o == limiter.LocalDenied
		if st := z.obs.stats; st != nil {
			st.count(o, sec)
			if denied {
				st.top.add(reqs[i].Key, sec)
			}
		}
		if denied && h.obs.events != nil && h.obs.events.ShouldEmit(exceededEvent) {
			h.emitExceeded(z, &reqs[i], res, o == limiter.LocalDenied)
		}
	}
}

// emitExceeded emits the rate_limit_exceeded event of a zone's denial. Its
// data: zone, key_digest (and key, only with log_key), cost, retry_after
// (whole seconds, rounded up like the Retry-After field; absent when the
// cost exceeds the burst, so no wait helps) and local (decided on this
// node's fallback bucket while the store failed). Handlers run
// synchronously, in the request.
func (h *Handler) emitExceeded(z *Zone, req *limiter.Request, res *limiter.Result, local bool) {
	data := map[string]any{
		"zone":       z.Name,
		"key_digest": limiter.KeyDigest(req.Key),
		"cost":       req.Cost,
		"local":      local,
	}
	if h.LogKey {
		data["key"] = req.Key
	}
	if res.RetryAfter != limiter.Never {
		data["retry_after"] = retryAfterSeconds(res.RetryAfter)
	}
	h.obs.events.Emit(h.obs.ctx, exceededEvent, data)
}
