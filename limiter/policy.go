package limiter

import (
	"errors"
	"fmt"
	"time"
)

// Policy is what a zone does when the store cannot decide.
type Policy uint8

// The failure policies.
const (
	// PolicyAllow lets the request pass unlimited (fail open).
	PolicyAllow Policy = iota
	// PolicyDeny rejects the request (fail closed): 503, the store failed.
	PolicyDeny
	// PolicyLocal decides against an in-memory bucket on this node with
	// the zone's rate and burst divided by the fleet size, so that the
	// fleet stays about within the limit while the store is away. The
	// default.
	PolicyLocal
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

// SetFailurePolicy sets what the zone does when the store fails. For
// PolicyLocal, fleetSize is how many nodes share the limit: each node's
// local bucket gets the rate divided by it (for the buckets exactly: the
// same tokens over a period fleetSize times longer; for the windows, the
// count per window) and the burst divided by it, at least 1. A fleetSize
// of 0 leaves the divisor to the limiter: the nodes its fleet view saw
// lately (see Options.FleetSize), 1 when it has none; Local is then the
// rule for 1.
func (r *Rule) SetFailurePolicy(p Policy, fleetSize int64) error {
	r.OnError = p
	r.Local, r.FleetSize = nil, 0
	r.locals.Store(nil)
	if p != PolicyLocal {
		return nil
	}
	if fleetSize < 0 {
		return ErrBadFleetSize
	}
	local, err := r.localRule(max(1, fleetSize))
	if err != nil {
		return fmt.Errorf("local bucket for fleet_size %d: %w", fleetSize, err)
	}
	r.Local, r.FleetSize = local, fleetSize
	return nil
}

// localRule builds the rule of a local bucket for a fleet of n nodes.
func (r *Rule) localRule(n int64) (*Rule, error) {
	// Buckets: the same tokens over a period n times longer.
	// Windows: the window stays, the count is divided.
	rate, per := r.Rate, r.Per*time.Duration(n)
	if r.Algorithm.windowed() {
		rate, per = max(1, r.Rate/n), r.Per
	}
	return NewAlgorithmRule(r.Name+"#local", r.Algorithm, rate, per, max(1, r.Burst/n), time.Duration(r.MaxDelayUS)*time.Microsecond)
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
// nodes were seen lately: Local when the fleet size is fixed, otherwise a
// rule for fleetView nodes, built once per change of the fleet's size.
func (r *Rule) localFor(fleetView int64) (rule *Rule, divisor int64) {
	if r.FleetSize > 0 || r.Local == nil {
		return r.Local, max(1, r.FleetSize)
	}
	n := min(max(1, fleetView), maxFleetDivisor)
	if n == 1 {
		return r.Local, 1
	}
	if l := r.locals.Load(); l != nil && l.n == n {
		return l.rule, n
	}
	local, err := r.localRule(n)
	if err != nil { // too fine to count: keep the coarser rule
		return r.Local, 1
	}
	r.locals.Store(&localSized{n: n, rule: local})
	return local, n
}
