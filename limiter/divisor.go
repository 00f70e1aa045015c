package limiter

import (
	"strconv"
	"sync"
	"time"

	"go.uber.org/zap"
)

// The divisor of the local fallback buckets: the largest fleet size seen
// lately.

// divisorWindow is how long the largest fleet size seen is kept.
const divisorWindow = 10 * time.Minute

// fleetDivisor is the largest fleet size seen lately: the maxima of the
// current and previous half windows.
type fleetDivisor struct {
	mu        sync.Mutex
	cur, prev int64
	since     time.Time // when the current half window began
}

// see records a fleet view of n nodes at now, and returns the divisor
// before and after. A half window ends only when keep is false (no zone
// has been deciding locally lately).
func (d *fleetDivisor) see(n int64, now time.Time, keep bool) (before, after int64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	before = max(1, d.cur, d.prev)
	if d.since.IsZero() {
		d.since = now
	}
	if !keep && now.Sub(d.since) >= divisorWindow/2 {
		d.prev, d.cur, d.since = d.cur, 0, now
	}
	d.cur = max(d.cur, n)
	return before, max(1, d.cur, d.prev)
}

// fleetSize returns the divisor of the local buckets of zones without a
// fixed fleet size: the largest fleet view within divisorWindow, the
// current view included. It logs a change.
func (l *Limiter) fleetSize() int64 {
	if l.fleet == nil {
		return 1
	}
	return l.sampleFleet(time.Now())
}

// sampleFleet records the fleet view at now and returns the divisor,
// logging a change.
func (l *Limiter) sampleFleet(now time.Time) int64 {
	view := min(max(1, l.fleet()), maxFleetDivisor)
	local := now.UnixNano()-l.lastLocal.Load() < int64(fallbackQuiet)
	before, after := l.div.see(view, now, local)
	if before != after {
		why := "the fleet view saw " + strconv.FormatInt(view, 10) + " nodes"
		if after < before {
			why = "no fleet view of more than " + strconv.FormatInt(after, 10) + " nodes in the last " + divisorWindow.String()
		}
		l.log.Info("rate limit local fallback divisor changed", zap.Int64("old", before),
			zap.Int64("new", after), zap.String("why", why))
	}
	return after
}

// sampleFleetEvery samples the fleet view every second until stop is
// closed, so that the divisor knows the fleet before an outage.
func (l *Limiter) sampleFleetEvery(stop <-chan struct{}) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	l.sampleFleet(time.Now())
	for {
		select {
		case <-stop:
			return
		case now := <-t.C:
			l.sampleFleet(now)
		}
	}
}
