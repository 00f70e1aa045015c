package limiter

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"
)

// The deny cache, a decision's second layer (Limiter.decideCached): denials
// the store has shown, answered on this node, and the last state the store told
// of each bucket.

// defaultDenyCacheSize is how many buckets a deny cache remembers unless
// told otherwise.
const defaultDenyCacheSize = 1 << 16

// DenyCache lets one node deny, without asking the shared store, requests
// that the store has already shown cannot pass yet.
//
// When the store denies a request (or admits one that leaves too few tokens
// for another like it), it reports how much the bucket owes. The cache keeps
// that as the bucket's state in this node's monotonic clock, counted from
// the moment the request was sent, which is no later than the moment the
// store decided: so the cached state is never fuller than the real bucket.
// Other nodes can only empty the real bucket further, never refill it. A
// request that the cached state denies is therefore denied by the store
// too, and the cache is exact: a key denied until T stays denied until T,
// and is asked about again from T on.
//
// When a cached bucket may have a token again, only one request per bucket
// goes to the store at a time; concurrent requests for the same bucket wait
// for its answer (which usually empties the bucket again) and then decide
// against the cache anew. A flood on one denied key costs each node about
// one store call per refill interval.
//
// Memory is bounded: each shard holds at most its share of the size, and
// makes room by dropping buckets that are full, then arbitrary ones (a
// dropped bucket only costs a store call). A cache belongs to one
// configuration: a new configuration starts with an empty one.
type DenyCache struct {
	hash     hasher
	perShard int
	clock    Clock
	base     time.Time // the clock's reading when the cache was made
	shards   [numShards]denyShard

	hits    atomic.Uint64
	learned atomic.Uint64
	// quotas reports that a shard holds quota counts (quotaSeen).
	quotas atomic.Bool
}

type denyShard struct {
	mu     sync.Mutex
	m      map[bucketID]State
	bans   map[bucketID]int64         // banned buckets: when the ban ends (cache microseconds)
	flight map[bucketID]chan struct{} // store calls in progress for cached buckets
	last   map[bucketID]State         // every bucket's last state the store told (keepLast)
	quotas map[bucketID]quotaSeen     // every quota's last count the store told (rememberQuota); nil until one
	resets map[bucketID]int64         // buckets reset lately: when (forgetReset); nil until one is
	_      [16]byte
}

// probe records the buckets whose store call a request has claimed.
type probe struct {
	n   int
	ids [8]bucketID
}

// DenyCacheOptions configures a DenyCache.
type DenyCacheOptions struct {
	// Size is the most buckets the cache holds (denied ones; and apart,
	// the last state the store told of each bucket, for the local
	// fallback: see LastFullAt). Default 65536.
	Size int
	// Clock is the cache's time, of which it uses only the time elapsed
	// since the cache was made (Now().Sub): with the system clock, the
	// monotonic reading. Default: the system clock.
	Clock Clock
}

// NewDenyCache returns an empty cache.
func NewDenyCache(opt DenyCacheOptions) *DenyCache {
	size := opt.Size
	if size <= 0 {
		size = defaultDenyCacheSize
	}
	clock := clockOr(opt.Clock)
	c := &DenyCache{hash: newHasher(), perShard: max(1, size/numShards), clock: clock, base: clock.Now()}
	for i := range c.shards {
		c.shards[i].m = make(map[bucketID]State)
		c.shards[i].bans = make(map[bucketID]int64)
		c.shards[i].flight = make(map[bucketID]chan struct{})
		c.shards[i].last = make(map[bucketID]State)
	}
	return c
}

// Hits returns how many requests the cache denied without the store.
func (c *DenyCache) Hits() uint64 { return c.hits.Load() }

// Len returns how many buckets the cache holds.
func (c *DenyCache) Len() int {
	n := 0
	for i := range c.shards {
		sh := &c.shards[i]
		sh.mu.Lock()
		n += len(sh.m) + len(sh.bans)
		sh.mu.Unlock()
	}
	return n
}

// now returns the microseconds elapsed since the cache was made, on its
// clock (monotonic, with the system clock).
func (c *DenyCache) now() int64 {
	return int64(c.clock.Now().Sub(c.base) / time.Microsecond)
}

