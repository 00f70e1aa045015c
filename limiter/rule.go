package limiter

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// maxTicks bounds every tick count the arithmetic handles (a bucket's
// capacity plus one request's cost), so that the Lua script, whose numbers
// are IEEE doubles, computes the same integers as Go: 2^53 is where doubles
// stop being exact, and the margin keeps sums of two such values exact too.
const maxTicks = 1 << 50

// fracScale is 10^3: the last three decimal digits of a stored bucket value
// hold the sub-microsecond part of its time (see the State type), so a rule's
// tick denominator is at most 1000.
const fracScale = 1000

// Rule is one zone's compiled limit: Rate tokens are refilled every Per,
// into a bucket that holds at most Burst tokens (or, for the window
// algorithms, Rate requests per window of Per), and what the zone does
// when the store fails. Build it with NewRule, which validates and compiles
// everything; a Rule never changes afterwards, and the zero value is not
// usable.
//
// The arithmetic is integer throughout. Time is counted in ticks of 1/denom
// microsecond, chosen so that the time one token takes to refill (interval
// ticks) is a whole number: for 3 tokens per second a tick is a third of a
// microsecond and a token takes 1,000,000 ticks, so no rounding ever creeps
// in, however long the bucket runs. Only rules whose per-microsecond rate
// reduces to a denominator above 1000 (say 12345 per second) round the
// interval up to the next 1/1000 microsecond, which can only admit less.
type Rule struct {
	// name is the zone's name.
	name string
	// bucket names the zone's buckets in the stores (see bucketName).
	bucket string
	// alg is how the zone counts.
	alg Algorithm
	// rate is how many tokens are refilled every per.
	rate int64
	// per is the refill period of rate tokens (the window algorithms:
	// the window).
	per time.Duration
	// burst is the bucket's capacity: the most tokens a client can spend
	// at once (rate for the window algorithms).
	burst int64

	// denom is how many ticks make one microsecond (1 to 1000).
	denom int64
	// interval is the refill time of one token, in ticks.
	interval int64
	// capacity is burst tokens in ticks: the most debt the bucket can carry.
	capacity int64
	// exact reports whether interval is exact (true for every rule whose
	// per-microsecond rate reduces to a denominator of at most 1000).
	exact bool
	// windowUS is the window of the window algorithms, in microseconds
	// (per); their limit is rate per window.
	windowUS int64
	// maxDelayUS is how long a leaky bucket lets a request wait, in
	// microseconds.
	maxDelayUS int64
	// leaseUS is how long a concurrency slot outlives a node that died
	// holding it, in microseconds.
	leaseUS int64
	// period and loc are a quota's calendar period and time zone, and
	// cal the periods it sends Redis around the node's time (quotaArgs).
	period Period
	loc    *time.Location
	cal    atomic.Pointer[quotaWindow]

	// dryRun: the zone decides and counts but never denies.
	dryRun bool
	// refunds: the zone's charges may be refunded (RuleConfig.Refunds).
	refunds bool
	// prefetch is the most tokens one decision may take (cost and
	// spares; 0: none), kept at most prefetchHold (Limiter.decideSpares).
	prefetch     int64
	prefetchHold time.Duration
	// shedPct is the soft shed's threshold in percent of the burst (0:
	// none), shedAt the same as a debt in ticks, and shedMaxUS its
	// longest delay (shedDelay).
	shedPct, shedAt, shedMaxUS int64
	// ban bans a key that the zone denied ban.After times in ban.Window,
	// for ban.Duration (zero: no bans); the same in microseconds.
	ban                          Ban
	banUS, banAfter, banWindowUS int64

	// onError is what the zone does when the store fails.
	onError Policy
	// local is the rule of this node's fallback bucket under PolicyLocal
	// (with fleetSize 0: for a fleet of one; see localFor); nil under the
	// other policies.
	local *Rule
	// fleetSize is the fleet size local divides the limit by; 0: the
	// limiter's fleet view tells it.
	fleetSize int64
	// locals caches the local rule for the fleet view's size.
	locals atomic.Pointer[localSized]

	argsOnce sync.Once
	args     []any // scriptArgs
}

