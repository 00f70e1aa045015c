package limiter

// A deny cache and a key reset (keys.go). A reset makes the key's bucket
// full again in the store: the cache forgets the key's denial and the last
// state it heard of the bucket (the local fallback would start from it).
// A decision sent before the reset may come back after it, with the state
// of the bucket that was deleted: the cache remembers, per bucket, when it
// heard of the reset, and learns nothing from a decision sent before.
// What it remembers is bounded like the rest of the shard, and forgotten
// after resetsKeep (far longer than any decision waits).

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
