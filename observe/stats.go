package observe

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/fleetlimit/caddy-fleetlimit/limiter"
)

// The statistics behind the admin API, registered by zone (zoneKey: its
// name and its store) and by store in process-wide caddy.UsagePools, so
// that the admin API reaches them and a zone's counts outlive a reload
// (docs/design.md, "The statistics' registries").
var (
	zoneRegistry  = caddy.NewUsagePool() // zoneKey -> *zoneStats
	storeRegistry = caddy.NewUsagePool() // store pool key -> *storeStats
)

// zoneKey identifies a zone's stats: its name and its store's pool key.
type zoneKey struct {
	name  string
	store string
}

// zoneInfo describes a zone as one handler configured it. Each handler
// holding the zone's stats has its own (see zoneStats.hold).
type zoneInfo struct {
	alg      string
	maxDelay time.Duration // a leaky bucket's max_delay, or a soft shed's
	shedPct  int64         // a token bucket's soft_shed percentage (0: none)
	rate     int64
	per      time.Duration
	burst    int64
	onError  string
	logKey   bool
	digest   limiter.Digester // the handler's, for the top keys
	// memory holds the zone's buckets in this process (the memory store,
	// or the local fallback buckets), named buckets there; nil if none.
	memory  *limiter.MemoryStore
	buckets []string
	// keys normalises a raw client key as the zone does (ZoneConfig.Keys);
	// nil when the zone has no key alternative.
	keys func(string) []string
	// rule is the zone's rule; tiers, if set, its rules per tier, and
	// lastRule, if set, the rule that applied last to a key (ZoneConfig).
	rule     *limiter.Rule
	tiers    func() []*limiter.Rule
	lastRule func(string) *limiter.Rule
	// queue tells, for a leaky bucket, how many of its requests wait and
	// how many were turned away (ZoneConfig.Queue); nil otherwise.
	queue func() (int64, uint64)
	// prefetch tells what this node's prefetch did for the zone
	// (ZoneConfig.Prefetch); nil without prefetch.
	prefetch func() limiter.PrefetchStats
	maxWait  int64 // the most requests that wait at once (max_waiting)
	// server is the Caddy HTTP server (*caddyhttp.Server) the handler
	// serves in, nil when it was provisioned outside one: a dashboard of
	// scope server shows the zones its own server's handlers hold.
	server any
}

// evictions returns how many of the zone's buckets this process's memory
// store evicted to make room for new keys (max_keys).
func (i *zoneInfo) evictions() uint64 {
	if i == nil || i.memory == nil {
		return 0
	}
	var n uint64
	for _, b := range i.buckets {
		n += i.memory.Evictions(b)
	}
	return n
}

// zoneStats are one zone's statistics, shared by every handler with a zone
// of that name on that store and kept across reloads (see zoneRegistry).
//
// What the stats say of the zone's configuration (info) is that of the
// newest handler still holding them, not merely the last provisioned: a
// configuration whose load fails after this handler's Provision is cleaned
// up without ever running, and its Cleanup takes its description away, so
// the stats describe the configuration that runs again. Deferring the
// description to the first request served would leave a reload that no
// request follows undescribed, and a successful load is always the newest
// holder once the previous configuration's Cleanup has run.
type zoneStats struct {
	name   string
	store  *storeStats // where the zone's buckets are (part of its key)
	totals [limiter.NumOutcomes]atomic.Uint64
	hits   atomic.Uint64 // deny cache hits
	// exempt counts the requests the zone left alone (their client is
	// exempt), nearLimit the admitted ones that left the bucket nearly
	// empty (nearLimitShare).
	exempt, nearLimit atomic.Uint64
	// shedDelayed counts the requests a soft-shedding zone delayed (a
	// dry run: would have delayed), and shedDelayUS their delays in
	// microseconds.
	shedDelayed, shedDelayUS atomic.Uint64
	// refunds and refundsDropped count charges given back after the
	// response, and those the store failed to take back.
	refunds, refundsDropped atomic.Uint64
	// settlements and settlementsLost count cost_header settlements
	// applied, and those the store failed.
	settlements, settlementsLost atomic.Uint64
	ring                         counterRing
	top                          *topKeys
	nets                         *topKeys // the denied clients' networks (networkKey)
	series                       zoneSeries
	dead                         atomic.Bool

	mu      sync.Mutex
	holders []*zoneInfo              // one per handler holding the stats, oldest first
	info    atomic.Pointer[zoneInfo] // the newest holder's; nil when none
}

