package limiter

import (
	"cmp"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// stallPeriod is how often a stallClock looks at the time.
const stallPeriod = 5 * time.Millisecond

// stallSlack is the lateness a stallClock forgives: the timer, poller and
// scheduler noise of a node that is not starved.
const stallSlack = 500 * time.Microsecond

// stallClock measures how long this process was kept from reacting: how
// late its timers fire and how late the readiness of its connections
// reaches the goroutines waiting on them. On a node whose CPUs are
// saturated, a reply that Redis sent in time sits in the socket until the
// runtime's poller notices it and a goroutine runs to read it; that can
// take far longer than the reply took. The clock tells such a node apart
// from a slow Redis.
//
// Every stallPeriod a goroutine wakes up (its lateness is one measure) and
// writes a byte into a pipe that another goroutine waits to read through
// the runtime's poller, as the Redis connections are read (the delay until
// it reads is the other). The stall is the union of the late intervals,
// including those still going on, so it never exceeds the time elapsed.
// It costs a wake-up and two small system calls every 5 ms.
//
// A clock made by stallClockOf(true) is switched off: it counts no
// stall, so that the time a process ran is the wall time elapsed.
type stallClock struct {
	base time.Time
	off  bool // counts no stall, and runs no goroutines

	// mu orders the writers; readers load the atomics without it (a
	// reading between the two stores is off by one interval at most).
	mu       sync.Mutex
	spans    []span       // the recent stall, as disjoint intervals in order
	stalled  atomic.Int64 // nanoseconds of stall counted so far
	frontier atomic.Int64 // the end of the last interval counted

	lastTick atomic.Int64 // when the ticker last ran
	probe    atomic.Int64 // when the byte in the pipe was written; 0: none

	r, w *os.File
	stop chan struct{}
	done sync.WaitGroup
}

// newStallClock starts a stall clock; stop it with close.
func newStallClock() *stallClock {
	c := &stallClock{base: time.Now(), stop: make(chan struct{})}
	var err error
	c.r, c.w, err = os.Pipe()
	if err != nil { // no pipe: the timers alone are watched
		c.r, c.w = nil, nil
	}
	c.done.Go(c.tick)
	if c.r != nil {
		c.done.Go(c.read)
	}
	return c
}

// stallClockOf returns a running stall clock, or with off one that is
// switched off: it starts nothing and counts no stall.
func stallClockOf(off bool) *stallClock {
	if off {
		return &stallClock{base: time.Now(), off: true}
	}
	return newStallClock()
}

// tick wakes every stallPeriod, counts how late it woke, and sends a probe
// through the pipe when none is out.
func (c *stallClock) tick() {
	t := time.NewTicker(stallPeriod)
	defer t.Stop()
	for {
		select {
		case <-c.stop:
			return
		case <-t.C:
			now := c.mono()
			due := c.lastTick.Swap(now) + int64(stallPeriod)
			c.count(due+int64(stallSlack), now)
			if c.w != nil && c.probe.Load() == 0 {
				c.probe.Store(now)
				if _, err := c.w.Write([]byte{0}); err != nil {
					c.probe.Store(0)
				}
			}
		}
	}
}

// read takes the probes out of the pipe and counts how late each arrived.
func (c *stallClock) read() {
	var b [1]byte
	for {
		if _, err := c.r.Read(b[:]); err != nil {
			return // closed
		}
		now := c.mono()
		if sent := c.probe.Swap(0); sent != 0 {
			c.count(sent+int64(stallSlack), now)
		}
	}
}

// count adds the interval [from, to] to the stall, less what is counted
// already.
func (c *stallClock) count(from, to int64) {
	if to <= from || c.off {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	// The part of [from, to] that the recent spans cover is counted
	// already; merge the rest in.
	added := to - from
	merged := span{from, to}
	keep := c.spans[:0]
	for _, sp := range c.spans {
		if sp.to < merged.from || sp.from > merged.to {
			keep = append(keep, sp)
			continue
		}
		added -= min(sp.to, to) - max(sp.from, from)
		merged = span{min(merged.from, sp.from), max(merged.to, sp.to)}
	}
	keep = append(keep, merged)
	slices.SortFunc(keep, func(a, b span) int { return cmp.Compare(a.from, b.from) })
	// Spans far older than any interval still to come are forgotten: an
	// interval reaches back at most a wake-up's lateness.
	for len(keep) > maxSpans || (len(keep) > 1 && keep[0].to < to-int64(spanMemory)) {
		keep = keep[1:]
	}
	c.spans = append(c.spans[:0], keep...)
	c.stalled.Add(added)
	c.frontier.Store(max(c.frontier.Load(), to))
}

// span is an interval of stall, in monotonic nanoseconds.
type span struct{ from, to int64 }

// maxSpans and spanMemory bound what a stallClock remembers of its stall
// to tell new intervals from ones counted already.
const (
	maxSpans   = 64
	spanMemory = 10 * time.Second
)

// mono returns the monotonic time in nanoseconds since the clock started.
func (c *stallClock) mono() int64 { return int64(time.Since(c.base)) }

// now returns the monotonic time and the stall so far, including the late
// intervals still going on: a tick that is due and has not run, a probe
// that is in the pipe and has not been read (the process may be stalled
// right now).
func (c *stallClock) now() (now, stalled int64) {
	if c.off {
		return c.mono(), 0
	}
	// Everything is loaded before the time is read, the stall before its
	// frontier: what a writer counts meanwhile is left out (it ends before
	// now) rather than counted beyond now, so that the stall of an
	// interval never exceeds its length.
	stalled = c.stalled.Load()
	f := c.frontier.Load()
	from := c.lastTick.Load() + int64(stallPeriod+stallSlack)
	if sent := c.probe.Load(); sent != 0 {
		from = min(from, sent+int64(stallSlack))
	}
	now = c.mono()
	if now > from && now > f {
		stalled += now - max(from, f)
	}
	return now, stalled
}

// close stops the clock's goroutines.
func (c *stallClock) close() {
	if c.off {
		return
	}
	close(c.stop)
	if c.w != nil {
		_ = c.w.Close()
		_ = c.r.Close()
	}
	c.done.Wait()
}

// stallMark is a moment on a stallClock: the monotonic time and the stall
// summed so far.
type stallMark struct{ at, stalled int64 }

// mark returns the current moment.
func (c *stallClock) mark() stallMark {
	at, st := c.now()
	return stallMark{at, st}
}

// since returns the time elapsed since m, and the part of it during which
// the process ran (elapsed less the stall).
func (c *stallClock) since(m stallMark) (elapsed, ran time.Duration) {
	at, st := c.now()
	elapsed = time.Duration(at - m.at)
	ran = elapsed - time.Duration(st-m.stalled)
	return elapsed, max(0, ran)
}

// add counts d of stall ending now, for tests that play a starved node.
func (c *stallClock) add(d time.Duration) {
	now := c.mono()
	c.count(now-int64(d), now)
}
