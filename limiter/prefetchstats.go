package limiter

import "sync/atomic"

// PrefetchStats are what a node's prefetch did for one zone (or for all
// of a limiter's zones), since the limiter's first spares.
type PrefetchStats struct {
	// Hits counts requests the zone admitted from spares, without the
	// store.
	Hits uint64 `json:"hits"`
	// Paced counts requests denied on this node while the zone's key was
	// paced, without the store.
	Paced uint64 `json:"paced"`
	// Decisions counts the zone's decisions by the store; Short those of
	// them that took fewer spares than they wanted (they start a pause).
	Decisions uint64 `json:"decisions"`
	Short     uint64 `json:"short"`
	// Taken counts the spare tokens taken, Returned those refunded
	// unused, in Refunds store calls.
	Taken    uint64 `json:"taken"`
	Returned uint64 `json:"returned"`
	Refunds  uint64 `json:"refunds"`
}

// Minus returns the counts that s has more than an earlier o: what
// happened between the two.
func (s PrefetchStats) Minus(o PrefetchStats) PrefetchStats {
	return PrefetchStats{
		Hits: s.Hits - o.Hits, Paced: s.Paced - o.Paced, Decisions: s.Decisions - o.Decisions, Short: s.Short - o.Short,
		Taken: s.Taken - o.Taken, Returned: s.Returned - o.Returned, Refunds: s.Refunds - o.Refunds,
	}
}

// prefetchCounts are one zone's PrefetchStats as they grow.
type prefetchCounts struct {
	hits, paced, decisions, short, taken, returned, refunds atomic.Uint64
}

// load returns the counts as they are now.
func (c *prefetchCounts) load() PrefetchStats {
	return PrefetchStats{
		Hits: c.hits.Load(), Paced: c.paced.Load(), Decisions: c.decisions.Load(), Short: c.short.Load(),
		Taken: c.taken.Load(), Returned: c.returned.Load(), Refunds: c.refunds.Load(),
	}
}

// add adds o to s.
func (s *PrefetchStats) add(o PrefetchStats) {
	s.Hits += o.Hits
	s.Paced += o.Paced
	s.Decisions += o.Decisions
	s.Short += o.Short
	s.Taken += o.Taken
	s.Returned += o.Returned
	s.Refunds += o.Refunds
}

// counts returns the counts of a zone's rule, made on first use; the
// holder must be locked.
func (s *spares) counts(r *Rule) *prefetchCounts {
	c := s.stats[r]
	if c == nil {
		c = &prefetchCounts{}
		s.stats[r] = c
	}
	return c
}

// countsOf is counts with the holder unlocked.
func (s *spares) countsOf(r *Rule) *prefetchCounts {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.counts(r)
}

// PrefetchStats reports what the limiter's prefetch did for the zone of
// rule r, or for all its zones with r nil.
func (l *Limiter) PrefetchStats(r *Rule) PrefetchStats {
	sp := l.spares.Load()
	if sp == nil {
		return PrefetchStats{}
	}
	sp.mu.Lock()
	defer sp.mu.Unlock()
	if r != nil {
		if c := sp.stats[r]; c != nil {
			return c.load()
		}
		return PrefetchStats{}
	}
	var all PrefetchStats
	for _, c := range sp.stats {
		all.add(c.load())
	}
	return all
}