// RuleConfig is a zone's limit as configured: what NewRule validates and
// compiles into a Rule.
type RuleConfig struct {
	// Name is the zone's name; it names the zone's buckets in the stores.
	Name string
	// Algorithm is how the zone counts. Default TokenBucket (the zero
	// value).
	Algorithm Algorithm
	// Rate is how many tokens are refilled every Per (the window
	// algorithms: how many requests a window of Per admits, at most
	// MaxWindowLimit, a fixed window MaxFixedWindowLimit). Required:
	// positive.
	Rate int64
	// Per is the refill period of Rate tokens: at least a microsecond. For
	// the window algorithms it is the window: whole milliseconds, at least
	// 1ms and under 24 days (a fixed window: under 2^40 ms, about 34
	// years). Required.
	Per time.Duration
	// Burst is the bucket's capacity, token and leaky bucket only (the
	// window algorithms take none). Default 0: Rate.
	Burst int64
	// MaxDelay is the longest a leaky bucket lets a request wait for its
	// turn, leaky bucket only. Default 0: DefaultMaxDelay, or as long as
	// the queue (Burst) allows if that is shorter.
	MaxDelay time.Duration
	// OnError is what the zone does when the store fails. Default
	// PolicyLocal, the zero value (DefaultPolicy, as ParsePolicy("")).
	OnError Policy
	// Lease is, for a concurrency zone, how long a slot outlives a node
	// that died holding it (the others refund their slots when their
	// requests end). Concurrency only. Default 0: one minute.
	Lease time.Duration
	// DryRun makes the zone decide and count as if it were enforced (a
	// request it would deny is not charged), but deny nothing: its
	// results carry DryRun where it would have denied.
	DryRun bool
	// Ban bans, for Ban.Duration, a key that the zone denied Ban.After
	// times within Ban.Window. Every denial counts, so a deny cache holds
	// none of the zone's buckets, only its bans. Default: no bans.
	Ban Ban
	// Prefetch lets a node take up to Prefetch tokens from the store in
	// one decision (the request's cost, plus spares if the bucket holds
	// them) and admit the key's next requests from its spares without
	// asking the store. Token bucket and fixed window only. Default 0:
	// none.
	Prefetch int64
	// PrefetchHold is the longest a node keeps unused spares before it
	// refunds them. Default 100ms.
	PrefetchHold time.Duration
	// SoftShed delays, rather than denies, a key that has used more
	// than this share of its burst, in percent (1 to 99): each request
	// the zone admits past it waits the time the rate takes to refill
	// what the request left the bucket owing beyond it, at most
	// SoftShedMaxDelay (see Rule.shedDelay). Token bucket only. Default 0:
	// none.
	SoftShed int64
	// SoftShedMaxDelay is the longest a soft-shedding zone delays a
	// request: from 1us to MaxSoftShedDelay. Default
	// DefaultSoftShedMaxDelay (1s).
	SoftShedMaxDelay time.Duration
	// Refunds says that the zone's charges may be refunded
	// (Limiter.Refund; count_status). A deny cache then holds none of its
	// buckets: another node's refund can make a bucket fuller than the
	// cache could know.
	Refunds bool
	// Period is a quota's calendar period: a day, a week from Monday or
	// a month. Required for Quota, where Rate is the most per period
	// (at most MaxQuota) and Per is not used.
	Period Period
	// Location is the time zone of a quota's periods. Default nil: UTC.
	Location *time.Location
	// FleetSize is, under PolicyLocal, how many nodes share the limit:
	// each node's fallback bucket gets the rate divided by it (for the
	// buckets exactly: the same tokens over a period FleetSize times
	// longer; for the windows, the count per window; for concurrency,
	// the slots) and the burst divided by it, at least 1. Default 0: the
	// limiter's fleet view tells it (see Options.FleetSize), 1 when it
	// has none. Must not be negative; ignored by the other policies.
	FleetSize int64
}

