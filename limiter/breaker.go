package limiter

import (
	"errors"
	"sync/atomic"
	"time"
)

// ErrBreakerOpen is returned, at once, by a store whose circuit breaker is
// open: it failed too often in a row, and is left alone for a cooldown.
var ErrBreakerOpen = errors.New("rate limit store circuit breaker is open")

// Breaker is a circuit breaker for a store: after Failures consecutive
// failed decisions it opens, and the store is not called for Cooldown;
// then one decision is let through as a probe, whose success closes the
// breaker and whose failure opens it for another cooldown. A probe that
// never reports (its request went away, say) expires after a cooldown, and
// the next caller probes instead, so the breaker cannot stay half-open for
// good. It is safe for concurrent use and costs two atomic loads on the
// path of a closed breaker.
type Breaker struct {
	failures int64
	cooldown time.Duration

	consecutive atomic.Int64
	openUntil   atomic.Int64 // unix nanoseconds; 0 while closed
	probeSince  atomic.Int64 // unix nanoseconds the probe started; 0: none
	opened      atomic.Uint64
}

// BreakerState is the state of a Breaker.
type BreakerState uint8

// The states of a Breaker.
const (
	// BreakerClosed: the store is called.
	BreakerClosed BreakerState = iota
	// BreakerOpen: the store is not called until the cooldown ends.
	BreakerOpen
	// BreakerHalfOpen: the cooldown ended; one probe decides.
	BreakerHalfOpen
)

// String names the state.
func (s BreakerState) String() string {
	switch s {
	case BreakerOpen:
		return "open"
	case BreakerHalfOpen:
		return "half-open"
	}
	return "closed"
}

// NewBreaker returns a closed breaker that opens after failures consecutive
// failures (default 5) for cooldown (default 1s).
func NewBreaker(failures int, cooldown time.Duration) *Breaker {
	if failures <= 0 {
		failures = 5
	}
	if cooldown <= 0 {
		cooldown = time.Second
	}
	return &Breaker{failures: int64(failures), cooldown: cooldown}
}

// Allow reports whether the store may be called now. After the cooldown it
// admits one caller, the probe, until Success or Failure, or until the probe
// has been out for a cooldown without either: then it counts as lost and the
// next caller probes.
func (b *Breaker) Allow() bool {
	ok, _ := b.allow()
	return ok
}

// allow is Allow, and reports whether the caller is the probe.
func (b *Breaker) allow() (ok, probe bool) {
	until := b.openUntil.Load()
	if until == 0 {
		return true, false
	}
	now := time.Now().UnixNano()
	if now < until {
		return false, false
	}
	since := b.probeSince.Load()
	if since != 0 && now-since < int64(b.cooldown) {
		return false, false
	}
	if !b.probeSince.CompareAndSwap(since, now) {
		return false, false
	}
	return true, true
}

// abandonProbe frees the probe's place when the probe ended without telling
// anything of the store (its request went away first), so that the next
// caller probes at once.
func (b *Breaker) abandonProbe() {
	if since := b.probeSince.Load(); since != 0 {
		b.probeSince.CompareAndSwap(since, 0)
	}
}

// Success records a decision the store made.
func (b *Breaker) Success() { b.succeed() }

// succeed records a decision the store made, and reports whether it
// closed the breaker (it was open or half-open).
func (b *Breaker) succeed() bool {
	if b.consecutive.Load() != 0 {
		b.consecutive.Store(0)
	}
	if until := b.openUntil.Load(); until != 0 && b.openUntil.CompareAndSwap(until, 0) {
		b.probeSince.Store(0)
		return true
	}
	return false
}

// Close closes an open breaker at once: another node's probe found the
// store answering (see breakerClosedMsg). A store still away here opens it
// again after its failures.
func (b *Breaker) Close() { b.succeed() }

// Failure records a failed store call: it opens the breaker after enough
// of them in a row, or at once when the probe failed.
func (b *Breaker) Failure() {
	n := b.consecutive.Add(1)
	if b.probeSince.Load() != 0 || (n >= b.failures && b.openUntil.Load() == 0) {
		b.openUntil.Store(time.Now().Add(b.cooldown).UnixNano())
		b.probeSince.Store(0)
		b.opened.Add(1)
	}
}

// State returns the breaker's state now.
func (b *Breaker) State() BreakerState {
	until := b.openUntil.Load()
	switch {
	case until == 0:
		return BreakerClosed
	case time.Now().UnixNano() < until:
		return BreakerOpen
	}
	return BreakerHalfOpen
}

// RetryAfter returns how long until the breaker lets a probe through (0
// when it is not open).
func (b *Breaker) RetryAfter() time.Duration {
	until := b.openUntil.Load()
	if until == 0 {
		return 0
	}
	return max(0, time.Duration(until-time.Now().UnixNano()))
}

// Opened returns how many times the breaker has opened.
func (b *Breaker) Opened() uint64 { return b.opened.Load() }
