package limiter

import "time"

// Clock tells the time to what runs on this node's time: the memory store
// (wall-clock microseconds, from Now().UnixMicro()) and the deny cache
// (elapsed time only, from Now().Sub of an earlier reading: with the
// system clock that is the monotonic reading time.Now carries, so a wall
// clock that jumps does not move cached denials). Decisions in Redis never
// read it: their clock is Redis TIME, the same for every node, so a node
// whose clock is off cannot skew a shared bucket (see RedisOptions.Clock
// for the one exception, in tests).
//
// Every option of type Clock defaults to the system clock, time.Now.
// (Builds with the fleetlimit_clockskew tag shift that default by
// FLEETLIMIT_CLOCK_SKEW, for the fleet tests; see skewedClock.)
type Clock interface {
	// Now returns the current time. It must be safe for concurrent use.
	Now() time.Time
}

// ClockFunc adapts a function to a Clock.
type ClockFunc func() time.Time

// Now returns f().
func (f ClockFunc) Now() time.Time { return f() }

// SystemClock is the system's clock: time.Now.
type SystemClock struct{}

// Now returns time.Now().
func (SystemClock) Now() time.Time { return time.Now() }

// clockOr returns c, or this node's default clock when c is nil.
func clockOr(c Clock) Clock {
	if c == nil {
		return defaultClock
	}
	return c
}
