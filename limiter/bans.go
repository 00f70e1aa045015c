package limiter

import (
	"context"
	"errors"
	"sync"
	"time"
	"weak"
)

// Bans, the registry: the bans a store's zones started, listed and lifted
// across the fleet (BanKeeper), and the deny caches told of a lift.

// MaxBanRecords is how many bans a store's registry keeps per zone at most:
// those that end last. A ban left out still holds; it is only not listed.
const MaxBanRecords = 10_000

// ErrNoBanRegistry is the error of a ban operation on a limiter whose store
// keeps no registry of bans (neither a RedisStore nor a MemoryStore).
var ErrNoBanRegistry = errors.New("the rate limit store keeps no registry of bans")

// BanRecord is a ban as a store's registry lists it.
type BanRecord struct {
	// Zone is the name of the zone that banned the key.
	Zone string
	// Bucket is the name of the zone's buckets (Rule.Bucket): with Key,
	// what is banned.
	Bucket string
	// Key is the client key banned (see ClientKey). Show it only where
	// client keys may be shown (log_key); otherwise its digest.
	Key string
	// Start and End are when the ban began and when it ends, by the
	// store's clock (Redis TIME, or the memory store's Clock).
	Start, End time.Time
	// Left is how long the ban had left when it was listed or lifted, by
	// the store's clock when it has one to hand (listing), else by this
	// node's (lifting in Redis).
	Left time.Duration
	// Denials is how many denials started the ban.
	Denials int64
}

// BanKeeper is a store that keeps a registry of the bans its zones start:
// RedisStore (the fleet's, in Redis) and MemoryStore (this process's).
type BanKeeper interface {
	// Bans lists the bans in force in the zones named, at most limit per
	// zone (those that end last), those that end last first.
	Bans(ctx context.Context, zones []string, limit int) ([]BanRecord, error)
	// Unban lifts the ban of a client key in a zone (named zone, its
	// buckets named bucket): the ban and the denials counted towards the
	// next one are deleted where decisions read them, the ban leaves the
	// registry, and every deny cache of the store forgets it (with Redis,
	// on every node). It returns the ban lifted, and false when none was
	// in force (no error: there was nothing to lift).
	Unban(ctx context.Context, zone, bucket, key string) (BanRecord, bool, error)
}

// banNote is a ban as the limiter hands it to its store's registry: the
// zone, bucket and key, and in the store's microseconds its start and end,
// with the denials that started it.
type banNote struct {
	zone, bucket, key   string
	start, end, denials int64
}

// record returns the note as a BanRecord, with left at now (store
// microseconds).
func (n *banNote) record(now int64) BanRecord {
	return BanRecord{
		Zone: n.zone, Bucket: n.bucket, Key: n.key,
		Start: time.UnixMicro(n.start).UTC(), End: time.UnixMicro(n.end).UTC(),
		Left: us(max(0, n.end-now)), Denials: n.denials,
	}
}

// banRecorder is a store that keeps the bans the limiter hands it.
type banRecorder interface {
	// recordBan keeps a ban that started. It runs on the request path:
	// it must not block.
	recordBan(n banNote)
}

// cacheHolder is a store that tells deny caches about lifted bans.
type cacheHolder interface {
	denyCaches() *cacheSet
}

// watchBans adds the limiter's deny cache, if any, to those its store
// tells about lifted bans.
func (l *Limiter) watchBans() {
	if h, ok := l.store.(cacheHolder); ok && l.cache != nil {
		h.denyCaches().add(l.cache)
	}
}

// noteBans hands the store's registry every ban that a denial the store
// made started (a dry run starts none). A ban starts only on a denial, so
// only denials come here, and a ban is rare: the common denial costs a
// loop over its zones' results.
func (l *Limiter) noteBans(reqs []Request, results []Result) {
	for i := range results {
		res := &results[i]
		if !res.BanStarted || res.DryRun {
			continue
		}
		rec, ok := l.store.(banRecorder)
		if !ok {
			return
		}
		r := reqs[i].Rule
		rec.recordBan(banNote{
			zone: r.name, bucket: r.bucket, key: reqs[i].Key,
			start: res.at, end: res.at + r.banUS, denials: r.banAfter,
		})
	}
}

// Bans lists the bans in force in the zones named; see BanKeeper.Bans.
func (l *Limiter) Bans(ctx context.Context, zones []string, limit int) ([]BanRecord, error) {
	k, ok := l.store.(BanKeeper)
	if !ok {
		return nil, ErrNoBanRegistry
	}
	return k.Bans(ctx, zones, limit)
}

// Unban lifts the ban of key in rule's zone, fleet-wide with Redis; see
// BanKeeper.Unban. The limiter's own deny cache forgets the key even when
// the store fails.
func (l *Limiter) Unban(ctx context.Context, rule *Rule, key string) (BanRecord, bool, error) {
	if l.cache != nil {
		defer l.cache.Forget(rule.bucket, key)
	}
	k, ok := l.store.(BanKeeper)
	if !ok {
		return BanRecord{}, false, ErrNoBanRegistry
	}
	return k.Unban(ctx, rule.name, rule.bucket, key)
}

// cacheSet is the set of deny caches of one store.
type cacheSet struct {
	mu     sync.Mutex
	caches []weak.Pointer[DenyCache]
}

// add puts c, a cache that has decided nothing yet, in the set, and drops
// the caches collected since. c starts with the bans the set's caches hold:
// a new configuration (a reload) must not forget a ban the node knew, or its
// local fallback admits the key while Redis is away.
func (s *cacheSet) add(c *DenyCache) {
	s.mu.Lock()
	defer s.mu.Unlock()
	kept := s.caches[:0]
	for _, p := range s.caches {
		if v := p.Value(); v != nil && v != c {
			kept = append(kept, p)
			c.inheritBans(v)
		}
	}
	clear(s.caches[len(kept):])
	s.caches = append(kept, weak.Make(c))
}

// live returns the caches of the set still in use.
func (s *cacheSet) live() []*DenyCache {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]*DenyCache, 0, len(s.caches))
	for _, p := range s.caches {
		if v := p.Value(); v != nil {
			out = append(out, v)
		}
	}
	return out
}

// forget makes every cache of the set forget the key in the zone whose
// buckets are named bucket (see DenyCache.Forget) now and, when again is
// positive, once more after again.
func (s *cacheSet) forget(bucket, key string, again time.Duration) {
	caches := s.live()
	if len(caches) == 0 {
		return
	}
	for _, c := range caches {
		c.Forget(bucket, key)
	}
	if again > 0 {
		time.AfterFunc(again, func() {
			for _, c := range caches {
				c.Forget(bucket, key)
			}
		})
	}
}
