package limiter

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

// remembered reports whether the deny cache keeps the rule's buckets' last
// states for the local fallback: token and leaky buckets that are
// enforced, in zones whose failure policy is local. A zone that fails open
// or closed never reads them, so it does not pay for them (with many keys
// a map write, and an eviction once the cache is full, per decision).
func (r *Rule) remembered() bool {
	return (r.alg == TokenBucket || r.alg == LeakyBucket) && !r.dryRun && r.onError == PolicyLocal
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