// loadZoneStats takes a reference to the stats of a zone on a store (whose
// stats the caller holds a reference to); release it with
// zoneRegistry.Delete(zoneKey{name, store.key}).
func loadZoneStats(name string, store *storeStats) (*zoneStats, error) {
	v, _, err := zoneRegistry.LoadOrNew(zoneKey{name, store.key}, func() (caddy.Destructor, error) {
		z := &zoneStats{name: name, store: store, top: newTopKeys(), nets: newTopKeys()}
		z.series = claimZoneSeries(name)
		if store.fleet != nil {
			store.fleet.link(z)
		}
		return z, nil
	})
	if err != nil {
		return nil, err
	}
	return v.(*zoneStats), nil
}

// hold adds a handler's description of the zone, which the stats show
// until a newer handler holds them or until release.
func (z *zoneStats) hold(info *zoneInfo) {
	z.mu.Lock()
	defer z.mu.Unlock()
	z.holders = append(z.holders, info)
	z.info.Store(info)
}

// release removes a handler's description: the stats show the newest
// holder's left.
func (z *zoneStats) release(info *zoneInfo) {
	z.mu.Lock()
	defer z.mu.Unlock()
	for i, h := range z.holders {
		if h == info {
			z.holders = append(z.holders[:i], z.holders[i+1:]...)
			break
		}
	}
	var newest *zoneInfo
	if n := len(z.holders); n > 0 {
		newest = z.holders[n-1]
	}
	z.info.Store(newest)
}

// heldIn reports whether a handler of the Caddy HTTP server srv holds the
// zone's stats.
func (z *zoneStats) heldIn(srv any) bool {
	z.mu.Lock()
	defer z.mu.Unlock()
	for _, h := range z.holders {
		if h.server == srv {
			return true
		}
	}
	return false
}

// Destruct drops the zone's metric series: the zone has left the
// configuration.
func (z *zoneStats) Destruct() error {
	z.dead.Store(true)
	releaseZoneSeries(z.name)
	return nil
}

// count records one request's outcome in the zone at unix second sec.
func (z *zoneStats) count(o limiter.Outcome, sec int64) {
	z.totals[o].Add(1)
	z.ring.add(sec, o)
	z.series.decisions[o].Inc()
}

// exempted counts a request the zone left alone: its client is exempt.
func (z *zoneStats) exempted() {
	z.exempt.Add(1)
	z.series.exempt.Inc()
}

// nearedLimit counts an admitted request that left the bucket nearly
// empty.
func (z *zoneStats) nearedLimit() {
	z.nearLimit.Add(1)
	z.series.nearLimit.Inc()
}

func (z *zoneStats) cacheHit() {
	z.hits.Add(1)
	z.series.cacheHits.Inc()
}

// refunded counts a refund of the zone: applied, or dropped (err).
func (z *zoneStats) refunded(err error) {
	if err != nil {
		z.refundsDropped.Add(1)
		z.series.refunds[refundDropped].Inc()
		return
	}
	z.refunds.Add(1)
	z.series.refunds[refundApplied].Inc()
}

func (z *zoneStats) loadTotals() (c [limiter.NumOutcomes]uint64) {
	for i := range c {
		c[i] = z.totals[i].Load()
	}
	return c
}

// storeError is the last error of a store.
type storeError struct {
	msg string
	at  time.Time
}

// storeStats are one store's statistics, shared by every handler using that
// store (see storeRegistry). A Redis store's stats also run its fleet
// reporter, its denial feed's writer and its clock
// watcher.
type storeStats struct {
	key    string
	name   string
	redis  *limiter.RedisStore  // nil for the memory store
	shared *redisStats          // the Redis store's shared statistics, or nil
	memory *limiter.MemoryStore // nil for a Redis store
	lat    latencyRing
	errs   [numReasons]atomic.Uint64
	last   atomic.Pointer[storeError]
	series storeSeries
	fleet  *fleetReporter
	feed   *denialFeed
	writer *feedWriter   // nil for the memory store
	clock  *clockWatcher // nil for the memory store
	// feedRead and bansRead are the last reads of a Redis store's denial
	// streams and ban lists.
	feedRead cachedRead[[]Denial]
	bansRead cachedRead[[]limiter.BanRecord]
	// ctx ends the reads in flight when the stats go (cancel, in
	// Destruct).
	ctx    context.Context
	cancel context.CancelFunc
}

