package observe

import (
	"errors"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fleetlimit/caddy-fleetlimit/limiter"
)

// Prometheus metrics: collectors made once per process and registered into
// every config load's registry, so that counters count across reloads,
// labelled only by what the configuration names (zone, store, outcome,
// reason), never by client. Why, in docs/design.md (Metrics); the series,
// in docs/observability.md.

const (
	metricsNamespace = "caddy"
	metricsSubsystem = "rate_limit"
)

// outcomeNames label each limiter.Outcome when it is a zone's outcome.
var outcomeNames = [limiter.NumOutcomes]string{
	limiter.Allowed:      "allowed",
	limiter.Denied:       "denied",
	limiter.FailedOpen:   "failed_open",
	limiter.FailedClosed: "failed_closed",
	limiter.LocalAllowed: "local_allowed",
	limiter.LocalDenied:  "local_denied",
	limiter.Banned:       "banned",
	limiter.DryRunDenied: "dry_run_denied",
}

// outcomeExempt labels the requests a zone left alone because their client
// is exempt: not a limiter.Outcome, since the limiter never sees them.
const outcomeExempt = "exempt"

// Store error reasons, as labelled.
const (
	reasonTimeout = iota
	reasonBreakerOpen
	reasonError
	reasonOOM  // Redis out of memory (maxmemory with a policy that refuses writes)
	reasonAuth // Redis refused the credentials (WRONGPASS, NOAUTH, NOPERM)
	numReasons
)

var reasonNames = [numReasons]string{"timeout", "breaker_open", "error", "oom", "auth"}

var metrics = struct {
	once          sync.Once
	decisions     *prometheus.CounterVec
	cacheHits     *prometheus.CounterVec
	refunds       *prometheus.CounterVec
	settlements   *prometheus.CounterVec
	settledTokens *prometheus.CounterVec
	storeDuration *prometheus.HistogramVec
	storeErrors   *prometheus.CounterVec
	breaker       *scrapeCollector
	evictions     *scrapeCollector
	clockOffset   *scrapeCollector
	nearLimit     *prometheus.CounterVec
	shedDelayed   *prometheus.CounterVec
	shedDelay     *prometheus.HistogramVec
	memoryWarning *scrapeCollector
	redisEvicted  *scrapeCollector

	// mu guards users: how many stats values use the series of a zone or
	// store name. Their series are deleted when the last one goes, not
	// when a value that a successor (or a twin) outlives goes.
	mu    sync.Mutex
	users map[string]int
}{users: make(map[string]int)}

func initMetrics() {
	metrics.once.Do(func() {
		metrics.decisions = newCounterVec("decisions_total",
			"Requests decided per zone, by outcome: allowed, denied, failed_open, failed_closed, local_allowed, local_denied, banned, dry_run_denied, exempt.",
			"zone", "outcome")
		metrics.refunds = newCounterVec("refunds_total",
			"Charges given back after the response, per zone (count_status refunds, concurrency slots released), by result: applied, or dropped because the store failed (the charge stays).",
			"zone", "result")
		metrics.settlements, metrics.settledTokens = newSettleMetrics()
		metrics.cacheHits = newCounterVec("deny_cache_hits_total",
			"Requests denied by the node's deny cache without asking the store, per zone.",
			"zone")
		metrics.storeDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: metricsNamespace,
			Subsystem: metricsSubsystem,
			Name:      "store_duration_seconds",
			Help:      "Time of each decision call to the shared store (Redis), failed ones included.",
			Buckets:   []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1},
		}, []string{"store"})
		metrics.storeErrors = newCounterVec("store_errors_total",
			"Decisions the shared store (Redis) could not make, by reason: timeout, breaker_open, oom, auth, error.",
			"store", "reason")
		metrics.breaker = newScrapeCollector("breaker_open",
			"1 while the store's circuit breaker is open or waiting for its probe (decisions take the zones' failure policies), else 0.",
			"store", prometheus.GaugeValue, breakerStates)
		metrics.evictions = newScrapeCollector("evictions_total",
			"Buckets of the zone this node's memory store evicted before they were full, to make room for new keys (max_keys).",
			"zone", prometheus.CounterValue, zoneEvictions)
		metrics.clockOffset = newScrapeCollector("clock_offset_seconds",
			"Redis' TIME minus this node's clock, measured once a second (negative when this node's clock is ahead); buckets never depend on it.",
			"store", prometheus.GaugeValue, clockOffsets)
		metrics.nearLimit = newCounterVec("near_limit_total",
			"Requests the zone admitted that left its bucket less than 20% of its capacity (the burst; the limit of a window or a concurrency zone).",
			"zone")
		initShedMetrics()
		metrics.memoryWarning = newScrapeCollector("redis_memory_warning",
			"1 when Redis' memory set-up does not suit rate-limit buckets (no maxmemory, noeviction, allkeys-*; see the stats' memory.warning), else 0; absent until read, or when the ACL refuses INFO.",
			"store", prometheus.GaugeValue, memoryWarnings)
		metrics.redisEvicted = newScrapeCollector("redis_evicted_keys_total",
			"Keys the Redis servers of the store evicted (INFO stats evicted_keys, summed; from each server's start), read once a minute; absent until read.",
			"store", prometheus.CounterValue, redisEvictedKeys)
	})
}

