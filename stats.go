package fleetlimit

import (
	"context"
	"errors"
	"hash/maphash"
	"math/bits"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/fleetlimit/caddy-fleetlimit/limiter"
)

// The statistics behind the admin API (admin.go): per zone, rolling
// per-second counts of each outcome and the keys denied most; per store,
// latency and errors. All of it has a fixed size, whatever the traffic and
// however many clients there are.
//
// Why process-wide registries: the admin API module is provisioned by
// Caddy's admin server, separately from the http app and before it, so it
// cannot reach the handlers of a configuration. Handlers therefore register
// their stats here, by zone name and by store, in caddy.UsagePools: each
// Provision takes a reference (LoadOrNew) and the handler's Cleanup drops it
// (Delete). A new configuration provisions before the old one is cleaned
// up, so a zone that stays in the configuration keeps its counts (and its
// charts) across reloads, and one that leaves it is dropped with the last
// handler that had it: nothing leaks from one config load to the next.
// Handlers with zones of the same name share their buckets in the store, and
// share their stats too.
var (
	zoneRegistry  = caddy.NewUsagePool() // zone name -> *zoneStats
	storeRegistry = caddy.NewUsagePool() // store pool key -> *storeStats
)

// seriesSeconds is how many seconds of per-second counts each zone keeps:
// the dashboard's chart spans them.
const seriesSeconds = 300

// counterRing counts outcomes per second over the last seriesSeconds
// seconds, with atomic adds; its lock is taken only when a slot moves on to
// a new second.
type counterRing struct {
	mu    sync.Mutex
	slots [seriesSeconds + 2]counterSlot
}

type counterSlot struct {
	sec atomic.Int64
	n   [limiter.NumOutcomes]atomic.Uint64
}

func (r *counterRing) add(sec int64, o limiter.Outcome) {
	s := &r.slots[uint64(sec)%uint64(len(r.slots))]
	if cur := s.sec.Load(); cur != sec {
		if cur > sec {
			return // a second that has already left the ring
		}
		r.mu.Lock()
		if s.sec.Load() < sec {
			for i := range s.n {
				s.n[i].Store(0)
			}
			s.sec.Store(sec)
		}
		r.mu.Unlock()
	}
	s.n[o].Add(1)
}

// get returns the counts of one second (zero for one the ring no longer or
// not yet holds).
func (r *counterRing) get(sec int64) (c [limiter.NumOutcomes]uint64) {
	s := &r.slots[uint64(sec)%uint64(len(r.slots))]
	if s.sec.Load() != sec {
		return c
	}
	for i := range c {
		c[i] = s.n[i].Load()
	}
	return c
}

// sum returns the counts of the n seconds that end with second end.
func (r *counterRing) sum(end int64, n int) (c [limiter.NumOutcomes]uint64) {
	for sec := end - int64(n) + 1; sec <= end; sec++ {
		g := r.get(sec)
		for i := range c {
			c[i] += g[i]
		}
	}
	return c
}

// The top denied keys: a Space-Saving sketch (Metwally, Agrawal and El
// Abbadi, 2005) of topPerShard counters in each of topShards shards, keys
// spread over the shards by hash so that each shard's lock is rarely
// contended and the shards' summaries never overlap. Space-Saving finds every
// key denied more than 1/topPerShard of its shard's denials, with counts
// that may be high by at most the reported error. Two generations of
// topWindow seconds are kept, so the table shows who is denied now, not who
// was an hour ago.
const (
	topShards   = 8
	topPerShard = 32
	topWindow   = 60
	topReport   = 10
)

type topKeys struct {
	seed   maphash.Seed
	shards [topShards]topShard
}

type topShard struct {
	mu        sync.Mutex
	epoch     int64 // the topWindow of cur; prev holds the one before, or nothing
	cur, prev spaceSaving
	_         [64]byte // keeps shards' locks off each other's cache lines
}

type spaceSaving struct {
	idx   map[string]int
	items []topItem
}

type topItem struct {
	key   string
	count uint64
	over  uint64 // how much count may exceed the key's true count
}

func newTopKeys() *topKeys { return &topKeys{seed: maphash.MakeSeed()} }

// add counts one denial of key at unix second sec.
func (t *topKeys) add(key string, sec int64) {
	sh := &t.shards[maphash.String(t.seed, key)%topShards]
	epoch := sec / topWindow
	sh.mu.Lock()
	if epoch > sh.epoch {
		if epoch == sh.epoch+1 {
			sh.prev, sh.cur = sh.cur, sh.prev
		} else {
			sh.prev.reset()
		}
		sh.cur.reset()
		sh.epoch = epoch
	}
	sh.cur.add(key)
	sh.mu.Unlock()
}

