package limiter

import (
	"sync/atomic"
	"time"
)

// stallPeriod is how often a stallClock wakes up to look at the time.
const stallPeriod = 5 * time.Millisecond

// stallSlack is the lateness a stallClock forgives each wake-up: the timer
// and scheduler noise of a node that is not starved.
const stallSlack = 500 * time.Microsecond

// stallClock measures how long this process was kept from running: a
// goroutine wakes every stallPeriod and adds to the clock how much later
// than due it woke up. On a node whose CPUs are saturated every goroutine
// runs late, the one reading Redis' replies included, so a reply that
// arrives in time is read late; the clock tells such a node apart from a
// slow Redis. Costs one wake-up every 5 ms.
type stallClock struct {
	stalled atomic.Int64 // nanoseconds of lateness summed so far
	last    atomic.Int64 // monotonic nanoseconds of the last wake-up
	base    time.Time
	stop    chan struct{}
	done    chan struct{}
}

// newStallClock starts a stall clock; stop it with close.
func newStallClock() *stallClock {
	c := &stallClock{base: time.Now(), stop: make(chan struct{}), done: make(chan struct{})}
	go c.run()
	return c
}

func (c *stallClock) run() {
	defer close(c.done)
	t := time.NewTicker(stallPeriod)
	defer t.Stop()
	for {
		select {
		case <-c.stop:
			return
		case <-t.C:
			now := c.mono()
			if late := now - c.last.Swap(now) - int64(stallPeriod+stallSlack); late > 0 {
				c.stalled.Add(late)
			}
		}
	}
}

// mono returns the monotonic time in nanoseconds since the clock started.
func (c *stallClock) mono() int64 { return int64(time.Since(c.base)) }

// read returns the monotonic time and the stall so far, including the
// lateness of a wake-up that is due but has not run yet (the process may be
// stalled right now).
func (c *stallClock) read() (now, stalled int64) {
	now = c.mono()
	stalled = c.stalled.Load()
	if pending := now - c.last.Load() - int64(stallPeriod+stallSlack); pending > 0 {
		stalled += pending
	}
	return now, stalled
}

// close stops the clock's goroutine.
func (c *stallClock) close() {
	close(c.stop)
	<-c.done
}

// stallMark is a moment on a stallClock: the monotonic time and the stall
// summed so far.
type stallMark struct{ at, stalled int64 }

// mark returns the current moment.
func (c *stallClock) mark() stallMark {
	at, st := c.read()
	return stallMark{at, st}
}

// since returns the time elapsed since m, and the part of it during which
// the process ran (elapsed less the stall).
func (c *stallClock) since(m stallMark) (elapsed, ran time.Duration) {
	at, st := c.read()
	elapsed = time.Duration(at - m.at)
	ran = elapsed - time.Duration(st-m.stalled)
	return elapsed, max(0, ran)
}
