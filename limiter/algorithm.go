package limiter

import (
	"errors"
	"fmt"
	"math"
	"time"
)

// Algorithm is how a zone counts.
type Algorithm uint8

// The algorithms. Each is exact in its own terms, in Redis and in memory,
// with the same integer arithmetic.
const (
	// TokenBucket: a bucket of Burst tokens refilled at Rate per Per;
	// forgives bursts (GCRA).
	TokenBucket Algorithm = iota
	// SlidingWindow: at most Rate per window of Per, estimated from the
	// current and the previous fixed window, the previous one weighted by
	// how much of it the sliding window still covers (the widely used
	// approximation). Two counters per key.
	SlidingWindow
	// FixedWindow: at most Rate per window of Per, the windows aligned to
	// the clock (Redis TIME). One counter per key.
	FixedWindow
	// SlidingLog: exactly at most Rate in any window of Per, from a log of
	// the admitted requests (memory grows with the limit).
	SlidingLog
	// LeakyBucket: a shaper. Requests over the rate wait for their turn
	// (at most MaxDelay, at most Burst tokens queued) and then proceed at a
	// steady rate; beyond that they are denied.
	LeakyBucket
	// Concurrency: at most Rate requests of a key in flight at once, across
	// the fleet. A request holds a slot from its admission until the
	// limiter is told it ended (Limiter.Refund); a slot whose node died
	// is freed after the rule's lease.
	Concurrency
	// Quota: at most Rate per calendar period (RuleConfig.Period, in
	// RuleConfig.Location), starting afresh at each period's first
	// instant (quotaRule). One counter per key, kept until the period
	// ends.
	Quota
)

// ParseAlgorithm parses an algorithm name ("" is token_bucket).
func ParseAlgorithm(s string) (Algorithm, error) {
	switch s {
	case "", "token_bucket":
		return TokenBucket, nil
	case "sliding_window":
		return SlidingWindow, nil
	case "fixed_window":
		return FixedWindow, nil
	case "sliding_log":
		return SlidingLog, nil
	case "leaky_bucket":
		return LeakyBucket, nil
	case "concurrency":
		return Concurrency, nil
	}
	return 0, fmt.Errorf("unknown algorithm %q (want token_bucket, sliding_window, fixed_window, sliding_log, leaky_bucket or concurrency)", s)
}

// String names the algorithm as the configuration does.
func (a Algorithm) String() string {
	switch a {
	case SlidingWindow:
		return "sliding_window"
	case FixedWindow:
		return "fixed_window"
	case SlidingLog:
		return "sliding_log"
	case LeakyBucket:
		return "leaky_bucket"
	case Concurrency:
		return "concurrency"
	case Quota:
		return "quota"
	}
	return "token_bucket"
}

// bucketName names a zone's buckets in the stores. A sliding log is a
// sorted set in Redis, the others one integer: it gets its own name, so
// that a zone switched to or from it in a reload does not meet a value of
// the other type. The integer states tell each other apart by size (see
// windowCounts), so they keep the zone's name, and with it the shortest
// key.
func bucketName(name string, alg Algorithm) string {
	switch alg {
	case SlidingLog:
		return name + "~log"
	case Concurrency:
		return name + "~slots"
	case Quota:
		return name + "~quota"
	}
	return name
}

// windowed reports whether the algorithm counts requests in windows.
func (a Algorithm) windowed() bool {
	return a == SlidingWindow || a == FixedWindow || a == SlidingLog
}

// Limits of the window algorithms' compact state (see State).
const (
	// MaxWindowLimit is the largest Rate of a sliding window or a sliding
	// log: counters have 21 bits. (A fixed window counts further: see
	// MaxFixedWindowLimit.)
	MaxWindowLimit = 1<<21 - 1
	// maxSlidingWindowMS bounds a sliding window in milliseconds, so that
	// counter x milliseconds stays exact in a double.
	maxSlidingWindowMS = 1 << 31
	windowIdxMod       = 1024
	counterBits        = 21
	// maxWindowState bounds packed window counters (10 + 2 x 21 bits); a
	// bucket's time state is always far above it.
	maxWindowState = 1 << 52
)

// Errors of the window algorithms' rules.
var (
	ErrWindowLimit = fmt.Errorf("a window algorithm's rate must be at most %d per window (a fixed window's %d)",
		MaxWindowLimit, MaxFixedWindowLimit)
	ErrWindowLength = errors.New("a window must be a whole number of milliseconds, at least 1ms and under 24 days " +
		"(a fixed window: under 34 years)")
	ErrMaxDelay = errors.New("max_delay must not be negative")
	ErrBadLimit = errors.New("a concurrency limit must be a positive integer")
	ErrBadLease = errors.New("a lease must be a whole number of milliseconds, at least 1ms and under 24 days")
)

