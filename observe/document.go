package observe

import (
	"context"
	"errors"
	"sort"
	"strings"
	"time"

	"github.com/fleetlimit/caddy-fleetlimit/limiter"
)

// statsBody is the body of GET /rate_limit/stats.
type statsBody struct {
	// Node is this node's id in the fleet view (host name/process id).
	Node string `json:"node"`
	// Time is when the statistics were taken; Second is its unix second,
	// the one the rates' windows end before (they cover whole seconds).
	Time   time.Time `json:"time"`
	Second int64     `json:"second"`
	// Zones are the zones of the configuration, one entry per zone name
	// and store, sorted by name then store.
	Zones []statsZone `json:"zones"`
	// Stores are the stores the zones use, sorted by name.
	Stores []statsStore `json:"stores"`
}

// outcomeCounts has one field per zone outcome (see zoneOutcome).
type outcomeCounts[T uint64 | float64] struct {
	Allowed      T `json:"allowed"`
	Denied       T `json:"denied"`
	FailedOpen   T `json:"failed_open"`
	FailedClosed T `json:"failed_closed"`
	LocalAllowed T `json:"local_allowed"`
	LocalDenied  T `json:"local_denied"`
	Banned       T `json:"banned"`
	DryRunDenied T `json:"dry_run_denied"`
}

func countsOf(c [limiter.NumOutcomes]uint64) outcomeCounts[uint64] {
	return outcomeCounts[uint64]{
		Allowed: c[limiter.Allowed], Denied: c[limiter.Denied],
		FailedOpen: c[limiter.FailedOpen], FailedClosed: c[limiter.FailedClosed],
		LocalAllowed: c[limiter.LocalAllowed], LocalDenied: c[limiter.LocalDenied],
		Banned: c[limiter.Banned], DryRunDenied: c[limiter.DryRunDenied],
	}
}

func ratesOf(c [limiter.NumOutcomes]uint64, seconds int) outcomeCounts[float64] {
	d := float64(seconds)
	return outcomeCounts[float64]{
		Allowed: float64(c[limiter.Allowed]) / d, Denied: float64(c[limiter.Denied]) / d,
		FailedOpen: float64(c[limiter.FailedOpen]) / d, FailedClosed: float64(c[limiter.FailedClosed]) / d,
		LocalAllowed: float64(c[limiter.LocalAllowed]) / d, LocalDenied: float64(c[limiter.LocalDenied]) / d,
		Banned: float64(c[limiter.Banned]) / d, DryRunDenied: float64(c[limiter.DryRunDenied]) / d,
	}
}

// statsWindows are per-second rates over the last 1, 10 and 60 whole
// seconds.
type statsWindows struct {
	One   outcomeCounts[float64] `json:"1s"`
	Ten   outcomeCounts[float64] `json:"10s"`
	Sixty outcomeCounts[float64] `json:"60s"`
}

// statsSeries is a chart's data: per second, oldest first, the last one
// being End. Allowed counts every request that passed (allowed,
// local_allowed, failed_open), Denied every one rejected (denied,
// local_denied, failed_closed).
type statsSeries struct {
	End     int64    `json:"end"`
	Allowed []uint64 `json:"allowed"`
	Denied  []uint64 `json:"denied"`
}

