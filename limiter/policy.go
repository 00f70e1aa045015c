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
	// fleet stays about within the limit while the store is away.
	PolicyLocal
)

// ParsePolicy parses "allow", "deny" or "local" ("" is allow).
func ParsePolicy(s string) (Policy, error) {
	switch s {
	case "", "allow":
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

// ErrBadFleetSize is returned for a fleet size below 1.
var ErrBadFleetSize = errors.New("fleet_size must be a positive integer")

// SetFailurePolicy sets what the zone does when the store fails. For
// PolicyLocal, fleetSize is how many nodes share the limit: each node's
// local bucket gets the rate divided by it (for the buckets exactly: the
// same tokens over a period fleetSize times longer; for the windows, the
// count per window) and the burst divided by it, at least 1.
func (r *Rule) SetFailurePolicy(p Policy, fleetSize int64) error {
	r.OnError = p
	r.Local = nil
	if p != PolicyLocal {
		return nil
	}
	if fleetSize < 1 {
		return ErrBadFleetSize
	}
	// Buckets: the same tokens over a period fleetSize times longer.
	// Windows: the window stays, the count is divided.
	rate, per := r.Rate, r.Per*time.Duration(fleetSize)
	if r.Algorithm.windowed() {
		rate, per = max(1, r.Rate/fleetSize), r.Per
	}
	local, err := NewAlgorithmRule(r.Name+"#local", r.Algorithm, rate, per, max(1, r.Burst/fleetSize), time.Duration(r.MaxDelayUS)*time.Microsecond)
	if err != nil {
		return fmt.Errorf("local bucket for fleet_size %d: %w", fleetSize, err)
	}
	r.Local = local
	return nil
}