// DefaultLease is how long a concurrency slot outlives a node that died
// holding it, unless the rule says otherwise.
const DefaultLease = time.Minute

// compileRule compiles the limit of a rule for any algorithm (NewRule adds
// the failure policy): rate per period, the burst (token and leaky bucket;
// 0 means rate; ignored by the windows) and, for the leaky bucket, the
// longest a request may wait (0 means as long as the queue allows).
func compileRule(cfg RuleConfig) (*Rule, error) {
	name, alg, rate, per := cfg.Name, cfg.Algorithm, cfg.Rate, cfg.Per
	switch alg {
	case Concurrency:
		return concurrencyRule(cfg)
	case Quota:
		return quotaRule(cfg)
	}
	if alg.windowed() {
		if rate <= 0 {
			return nil, ErrBadRate
		}
		maxRate, maxMS := int64(MaxWindowLimit), int64(maxSlidingWindowMS)
		if alg == FixedWindow {
			maxRate, maxMS = MaxFixedWindowLimit, maxFixedWindowMS
		}
		if rate > maxRate {
			return nil, ErrWindowLimit
		}
		if per < time.Millisecond || per%time.Millisecond != 0 || int64(per/time.Millisecond) >= maxMS {
			return nil, ErrWindowLength
		}
		return &Rule{name: name, bucket: bucketName(name, alg), alg: alg, rate: rate, per: per, burst: rate, exact: true,
			windowUS: int64(per / time.Microsecond)}, nil
	}
	r, err := newBucketRule(name, rate, per, cfg.Burst)
	if err != nil {
		return nil, err
	}
	r.alg = alg
	if alg == LeakyBucket {
		if cfg.MaxDelay < 0 {
			return nil, ErrMaxDelay
		}
		r.maxDelayUS = int64(cfg.MaxDelay / time.Microsecond)
		if cfg.MaxDelay == 0 {
			r.maxDelayUS = int64(DefaultMaxDelay / time.Microsecond)
		}
		if r.maxDelayUS > r.capacity/r.denom {
			r.maxDelayUS = ceilDiv(r.capacity, r.denom) // the queue is the bound
		}
	}
	return r, nil
}

// verdict is one zone's answer before the request as a whole is decided,
// with what the algorithm needs to report and to write its new state.
type verdict struct {
	ok    bool // the zone would admit the request
	never bool // no wait makes it admissible (the cost exceeds the limit)

	// token and leaky bucket: ticks owed before the request (0 full to
	// Capacity empty), and after it if charged.
	debt, after int64
	// over is, for a token bucket that denies, the ticks it owes beyond
	// its capacity (a settlement's or an outage charge's debt).
	over int64

	// windows: the current window's count (curr) and the previous
	// window's (prev, sliding window), and microseconds into the current
	// window.
	curr, prev, elapsed int64

	// sliding log: tokens in the window, and (computed from the log) when
	// a retry can pass and when the log is empty. Quota: curr is the
	// period's count, reset the microseconds until the period ends and
	// periodUS its length.
	used, retry, reset int64
	periodUS           int64

	// slots is what a concurrency zone holds before the request.
	slots int64

	// spares are the tokens a prefetching zone took beyond the cost
	// (after already counts them; see Rule.takeSpares).
	spares int64

	// delay is, for an admitted request of a soft-shedding token bucket,
	// how long it waits before it is passed on, in microseconds
	// (Rule.shedDelay).
	delay int64

	// res is the reserve the request must leave (see Rule.reserveUnits).
	res int64

	// banned: the key is banned for banLeft more microseconds, after
	// banDenials denials. banStarted: this denial started the ban.
	banned, banStarted  bool
	banLeft, banDenials int64
}

// check evaluates a request of cost tokens that must leave res in reserve
// (see reserveUnits) against a bucket in state s at microsecond now. It
// changes nothing. (The sliding log keeps a log, not a State: see
// logCheck.)
func (r *Rule) check(s State, now, cost, res int64) verdict {
	var v verdict
	switch r.alg {
	case FixedWindow:
		v = r.fixedCheck(s, now, cost, res)
	case SlidingWindow:
		v = r.slidingCheck(s, now, cost, res)
	case LeakyBucket:
		v = r.leakyCheck(s, now, cost, res)
	case Concurrency:
		v = r.slotsCheck(s, cost)
	case Quota:
		v = r.quotaCheck(s, now, cost, res)
	default:
		v = r.tbCheck(s, now, cost, res)
	}
	v.res = res
	return v
}

// reserveUnits converts a request's reserve, a share of the zone's
// capacity in percent (0 to 99), into the units its algorithm counts in,
// rounded up: ticks of the burst for the token and leaky buckets, requests
// of the limit for the windows. Concurrency zones take no reserve.
func (r *Rule) reserveUnits(pct int64) int64 {
	switch {
	case pct <= 0 || r.alg == Concurrency:
		return 0
	case pct > 99:
		pct = 99
	}
	if r.alg.windowed() || r.alg == Quota {
		return ceilDiv(r.rate*pct, 100)
	}
	return ceilDiv(r.capacity*pct, 100) // capacity < 2^50: no overflow
}