// statsZone is one zone on one store. Zones of the same name on different
// stores (one site on the memory store, another on Redis) have buckets of
// their own, and are distinct entries: Name and Store tell them apart.
// The configuration shown (Algorithm to OnError) is that of the newest
// handler still holding the zone, so a reload that failed to load does not
// show.
type statsZone struct {
	// Name is the zone's name.
	Name string `json:"name"`
	// Algorithm, Rate per Per, Burst and OnError are the zone's rule.
	Algorithm string `json:"algorithm"`
	Rate      int64  `json:"rate"`
	Per       string `json:"per"`
	Burst     int64  `json:"burst"`
	OnError   string `json:"on_error"`
	// Store is the name of the store the zone's buckets are in (as in
	// Stores).
	Store string `json:"store"`
	// Totals count since the zone entered the configuration (they
	// survive reloads).
	Totals        outcomeCounts[uint64] `json:"totals"`
	DenyCacheHits uint64                `json:"deny_cache_hits"`
	// Exempt counts the requests the zone left alone because their
	// client is exempt (exempt), NearLimit the admitted requests that left
	// the bucket less than 20% of its capacity.
	Exempt    uint64 `json:"exempt"`
	NearLimit uint64 `json:"near_limit"`
	// Evictions counts the zone's buckets this node's memory store
	// evicted before they were full, to make room for new keys
	// (max_keys).
	Evictions uint64 `json:"evictions"`
	// Refunds counts the charges given back after the response
	// (count_status refunds, concurrency slots released), and
	// RefundsDropped those the store failed to take back (the charge
	// stayed).
	Refunds        uint64 `json:"refunds"`
	RefundsDropped uint64 `json:"refunds_dropped"`
	// Settlements counts the cost_header settlements applied after the
	// response, and SettlementsLost those the store failed every attempt
	// of (the charge, or the refund, was not made).
	Settlements     uint64 `json:"settlements"`
	SettlementsLost uint64 `json:"settlements_lost"`
	// Queue is, for a leaky bucket, its requests waiting for their turn
	// on this node (for a soft-shedding token bucket: for their delay);
	// absent for the other zones.
	Queue *statsQueue `json:"queue,omitempty"`
	// SoftShed is, for a soft-shedding token bucket, its threshold and
	// the requests it delayed; absent for the other zones.
	SoftShed *statsSoftShed `json:"soft_shed,omitempty"`
	// Prefetch is, for a zone with prefetch, what this node's prefetch
	// did for it since the configuration loaded: requests admitted from
	// spares or paced without the store, store decisions, spares taken
	// and given back.
	Prefetch  *limiter.PrefetchStats `json:"prefetch,omitempty"`
	Rates     statsWindows           `json:"rates"`
	TopDenied statsTop               `json:"top_denied"`
	// TopNetworks are the client networks denied most.
	TopNetworks statsTopNetworks `json:"top_networks"`
	Series      *statsSeries     `json:"series,omitempty"`
	// Fleet is what every node sharing the zone's Redis decided; absent
	// with the memory store.
	Fleet *statsFleet `json:"fleet,omitempty"`
}

// statsQueue is a leaky bucket's waiting room on this node: the longest a
// request waits (max_delay), how many may wait at once (max_waiting), how
// many wait now, and how many were answered 429 because the room was
// full (since the handler was provisioned).
type statsQueue struct {
	MaxDelay   string `json:"max_delay"`
	MaxWaiting int64  `json:"max_waiting"`
	Waiting    int64  `json:"waiting"`
	TurnedAway uint64 `json:"turned_away"`
}

// statsTop lists the keys denied most since Since (one to two minutes ago).
// Keys are digests (the handler's limiter.Digester, as in the logs) unless the handler
// has log_key. Denied may exceed the true count by at most Error.
type statsTop struct {
	Since  int64         `json:"since"`
	Hashed bool          `json:"hashed"`
	Keys   []statsTopKey `json:"keys"`
}

// statsTopKey is one of the keys denied most: the key (or its digest), how
// many times it was denied, and by how many that count may be over.
type statsTopKey struct {
	Key    string `json:"key"`
	Denied uint64 `json:"denied"`
	Error  uint64 `json:"error"`
}

// statsTopNetworks lists the client networks denied most since Since (one
// to two minutes ago): the denied requests' client addresses (as Caddy's
// client_ip gives them) grouped by /24 for IPv4 and /64 for IPv6, counted
// by the sketch of the top keys. Denied may exceed the true count by at
// most Error.
type statsTopNetworks struct {
	Since    int64             `json:"since"`
	Networks []statsTopNetwork `json:"networks"`
}

// statsTopNetwork is one of the networks denied most.
type statsTopNetwork struct {
	Network string `json:"network"`
	Denied  uint64 `json:"denied"`
	Error   uint64 `json:"error"`
}

// statsFleet is the fleet's part of a zone: the nodes that reported in the
// last 10 s, and counts of whole seconds of Redis' clock ending two seconds
// ago (a node reports about a second late). Totals cover the last
// WindowSeconds. Nodes, WindowSeconds, Totals, Rates and Series are as of
// ReadAt: a stale read's are older.
type statsFleet struct {
	Nodes         []string              `json:"nodes"`
	WindowSeconds int                   `json:"window_seconds"`
	Totals        outcomeCounts[uint64] `json:"totals"`
	Rates         statsWindows          `json:"rates"`
	Series        *statsSeries          `json:"series,omitempty"`
	// Stale says Redis did not answer the latest read of the fleet's
	// counts in time (or failed it): these are the last read, at ReadAt.
	Stale bool `json:"stale"`
	// ReadAt is when the counts were read; absent when none ever was.
	ReadAt *time.Time `json:"read_at,omitempty"`
	// Error is why the latest read gave nothing new.
	Error string `json:"error,omitempty"`
}

