package observe

import (
	"context"
	"testing"
	"time"

	"github.com/fleetlimit/caddy-fleetlimit/internal/redistest"
	"github.com/fleetlimit/caddy-fleetlimit/limiter"
)

// TestReadClock: a node whose clock is 300ms ahead of Redis' (the store's
// Clock, as the fleetlimit_clockskew build shifts the default one) reads
// an offset of -300ms, within the round trip; one on the system clock
// reads about zero (redis-server runs on this machine's clock).
func TestReadClock(t *testing.T) {
	t.Parallel()
	r := redistest.Start(t)
	const skew = 300 * time.Millisecond
	ahead := startRedisStats(t, limiter.RedisOptions{Address: r.Addr, Clock: limiter.ClockFunc(func() time.Time { return time.Now().Add(skew) })})
	exact := startRedisStats(t, limiter.RedisOptions{Address: r.Addr})
	ctx := context.Background()
	for _, c := range []struct {
		name string
		s    *redisStats
		want time.Duration
	}{{"ahead", ahead, -skew}, {"exact", exact, 0}} {
		w := newClockWatch(c.s)
		if _, ok := w.Offset(); ok {
			t.Fatalf("%s: an offset before any reading", c.name)
		}
		if err := w.Measure(ctx); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		got, ok := w.Offset()
		if !ok {
			t.Fatalf("%s: no offset after a reading", c.name)
		}
		// Within half the round trip, and Redis' microsecond; a
		// generous floor for a busy machine's clock reads.
		if tol := got.RoundTrip/2 + 5*time.Millisecond; got.Offset < c.want-tol || got.Offset > c.want+tol {
			t.Errorf("%s: offset %s (round trip %s), want %s", c.name, got.Offset, got.RoundTrip, c.want)
		}
		// A second measurement within ClockInterval reads nothing.
		if err := w.Measure(ctx); err != nil {
			t.Fatal(err)
		}
		w.mu.Lock()
		n := w.n
		w.mu.Unlock()
		if n != 1 {
			t.Errorf("%s: %d readings after two measurements within %s, want 1", c.name, n, ClockInterval)
		}
	}
}

// TestClockWatchShortestRoundTrip: the estimate is the reading with the
// shortest round trip among the last eight.
func TestClockWatchShortestRoundTrip(t *testing.T) {
	t.Parallel()
	w := newClockWatch(nil)
	for i, r := range []ClockReading{
		{Offset: 40 * time.Millisecond, RoundTrip: 80 * time.Millisecond}, // queued: off by up to 40ms
		{Offset: -2 * time.Millisecond, RoundTrip: 200 * time.Microsecond},
		{Offset: 9 * time.Millisecond, RoundTrip: 20 * time.Millisecond},
	} {
		w.add(r)
		if got, _ := w.Offset(); i > 0 && got.Offset != -2*time.Millisecond {
			t.Fatalf("after %d readings: %s", i+1, got.Offset)
		}
	}
	// Eight readings later the short one has left the window.
	for range clockReadings {
		w.add(ClockReading{Offset: time.Millisecond, RoundTrip: time.Millisecond})
	}
	if got, _ := w.Offset(); got.Offset != time.Millisecond {
		t.Errorf("after the window moved on: %s", got.Offset)
	}
}