// readDeadline is how long a request that began at start waits for a read
// of the Redis store: the store's timeout.
func (s *storeStats) readDeadline(start time.Time) time.Time {
	return start.Add(s.redis.Timeout())
}

// loadStoreStats takes a reference to a store's stats; release it with
// storeRegistry.Delete(key).
func loadStoreStats(key, name string, store limiter.Store) (*storeStats, error) {
	v, _, err := storeRegistry.LoadOrNew(key, func() (caddy.Destructor, error) {
		s := &storeStats{key: key, name: name}
		s.ctx, s.cancel = context.WithCancel(context.Background())
		s.redis, _ = store.(*limiter.RedisStore)
		s.memory, _ = store.(*limiter.MemoryStore)
		s.series = claimStoreSeries(name)
		s.feed = newDenialFeed(s.redis != nil)
		if s.redis != nil {
			s.shared = newRedisStats(s.redis)
			s.fleet = startFleetReporter(s)
			s.writer = startFeedWriter(s)
			s.clock = startClockWatcher(s.shared)
		}
		return s, nil
	})
	if err != nil {
		return nil, err
	}
	return v.(*storeStats), nil
}

// Destruct stops the fleet reporter, the feed's writer, the clock watcher
// and the admin API's reads in flight, and drops the store's metric
// series.
func (s *storeStats) Destruct() error {
	s.cancel()
	if s.fleet != nil {
		s.fleet.stop()
	}
	if s.writer != nil {
		s.writer.stop()
	}
	if s.clock != nil {
		s.clock.stop()
	}
	releaseStoreSeries(s.name)
	return nil
}

// decided records one store call (see limiter.Observer).
func (s *storeStats) decided(took time.Duration, err error) {
	reason := -1
	switch {
	case err == nil:
	case errors.Is(err, context.Canceled):
		return // the client went away: not the store's doing
	case errors.Is(err, limiter.ErrBreakerOpen):
		reason = reasonBreakerOpen
	case errors.Is(err, limiter.ErrStoreTimeout):
		reason = reasonTimeout
	case limiter.IsOOM(err):
		reason = reasonOOM
	case limiter.IsAuth(err):
		reason = reasonAuth
	default:
		reason = reasonError
	}
	slot := s.lat.slot(time.Now().Unix())
	if reason != reasonBreakerOpen {
		s.series.duration.Observe(took.Seconds())
		if slot != nil {
			slot.calls.Add(1)
			slot.buckets[latIndex(took)].Add(1)
		}
	}
	if reason < 0 {
		return
	}
	s.errs[reason].Add(1)
	s.series.errors[reason].Inc()
	if slot != nil {
		slot.errors.Add(1)
	}
	if reason != reasonBreakerOpen {
		s.last.Store(&storeError{msg: err.Error(), at: time.Now()})
	}
}

// limiterObserver is a handler's limiter.Observer: store calls go to the
// store's stats, deny cache hits to the zone's.
type limiterObserver struct {
	store *storeStats
	rules []*limiter.Rule
	zones []*zoneStats
}

// StoreDecided records a store call in the store's stats.
func (o *limiterObserver) StoreDecided(took time.Duration, err error) { o.store.decided(took, err) }

// CacheDenied counts a deny cache hit in the zone of the rule.
func (o *limiterObserver) CacheDenied(rule *limiter.Rule) {
	if z := o.zoneOf(rule); z != nil {
		z.cacheHit()
	}
}

// Refunded counts a zone's refund, applied or dropped.
func (o *limiterObserver) Refunded(rule *limiter.Rule, err error) {
	if z := o.zoneOf(rule); z != nil {
		z.refunded(err)
	}
}

// zoneOf returns the stats of the zone whose rule this is (a rule from
// placeholders is its zone's by name), or nil.
func (o *limiterObserver) zoneOf(rule *limiter.Rule) *zoneStats {
	for i, r := range o.rules {
		if r == rule {
			return o.zones[i]
		}
	}
	for i, r := range o.rules {
		if r.Name() == rule.Name() {
			return o.zones[i]
		}
	}
	return nil
}

// Interface guards
var (
	_ caddy.Destructor = (*zoneStats)(nil)
	_ caddy.Destructor = (*storeStats)(nil)
	_ limiter.Observer = (*limiterObserver)(nil)
)