// statsStore is one store's health.
type statsStore struct {
	// Name names the store as the metrics' store label does: the servers
	// it talks to, or "memory".
	Name string `json:"name"`
	// Kind is memory or redis.
	Kind string `json:"kind"`
	// Status is ok; degraded (errors in the last 10 s); stalled (Redis
	// accepts the connection but did not answer the latest idle probe in
	// time); or down (the circuit breaker is open, or the latest idle
	// probe failed otherwise).
	Status string `json:"status"`
	// Breaker is the circuit breaker's state: closed, open or half-open.
	Breaker string `json:"breaker,omitempty"`
	// Probe is the latest idle PING (sent only while no decision goes to
	// Redis, at most once a second); absent under traffic.
	Probe *statsProbe `json:"probe,omitempty"`
	// Calls and errors per second over the last 10 s.
	CallsPerSecond  float64 `json:"calls_per_second"`
	ErrorsPerSecond float64 `json:"errors_per_second"`
	// Errors since the store's stats began, by reason.
	Errors    map[string]uint64 `json:"errors"`
	Latency   *statsLatency     `json:"latency_ms,omitempty"`
	LastError *statsError       `json:"last_error,omitempty"`
	Fleet     *statsFleetStatus `json:"fleet,omitempty"`
	// Keys and MaxKeys are the buckets the memory store holds and its
	// bound (max_keys); memory store only.
	Keys    int `json:"keys,omitempty"`
	MaxKeys int `json:"max_keys,omitempty"`
	// Memory is what Redis last said of its memory (read once a
	// minute); Redis only, absent until read or when INFO is refused.
	Memory *statsRedisMemory `json:"memory,omitempty"`
	// Clock is this node's clock against Redis'; Redis only, absent
	// until the first reading.
	Clock *statsClock `json:"clock,omitempty"`
	// Feed tells whether this node's denials reach the fleet's denial
	// feed; Redis only.
	Feed *statsFeedStatus `json:"feed,omitempty"`
}

// statsProbe is an idle PING of Redis: when it ended, how long it waited,
// and why it failed, if it did.
type statsProbe struct {
	Time   time.Time `json:"time"`
	TookMS float64   `json:"took_ms"`
	Error  string    `json:"error,omitempty"`
}

// statsClock is this node's clock offset against Redis' TIME, in
// milliseconds: OffsetMS is Redis' time minus this node's (negative when
// this node's clock is ahead), within half of RoundTripMS, the round trip
// of the reading it comes from (the shortest of the last eight, taken once
// a second), at Time (by this node's clock).
type statsClock struct {
	OffsetMS    float64   `json:"offset_ms"`
	RoundTripMS float64   `json:"round_trip_ms"`
	Time        time.Time `json:"time"`
	// ReadAt is when the latest reading was taken (readings fail while
	// Redis does not answer); Stale says it is older than three
	// readings' interval, or that Redis does not answer now.
	ReadAt time.Time `json:"read_at"`
	Stale  bool      `json:"stale"`
}

// statsFeedStatus tells whether this node's sampled denials reach the
// fleet's denial feed: Dropped counts those left out because the queue to
// Redis was full, Thinned those this node's ring left out under a flood
// (more than feedPerMilli in a millisecond), LastError is the last
// failure to send.
type statsFeedStatus struct {
	Dropped   uint64      `json:"dropped"`
	Thinned   uint64      `json:"thinned"`
	LastError *statsError `json:"last_error,omitempty"`
}

// statsRedisMemory is Redis' memory: used against maxmemory (0: no limit),
// the eviction policy, and the keys evicted since Redis started; summed
// over a Cluster's masters.
type statsRedisMemory struct {
	UsedBytes   int64  `json:"used_bytes"`
	MaxBytes    int64  `json:"max_bytes"`
	Policy      string `json:"policy"`
	EvictedKeys int64  `json:"evicted_keys"`
	// Warning says what is wrong with the policy, if anything.
	Warning string `json:"warning,omitempty"`
	// ReadAt is when Redis said this (read once a minute); Stale says
	// Redis does not answer now (the store is stalled or down).
	ReadAt time.Time `json:"read_at"`
	Stale  bool      `json:"stale"`
}