// decideCached is a decision's second layer: it denies, without the store,
// what the deny cache (if any) shows cannot pass yet, and asks the outage
// fallback's layer (decideStore) about the rest, learning its answer.
func (l *Limiter) decideCached(ctx context.Context, reqs []Request, results []Result) Outcome {
	if l.cache == nil {
		return l.decideStore(ctx, reqs, results)
	}
	var p probe
	for {
		denied, wait := l.cache.check(reqs, results, &p)
		if denied {
			l.observeCacheHit(reqs, results)
			return Denied
		}
		if wait == nil {
			break
		}
		// Another request is asking the store about one of these
		// buckets; its answer may settle this one too.
		select {
		case <-wait:
		case <-ctx.Done():
			l.cache.land(&p)
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				// The deadline came before the store's answer: a
				// timeout, which each zone's policy answers.
				return l.fail(ctx, reqs, results, ErrStoreTimeout)
			}
			return Canceled
		}
	}
	sent := l.cache.now()
	out := l.decideStore(ctx, reqs, results)
	if out == Allowed || out == Denied {
		l.cache.learn(reqs, results, sent, out == Allowed)
	}
	l.cache.land(&p)
	return out
}

// check decides the request from the cache when it can. It returns denied
// (with results filled: the denying zone's from its cached state, the
// others Unknown) when a cached bucket cannot pass the request. Otherwise
// it returns a channel to wait on when another request is asking the store
// about one of the cached buckets, or nil when this request may ask the
// store, having claimed, in p, the cached buckets it asks about.
func (c *DenyCache) check(reqs []Request, results []Result, p *probe) (bool, <-chan struct{}) {
	now := c.now()
	for i := range reqs {
		r := reqs[i].Rule
		if r.ban.enabled() && !r.dryRun {
			if left := c.banLeft(r, reqs[i].Key, now); left > 0 {
				c.land(p)
				for j := range results {
					results[j] = Result{Allowed: true, Unknown: true}
				}
				results[i] = Result{Banned: true, RetryAfter: us(left), ResetAfter: us(left)}
				c.hits.Add(1)
				return true, nil
			}
		}
		if !r.cacheable() {
			continue
		}
		id := c.hash.id(r.bucket, reqs[i].Key)
		sh := &c.shards[id.shard()]
		sh.mu.Lock()
		st, ok := sh.m[id]
		if !ok {
			sh.mu.Unlock()
			continue
		}
		if st.fullAt() <= now {
			delete(sh.m, id)
			sh.mu.Unlock()
			continue
		}
		v := r.check(st, now, reqs[i].Cost, r.reserveUnits(reqs[i].Reserve))
		if !v.ok {
			sh.mu.Unlock()
			c.land(p)
			for j := range results {
				results[j] = Result{Allowed: true, Unknown: true}
			}
			results[i] = r.result(v, false, reqs[i].Cost)
			c.hits.Add(1)
			return true, nil
		}
		if wait, busy := sh.flight[id]; busy {
			sh.mu.Unlock()
			c.land(p)
			return false, wait
		}
		if p.n < len(p.ids) {
			sh.flight[id] = make(chan struct{})
			p.ids[p.n] = id
			p.n++
		}
		sh.mu.Unlock()
	}
	return false, nil
}

// land ends the store calls claimed in p, waking the requests waiting
// for them.
func (c *DenyCache) land(p *probe) {
	for _, id := range p.ids[:p.n] {
		sh := &c.shards[id.shard()]
		sh.mu.Lock()
		if ch, ok := sh.flight[id]; ok {
			close(ch)
			delete(sh.flight, id)
		}
		sh.mu.Unlock()
	}
	p.n = 0
}

// learn records what the store answered for a request sent at monotonic
// microsecond sent: every zone that denied it, and, when it was admitted,
// every zone left with fewer tokens than it cost.
//
// A bucket already in the cache is updated by every answer about it, so
// that its cached state stays as close to the store's as the network
// allows.
func (c *DenyCache) learn(reqs []Request, results []Result, sent int64, admitted bool) {
	for i := range reqs {
		res := &results[i]
		if res.Banned && !res.DryRun {
			c.learnBan(reqs[i].Rule, reqs[i].Key, sent+int64(res.RetryAfter/time.Microsecond))
			continue
		}
		r := reqs[i].Rule
		cacheable, remembered := r.cacheable(), r.remembered()
		if res.Unknown || (!cacheable && !remembered) {
			continue
		}
		if r.alg == Quota { // remembered: a count, not a time
			c.rememberQuota(r, reqs[i].Key, res, sent)
			continue
		}
		worth := (admitted && res.Remaining < reqs[i].Cost) || (!admitted && !res.Allowed)
		st := r.stateAt(sent, res.owed)
		id := c.hash.id(r.bucket, reqs[i].Key)
		sh := &c.shards[id.shard()]
		sh.mu.Lock()
		if sh.resetAfter(id, sent) { // the answer is of a bucket since deleted
			sh.mu.Unlock()
			continue
		}
		if remembered {
			sh.keepLast(id, st, c.perShard)
		}
		old, ok := sh.m[id]
		switch {
		case !cacheable:
		case ok && old < st:
			sh.m[id] = st
		case !ok && worth:
			if len(sh.m) >= c.perShard {
				sh.evict(sent, c.perShard)
			}
			sh.m[id] = st
			c.learned.Add(1)
		}
		sh.mu.Unlock()
	}
}