// reserveTokens is reserveUnits in tokens (the windows: requests) of the
// capacity, rounded up, as a result's Remaining counts them.
func (r *Rule) reserveTokens(pct int64) int64 {
	switch {
	case pct <= 0 || r.alg == Concurrency:
		return 0
	case r.alg.windowed() || r.alg == Quota:
		return ceilDiv(r.rate*min(pct, 99), 100)
	}
	return ceilDiv(r.burst*min(pct, 99), 100)
}

// commit returns the state after charging a request that v admitted at
// microsecond now, and the microsecond from which it counts nothing (the
// window it counts in has passed, or the bucket is full again).
func (r *Rule) commit(v verdict, now, cost int64) (State, int64) {
	switch r.alg {
	case FixedWindow:
		return r.fixedState(now, v.curr+cost+v.spares), now + r.windowUS - v.elapsed
	case SlidingWindow:
		return r.windowState(now, v.prev, v.curr+cost), now + 2*r.windowUS - v.elapsed
	case Concurrency:
		return State(v.slots + cost), math.MaxInt64 // held until refunded
	case Quota:
		return r.quotaCommit(v, now, cost)
	}
	st := r.stateAt(now, v.after)
	return st, st.fullAt()
}

// result turns a verdict into the zone's Result. charged says whether the
// request was admitted by every zone and so charged to this one.
func (r *Rule) result(v verdict, charged bool, cost int64) Result {
	switch {
	case v.banned:
		return Result{Banned: true, RetryAfter: us(v.banLeft), ResetAfter: us(v.banLeft), DryRun: r.dryRun, Allowed: r.dryRun}
	case !v.ok && r.dryRun:
		res := r.algResult(v, false, cost)
		res.Allowed, res.DryRun, res.BanStarted = true, true, v.banStarted
		return res
	case v.banStarted:
		return Result{Banned: true, BanStarted: true, RetryAfter: r.ban.Duration, ResetAfter: r.ban.Duration}
	}
	return r.algResult(v, charged, cost)
}

// algResult is result by the zone's algorithm alone.
func (r *Rule) algResult(v verdict, charged bool, cost int64) Result {
	switch r.alg {
	case FixedWindow:
		return r.fixedResult(v, charged, cost)
	case SlidingWindow:
		return r.slidingResult(v, charged, cost)
	case SlidingLog:
		return r.logResult(v, charged, cost)
	case LeakyBucket:
		return r.leakyResult(v, charged)
	case Concurrency:
		return r.slotsResult(v, charged, cost)
	case Quota:
		return r.quotaResult(v, charged, cost)
	}
	return r.tbResult(v, charged)
}

// cacheable reports whether the deny cache can hold this zone's buckets:
// those whose state is a time relative to now (token and leaky bucket).
// Window states are tied to the store's clock, which a node cannot read;
// slots can be freed at any moment; a dry run denies nothing; a zone whose
// charges are refunded can become fuller than the cache knows; a zone with
// a ban counts every denial in the store (a denial the cache answered
// would count towards no ban): the cache holds its bans instead.
func (r *Rule) cacheable() bool {
	return (r.alg == TokenBucket || r.alg == LeakyBucket) && !r.dryRun && !r.refunds && !r.ban.enabled()
}

// windowState packs a window algorithm's state: the index of the current
// window modulo 1024, and two 21-bit counters (previous, current).
func (r *Rule) windowState(now, prev, curr int64) State {
	idx := (now / r.windowUS) % windowIdxMod
	return State(idx<<(2*counterBits) | prev<<counterBits | curr)
}

// windowCounts unpacks a window state as seen at microsecond now: the
// counts of the previous and current windows (zero for windows the state
// does not know), and the microseconds into the current window.
func (r *Rule) windowCounts(s State, now int64) (prev, curr, elapsed int64) {
	w := now / r.windowUS
	elapsed = now - w*r.windowUS
	if s >= maxWindowState {
		// A token or leaky bucket's state (a time x 1000, far above any
		// packed counters): the zone changed algorithm; start afresh.
		return 0, 0, elapsed
	}
	idx := int64(s) >> (2 * counterBits)
	sPrev := int64(s) >> counterBits & MaxWindowLimit
	sCurr := int64(s) & MaxWindowLimit
	if s == 0 {
		return 0, 0, elapsed
	}
	switch idx {
	case w % windowIdxMod:
		return sPrev, sCurr, elapsed
	case (w - 1) % windowIdxMod:
		return sCurr, 0, elapsed
	}
	return 0, 0, elapsed
}
