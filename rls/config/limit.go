package config

import (
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/fleetlimit/caddy-fleetlimit/limiter"
)

// Limit is a rule that applies to descriptors: a rate_limit of the
// configuration, or a request's own override (Config.Override). A Limit
// that Config.Match returns is shared by every request that matches it and
// must not be changed.
type Limit struct {
	// Domain is the domain the rule belongs to.
	Domain string
	// FullKey names the rule as the reference names it: the domain and,
	// for each level down to the rule, its key or key_value, joined by
	// dots ("api.remote_address", "api.user_alice.path_/login"). For an
	// override it is made of the request's entries.
	FullKey string
	// Source says where the rule is written: "file:line" of its
	// descriptor, or the xDS resource and the descriptor's path in it.
	// Empty for an override.
	Source string

	// Name is the rule's name, which other rules' Replaces refer to; ""
	// when it has none.
	Name string
	// RequestsPerUnit is how many requests the rule admits per Unit. 0
	// admits none (as in the reference, where a rule of 0 bans).
	RequestsPerUnit uint32
	// Unit is the rate's time unit: UnitUnknown only for an unlimited rule
	// and for a rule with a Zone.
	Unit Unit
	// Unlimited marks a rule that admits everything; the reference reports
	// it with a limit_remaining of the largest uint32.
	Unlimited bool
	// Replaces are the names of rules that this rule switches off when
	// both match descriptors of one request (see DropReplaced).
	Replaces []string
	// ShadowMode: the rule counts and reports, but denies nothing.
	ShadowMode bool
	// QuotaMode: the rule's denial does not deny the request on its own; a
	// request is over the limit only when all its quota rules are.
	QuotaMode bool
	// DetailedMetric: the rule's statistics are kept per value of the
	// request's entries (see MetricKey).
	DetailedMetric bool
	// Metadata is the descriptor's metadata, for a response's dynamic
	// metadata; nil when it has none.
	Metadata *structpb.Struct

	// Algorithm is how the rule counts (extension "algorithm"). Default
	// limiter.FixedWindow, one window per Unit, as the reference counts.
	Algorithm limiter.Algorithm
	// Burst is the bucket's capacity for limiter.TokenBucket and
	// limiter.LeakyBucket (extension "burst"); 0: RequestsPerUnit.
	Burst int64
	// Zone names the Caddy rate_limit zone whose buckets the rule spends
	// (extension "zone"), "" when none. The service resolves it.
	Zone string

	// Override marks a limit that a request's descriptor gave itself.
	Override bool

	// path holds the configuration's levels from the domain's first down
	// to the rule's own, for the keys of a match (MetricKey, CounterValue).
	// Nil for an override.
	path []*node
}

// defaultAlgorithm is how a rule counts unless it names an algorithm: as
// the reference, in fixed windows of its unit.
const defaultAlgorithm = limiter.FixedWindow

// Depth returns how many entries a descriptor has when it matches the rule:
// the levels from the domain down to the rule. 0 for an override, which
// takes any number.
func (l *Limit) Depth() int { return len(l.path) }
