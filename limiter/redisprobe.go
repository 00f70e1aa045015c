package limiter

import (
	"context"
	"errors"
	"sync/atomic"
	"time"
)

// The idle prober: a PING to Redis when no round trip went to it lately, so that
// a Redis gone quiet is found out before a request pays for it.

// probeInterval is how long the store waits without a round trip before
// it PINGs, and the least time between two PINGs.
const probeInterval = time.Second

// probeWait bounds a PING's wait in wall time, below MaxWait: with nothing
// else in flight a decision would wait MaxWait for Redis (the delay might
// be this node's), which would leave the stats telling of a stall seconds
// late. A node starved for this long counts one failure towards the breaker.
const probeWait = probeInterval / 2

// RedisProbe is the outcome of one idle PING.
type RedisProbe struct {
	// At is when the PING ended, by this node's clock.
	At time.Time
	// Took is how long it waited for Redis.
	Took time.Duration
	// Err is why Redis did not answer (ErrStoreTimeout when it did not in
	// time); nil when it answered.
	Err error
}

// idleProbe holds the latest probe.
type idleProbe struct {
	last atomic.Pointer[RedisProbe]
}

// LastProbe returns the latest idle PING, and false before the first. A
// probe is taken only while no decision goes to Redis: under traffic the
// latest one is as old as the traffic.
func (s *RedisStore) LastProbe() (RedisProbe, bool) {
	p := s.probe.last.Load()
	if p == nil {
		return RedisProbe{}, false
	}
	return *p, true
}

// Timeout returns how long a decision waits for Redis
// (RedisOptions.Timeout, with its default).
func (s *RedisStore) Timeout() time.Duration { return s.timeout }

// probeIdle PINGs Redis each probeInterval in which no round trip went to
// it, until the store closes.
func (s *RedisStore) probeIdle() {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s.cancelOnClose(ctx, cancel)
	t := time.NewTicker(probeInterval)
	defer t.Stop()
	last := s.trips.Load()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
		}
		if n := s.trips.Load(); n != last {
			last = n // traffic: its round trips tell
			continue
		}
		start := time.Now()
		pctx, pcancel := context.WithTimeout(ctx, max(probeWait, s.timeout))
		err := s.Ping(pctx)
		pcancel()
		if ctx.Err() != nil {
			return
		}
		if errors.Is(err, ErrBreakerOpen) {
			continue // not the probe's turn: the breaker says it already
		}
		s.probe.last.Store(&RedisProbe{At: time.Now(), Took: time.Since(start), Err: err})
	}
}