// statsLatency are store call latency percentiles over the last 60 s, in
// milliseconds (upper bounds of histogram buckets a quarter wide).
type statsLatency struct {
	Calls uint64  `json:"calls"`
	P50   float64 `json:"p50"`
	P90   float64 `json:"p90"`
	P99   float64 `json:"p99"`
	Max   float64 `json:"max"`
}

// statsError is an error message and when it happened.
type statsError struct {
	Message string    `json:"message"`
	Time    time.Time `json:"time"`
}

// statsFleetStatus tells whether this node's reports reach the fleet view.
type statsFleetStatus struct {
	LastReport *time.Time  `json:"last_report,omitempty"`
	LastError  *statsError `json:"last_error,omitempty"`
}

// collectStats gathers the statistics of every zone in scope, and of the
// stores they use (every store with a nil scope), at time now, with series
// seconds of per-second counts.
func collectStats(ctx context.Context, now time.Time, series int, in scope) *statsBody {
	sec := now.Unix()
	out := &statsBody{Node: nodeID, Time: now, Second: sec, Zones: []statsZone{}, Stores: []statsStore{}}

	var zones []*zoneStats
	used := map[*storeStats]bool{}
	zoneRegistry.Range(func(_, v any) bool {
		if z := v.(*zoneStats); in.has(z) {
			zones = append(zones, z)
			used[z.store] = true
		}
		return true
	})
	// By name, then store: zones of one name on several stores are
	// distinct entries (the store's pool key keeps their order steady when
	// their store names are alike too).
	sort.Slice(zones, func(i, j int) bool {
		a, b := zones[i], zones[j]
		if a.name != b.name {
			return a.name < b.name
		}
		if a.store.name != b.store.name {
			return a.store.name < b.store.name
		}
		return a.store.key < b.store.key
	})
	var stores []*storeStats
	storeRegistry.Range(func(_, v any) bool {
		if s := v.(*storeStats); in == nil || used[s] {
			stores = append(stores, s)
		}
		return true
	})
	sort.Slice(stores, func(i, j int) bool { return stores[i].name < stores[j].name })

	fleets := readFleets(now, stores, zones, series)
	for _, z := range zones {
		out.Zones = append(out.Zones, z.document(sec, series, fleets))
	}
	for _, s := range stores {
		out.Stores = append(out.Stores, s.snapshot(sec))
	}
	return out
}

// readFleets reads the fleet's counts: one read per Redis store, for its
// zones, each waited for until the store's timeout after now.
func readFleets(now time.Time, stores []*storeStats, zones []*zoneStats, series int) map[*storeStats]*fleetRead {
	fleets := map[*storeStats]*fleetRead{}
	for _, s := range stores {
		if s.fleet == nil {
			continue
		}
		var names []string
		for _, z := range zones {
			if z.store == s {
				names = append(names, z.name)
			}
		}
		if len(names) == 0 {
			continue
		}
		fleets[s] = &fleetRead{s.fleet.read(names, max(series, 60), s.readDeadline(now))}
	}
	return fleets
}

// document reports the zone at unix second sec, with series seconds of
// per-second counts and its part of the fleet's counts.
func (z *zoneStats) document(sec int64, series int, fleets map[*storeStats]*fleetRead) statsZone {
	last := sec - 1 // the last whole second
	info := z.info.Load()
	zj := statsZone{
		Name:            z.name,
		Totals:          countsOf(z.loadTotals()),
		DenyCacheHits:   z.hits.Load(),
		Exempt:          z.exempt.Load(),
		NearLimit:       z.nearLimit.Load(),
		Evictions:       info.evictions(),
		Refunds:         z.refunds.Load(),
		RefundsDropped:  z.refundsDropped.Load(),
		Settlements:     z.settlements.Load(),
		SettlementsLost: z.settlementsLost.Load(),
		Rates: statsWindows{
			One:   ratesOf(z.ring.sum(last, 1), 1),
			Ten:   ratesOf(z.ring.sum(last, 10), 10),
			Sixty: ratesOf(z.ring.sum(last, 60), 60),
		},
	}
	if info != nil {
		zj.Algorithm, zj.Rate, zj.Per, zj.Burst, zj.OnError = info.alg, info.rate, info.per.String(), info.burst, info.onError
		if info.prefetch != nil {
			ps := info.prefetch()
			zj.Prefetch = &ps
		}
		if info.queue != nil {
			waiting, away := info.queue()
			zj.Queue = &statsQueue{MaxDelay: info.maxDelay.String(), MaxWaiting: info.maxWait, Waiting: waiting, TurnedAway: away}
		}
		zj.SoftShed = z.softShedDocument(info)
	}
	store := z.store
	zj.Store = store.name
	items, since := z.top.top(sec, topReport)
	hashed := info == nil || !info.logKey
	zj.TopDenied = statsTop{Since: since, Hashed: hashed, Keys: make([]statsTopKey, 0, len(items))}
	for _, it := range items {
		key := it.key
		if hashed {
			key = digestOf(info, key)
		}
		zj.TopDenied.Keys = append(zj.TopDenied.Keys, statsTopKey{Key: key, Denied: it.count, Error: it.over})
	}
	nets, since := z.nets.top(sec, topReport)
	zj.TopNetworks = statsTopNetworks{Since: since, Networks: make([]statsTopNetwork, 0, len(nets))}
	for _, it := range nets {
		if n := networkOfKey(it.key); n != "" {
			zj.TopNetworks.Networks = append(zj.TopNetworks.Networks, statsTopNetwork{Network: n, Denied: it.count, Error: it.over})
		}
	}
	if series > 0 {
		zj.Series = &statsSeries{End: last, Allowed: make([]uint64, series), Denied: make([]uint64, series)}
		for i := range series {
			c := z.ring.get(last - int64(series-1-i))
			zj.Series.Allowed[i], zj.Series.Denied[i] = passed(c), rejected(c)
		}
	}
	if fr := fleets[store]; fr != nil {
		zj.Fleet = fr.zone(z.name, series)
	}
	return zj
}

