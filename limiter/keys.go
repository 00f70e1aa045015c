package limiter

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"time"
	"weak"
)

// A client key looked up and reset by an operator (Limiter.Peek,
// Limiter.ResetKey), on every node's limiters.

// ErrNoKeyKeeper is the error of a key lookup or reset on a store that
// cannot look keys up (neither a RedisStore nor a MemoryStore).
var ErrNoKeyKeeper = errors.New("the rate limit store cannot look up or reset keys")

// KeyState is what one rule's bucket holds for a client key, as a request
// of cost 0 would find it: nothing is charged to read it.
type KeyState struct {
	// Rule is the rule the state is read under (a zone with tiers has
	// one per tier: the same bucket, read under each tier's limit).
	Rule *Rule
	// At is the store's time of the reading (Redis TIME, or the memory
	// store's clock).
	At time.Time
	// Remaining is how many tokens the bucket holds (the windows: how
	// many requests the window still admits; concurrency: free slots).
	Remaining int64
	// ResetAfter is how long until the bucket is full again (the
	// windows: until what they count now no longer counts; 0: full).
	ResetAfter time.Duration
	// Slots is, for a concurrency zone, how many slots are held.
	Slots int64
	// BanLeft is how long the key's ban in the zone has left (0: none),
	// and BanDenials the denials that started it.
	BanLeft    time.Duration
	BanDenials int64
	// Denials is how many denials count towards the key's next ban.
	Denials int64
}

// KeyKeeper is a store that can show a client key's state in a zone
// without charging it, and reset it: RedisStore (the fleet's) and
// MemoryStore (this process's).
type KeyKeeper interface {
	// Peek returns the state of key under each of rules (the rules of
	// one zone: its own, or one per tier), in order.
	Peek(ctx context.Context, rules []*Rule, key string) ([]KeyState, error)
	// ResetKey makes the key's buckets of rules (one zone's) full again,
	// and every limiter of the store forget what it holds of the key in
	// them (with Redis, on every node). It returns how many buckets held
	// something (0: the key was full already).
	ResetKey(ctx context.Context, rules []*Rule, key string) (int, error)
}

// resetBuckets returns the names of the buckets a reset of rules' zone
// empties: each rule's bucket, but a concurrency zone's slots, and its
// local fallback bucket, each once.
func resetBuckets(rules []*Rule) []string {
	var out []string
	for _, r := range rules {
		if r.alg != Concurrency && !slices.Contains(out, r.bucket) {
			out = append(out, r.bucket)
		}
		if l := r.LocalBucket(); l != "" && r.alg != Concurrency && !slices.Contains(out, l) {
			out = append(out, l)
		}
	}
	return out
}

// limiterSet is the set of limiters deciding through one store, told of
// keys reset. It holds them weakly, as cacheSet holds deny caches: a
// limiter whose configuration was unloaded leaves it once collected.
type limiterSet struct {
	mu   sync.Mutex
	list []weak.Pointer[Limiter]
}

// add puts l in the set, and drops the limiters collected since.
func (s *limiterSet) add(l *Limiter) {
	s.mu.Lock()
	defer s.mu.Unlock()
	kept := s.list[:0]
	for _, p := range s.list {
		if v := p.Value(); v != nil && v != l {
			kept = append(kept, p)
		}
	}
	clear(s.list[len(kept):])
	s.list = append(kept, weak.Make(l))
}

// forget makes every limiter of the set forget the key in buckets.
func (s *limiterSet) forget(buckets []string, key string) {
	s.mu.Lock()
	live := make([]*Limiter, 0, len(s.list))
	for _, p := range s.list {
		if v := p.Value(); v != nil {
			live = append(live, v)
		}
	}
	s.mu.Unlock()
	for _, l := range live {
		l.forgetKey(buckets, key)
	}
}

// limiterHolder is a store that tells its limiters of keys reset.
type limiterHolder interface {
	limiters() *limiterSet
}

// watchResets adds the limiter to those its store tells of keys reset.
func (l *Limiter) watchResets() {
	if h, ok := l.store.(limiterHolder); ok {
		h.limiters().add(l)
	}
}

// forgetKey forgets what the limiter holds of key in buckets, which a reset
// made full again: its deny cache's denial and last state, its spares
// (dropped, not refunded: the bucket that was charged for them is gone),
// its quotas' seeds and its local fallback buckets. A decision sent before
// the reset that comes back after it teaches neither the cache nor the
// spares.
func (l *Limiter) forgetKey(buckets []string, key string) {
	l.resets.note(buckets, key)
	l.out.forget(buckets, key) // a quota's seed
	for _, b := range buckets {
		if l.cache != nil {
			l.cache.forgetReset(b, key)
		}
		if sp := l.spares.Load(); sp != nil {
			sp.drop(spareKey{b, key})
		}
	}
	if m, ok := l.local.(*MemoryStore); ok {
		m.resetBuckets(buckets, key)
	}
}

// Peek returns the state of key under rules; see KeyKeeper.Peek.
func (l *Limiter) Peek(ctx context.Context, rules []*Rule, key string) ([]KeyState, error) {
	k, ok := l.store.(KeyKeeper)
	if !ok {
		return nil, ErrNoKeyKeeper
	}
	return k.Peek(ctx, rules, key)
}

// ResetKey resets key in rules' zone; see KeyKeeper.ResetKey. The limiter
// forgets the key even when the store fails.
func (l *Limiter) ResetKey(ctx context.Context, rules []*Rule, key string) (int, error) {
	defer l.forgetKey(resetBuckets(rules), key)
	k, ok := l.store.(KeyKeeper)
	if !ok {
		return 0, ErrNoKeyKeeper
	}
	return k.ResetKey(ctx, rules, key)
}

// keyResets remembers the keys a limiter was told were reset lately, so
// that the spares of a decision sent before a reset and answered after it
// are not kept. gen counts the resets: a decision reads it when it starts,
// and only a decision during which it moved looks a key up.
type keyResets struct {
	gen atomic.Uint64
	mu  sync.Mutex
	m   map[spareKey]resetMark
}

// resetMark is when a key was reset: the generation it started, and this
// node's time, to forget it later.
type resetMark struct {
	gen uint64
	at  time.Time
}

// resetsKeep is how long a limiter remembers a reset: far longer than any
// decision can wait (twice a Redis store's MaxWait).
const resetsKeep = time.Minute

// resetsMax bounds the resets a limiter remembers.
const resetsMax = 4096

// note records a reset of key in buckets.
func (k *keyResets) note(buckets []string, key string) {
	now := time.Now()
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.m == nil {
		k.m = make(map[spareKey]resetMark)
	}
	for sk, m := range k.m {
		if len(k.m) < resetsMax && now.Sub(m.at) < resetsKeep {
			break
		}
		delete(k.m, sk)
	}
	g := k.gen.Add(1)
	for _, b := range buckets {
		k.m[spareKey{b, key}] = resetMark{gen: g, at: now}
	}
}

// since reports whether the key was reset after generation gen.
func (k *keyResets) since(gen uint64, sk spareKey) bool {
	if k.gen.Load() == gen {
		return false
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	m, ok := k.m[sk]
	return ok && m.gen > gen
}
