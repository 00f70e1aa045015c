package limiter

import (
	"math"
	"sync"
	"time"
)

// How long a decision waits for Redis: the round trip in flight, the slow ones
// lately, and when a late reply counts as Redis' failure.

// flight is a round trip in flight: its number and when it left.
type flight struct {
	trip uint64
	left stallMark
}

// tripFailed is the last failure token of a round trip: the round trip
// itself failed (an error, or its sockets' hard cap ran out).
const tripFailed = 0xffff

// slowTripFactor is how many times the slowest recent round trip a round
// trip may take before it is overdue.
const slowTripFactor = 4

// slowTripHalfLife is how fast the memory of a slow round trip fades. On a
// saturated machine round trips are slow now and then, not every time: the
// memory must outlast the gaps between them.
const slowTripHalfLife = 5 * time.Second

// slowTrips keeps a decaying maximum of recent round-trip times: the
// slowest lately, halving every slowTripHalfLife.
type slowTrips struct {
	mu  sync.Mutex
	max time.Duration
	at  int64 // stall clock time of max
}

// add records a round trip of d that ended at now.
func (w *slowTrips) add(d time.Duration, now int64) {
	w.mu.Lock()
	if d >= w.value(now) {
		w.max, w.at = d, now
	}
	w.mu.Unlock()
}

// get returns the decayed maximum at now.
func (w *slowTrips) get(now int64) time.Duration {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.value(now)
}

func (w *slowTrips) value(now int64) time.Duration {
	if w.max == 0 {
		return 0
	}
	age := float64(now-w.at) / float64(slowTripHalfLife)
	return time.Duration(float64(w.max) * math.Exp2(-max(0, age)))
}

// flightOf returns the round trip a call waits on: the one carrying it
// (trip), or while it is still queued (trip 0) the oldest in flight; nil
// when none is in flight.
func (s *RedisStore) flightOf(trip uint64) *flight {
	var f *flight
	for i := range s.flights {
		g := s.flights[i].Load()
		if g == nil || (trip != 0 && g.trip != trip) {
			continue
		}
		if f == nil || g.trip < f.trip {
			f = g
		}
	}
	return f
}

// overdueAfter returns how long a round trip may be out before it is
// overdue: Timeout, or four times the slowest round trip lately if that is
// longer, and at most MaxWait.
func (s *RedisStore) overdueAfter() time.Duration {
	now, _ := s.stall.now()
	return min(s.maxWait, max(s.timeout, slowTripFactor*s.slow.get(now)))
}

// extension returns how much longer a decision that began at start, and
// that waits on round trip trip (0: still queued), waits for its reply
// (see the rules above). 0: give up now. A decision that began before the
// store's start-up connection attempt ended (beganWarming) waits up to
// MaxWait in wall time, whatever its round trip.
func (s *RedisStore) extension(start stallMark, trip uint64) time.Duration {
	elapsed, ran := s.stall.since(start)
	if elapsed < s.maxWait && s.beganWarming(start) {
		return max(time.Millisecond, s.maxWait-elapsed)
	}
	if elapsed >= s.maxWait {
		if ran >= s.timeout || elapsed >= 2*s.maxWait {
			return 0
		}
		return max(time.Millisecond, min(s.timeout-ran, 2*s.maxWait-elapsed))
	}
	left := s.maxWait - elapsed
	if ran < s.timeout {
		return max(time.Millisecond, min(s.timeout-ran, left))
	}
	f := s.flightOf(trip)
	if f == nil { // nothing out: this node has yet to send it
		return max(time.Millisecond, min(s.timeout/4, left))
	}
	_, out := s.stall.since(f.left)
	if limit := s.overdueAfter(); out < limit {
		return max(time.Millisecond, min(limit-out, left))
	}
	return 0
}

// failureToken returns the number by which the circuit breaker counts a
// decision that gave up waiting: the round trip it waited on (the one that
// carried it, or the oldest in flight while it was still queued) and how
// many timeouts that round trip has been out, in the time this node was
// able to run. A stalled round trip so counts once per timeout, however
// many decisions it carried; a decision that gave up with no round trip
// overdue (the hard cap on a starved node) counts not at all: 0.
func (s *RedisStore) failureToken(trip uint64) uint64 {
	f := s.flightOf(trip)
	if f == nil {
		return 0
	}
	_, out := s.stall.since(f.left)
	if out < s.overdueAfter() {
		return 0
	}
	k := uint64(out / s.timeout)
	return f.trip<<16 | min(max(k, 1), tripFailed-1)
}
