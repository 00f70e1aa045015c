package limiter

import (
	"context"
	"errors"
	"time"
)

// Settlements: the difference between a request's up-front cost and its real
// one, charged or refunded after the response.

// settleAttempts is how many times a settlement's charge is sent at most.
const settleAttempts = 3

// settleBackoff is the wait before each further attempt of a charge.
var settleBackoff = [settleAttempts - 1]time.Duration{250 * time.Millisecond, time.Second}

// ErrNotSettled is the error of a settlement whose charge the store failed
// settleAttempts times: it is lost.
var ErrNotSettled = errors.New("settlement not applied: the store failed every attempt")

// Settlement is what Settle did.
type Settlement struct {
	// Tokens is the difference settled: charged when positive, refunded
	// when negative; 0 when there was none.
	Tokens int64
	// Capped reports that the real cost exceeded the up-front cost by
	// more than the zone's burst: the charge is capped at the burst.
	Capped bool
	// Attempts is how many store calls the settlement took.
	Attempts int
	// Local reports that the request was decided, and settled, on this
	// node's fallback bucket.
	Local bool
}

// SettleObserver is an Observer that also learns of settlements: tokens
// charged (positive) or refunded (negative), and err when the store
// failed (the settlement is lost, or a refund dropped).
type SettleObserver interface {
	Settled(rule *Rule, tokens int64, err error)
}

// SettleTokens returns the difference a request of cost upfront whose
// real cost is real settles in zone r: real - upfront (a negative real
// counts as 0), capped at r's burst, and whether it was capped. It cannot
// overflow, whatever real a hostile upstream reports.
func SettleTokens(r *Rule, upfront, real int64) (tokens int64, capped bool) {
	upfront, real = max(upfront, 0), max(real, 0)
	if real-upfront > r.burst {
		return r.burst, true
	}
	return real - upfront, false
}

// Settle settles the real cost of an admitted request in one token bucket
// zone or quota (a quota's count: see quotaCharge): q and res are the zone's request and result as Decide left them
// (q.Cost is the cost it was admitted on), outcome the request's, and real
// the cost its response reported. It charges or refunds the difference
// (see SettleTokens) where the request was decided: the store (Allowed),
// or this node's fallback bucket and the outage's ledger (LocalAllowed).
// A zone that was not charged (not consulted, a dry run, a failure policy
// that let the request through) settles nothing. Call it after the
// response, not on its path: a charge that fails is sent again, for up to
// about two seconds, before it is lost (ErrNotSettled).
func (l *Limiter) Settle(ctx context.Context, outcome Outcome, q Request, res Result, real int64) (Settlement, error) {
	r := q.Rule
	if r == nil || (r.alg != TokenBucket && r.alg != Quota) || r.dryRun || res.Unknown || res.DryRun ||
		(outcome != Allowed && outcome != LocalAllowed) {
		return Settlement{}, nil
	}
	q.Cost = min(max(q.Cost, 0), r.maxCost())
	st := Settlement{Local: outcome == LocalAllowed}
	st.Tokens, st.Capped = SettleTokens(r, q.Cost, real)
	if st.Tokens == 0 {
		return st, nil
	}
	var err error
	if st.Local {
		err = l.settleLocal(ctx, q, res, &st)
	} else {
		err = l.settleStore(ctx, q, res, &st)
	}
	l.settled.Add(1)
	if err != nil {
		l.settleLost.Add(1)
	}
	if so, ok := l.obs.(SettleObserver); ok {
		so.Settled(r, st.Tokens, err)
	}
	return st, err
}

// settleStore applies a settlement to the store's bucket: a refund once, a
// charge up to settleAttempts times.
func (l *Limiter) settleStore(ctx context.Context, q Request, res Result, st *Settlement) error {
	if st.Tokens < 0 {
		st.Attempts++
		q.Cost = -st.Tokens
		return l.store.Refund(ctx, []Request{q}, []Result{res})
	}
	ch, ok := l.store.(charger)
	if !ok {
		return nil
	}
	charges := []Charge{{Rule: q.Rule, Key: q.Key, Ticks: q.Rule.chargeUnits(st.Tokens)}}
	var err error
	for a := range settleAttempts {
		if a > 0 {
			t := time.NewTimer(settleBackoff[a-1])
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				return errors.Join(ErrNotSettled, err)
			}
		}
		st.Attempts++
		if err = ch.Charge(ctx, charges); err == nil {
			return nil
		}
	}
	return errors.Join(ErrNotSettled, err)
}

// settleLocal applies a settlement of a request decided on this node's
// fallback bucket: to that bucket, and to the outage's ledger, which
// charges the store with the rest when it answers again. A key no longer
// in the ledger (its charge already went in, or a full ledger left it out)
// has a charge settled on the store's bucket too.
func (l *Limiter) settleLocal(ctx context.Context, q Request, res Result, st *Settlement) error {
	r := q.Rule
	m, ok := l.local.(*MemoryStore)
	if !ok || r.onError != PolicyLocal || r.local == nil {
		return nil
	}
	o := &l.out
	o.mu.Lock()
	e := o.entries[outageKey{r.bucket, q.Key}]
	local := r.local
	if e != nil {
		o.add(e, st.Tokens)
		local = e.local
	} else {
		local, _ = r.localFor(l.fleetSize())
	}
	o.mu.Unlock()
	st.Attempts++
	if st.Tokens > 0 {
		_ = m.Charge(ctx, []Charge{{Rule: local, Key: q.Key, Ticks: local.chargeUnits(st.Tokens)}})
		if e == nil {
			return l.settleStore(ctx, q, res, st)
		}
		return nil
	}
	q.Rule, q.Cost = local, -st.Tokens
	return m.Refund(ctx, []Request{q}, []Result{res})
}

// chargeUnits returns tokens in the units of a Charge of the rule: ticks of
// a bucket, requests of a quota.
func (r *Rule) chargeUnits(tokens int64) int64 {
	if r.alg == Quota {
		return tokens
	}
	return tokens * r.interval
}

// Settlements returns how many settlements the limiter applied or tried,
// and how many of them the store failed (lost charges, dropped refunds).
func (l *Limiter) Settlements() (settled, lost uint64) {
	return l.settled.Load(), l.settleLost.Load()
}
