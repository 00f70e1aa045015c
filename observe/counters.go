package observe

import (
	"sync"
	"sync/atomic"

	"github.com/fleetlimit/caddy-fleetlimit/limiter"
)

// seriesSeconds is how many seconds of per-second counts each zone keeps:
// the dashboard's chart spans them.
const seriesSeconds = 300

// counterRing counts outcomes per second over the last seriesSeconds
// seconds, with atomic adds; its lock is taken only when a slot moves on to
// a new second.
type counterRing struct {
	mu    sync.Mutex
	slots [seriesSeconds + 2]counterSlot
}

type counterSlot struct {
	sec atomic.Int64
	n   [limiter.NumOutcomes]atomic.Uint64
}

func (r *counterRing) add(sec int64, o limiter.Outcome) {
	s := &r.slots[uint64(sec)%uint64(len(r.slots))]
	if cur := s.sec.Load(); cur != sec {
		if cur > sec {
			return // a second that has already left the ring
		}
		r.mu.Lock()
		if s.sec.Load() < sec {
			for i := range s.n {
				s.n[i].Store(0)
			}
			s.sec.Store(sec)
		}
		r.mu.Unlock()
	}
	s.n[o].Add(1)
}

// get returns the counts of one second (zero for one the ring no longer or
// not yet holds).
func (r *counterRing) get(sec int64) (c [limiter.NumOutcomes]uint64) {
	s := &r.slots[uint64(sec)%uint64(len(r.slots))]
	if s.sec.Load() != sec {
		return c
	}
	for i := range c {
		c[i] = s.n[i].Load()
	}
	return c
}

// sum returns the counts of the n seconds that end with second end.
func (r *counterRing) sum(end int64, n int) (c [limiter.NumOutcomes]uint64) {
	for sec := end - int64(n) + 1; sec <= end; sec++ {
		g := r.get(sec)
		for i := range c {
			c[i] += g[i]
		}
	}
	return c
}
