package observe

import (
	"context"
	"time"
)

// Node clock drift: one goroutine per Redis store reads this node's clock
// offset against Redis' TIME once a ClockInterval, off the
// request path, for the metric caddy_rate_limit_clock_offset_seconds and
// the stats' stores[].clock. Buckets never read it: their time is Redis'.

// clockTimeout bounds one reading: a reading that waited longer would say
// little of the clocks anyway.
const clockTimeout = 500 * time.Millisecond

// clockWatcher measures a Redis store's clock offset. It lives as long as
// the store's stats.
type clockWatcher struct {
	watch *clockWatch
	quit  chan struct{}
	done  chan struct{}
}

func startClockWatcher(redis *redisStats) *clockWatcher {
	c := &clockWatcher{
		watch: newClockWatch(redis),
		quit:  make(chan struct{}),
		done:  make(chan struct{}),
	}
	go c.run()
	return c
}

// run reads at once, then a ClockInterval after each reading until
// stopped. A failed reading is left out: the store's own errors say what
// is wrong with Redis.
func (c *clockWatcher) run() {
	defer close(c.done)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-c.quit:
			cancel()
		case <-ctx.Done():
		}
	}()
	// A timer started after each reading keeps readings ClockInterval
	// apart at least, as the watch wants them.
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-c.quit:
			return
		case <-t.C:
		}
		rc, cancelRead := context.WithTimeout(ctx, clockTimeout)
		_ = c.watch.Measure(rc)
		cancelRead()
		t.Reset(ClockInterval)
	}
}

// offset returns the latest estimate of the offset, and false before the
// first reading.
func (c *clockWatcher) offset() (ClockReading, bool) {
	if c == nil {
		return ClockReading{}, false
	}
	return c.watch.Offset()
}

// latest returns when the latest reading was taken.
func (c *clockWatcher) latest() time.Time {
	if c == nil {
		return time.Time{}
	}
	return c.watch.Latest()
}

// stop ends the watcher and waits for it.
func (c *clockWatcher) stop() {
	close(c.quit)
	<-c.done
}
