package observe

import (
	"math/bits"
	"sync"
	"sync/atomic"
	"time"
)

// Store latency is kept per second for the last latencySeconds seconds, in
// a log-linear histogram: latSub buckets per doubling from 2^latMinExp ns
// (about a microsecond) to 2^latMaxExp ns (about 34 s), so a percentile is
// known within a quarter of its value.
const (
	latencySeconds = 60
	latMinExp      = 10
	latMaxExp      = 35
	latSub         = 4
	latBuckets     = (latMaxExp-latMinExp)*latSub + 1
)

type latencyRing struct {
	mu    sync.Mutex
	slots [latencySeconds + 1]latencySlot
}

type latencySlot struct {
	sec     atomic.Int64
	calls   atomic.Uint64 // store calls made (failed ones included)
	errors  atomic.Uint64 // decisions the store could not make
	buckets [latBuckets]atomic.Uint64
}

// latIndex returns the histogram bucket of a duration.
func latIndex(d time.Duration) int {
	ns := uint64(max(d, 0))
	if ns < 1<<latMinExp {
		return 0
	}
	e := bits.Len64(ns) - 1 // 2^e <= ns < 2^(e+1)
	if e >= latMaxExp {
		return latBuckets - 1
	}
	m := int(ns>>(e-2)) & (latSub - 1)
	return 1 + (e-latMinExp)*latSub + m
}

// latUpper returns the upper bound of a histogram bucket.
func latUpper(i int) time.Duration {
	if i == 0 {
		return 1 << latMinExp
	}
	i--
	e, m := latMinExp+i/latSub, i%latSub
	return time.Duration(uint64(latSub+m+1) << (e - 2))
}

func (r *latencyRing) slot(sec int64) *latencySlot {
	s := &r.slots[uint64(sec)%uint64(len(r.slots))]
	if cur := s.sec.Load(); cur != sec {
		if cur > sec {
			return nil
		}
		r.mu.Lock()
		if s.sec.Load() < sec {
			s.calls.Store(0)
			s.errors.Store(0)
			for i := range s.buckets {
				s.buckets[i].Store(0)
			}
			s.sec.Store(sec)
		}
		r.mu.Unlock()
	}
	return s
}

// latencySummary is what the ring says about the last seconds.
type latencySummary struct {
	calls, errors uint64
	buckets       [latBuckets]uint64
}

func (r *latencyRing) summary(now int64, seconds int) latencySummary {
	var sum latencySummary
	for sec := now - int64(seconds) + 1; sec <= now; sec++ {
		s := &r.slots[uint64(sec)%uint64(len(r.slots))]
		if s.sec.Load() != sec {
			continue
		}
		sum.calls += s.calls.Load()
		sum.errors += s.errors.Load()
		for i := range s.buckets {
			sum.buckets[i] += s.buckets[i].Load()
		}
	}
	return sum
}

// quantile returns the upper bound of the bucket holding quantile q of the
// calls, and 0 when there were none.
func (s *latencySummary) quantile(q float64) time.Duration {
	var total uint64
	for _, n := range s.buckets {
		total += n
	}
	if total == 0 {
		return 0
	}
	rank := uint64(q*float64(total) + 0.5)
	rank = max(1, min(rank, total))
	var seen uint64
	for i, n := range s.buckets {
		seen += n
		if seen >= rank {
			return latUpper(i)
		}
	}
	return latUpper(latBuckets - 1)
}
