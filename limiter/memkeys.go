package limiter

import (
	"context"
	"time"
)

// A key looked up and reset in the memory store (KeyKeeper).

// Peek implements KeyKeeper: the key's state under each rule, by the
// store's clock, without charging anything or trimming any log.
func (s *MemoryStore) Peek(_ context.Context, rules []*Rule, key string) ([]KeyState, error) {
	out := make([]KeyState, len(rules))
	for i, r := range rules {
		id := s.hash.id(r.bucket, key)
		sh := &s.shards[id.shard()]
		sh.mu.Lock()
		now := s.now()
		var v verdict
		if r.alg == SlidingLog {
			var log []logEntry
			if lb := sh.logs[id]; lb != nil {
				log = lb.entries
			}
			v, _ = r.logCheck(log, now, 0, 0) // reslices: the log stays
		} else {
			e, _ := sh.m.get(id)
			if e.expires <= now {
				e.state = 0
			}
			v = r.check(e.state, now, 0, 0)
		}
		st := keyState(r, v, now)
		if b, ok := sh.bans[id]; ok && r.ban.enabled() {
			if b.banEnd > now {
				st.BanLeft, st.BanDenials = us(b.banEnd-now), b.banDenials
			}
			if b.countEnd > now {
				st.Denials = b.denials
			}
		}
		sh.mu.Unlock()
		out[i] = st
	}
	return out, nil
}

// keyState is the state a verdict of cost 0 reads, at store microsecond
// now (the ban aside).
func keyState(r *Rule, v verdict, now int64) KeyState {
	res := r.algResult(v, false, 0)
	return KeyState{Rule: r, At: time.UnixMicro(now).UTC(), Remaining: max(0, res.Remaining),
		ResetAfter: res.ResetAfter, Slots: v.slots}
}

// ResetKey implements KeyKeeper: it deletes the key's buckets of rules in
// this process and makes the store's limiters forget them.
func (s *MemoryStore) ResetKey(_ context.Context, rules []*Rule, key string) (int, error) {
	buckets := resetBuckets(rules)
	n := s.resetBuckets(buckets, key)
	s.lims.forget(buckets, key)
	return n, nil
}

// resetBuckets deletes the key's buckets named buckets, and returns how
// many held something that still counted.
func (s *MemoryStore) resetBuckets(buckets []string, key string) int {
	n := 0
	for _, b := range buckets {
		id := s.hash.id(b, key)
		sh := &s.shards[id.shard()]
		sh.mu.Lock()
		now := s.now()
		if e, ok := sh.m.get(id); ok {
			if e.expires > now {
				n++
			}
			sh.m.remove(id)
		}
		if lb, ok := sh.logs[id]; ok {
			if lb.expires > now {
				n++
			}
			delete(sh.logs, id)
		}
		sh.mu.Unlock()
	}
	return n
}

// limiters implements limiterHolder.
func (s *MemoryStore) limiters() *limiterSet { return &s.lims }