func (s *spaceSaving) reset() {
	clear(s.idx)
	clear(s.items)
	s.items = s.items[:0]
}

func (s *spaceSaving) add(key string) {
	if i, ok := s.idx[key]; ok {
		s.items[i].count++
		return
	}
	if s.idx == nil {
		s.idx = make(map[string]int, topPerShard)
		s.items = make([]topItem, 0, topPerShard)
	}
	// The key may point into a request's memory: keep a copy.
	k := strings.Clone(key)
	if len(s.items) < topPerShard {
		s.idx[k] = len(s.items)
		s.items = append(s.items, topItem{key: k, count: 1})
		return
	}
	m := 0
	for i := 1; i < len(s.items); i++ {
		if s.items[i].count < s.items[m].count {
			m = i
		}
	}
	delete(s.idx, s.items[m].key)
	s.idx[k] = m
	s.items[m] = topItem{key: k, count: s.items[m].count + 1, over: s.items[m].count}
}

// top returns the n keys denied most in the current and the previous
// window at unix second now, and the unix second the data starts from.
func (t *topKeys) top(now int64, n int) ([]topItem, int64) {
	epoch := now / topWindow
	merged := map[string]topItem{}
	addAll := func(s *spaceSaving) {
		for _, it := range s.items {
			m := merged[it.key]
			m.key = it.key
			m.count += it.count
			m.over += it.over
			merged[it.key] = m
		}
	}
	for i := range t.shards {
		sh := &t.shards[i]
		sh.mu.Lock()
		switch sh.epoch {
		case epoch:
			addAll(&sh.cur)
			addAll(&sh.prev)
		case epoch - 1:
			addAll(&sh.cur)
		}
		sh.mu.Unlock()
	}
	items := make([]topItem, 0, len(merged))
	for _, it := range merged {
		items = append(items, it)
	}
	sort.Slice(items, func(i, j int) bool {
		if items[i].count != items[j].count {
			return items[i].count > items[j].count
		}
		return items[i].key < items[j].key
	})
	if len(items) > n {
		items = items[:n]
	}
	return items, (epoch - 1) * topWindow
}

// zoneInfo describes a zone as the handler provisioned last configured it.
type zoneInfo struct {
	alg     string
	rate    int64
	per     time.Duration
	burst   int64
	onError string
	logKey  bool
}

// zoneStats are one zone's statistics, shared by every handler with a zone
// of that name and kept across reloads (see zoneRegistry).
type zoneStats struct {
	name   string
	info   atomic.Pointer[zoneInfo]
	store  atomic.Pointer[storeStats] // where the zone's buckets are
	totals [limiter.NumOutcomes]atomic.Uint64
	hits   atomic.Uint64 // deny cache hits
	ring   counterRing
	top    *topKeys
	series zoneSeries
	dead   atomic.Bool
}

