package limiter

import (
	"context"
	"errors"
	"net"

	"github.com/redis/go-redis/v9"

	"github.com/fleetlimit/caddy-fleetlimit/lua"
)

// Charge is what a node's local fallback admitted from one key's bucket
// while the store could not decide, to be charged to the store's bucket
// when it answers again.
type Charge struct {
	// Rule is the zone's rule (not its local one): it names the bucket.
	Rule *Rule
	// Key is the client key.
	Key string
	// Ticks is the charge in the rule's ticks (a token is the rule's
	// refill interval in ticks); a quota's, in requests.
	Ticks int64
}

// charger is a store that takes charges: the Redis store.
type charger interface {
	Charge(ctx context.Context, charges []Charge) error
}

// Charge charges each key's bucket what the local fallback admitted from it
// (token and leaky buckets), or a settlement (settle.go: token buckets and
// quotas); the others are skipped: one script call per
// key, queued like refunds and sent together, bounded by the store's
// timeout. A charge may leave a bucket in debt beyond its capacity: the
// key's next requests then wait for the refill the outage already spent.
// It goes through the circuit breaker as a decision does, and returns the
// first error.
func (s *RedisStore) Charge(ctx context.Context, charges []Charge) error {
	allowed, probe := s.breaker.allow()
	if !allowed {
		return ErrBreakerOpen
	}
	ctx, cancel := s.timeoutContext(ctx)
	defer cancel()
	calls := make([]*call, 0, len(charges))
	for _, ch := range charges {
		if ch.Ticks <= 0 || !ch.Rule.chargeable() {
			continue
		}
		calls = append(calls, &call{
			script: s.refund,
			done:   make(chan struct{}, 1),
			keys:   []string{s.Key(ch.Rule.bucket, ch.Key)},
			rules:  []*Rule{ch.Rule},
			costs:  []int64{1},
			aux:    []any{lua.ChargeAux - min(ch.Ticks, lua.MaxChargeDebt)},
		})
	}
	var firstErr error
	for _, err := range s.sendAll(ctx, calls) {
		firstErr = orErr(firstErr, err)
	}
	switch {
	case firstErr == nil:
		if s.breaker.succeed() {
			s.bans.breakerClosed() // breakerclose.go
		}
	case probe:
		s.breaker.Failure()
	}
	return firstErr
}

// Charge charges each key's bucket as the Redis store's Charge does, with
// the same arithmetic as the refund script's charge mode: a token or leaky
// bucket may be left owing more than its capacity, at most
// lua.MaxChargeDebt ticks; a quota's current period counts the charge
// (settle.go). It never fails.
func (s *MemoryStore) Charge(_ context.Context, charges []Charge) error {
	for _, ch := range charges {
		r := ch.Rule
		if ch.Ticks <= 0 || !r.chargeable() {
			continue
		}
		id := s.hash.id(r.bucket, ch.Key)
		sh := &s.shards[id.shard()]
		sh.mu.Lock()
		now := s.now()
		e, ok := sh.m.get(id)
		if !ok || e.expires <= now {
			e.state = 0
		}
		if limit := int(s.perShard.Load()); limit > 0 && !ok {
			s.makeRoom(sh, limit, now)
		}
		var st State
		var expires int64
		if r.alg == Quota {
			st, expires = r.quotaCharge(e.state, now, ch.Ticks)
		} else {
			debt := r.debt(e.state, now) + r.over(e.state, now)
			st = r.stateAt(now, min(debt+min(ch.Ticks, lua.MaxChargeDebt), lua.MaxChargeDebt))
			expires = st.fullAt()
		}
		sh.m.put(id, memEntry{state: st, expires: expires})
		sh.mu.Unlock()
	}
	return nil
}

// chargeable reports whether a Charge applies to the rule's buckets: the
// token and leaky buckets (in ticks), and quotas (settlements, in
// requests).
func (r *Rule) chargeable() bool {
	return r.alg == TokenBucket || r.alg == LeakyBucket || r.alg == Quota
}

// pinger is a store that can tell whether it answers without deciding
// anything: the Redis store.
type pinger interface {
	Ping(ctx context.Context) error
}

// Ping asks Redis whether it answers (a PING), through the circuit breaker
// as a decision would go, within the store's timeout. A node with charges
// to make probes the store this way rather than with a request, which
// Redis would decide ahead of the charges.
func (s *RedisStore) Ping(ctx context.Context) error {
	if _, probe := s.breaker.allow(); !probe && s.breaker.State() != BreakerClosed {
		return ErrBreakerOpen
	}
	ctx, cancel := s.timeoutContext(ctx)
	defer cancel()
	var refused redis.Error // Redis answered, if only to refuse: it is up
	if err := s.client.Ping(ctx).Err(); err != nil && !errors.As(err, &refused) {
		s.breaker.Failure()
		var nerr net.Error
		switch {
		case ctx.Err() != nil:
			return s.ctxErr(ctx)
		case errors.As(err, &nerr) && nerr.Timeout(): // the socket's deadline: the context's
			return s.errTimeout
		}
		return err
	}
	if s.breaker.succeed() {
		s.bans.breakerClosed() // breakerclose.go
	}
	return nil
}