func passed(c [limiter.NumOutcomes]uint64) uint64 {
	return c[limiter.Allowed] + c[limiter.LocalAllowed] + c[limiter.FailedOpen] + c[limiter.DryRunDenied]
}

func rejected(c [limiter.NumOutcomes]uint64) uint64 {
	return c[limiter.Denied] + c[limiter.LocalDenied] + c[limiter.FailedClosed] + c[limiter.Banned]
}

// fleetRead is a read of a Redis store's fleet counts, for its zones.
type fleetRead struct{ reading[*FleetView] }

// zone returns one zone's part of a fleet read.
func (fr *fleetRead) zone(name string, series int) *statsFleet {
	if !fr.ok {
		return &statsFleet{Nodes: []string{}, Error: redisError(fr.err)}
	}
	at := fr.at
	fj := &statsFleet{Nodes: []string{}, Stale: fr.stale, ReadAt: &at}
	if fr.err != nil {
		fj.Error = redisError(fr.err)
	}
	fz := fr.val.Zones[name]
	if fz == nil {
		return fj
	}
	secs := fz.Seconds
	sum := func(n int) (c [limiter.NumOutcomes]uint64) {
		for _, s := range secs[max(0, len(secs)-n):] {
			for o, v := range s {
				c[o] += uint64(max(v, 0))
			}
		}
		return c
	}
	if fz.Nodes != nil {
		fj.Nodes = fz.Nodes
	}
	fj.Rates = statsWindows{One: ratesOf(sum(1), 1), Ten: ratesOf(sum(10), 10), Sixty: ratesOf(sum(60), 60)}
	fj.WindowSeconds = len(secs)
	fj.Totals = countsOf(sum(len(secs)))
	n := min(series, len(secs))
	if series > 0 {
		fj.Series = &statsSeries{End: fr.val.End, Allowed: make([]uint64, series), Denied: make([]uint64, series)}
		off := series - n
		for i, s := range secs[len(secs)-n:] {
			var c [limiter.NumOutcomes]uint64
			for o, v := range s {
				c[o] = uint64(max(v, 0))
			}
			fj.Series.Allowed[off+i], fj.Series.Denied[off+i] = passed(c), rejected(c)
		}
	}
	return fj
}

// probeFresh is how long an idle probe's outcome tells the store's status:
// while idle a probe follows about every second; under traffic none does,
// and the decisions' own errors tell.
const probeFresh = 3 * time.Second

