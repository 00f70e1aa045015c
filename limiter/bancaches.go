package limiter

import (
	"sync"
	"time"
	"weak"
)

// The deny caches a store tells about lifted bans. Several limiters (one per
// handler, and per configuration across a reload) may decide through one
// store, each with a deny cache that may have learned a ban: when the ban is
// lifted, here or on another node, each must forget it. New adds a
// limiter's cache to its store's set. The set holds its caches weakly: a
// cache whose limiter is gone (its configuration unloaded) leaves the set
// once the garbage collector has taken it, and nobody has to remember to
// take it out.
//
// A decision that was on its way to the store when the ban was lifted can
// come back banned after its cache forgot the ban, and teach it the ban
// again. Each forget is therefore repeated once the longest a decision can
// wait has passed (see forget's again), when every such decision has come
// back.

// cacheSet is the set of deny caches of one store.
type cacheSet struct {
	mu     sync.Mutex
	caches []weak.Pointer[DenyCache]
}

// add puts c in the set, and drops the caches collected since.
func (s *cacheSet) add(c *DenyCache) {
	s.mu.Lock()
	defer s.mu.Unlock()
	kept := s.caches[:0]
	for _, p := range s.caches {
		if v := p.Value(); v != nil && v != c {
			kept = append(kept, p)
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