// banLeft returns how many microseconds the cached ban of the key in rule's
// zone has left at now (0: none).
func (c *DenyCache) banLeft(r *Rule, key string, now int64) int64 {
	id := c.hash.id(r.bucket, key)
	sh := &c.shards[id.shard()]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	end, ok := sh.bans[id]
	if !ok {
		return 0
	}
	if end <= now {
		delete(sh.bans, id)
		return 0
	}
	return end - now
}

// learnBan records that the key is banned in rule's zone until end (cache
// microseconds). The store reported the time the ban had left when it
// decided, which is no earlier than when the request was sent: counted
// from the sending, the cached ban ends no later than the real one.
func (c *DenyCache) learnBan(r *Rule, key string, end int64) {
	c.learnBanIn(r.bucket, key, end)
}

// learnBanIn is learnBan for the zone whose buckets are named bucket.
func (c *DenyCache) learnBanIn(bucket, key string, end int64) {
	c.learnBanID(c.hash.id(bucket, key), end)
}

// learnBanID is learnBan for the bucket whose id is id.
func (c *DenyCache) learnBanID(id bucketID, end int64) {
	sh := &c.shards[id.shard()]
	sh.mu.Lock()
	for id := range sh.bans { // make room: any ban (the store still has it)
		if len(sh.bans) < c.perShard {
			break
		}
		delete(sh.bans, id)
	}
	sh.bans[id] = end
	sh.mu.Unlock()
	c.learned.Add(1)
}

// inheritBans makes c, before its first decision, name buckets as o does
// (so that every cache of a store shares one hasher: see cacheSet.add) and
// learn the bans o holds, each ending when it ends in o.
func (c *DenyCache) inheritBans(o *DenyCache) {
	c.hash = o.hash
	type ban struct {
		id   bucketID
		left int64
	}
	var bans []ban
	onow := o.now()
	for i := range o.shards {
		sh := &o.shards[i]
		sh.mu.Lock()
		for id, end := range sh.bans {
			if end > onow {
				bans = append(bans, ban{id, end - onow})
			}
		}
		sh.mu.Unlock()
	}
	now := c.now()
	for _, b := range bans {
		c.learnBanID(b.id, now+b.left)
	}
}

// Forget drops what the cache holds about the key in the zone whose
// buckets are named bucket (Rule.Bucket()): its ban and its cached
// denial, for a ban lifted by an operator.
func (c *DenyCache) Forget(bucket, key string) {
	id := c.hash.id(bucket, key)
	sh := &c.shards[id.shard()]
	sh.mu.Lock()
	delete(sh.bans, id)
	delete(sh.m, id)
	sh.mu.Unlock()
}

// evict makes room in a shard holding limit buckets: full buckets go
// first, then arbitrary ones (map order is random) until one slot is free.
func (sh *denyShard) evict(now int64, limit int) {
	for id, st := range sh.m {
		if st.fullAt() <= now {
			delete(sh.m, id)
		}
	}
	for id := range sh.m {
		if len(sh.m) < limit {
			break
		}
		delete(sh.m, id)
	}
}

// remembered reports whether the deny cache keeps the rule's buckets' last
// states: token and leaky buckets that are enforced, in zones whose
// failure policy is local (for the local fallback), and enforced quotas
// (for the fallback, and to seed an empty Redis). A bucket zone that fails
// open or closed never reads them, so it does not pay for them (with many
// keys a map write, and an eviction once the cache is full, per decision).
func (r *Rule) remembered() bool {
	switch {
	case r.dryRun:
		return false
	case r.alg == Quota:
		return true
	}
	return (r.alg == TokenBucket || r.alg == LeakyBucket) && r.onError == PolicyLocal
}

// quotaSeen is the count Redis last gave a quota key: in the period that
// starts at microsecond start (a calendar instant, whoever's clock read
// it), under rule.
type quotaSeen struct {
	rule         *Rule
	key          string
	count, start int64
}

