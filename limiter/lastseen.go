package limiter

import "time"

// What Redis last said of each bucket. When the store cannot decide and a
// zone falls back to this node's local bucket, the bucket should start
// where the shared one was, not full: a key that had just drained its
// bucket would otherwise get the local burst at once on every node. The
// deny cache already learns every answer the store gives (learn), so it
// keeps, beside its denied buckets, the last state of every token and
// leaky bucket it heard of: one map write under the lock learn holds
// anyway. It is bounded like the denied buckets (DenyCacheOptions.Size
// per kind); a bucket dropped is one that starts at burst / fleet size
// on a fallback, as a bucket never seen does.

//
// Quotas alike: the cache keeps the count Redis last gave each quota key
// (its period's, with the key and the rule, in quotas), from which the
// key's local quota starts on a fallback, and which the outage's ledger
// sends Redis when it returns, so that a Redis that restarted empty
// counts the key from the highest count any node heard, not from zero
// (outage.go): whatever the zone's failure policy, since the count is
// what its customer is billed by.

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
	if sh.resetAfter(id, sent) { // cachereset.go
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