// ms is d in milliseconds.
func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// snapshot reports the store's health at unix second now.
func (s *storeStats) snapshot(now int64) statsStore {
	sj := statsStore{Name: s.name, Kind: "memory", Status: "ok", Errors: map[string]uint64{}}
	for r, name := range reasonNames {
		sj.Errors[name] = s.errs[r].Load()
	}
	if s.redis == nil {
		if s.memory != nil {
			sj.Keys, sj.MaxKeys = s.memory.Len(), s.memory.MaxKeys()
		}
		return sj
	}
	sj.Kind = "redis"
	recent := s.lat.summary(now, 10)
	sj.CallsPerSecond = float64(recent.calls) / 10
	sj.ErrorsPerSecond = float64(recent.errors) / 10
	state := s.redis.Breaker().State()
	sj.Breaker = state.String()
	probe, probed := s.redis.LastProbe()
	probed = probed && time.Since(probe.At) < probeFresh
	switch {
	case state != limiter.BreakerClosed:
		sj.Status = "down"
	case probed && errors.Is(probe.Err, limiter.ErrStoreTimeout):
		sj.Status = "stalled"
	case probed && probe.Err != nil:
		sj.Status = "down"
	case recent.errors > 0:
		sj.Status = "degraded"
	}
	away := sj.Status == "down" || sj.Status == "stalled"
	if probed {
		sj.Probe = &statsProbe{Time: probe.At, TookMS: ms(probe.Took)}
		if probe.Err != nil {
			sj.Probe.Error = probe.Err.Error()
		}
	}
	if m, ok := s.redis.Memory(); ok {
		sj.Memory = redisMemoryOf(m)
		sj.Memory.Stale = away
	}
	minute := s.lat.summary(now, latencySeconds)
	lat := &statsLatency{Calls: minute.calls, P50: ms(minute.quantile(.5)), P90: ms(minute.quantile(.9)), P99: ms(minute.quantile(.99))}
	for i := latBuckets - 1; i >= 0; i-- {
		if minute.buckets[i] > 0 {
			lat.Max = ms(latUpper(i))
			break
		}
	}
	sj.Latency = lat
	if e := s.last.Load(); e != nil {
		sj.LastError = &statsError{Message: e.msg, Time: e.at}
	}
	if probed && probe.Err != nil && (sj.LastError == nil || probe.At.After(sj.LastError.Time)) {
		sj.LastError = &statsError{Message: probe.Err.Error(), Time: probe.At}
	}
	if f := s.fleet; f != nil {
		st := &statsFleetStatus{}
		if ns := f.lastOK.Load(); ns != 0 {
			t := time.Unix(0, ns)
			st.LastReport = &t
		}
		if e := f.lastErr.Load(); e != nil && (st.LastReport == nil || e.at.After(*st.LastReport)) {
			st.LastError = &statsError{Message: e.msg, Time: e.at}
		}
		sj.Fleet = st
	}
	if c, ok := s.clock.offset(); ok {
		sj.Clock = &statsClock{OffsetMS: ms(c.Offset), RoundTripMS: ms(c.RoundTrip), Time: c.At}
		sj.Clock.ReadAt = s.clock.latest()
		sj.Clock.Stale = away || time.Since(sj.Clock.ReadAt) > 3*ClockInterval
	}
	if w := s.writer; w != nil {
		sj.Feed = &statsFeedStatus{Dropped: s.feed.dropped.Load(), Thinned: s.feed.thinned.Load()}
		if e := w.lastErr.Load(); e != nil {
			sj.Feed.LastError = &statsError{Message: e.msg, Time: e.at}
		}
	}
	return sj
}

// redisMemoryOf reports Redis' memory, with a warning for a policy that lets
// buckets fill Redis to OOM or evicts without regard to their TTLs.
func redisMemoryOf(m limiter.RedisMemory) *statsRedisMemory {
	out := &statsRedisMemory{UsedBytes: m.UsedMemory, MaxBytes: m.MaxMemory, EvictedKeys: m.EvictedKeys, ReadAt: m.ReadAt}
	for _, srv := range m.Servers {
		if out.Policy == "" || out.Policy == srv.Policy {
			out.Policy = srv.Policy
		} else {
			out.Policy = "mixed"
		}
	}
	switch {
	case out.MaxBytes == 0:
		out.Warning = "no maxmemory: Redis grows until the system runs out of memory; set maxmemory and maxmemory-policy volatile-ttl"
	case out.Policy == "noeviction":
		out.Warning = "noeviction: a flood of new keys fills Redis, then every decision fails (OOM); set maxmemory-policy volatile-ttl"
	case strings.HasPrefix(out.Policy, "allkeys-"):
		out.Warning = out.Policy + " evicts without regard to the buckets' TTLs; volatile-ttl evicts the buckets closest to full"
	}
	return out
}

// digestOf returns a key's digest under the secret of the handler that
// holds the zone's stats (the zero Digester's if none does).
func digestOf(info *zoneInfo, key string) string {
	var d limiter.Digester
	if info != nil {
		d = info.digest
	}
	return d.Digest(key)
}