// Sentinel errors returned by NewRule.
var (
	ErrBadRate  = errors.New("rate must be a positive integer")
	ErrBadPer   = errors.New("rate period must be at least one microsecond")
	ErrBadBurst = errors.New("burst must be a positive integer")
	ErrTooLarge = errors.New("burst x refill time is too large to count exactly")
	// ErrBurstNotApplicable: a window algorithm was given a burst.
	ErrBurstNotApplicable = errors.New("burst applies to token_bucket and leaky_bucket only (a window algorithm admits rate per window)")
	// ErrMaxDelayNotApplicable: an algorithm other than the leaky
	// bucket was given a max delay.
	ErrMaxDelayNotApplicable = errors.New("max_delay applies to leaky_bucket only")
	// ErrLeaseNotApplicable: an algorithm other than concurrency was
	// given a lease.
	ErrLeaseNotApplicable = errors.New("lease applies to the concurrency algorithm only")
	// ErrPeriodNotApplicable: an algorithm other than the quota was
	// given a calendar period.
	ErrPeriodNotApplicable = errors.New("a calendar period applies to quotas only")
	// ErrBadBan: a ban whose duration, count or window is not positive.
	ErrBadBan = errors.New("ban needs a positive duration, a positive number of denials and a positive window, in whole milliseconds")
)

// Ban is a zone's ban of repeat offenders: a key that the zone denied After
// times within Window is banned for Duration, across the fleet. While
// banned, the zone denies every request of the key without charging any
// bucket.
type Ban struct {
	// Duration is how long a ban lasts.
	Duration time.Duration
	// After is how many denials within Window start a ban.
	After int64
	// Window is the time in which After denials start a ban.
	Window time.Duration
}

// enabled reports whether the ban is configured.
func (b Ban) enabled() bool { return b.Duration > 0 }

// NewRule validates and compiles a zone's rule: its limit (see
// compileRule) and its failure policy, with the fallback rule of
// PolicyLocal. Errors are the sentinel errors above, ErrWindowLimit,
// ErrWindowLength, ErrMaxDelay, ErrBadFleetSize, the prefetch's and the
// soft shed's, some with details.
func NewRule(cfg RuleConfig) (*Rule, error) {
	switch {
	case cfg.Burst != 0 && cfg.Algorithm.windowed():
		return nil, ErrBurstNotApplicable
	case cfg.MaxDelay != 0 && cfg.Algorithm != LeakyBucket:
		return nil, ErrMaxDelayNotApplicable
	case cfg.Lease != 0 && cfg.Algorithm != Concurrency:
		return nil, ErrLeaseNotApplicable
	case cfg.Burst != 0 && cfg.Algorithm == Concurrency:
		return nil, ErrBurstNotApplicable
	case cfg.Period != 0 && cfg.Algorithm != Quota:
		return nil, ErrPeriodNotApplicable
	}
	r, err := compileRule(cfg)
	if err != nil {
		return nil, err
	}
	if err := r.setBan(cfg.Ban); err != nil {
		return nil, err
	}
	r.dryRun, r.refunds = cfg.DryRun, cfg.Refunds
	if err := r.setPrefetch(cfg.Prefetch, cfg.PrefetchHold); err != nil {
		return nil, err
	}
	if err := r.setSoftShed(cfg.SoftShed, cfg.SoftShedMaxDelay); err != nil {
		return nil, err
	}
	if err := r.setFailurePolicy(cfg.OnError, cfg.FleetSize); err != nil {
		return nil, err
	}
	return r, nil
}

// newBucketRule compiles the limit of a token or leaky bucket: rate tokens
// per period, into a bucket of burst (0 means rate).
func newBucketRule(name string, rate int64, per time.Duration, burst int64) (*Rule, error) {
	if rate <= 0 {
		return nil, ErrBadRate
	}
	perUS := int64(per / time.Microsecond)
	if perUS <= 0 {
		return nil, ErrBadPer
	}
	if burst == 0 {
		burst = rate
	}
	if burst < 0 {
		return nil, ErrBadBurst
	}
	r := &Rule{name: name, bucket: name, rate: rate, per: per, burst: burst}
	g := gcd(rate, perUS)
	if den := rate / g; den <= fracScale {
		r.denom, r.interval, r.exact = den, perUS/g, true
	} else {
		// Round the refill interval up to whole thousandths of a
		// microsecond: it can only make the rule stricter.
		r.denom = fracScale
		if perUS > (1<<62)/fracScale {
			return nil, ErrTooLarge
		}
		r.interval = (perUS*fracScale + rate - 1) / rate
	}
	if r.interval > maxTicks/burst {
		return nil, fmt.Errorf("%w: %d tokens of %s each", ErrTooLarge, burst, per/time.Duration(rate))
	}
	r.capacity = burst * r.interval
	return r, nil
}