// newCounterVec returns a counter of this module's namespace and subsystem.
func newCounterVec(name, help string, labels ...string) *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: metricsNamespace,
		Subsystem: metricsSubsystem,
		Name:      name,
		Help:      help,
	}, labels)
}

// registerMetrics registers the collectors into a config's registry; ones
// already there (another handler of the same config) are fine.
func registerMetrics(reg *prometheus.Registry) error {
	initMetrics()
	if reg == nil {
		return nil
	}
	for _, c := range []prometheus.Collector{metrics.decisions, metrics.cacheHits, metrics.refunds,
		metrics.settlements, metrics.settledTokens,
		metrics.storeDuration, metrics.storeErrors, metrics.breaker, metrics.evictions, metrics.clockOffset,
		metrics.nearLimit, metrics.shedDelayed, metrics.shedDelay, metrics.memoryWarning, metrics.redisEvicted} {
		if err := reg.Register(c); err != nil {
			var are prometheus.AlreadyRegisteredError
			if !errors.As(err, &are) {
				return err
			}
		}
	}
	return nil
}

// zoneSeries are a zone's metrics, resolved once so that the request path
// only adds to them.
type zoneSeries struct {
	decisions [limiter.NumOutcomes]prometheus.Counter
	exempt    prometheus.Counter // decisions{outcome="exempt"}
	nearLimit prometheus.Counter
	// shedDelayed and shedDelay count a soft-shedding zone's delayed
	// requests and their delays.
	shedDelayed prometheus.Counter
	shedDelay   prometheus.Observer
	cacheHits   prometheus.Counter
	refunds     [2]prometheus.Counter // by refundApplied, refundDropped
}

// The results of a refund, as labelled.
const (
	refundApplied = iota
	refundDropped
)

var refundResults = [2]string{"applied", "dropped"}

// claimZoneSeries returns the zone's series, counting one more user.
func claimZoneSeries(zone string) zoneSeries {
	initMetrics()
	metrics.mu.Lock()
	defer metrics.mu.Unlock()
	metrics.users["zone:"+zone]++
	var s zoneSeries
	for o := range s.decisions {
		s.decisions[o] = metrics.decisions.WithLabelValues(zone, outcomeNames[o])
	}
	s.exempt = metrics.decisions.WithLabelValues(zone, outcomeExempt)
	s.nearLimit = metrics.nearLimit.WithLabelValues(zone)
	s.shedDelayed, s.shedDelay = metrics.shedDelayed.WithLabelValues(zone), metrics.shedDelay.WithLabelValues(zone)
	s.cacheHits = metrics.cacheHits.WithLabelValues(zone)
	for r := range s.refunds {
		s.refunds[r] = metrics.refunds.WithLabelValues(zone, refundResults[r])
	}
	return s
}

// releaseZoneSeries counts one user less, and deletes the zone's series
// after the last: a zone that leaves the configuration leaves the metrics.
func releaseZoneSeries(zone string) {
	metrics.mu.Lock()
	defer metrics.mu.Unlock()
	if !dropUser("zone:" + zone) {
		return
	}
	for _, name := range outcomeNames {
		metrics.decisions.DeleteLabelValues(zone, name)
	}
	metrics.decisions.DeleteLabelValues(zone, outcomeExempt)
	metrics.nearLimit.DeleteLabelValues(zone)
	metrics.shedDelayed.DeleteLabelValues(zone)
	metrics.shedDelay.DeleteLabelValues(zone)
	metrics.cacheHits.DeleteLabelValues(zone)
	for _, r := range refundResults {
		metrics.refunds.DeleteLabelValues(zone, r)
	}
	deleteSettleSeries(zone)
}

// dropUser counts one user less of the series of key ("zone:NAME",
// "store:NAME"), and reports whether it was the last. metrics.mu must be
// held.
func dropUser(key string) bool {
	if metrics.users[key]--; metrics.users[key] > 0 {
		return false
	}
	delete(metrics.users, key)
	return true
}

// storeSeries are a store's metrics.
type storeSeries struct {
	duration prometheus.Observer
	errors   [numReasons]prometheus.Counter
}

func claimStoreSeries(store string) storeSeries {
	initMetrics()
	metrics.mu.Lock()
	defer metrics.mu.Unlock()
	metrics.users["store:"+store]++
	s := storeSeries{duration: metrics.storeDuration.WithLabelValues(store)}
	for r := range s.errors {
		s.errors[r] = metrics.storeErrors.WithLabelValues(store, reasonNames[r])
	}
	return s
}

