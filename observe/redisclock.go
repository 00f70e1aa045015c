package observe

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// Node clock drift: how far this node's clock is from Redis'. Buckets never
// read it (their time is Redis TIME, see limiter.Clock), but what runs on the
// node's time does (the memory store, the local fallback buckets, log
// timestamps, the denial feed's times), so a node whose clock drifts is
// worth an alert. The offset is measured as NTP does with one server:
// Redis' TIME against the midpoint of the node's send and receive times,
// which is exact when the request and the reply took as long, and off by at
// most half the round trip otherwise; of the recent readings, the one with
// the shortest round trip is the estimate.

const (
	// ClockInterval is the least time between two readings of a
	// clockWatch.
	ClockInterval = time.Second
	// clockReadings is how many recent readings a clockWatch chooses its
	// estimate from.
	clockReadings = 8
)

// ClockReading is one comparison of this node's clock with Redis'.
type ClockReading struct {
	// Offset is Redis' time minus this node's at the midpoint of the
	// round trip: negative when this node's clock is ahead of Redis',
	// positive when it is behind.
	Offset time.Duration
	// RoundTrip is how long the TIME call took, by this node's clock: the
	// offset is within half of it (and Redis' microsecond).
	RoundTrip time.Duration
	// At is when the reply arrived, by this node's clock.
	At time.Time
}

// readClock asks Redis for its TIME and compares it with this node's clock:
// the store's (limiter.RedisStore.Clock). In a Cluster, TIME goes to any
// one master.
func (s *redisStats) readClock(ctx context.Context) (ClockReading, error) {
	clock := s.clock
	sent := clock.Now()
	t, err := s.client.Time(ctx).Result()
	received := clock.Now()
	if err != nil {
		return ClockReading{}, fmt.Errorf("redis time: %w", err)
	}
	rtt := max(received.Sub(sent), 0)
	return ClockReading{Offset: t.Sub(sent.Add(rtt / 2)), RoundTrip: rtt, At: received}, nil
}

// clockWatch keeps the recent readings of a Redis store's clock offset.
// Measure it off the request path, about once a ClockInterval; read it with
// Offset.
type clockWatch struct {
	store *redisStats

	mu       sync.Mutex
	readings [clockReadings]ClockReading
	n        int       // readings held (up to clockReadings)
	next     int       // where the next reading goes
	last     time.Time // when the last reading began (monotonic)
}

// newClockWatch returns a watch of the store's clock offset, with no
// reading yet.
func newClockWatch(s *redisStats) *clockWatch { return &clockWatch{store: s} }

// Measure reads the store's clock offset, unless the previous reading
// began less than ClockInterval ago, and keeps the reading.
func (w *clockWatch) Measure(ctx context.Context) error {
	w.mu.Lock()
	now := time.Now()
	if !w.last.IsZero() && now.Sub(w.last) < ClockInterval {
		w.mu.Unlock()
		return nil
	}
	w.last = now
	w.mu.Unlock()
	r, err := w.store.readClock(ctx)
	if err != nil {
		return err
	}
	w.add(r)
	return nil
}

// add keeps a reading, in place of the oldest.
func (w *clockWatch) add(r ClockReading) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.readings[w.next] = r
	w.next = (w.next + 1) % clockReadings
	w.n = min(w.n+1, clockReadings)
}

// Latest returns when the latest reading was taken (zero before the
// first).
func (w *clockWatch) Latest() time.Time {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.n == 0 {
		return time.Time{}
	}
	return w.readings[(w.next+clockReadings-1)%clockReadings].At
}

// Offset returns the estimate of this node's clock offset: of the last
// readings (eight, about as many seconds), the one whose round trip was
// shortest, since queueing on the way to Redis or back skews a reading
// by up to half its round trip. It returns false before the first reading.
func (w *clockWatch) Offset() (ClockReading, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.n == 0 {
		return ClockReading{}, false
	}
	best := w.readings[0]
	for _, r := range w.readings[1:w.n] {
		if r.RoundTrip < best.RoundTrip {
			best = r
		}
	}
	return best, true
}