// rememberQuota records the count of a quota key that the store gave in
// res, for a decision sent at sent (cache microseconds), unless the key
// was reset since. Its period starts at the instant the result tells
// (the store's time, plus the time to the period's end, less its length).
// Within a period it keeps the highest count heard: concurrent decisions
// may come back in any order.
func (c *DenyCache) rememberQuota(r *Rule, key string, res *Result, sent int64) {
	q := quotaSeen{rule: r, key: key, count: res.owed,
		start: res.at + int64(res.ResetAfter/time.Microsecond) - int64(res.Period/time.Microsecond)}
	id := c.hash.id(r.bucket, key)
	sh := &c.shards[id.shard()]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if sh.resetAfter(id, sent) {
		return
	}
	if sh.quotas == nil {
		sh.quotas = make(map[bucketID]quotaSeen)
		c.quotas.Store(true)
	}
	old, ok := sh.quotas[id]
	if ok && old.start == q.start && old.count > q.count {
		q.count = old.count
	}
	if !ok && len(sh.quotas) >= c.perShard {
		for old := range sh.quotas { // map order is random
			delete(sh.quotas, old)
			if len(sh.quotas) < c.perShard {
				break
			}
		}
	}
	sh.quotas[id] = q
}

// lastQuota returns the count Redis last gave the key under rule's quota
// in the period that starts at microsecond start, and false when the
// cache knows none of that period.
func (c *DenyCache) lastQuota(r *Rule, key string, start int64) (int64, bool) {
	id := c.hash.id(r.bucket, key)
	sh := &c.shards[id.shard()]
	sh.mu.Lock()
	q, ok := sh.quotas[id]
	sh.mu.Unlock()
	if !ok || q.start != start {
		return 0, false
	}
	return q.count, true
}

// quotasSeen returns the quota keys the cache holds a count of, dropping
// those whose period has ended by microsecond now.
func (c *DenyCache) quotasSeen(now int64) []quotaSeen {
	if !c.quotas.Load() {
		return nil
	}
	var out []quotaSeen
	for i := range c.shards {
		sh := &c.shards[i]
		sh.mu.Lock()
		for id, q := range sh.quotas {
			if start, _ := q.rule.periodAt(now); start != q.start {
				delete(sh.quotas, id)
				continue
			}
			out = append(out, q)
		}
		sh.mu.Unlock()
	}
	return out
}

// keepLast records a bucket's last state, making room first when the
// shard holds limit of them (the ones already full, then any).
func (sh *denyShard) keepLast(id bucketID, st State, limit int) {
	if _, ok := sh.last[id]; !ok && len(sh.last) >= limit {
		for old := range sh.last { // map order is random
			delete(sh.last, old)
			if len(sh.last) < limit {
				break
			}
		}
	}
	sh.last[id] = st
}

// lastOwed returns how long, in microseconds from now, the bucket of the
// key in rule's zone was to take to be full again by the last state the
// store told of it, and false when the cache knows none (never seen, or
// dropped). A full bucket owes 0.
func (c *DenyCache) lastOwed(r *Rule, key string) (int64, bool) {
	id := c.hash.id(r.bucket, key)
	sh := &c.shards[id.shard()]
	sh.mu.Lock()
	st, ok := sh.last[id]
	sh.mu.Unlock()
	if !ok {
		return 0, false
	}
	return max(0, st.fullAt()-c.now()), true
}

// forgetReset drops what the cache holds of the key in the zone whose
// buckets are named bucket (its denial and its last state, not its ban),
// and ignores the answers to decisions sent before now.
func (c *DenyCache) forgetReset(bucket, key string) {
	id := c.hash.id(bucket, key)
	sh := &c.shards[id.shard()]
	now := c.now()
	keep := resetsKeep.Microseconds()
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if sh.resets == nil {
		sh.resets = make(map[bucketID]int64)
	}
	for old, at := range sh.resets {
		if len(sh.resets) < c.perShard && at > now-keep {
			break
		}
		delete(sh.resets, old)
	}
	sh.resets[id] = now
	delete(sh.m, id)
	delete(sh.last, id)
	delete(sh.quotas, id)
}

// resetAfter reports whether the bucket id was reset at or after sent
// (cache microseconds): an answer to a decision sent then describes the
// bucket the reset deleted. The shard is locked.
func (sh *denyShard) resetAfter(id bucketID, sent int64) bool {
	if len(sh.resets) == 0 {
		return false
	}
	at, ok := sh.resets[id]
	return ok && at >= sent
}
