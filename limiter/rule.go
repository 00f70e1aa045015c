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

// Rule is one zone's limit: Rate tokens are refilled every Per, into a bucket
// that holds at most Burst tokens. Build it with NewRule; the zero value is
// not usable.
//
// The arithmetic is integer throughout. Time is counted in ticks of 1/Denom
// microsecond, chosen so that the time one token takes to refill (Interval
// ticks) is a whole number: for 3 tokens per second a tick is a third of a
// microsecond and a token takes 1,000,000 ticks, so no rounding ever creeps
// in, however long the bucket runs. Only rules whose per-microsecond rate
// reduces to a denominator above 1000 (say 12345 per second) round the
// interval up to the next 1/1000 microsecond, which can only admit less.
type Rule struct {
	// Name is the zone's name.
	Name string
	// Bucket names the zone's buckets in the stores: the zone's name,
	// and "<name>~log" for a sliding log (a sorted set in Redis, not an
	// integer).
	Bucket string
	// Rate is how many tokens are refilled every Per.
	Rate int64
	// Per is the refill period of Rate tokens.
	Per time.Duration
	// Burst is the bucket's capacity: the most tokens a client can spend at once.
	Burst int64

	// Denom is how many ticks make one microsecond (1 to 1000).
	Denom int64
	// Interval is the refill time of one token, in ticks.
	Interval int64
	// Capacity is Burst tokens in ticks: the most debt the bucket can carry.
	Capacity int64
	// Exact reports whether Interval is exact (true for every rule whose
	// per-microsecond rate reduces to a denominator of at most 1000).
	Exact bool

	// Algorithm is how the zone counts; the zero value is TokenBucket.
	// Build other rules with NewAlgorithmRule.
	Algorithm Algorithm
	// WindowUS is the window of the window algorithms, in microseconds
	// (Per); their limit is Rate per window.
	WindowUS int64
	// MaxDelayUS is how long a leaky bucket lets a request wait, in
	// microseconds.
	MaxDelayUS int64

	// OnError is what the zone does when the store fails (see
	// SetFailurePolicy); the zero value allows.
	OnError Policy
	// Local is the rule of this node's fallback bucket under PolicyLocal
	// (with FleetSize 0: for a fleet of one; see localFor).
	Local *Rule
	// FleetSize is the fleet size Local divides the limit by; 0: the
	// limiter's fleet view tells it.
	FleetSize int64
	// locals caches the local rule for the fleet view's size.
	locals atomic.Pointer[localSized]

	argsOnce sync.Once
	args     []any // scriptArgs
}

// Sentinel errors returned by NewRule.
var (
	ErrBadRate  = errors.New("rate must be a positive integer")
	ErrBadPer   = errors.New("rate period must be at least one microsecond")
	ErrBadBurst = errors.New("burst must be a positive integer")
	ErrTooLarge = errors.New("burst x refill time is too large to count exactly")
)

// NewRule validates and compiles a rule. A burst of 0 means the same as
// rate.
func NewRule(name string, rate int64, per time.Duration, burst int64) (*Rule, error) {
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
	r := &Rule{Name: name, Bucket: name, Rate: rate, Per: per, Burst: burst}
	g := gcd(rate, perUS)
	if den := rate / g; den <= fracScale {
		r.Denom, r.Interval, r.Exact = den, perUS/g, true
	} else {
		// Round the refill interval up to whole thousandths of a
		// microsecond: it can only make the rule stricter.
		r.Denom = fracScale
		if perUS > (1<<62)/fracScale {
			return nil, ErrTooLarge
		}
		r.Interval = (perUS*fracScale + rate - 1) / rate
	}
	if r.Interval > maxTicks/burst {
		return nil, fmt.Errorf("%w: %d tokens of %s each", ErrTooLarge, burst, per/time.Duration(rate))
	}
	r.Capacity = burst * r.Interval
	return r, nil
}

// Window returns the refill period in whole seconds, rounded up (at least 1):
// the "w" of the IETF RateLimit-Policy field.
func (r *Rule) Window() int64 {
	s := int64((r.Per + time.Second - 1) / time.Second)
	if s < 1 {
		s = 1
	}
	return s
}

// String describes the rule for logs and errors.
func (r *Rule) String() string {
	return fmt.Sprintf("%s: %d per %s, burst %d", r.Name, r.Rate, r.Per, r.Burst)
}

func gcd(a, b int64) int64 {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}