func releaseStoreSeries(store string) {
	metrics.mu.Lock()
	defer metrics.mu.Unlock()
	if !dropUser("store:" + store) {
		return
	}
	metrics.storeDuration.DeleteLabelValues(store)
	for _, r := range reasonNames {
		metrics.storeErrors.DeleteLabelValues(store, r)
	}
}

// scrapeCollector reports a metric whose values are read when scraped:
// one series per value of its one label.
type scrapeCollector struct {
	desc      *prometheus.Desc
	valueType prometheus.ValueType
	read      func() map[string]float64 // the values by label value
}

func newScrapeCollector(name, help, label string, valueType prometheus.ValueType, read func() map[string]float64) *scrapeCollector {
	return &scrapeCollector{
		desc:      prometheus.NewDesc(prometheus.BuildFQName(metricsNamespace, metricsSubsystem, name), help, []string{label}, nil),
		valueType: valueType,
		read:      read,
	}
}

// Describe sends the metric's description (prometheus.Collector).
func (c *scrapeCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

// Collect sends the values read now (prometheus.Collector).
func (c *scrapeCollector) Collect(ch chan<- prometheus.Metric) {
	for name, val := range c.read() {
		ch <- prometheus.MustNewConstMetric(c.desc, c.valueType, val, name)
	}
}

// breakerStates returns each Redis store's circuit breaker: 1 if open, else
// 0. Two stores of the same name (the same servers, with settings that
// differ otherwise) are reported as one: open if either is.
func breakerStates() map[string]float64 {
	open := map[string]float64{}
	storeRegistry.Range(func(_, v any) bool {
		s := v.(*storeStats)
		if s.redis == nil {
			return true
		}
		val := 0.0
		if s.redis.Breaker().State() != limiter.BreakerClosed {
			val = 1
		}
		open[s.name] = max(open[s.name], val)
		return true
	})
	return open
}

// zoneEvictions returns each zone's evictions from this process's memory
// store (the store counts them itself), summed by zone name: zones of one
// name on several stores are one series (each memory bucket counted once,
// though several zones fall back to it).
func zoneEvictions() map[string]float64 {
	type bucket struct {
		memory *limiter.MemoryStore
		name   string
	}
	buckets := map[string]map[bucket]bool{}
	zoneRegistry.Range(func(_, v any) bool {
		z := v.(*zoneStats)
		if info := z.info.Load(); info != nil && info.memory != nil && !z.dead.Load() {
			if buckets[z.name] == nil {
				buckets[z.name] = map[bucket]bool{}
			}
			for _, b := range info.buckets {
				buckets[z.name][bucket{info.memory, b}] = true
			}
		}
		return true
	})
	out := make(map[string]float64, len(buckets))
	for name, bs := range buckets {
		var n uint64
		for b := range bs {
			n += b.memory.Evictions(b.name)
		}
		out[name] = float64(n)
	}
	return out
}

// clockOffsets returns this node's clock offset against each Redis store's
// TIME: the latest estimate of the store's clock watcher, absent
// until its first reading. Two stores of the same name report the first
// one's.
func clockOffsets() map[string]float64 {
	offsets := map[string]float64{}
	storeRegistry.Range(func(_, v any) bool {
		s := v.(*storeStats)
		if r, ok := s.clock.offset(); ok {
			if _, seen := offsets[s.name]; !seen {
				offsets[s.name] = r.Offset.Seconds()
			}
		}
		return true
	})
	return offsets
}

// memoryWarnings returns, for each Redis store whose memory has been read,
// 1 when its set-up does not suit buckets (the stats' memory.warning), else
// 0. Two stores of the same name report 1 if either warns.
func memoryWarnings() map[string]float64 {
	out := map[string]float64{}
	redisMemories(func(name string, m limiter.RedisMemory) {
		val := 0.0
		if redisMemoryOf(m).Warning != "" {
			val = 1
		}
		out[name] = max(out[name], val)
	})
	return out
}

// redisEvictedKeys returns, for each Redis store whose memory has been
// read, the keys its servers evicted (INFO's evicted_keys, summed). Two
// stores of the same name report the first one's.
func redisEvictedKeys() map[string]float64 {
	out := map[string]float64{}
	redisMemories(func(name string, m limiter.RedisMemory) {
		if _, seen := out[name]; !seen {
			out[name] = float64(m.EvictedKeys)
		}
	})
	return out
}

// redisMemories calls f with the name and the latest memory reading of
// each Redis store whose memory has been read.
func redisMemories(f func(name string, m limiter.RedisMemory)) {
	storeRegistry.Range(func(_, v any) bool {
		s := v.(*storeStats)
		if s.redis != nil {
			if m, ok := s.redis.Memory(); ok {
				f(s.name, m)
			}
		}
		return true
	})
}