// loadZoneStats takes a reference to a zone's stats; release it with
// zoneRegistry.Delete(name).
func loadZoneStats(name string) (*zoneStats, error) {
	v, _, err := zoneRegistry.LoadOrNew(name, func() (caddy.Destructor, error) {
		z := &zoneStats{name: name, top: newTopKeys()}
		z.series = claimZoneSeries(name)
		return z, nil
	})
	if err != nil {
		return nil, err
	}
	return v.(*zoneStats), nil
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

func (z *zoneStats) cacheHit() {
	z.hits.Add(1)
	z.series.cacheHits.Inc()
}

func (z *zoneStats) loadTotals() (c [limiter.NumOutcomes]uint64) {
	for i := range c {
		c[i] = z.totals[i].Load()
	}
	return c
}

// Store latency is kept per second for the last latencySeconds seconds, in
// a log-linear histogram: latSub buckets per doubling from 2^latMinExp ns
// (about a microsecond) to 2^latMaxExp ns (about 34 s), so a percentile is
// known within a quarter of its value.
const (
	latencySeconds = 60
	latMinExp      = 10
	latMaxExp      = 35
	latSub         = 4
	latBuckets     = (latMaxExp-latMinExp)*latSub + 1
)

type latencyRing struct {
	mu    sync.Mutex
	slots [latencySeconds + 1]latencySlot
}

type latencySlot struct {
	sec     atomic.Int64
	calls   atomic.Uint64 // store calls made (failed ones included)
	errors  atomic.Uint64 // decisions the store could not make
	buckets [latBuckets]atomic.Uint64
}

// latIndex returns the histogram bucket of a duration.
func latIndex(d time.Duration) int {
	ns := uint64(max(d, 0))
	if ns < 1<<latMinExp {
		return 0
	}
	e := bits.Len64(ns) - 1 // 2^e <= ns < 2^(e+1)
	if e >= latMaxExp {
		return latBuckets - 1
	}
	m := int(ns>>(e-2)) & (latSub - 1)
	return 1 + (e-latMinExp)*latSub + m
}

// latUpper returns the upper bound of a histogram bucket.
func latUpper(i int) time.Duration {
	if i == 0 {
		return 1 << latMinExp
	}
	i--
	e, m := latMinExp+i/latSub, i%latSub
	return time.Duration(uint64(latSub+m+1) << (e - 2))
}

func (r *latencyRing) slot(sec int64) *latencySlot {
	s := &r.slots[uint64(sec)%uint64(len(r.slots))]
	if cur := s.sec.Load(); cur != sec {
		if cur > sec {
			return nil
		}
		r.mu.Lock()
		if s.sec.Load() < sec {
			s.calls.Store(0)
			s.errors.Store(0)
			for i := range s.buckets {
				s.buckets[i].Store(0)
			}
			s.sec.Store(sec)
		}
		r.mu.Unlock()
	}
	return s
}

// latencySummary is what the ring says about the last seconds.
type latencySummary struct {
	calls, errors uint64
	buckets       [latBuckets]uint64
}

func (r *latencyRing) summary(now int64, seconds int) latencySummary {
	var sum latencySummary
	for sec := now - int64(seconds) + 1; sec <= now; sec++ {
		s := &r.slots[uint64(sec)%uint64(len(r.slots))]
		if s.sec.Load() != sec {
			continue
		}
		sum.calls += s.calls.Load()
		sum.errors += s.errors.Load()
		for i := range s.buckets {
			sum.buckets[i] += s.buckets[i].Load()
		}
	}
	return sum
}

// quantile returns the upper bound of the bucket holding quantile q of the
// calls, and 0 when there were none.
func (s *latencySummary) quantile(q float64) time.Duration {
	var total uint64
	for _, n := range s.buckets {
		total += n
	}
	if total == 0 {
		return 0
	}
	rank := uint64(q*float64(total) + 0.5)
	rank = max(1, min(rank, total))
	var seen uint64
	for i, n := range s.buckets {
		seen += n
		if seen >= rank {
			return latUpper(i)
		}
	}
	return latUpper(latBuckets - 1)
}

// storeError is the last error of a store.
type storeError struct {
	msg string
	at  time.Time
}

// storeStats are one store's statistics, shared by every handler using that
// store (see storeRegistry). A Redis store's stats also run its fleet
// reporter (fleet.go).
type storeStats struct {
	key    string
	name   string
	redis  *limiter.RedisStore // nil for the memory store
	lat    latencyRing
	errs   [numReasons]atomic.Uint64
	last   atomic.Pointer[storeError]
	series storeSeries
	fleet  *fleetReporter
}

// loadStoreStats takes a reference to a store's stats; release it with
// storeRegistry.Delete(key).
func loadStoreStats(key, name string, store limiter.Store) (*storeStats, error) {
	v, _, err := storeRegistry.LoadOrNew(key, func() (caddy.Destructor, error) {
		s := &storeStats{key: key, name: name}
		s.redis, _ = store.(*limiter.RedisStore)
		s.series = claimStoreSeries(name)
		if s.redis != nil {
			s.fleet = startFleetReporter(s)
		}
		return s, nil
	})
	if err != nil {
		return nil, err
	}
	return v.(*storeStats), nil
}

// Destruct stops the fleet reporter and drops the store's metric series.
func (s *storeStats) Destruct() error {
	if s.fleet != nil {
		s.fleet.stop()
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

func (o *limiterObserver) StoreDecided(took time.Duration, err error) { o.store.decided(took, err) }

func (o *limiterObserver) CacheDenied(rule *limiter.Rule) {
	for i, r := range o.rules {
		if r == rule {
			o.zones[i].cacheHit()
			return
		}
	}
}

// Interface guards
var (
	_ caddy.Destructor = (*zoneStats)(nil)
	_ caddy.Destructor = (*storeStats)(nil)
	_ limiter.Observer = (*limiterObserver)(nil)
)
