package limiter

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.uber.org/zap"
)

// The outage fallback, a decision's third layer (Limiter.decideStore): the
// store call, and each zone's failure policy when the store cannot decide.

// decideStore is a decision's third layer, the outage fallback around the
// store: it charges the store first for what this node admitted locally
// during an outage, asks the store, and when the store cannot decide
// applies each zone's failure policy (fail), local buckets included.
func (l *Limiter) decideStore(ctx context.Context, reqs []Request, results []Result) Outcome {
	if l.out.pending.Load() > 0 { // the outage ledger's charges first
		if l.returning(reqs) {
			for i := range results {
				results[i] = Result{Allowed: true, Unknown: true}
			}
			return l.decideLocal(ctx, reqs, results)
		}
		if l.awayWithCharges(reqs) {
			// As good as an open breaker: the store is not called.
			l.observeStore(l.observeStart(), errAwayWithCharges)
			return l.fail(ctx, reqs, results, errAwayWithCharges)
		}
		if err := l.settle(ctx, reqs); err != nil {
			if errors.Is(err, context.Canceled) && ctx.Err() != nil {
				return Canceled
			}
			return l.fail(ctx, reqs, results, err)
		}
	}
	start := l.observeStart()
	ok, err := l.store.Decide(ctx, reqs, results)
	l.observeStore(start, err)
	l.setStoreUp(err == nil)
	if err == nil && l.out.pending.Load() > 0 {
		l.flushCharges() // the store is back: charge every key
	}
	switch {
	case err == nil && ok:
		return Allowed
	case err == nil:
		l.noteBans(reqs, results) // a ban starts on a denial
		return Denied
	case errors.Is(err, context.Canceled) && ctx.Err() != nil:
		return Canceled
	}
	return l.fail(ctx, reqs, results, err)
}

// breakered is a store with a circuit breaker.
type breakered interface{ Breaker() *Breaker }

// fail applies the zones' failure policies to a request the store could
// not decide: deny wins over local, local over allow. A dry-run zone
// denies nothing, so its deny policy fails nothing closed.
func (l *Limiter) fail(ctx context.Context, reqs []Request, results []Result, err error) Outcome {
	l.failed.Add(1)
	if l.out.pending.Load() == 0 {
		l.ledgerQuotas() // an outage begins
	}
	if !errors.Is(err, ErrBreakerOpen) {
		l.lastCause.Store(&err)
	}
	l.logFailure(err)
	deny, local := false, false
	for i := range reqs {
		switch reqs[i].Rule.onError {
		case PolicyDeny:
			deny = deny || !reqs[i].Rule.dryRun
		case PolicyLocal:
			local = local || reqs[i].Rule.local != nil
		}
		results[i] = Result{Allowed: true, Unknown: true}
	}
	switch {
	case deny:
		retry := time.Second
		if b, ok := l.store.(breakered); ok && b.Breaker() != nil {
			retry = max(retry, b.Breaker().RetryAfter())
		}
		for i := range reqs {
			if reqs[i].Rule.onError == PolicyDeny && !reqs[i].Rule.dryRun {
				results[i] = Result{RetryAfter: retry, Unknown: true}
			}
		}
		return FailedClosed
	case local && l.local != nil:
		return l.decideLocal(ctx, reqs, results)
	}
	return FailedOpen
}

// decideLocal decides the zones with the local policy on this node's
// fallback buckets (each request as it is, reserve included, on the local
// rule); the other zones stay Unknown.
func (l *Limiter) decideLocal(ctx context.Context, reqs []Request, results []Result) Outcome {
	var reqBuf [8]Request
	var resBuf [8]Result
	var idxBuf [8]int
	var owedBuf [8]*owed
	lreqs, idx, ledger := reqBuf[:0], idxBuf[:0], owedBuf[:0]
	view := l.fleetSize()
	for i := range reqs {
		if r := reqs[i].Rule; r.onError == PolicyLocal && r.local != nil {
			local, divisor := r.localFor(view)
			l.logFallback(r, divisor)
			var e *owed
			if r.remembered() {
				e = l.seed(&reqs[i], local, divisor)
			}
			q := reqs[i]
			q.Rule = local
			lreqs = append(lreqs, q)
			idx = append(idx, i)
			ledger = append(ledger, e)
		}
	}
	lres := resBuf[:]
	if len(lreqs) > len(lres) {
		lres = make([]Result, len(lreqs))
	}
	lres = lres[:len(lreqs)]
	ok, err := l.local.Decide(ctx, lreqs, lres)
	if err != nil {
		return FailedOpen
	}
	for j, i := range idx {
		results[i] = lres[j]
		results[i].owed = 0
	}
	if ok {
		for j, e := range ledger {
			if e != nil {
				l.out.admittedLocally(e, lreqs[j].Cost)
			}
		}
		return LocalAllowed
	}
	return LocalDenied
}

// fallbackQuiet is how long no decision falls back to local buckets before
// the next fallback is logged as a new start.
const fallbackQuiet = 10 * time.Second

// logFallback logs, when a fallback to local buckets starts, the divisor
// of the zone's limit on this node.
func (l *Limiter) logFallback(r *Rule, divisor int64) {
	now := time.Now().UnixNano()
	last := l.lastLocal.Load()
	if now-last < int64(time.Second) {
		return // logged or refreshed within the second: nothing new
	}
	if !l.lastLocal.CompareAndSwap(last, now) || now-last < int64(fallbackQuiet) {
		return
	}
	source := "the largest fleet the fleet view saw in the last " + divisorWindow.String()
	switch {
	case r.fleetSize > 0:
		source = "fleet_size"
	case divisor == 1:
		// A node started during the outage knows no fleet yet.
		l.log.Warn("rate limit local fallback divides by 1: this node saw no other node lately and the zone sets no fleet_size; "+
			"each node may admit the whole limit until Redis returns (set fleet_size to bound it)",
			zap.String("zone", r.name))
		source = "no fleet view and no fleet_size"
	}
	l.log.Warn("rate limit store cannot decide; zones with on_error local limit on this node's own buckets",
		zap.String("zone", r.name), zap.Int64("divisor", divisor), zap.String("divisor_from", source),
		zap.Int64("node_rate", max(1, r.rate/divisor)), zap.Duration("per", r.per))
}

// Failures returns how many decisions failed over to the policy so far.
func (l *Limiter) Failures() uint64 { return l.failed.Load() }

// logFailure logs a store error, at most once a second, with the number of
// failures since the previous line.
func (l *Limiter) logFailure(err error) {
	now := time.Now().UnixNano()
	last := l.lastLog.Load()
	if now-last < int64(time.Second) || !l.lastLog.CompareAndSwap(last, now) {
		return
	}
	if errors.Is(err, ErrBreakerOpen) {
		if cause := l.lastCause.Load(); cause != nil {
			err = fmt.Errorf("%w, after: %w", err, *cause)
		}
	}
	msg := "rate limit store failed; each zone applies its failure policy (local unless set)"
	switch {
	case IsOOM(err):
		msg = "Redis is out of memory: its maxmemory is reached and its maxmemory-policy refuses new buckets " +
			"(set maxmemory-policy volatile-ttl); each zone applies its failure policy (local unless set)"
	case IsAuth(err):
		msg = "Redis refuses the rate limit store's credentials or commands; each zone applies its failure policy (local unless set)"
	}
	l.log.Warn(msg, zap.Error(err), zap.Uint64("failures_total", l.failed.Load()))
}

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