// Name returns the zone's name.
func (r *Rule) Name() string { return r.name }

// Bucket returns the name of the zone's buckets in the stores: the zone's
// name, and "<name>~log" for a sliding log (a sorted set in Redis, not an
// integer).
func (r *Rule) Bucket() string { return r.bucket }

// Algorithm returns how the zone counts.
func (r *Rule) Algorithm() Algorithm { return r.alg }

// Rate returns how many tokens are refilled every Per (the window
// algorithms: how many requests a window admits).
func (r *Rule) Rate() int64 { return r.rate }

// Per returns the refill period of Rate tokens, or the window.
func (r *Rule) Per() time.Duration { return r.per }

// Burst returns the bucket's capacity: the most tokens a client can spend
// at once (Rate for the window algorithms).
func (r *Rule) Burst() int64 { return r.burst }

// OnError returns what the zone does when the store fails.
func (r *Rule) OnError() Policy { return r.onError }

// FleetSize returns the fixed fleet size of the local fallback bucket, 0
// when the limiter's fleet view tells it (or the policy is not local).
func (r *Rule) FleetSize() int64 { return r.fleetSize }

// LocalBucket returns the bucket name of this node's fallback bucket under
// PolicyLocal, and "" when the zone has none (another policy).
func (r *Rule) LocalBucket() string {
	if r.local == nil {
		return ""
	}
	return r.local.bucket
}

// DryRun reports whether the zone is a dry run: it decides and counts but
// denies nothing.
func (r *Rule) DryRun() bool { return r.dryRun }

// Ban returns the zone's ban of repeat offenders (zero: none).
func (r *Rule) Ban() Ban { return r.ban }

// DefaultMaxDelay is the longest a leaky bucket lets a request wait for its
// turn when its rule sets no MaxDelay (or its queue's length, if shorter):
// a request parked longer holds a connection and a goroutine for nothing a
// client would still want.
const DefaultMaxDelay = 10 * time.Second

// MaxDelay returns, for a leaky bucket, the longest a request waits for
// its turn (0 for the other algorithms).
func (r *Rule) MaxDelay() time.Duration { return us(r.maxDelayUS) }

// Lease returns how long a concurrency zone's slot outlives a node that
// died holding it (0 for the other algorithms).
func (r *Rule) Lease() time.Duration { return us(r.leaseUS) }

// setBan sets the rule's ban, while NewRule builds it.
func (r *Rule) setBan(b Ban) error {
	if b == (Ban{}) {
		return nil
	}
	ms := time.Millisecond
	if b.Duration < ms || b.After < 1 || b.Window < ms || b.Duration%ms != 0 || b.Window%ms != 0 {
		return ErrBadBan
	}
	r.ban = b
	r.banUS, r.banAfter, r.banWindowUS = int64(b.Duration/time.Microsecond), b.After, int64(b.Window/time.Microsecond)
	return nil
}

// Window returns the refill period in whole seconds, rounded up (at least 1):
// the "w" of the IETF RateLimit-Policy field.
func (r *Rule) Window() int64 {
	s := int64((r.per + time.Second - 1) / time.Second)
	if s < 1 {
		s = 1
	}
	return s
}

// String describes the rule for logs and errors.
func (r *Rule) String() string {
	return fmt.Sprintf("%s: %d per %s, burst %d", r.name, r.rate, r.per, r.burst)
}

func gcd(a, b int64) int64 {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}

// maxCost is the largest cost a request of the rule is decided with: one
// more than the most the rule can ever admit at once (the burst, the
// window's limit, or the concurrency limit), so that such a request is
// still never admitted, and sums of costs stay far from overflowing.
func (r *Rule) maxCost() int64 { return max(r.rate, r.burst) + 1 }

// boundCosts bounds, in place, every request's cost to [0, maxCost] before
// any arithmetic sees it: a client-chosen cost (`cost {header.X-Tokens}`)
// of 2^63-1 is denied as never admissible, as any cost above the burst
// is, instead of wrapping a sum negative.
func boundCosts(reqs []Request) {
	for i := range reqs {
		if c := reqs[i].Cost; c < 0 || c > reqs[i].Rule.maxCost() {
			reqs[i].Cost = min(max(c, 0), reqs[i].Rule.maxCost())
		}
	}
}
