package limiter

import (
	"errors"
	"fmt"
	"time"
)

// Policy is what a zone does when the store cannot decide.
type Policy uint8

// The failure policies.
//
// PolicyLocal is the zero value, so that a rule built without naming a
// policy keeps limiting when the store fails, as a configuration without
// on_error does.
const (
	// PolicyLocal decides against an in-memory bucket on this node with
	// the zone's rate and burst divided by the fleet size, so that the
	// fleet stays about within the limit while the store is away. The
	// default.
	PolicyLocal Policy = iota
	// PolicyAllow lets the request pass unlimited (fail open).
	PolicyAllow
	// PolicyDeny rejects the request (fail closed): 503, the store failed.
	PolicyDeny
)

// DefaultPolicy is the failure policy of a zone that names none: a limiter
// keeps limiting, on each node's share of the limit, when Redis cannot
// decide (an attacker who can overload Redis or the nodes does not switch
// the limits off).
const DefaultPolicy = PolicyLocal

// ParsePolicy parses "allow", "deny" or "local" ("" is DefaultPolicy).
func ParsePolicy(s string) (Policy, error) {
	switch s {
	case "":
		return DefaultPolicy, nil
	case "allow":
		return PolicyAllow, nil
	case "deny":
		return PolicyDeny, nil
	case "local":
		return PolicyLocal, nil
	}
	return 0, fmt.Errorf("unknown failure policy %q (want allow, deny or local)", s)
}

// String names the policy.
func (p Policy) String() string {
	switch p {
	case PolicyDeny:
		return "deny"
	case PolicyLocal:
		return "local"
	}
	return "allow"
}

// ErrBadFleetSize is returned for a negative fleet size.
var ErrBadFleetSize = errors.New("fleet_size must be a positive integer")

// setFailurePolicy sets, while NewRule builds the rule, what the zone does
// when the store fails, and for PolicyLocal the rule of the fallback
// bucket (see RuleConfig.FleetSize): for a fleetSize of 0 the rule for 1,
// the others being built by localFor.
func (r *Rule) setFailurePolicy(p Policy, fleetSize int64) error {
	if fleetSize < 0 {
		return ErrBadFleetSize
	}
	r.onError = p
	if p != PolicyLocal {
		return nil
	}
	local, err := r.localRule(max(1, fleetSize))
	if err != nil {
		return fmt.Errorf("local bucket for fleet_size %d: %w", fleetSize, err)
	}
	r.local, r.fleetSize = local, fleetSize
	return nil
}

// localRule builds the rule of a local bucket for a fleet of n nodes. It
// is a dry run when the zone is, and bans and sheds softly as the zone
// does.
func (r *Rule) localRule(n int64) (*Rule, error) {
	// Buckets: the same tokens over a period n times longer.
	// Windows: the window stays, the count is divided.
	// Concurrency: the lease stays, the slots are divided.
	rate, per := r.rate, r.per*time.Duration(n)
	if r.alg.windowed() || r.alg == Concurrency {
		rate, per = max(1, r.rate/n), r.per
	}
	cfg := RuleConfig{Name: r.name + "#local", Algorithm: r.alg, Rate: rate, Per: per,
		MaxDelay: time.Duration(r.maxDelayUS) * time.Microsecond}
	switch {
	case r.alg == Quota:
		// The calendar stays, the quota is divided.
		cfg.Rate, cfg.Per, cfg.Period, cfg.Location = max(1, r.rate/n), 0, r.period, r.loc
	case r.alg == Concurrency:
		cfg.Lease = r.per
	case !r.alg.windowed():
		cfg.Burst = max(1, r.burst/n)
	}
	local, err := compileRule(cfg)
	if err != nil {
		return nil, err
	}
	local.dryRun = r.dryRun
	// The fallback bucket sheds softly as the zone does, from its own
	// (divided) burst.
	if err := local.setSoftShed(r.shedPct, us(r.shedMaxUS)); err != nil {
		return nil, err
	}
	// A key that offends on this node's buckets is banned here, for the
	// zone's time: an outage is no amnesty. (Bans this node learned from
	// Redis before it went away stay in its deny cache.)
	if err := local.setBan(r.ban); err != nil {
		return nil, err
	}
	return local, nil
}

// maxFleetDivisor bounds the fleet size a fleet view can set: the local
// rules of larger fleets are built for this many nodes (a stricter limit
// per node would not be stricter in practice: the burst is at least 1).
const maxFleetDivisor = 1 << 16

// localSized is a local rule and the fleet size it was built for.
type localSized struct {
	n    int64
	rule *Rule
}

// localFor returns the rule of this node's fallback bucket when fleetView
// nodes were seen lately: r.local when the fleet size is fixed, otherwise a
// rule for fleetView nodes, built once per change of the fleet's size.
func (r *Rule) localFor(fleetView int64) (rule *Rule, divisor int64) {
	if r.fleetSize > 0 || r.local == nil {
		return r.local, max(1, r.fleetSize)
	}
	n := min(max(1, fleetView), maxFleetDivisor)
	if n == 1 {
		return r.local, 1
	}
	if l := r.locals.Load(); l != nil && l.n == n {
		return l.rule, n
	}
	local, err := r.localRule(n)
	if err != nil { // too fine to count: keep the coarser rule
		return r.local, 1
	}
	r.locals.Store(&localSized{n: n, rule: local})
	return local, n
}
