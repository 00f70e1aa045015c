package limiter

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetlimit/caddy-fleetlimit/lua"
)

// The Redis store's side of an outage's charges: Charge and Ping, and the
// barrier that counts the nodes whose charges are in.

// returnGraceMax is the longest a node that finds Redis back keeps
// deciding the local zones' keys on its local buckets, waiting for the
// other nodes' charges.
const returnGraceMax = 2 * time.Second

// chargedWindow is how long a node's entry in the set of nodes whose
// charges are in counts: longer than returnGraceMax, so that the first
// node back still counts when the last one arrives. An outage that ends
// within it of the previous one finds the previous entries, and ends the
// grace early.
const chargedWindow = 2 * returnGraceMax

// chargingMsg is the ban channel's message that a node is back from an
// outage with charges to make.
const chargingMsg = "!charging"

// chargedPoll is how often a node in its grace counts the nodes whose
// charges are in.
const chargedPoll = 50 * time.Millisecond

// chargedShared is how recently a record of this node in the set must
// have come back for the store's limiters that poll the set to share it:
// under chargedPoll, so that each limiter's poll still reads a count newer
// than its last.
const chargedShared = chargedPoll / 2

// chargedAnswerEvery is the least time between two of a node's answers to
// chargingMsg. An entry counts for chargedWindow from when it was sent, and
// a grace lasts returnGraceMax from before its announcement, so an entry
// sent within chargedAnswerEvery of an announcement counts through its
// grace.
const chargedAnswerEvery = chargedWindow - returnGraceMax

// newNodeID returns a random id for a store, that tells this node's
// entries in Redis from the other nodes'.
func newNodeID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// chargedKey returns the Redis key of the set of nodes whose charges are
// in. It ends with a character other than a brace, so no bucket's key
// (which ends with its hash tag) can be it.
func (s *RedisStore) chargedKey() string { return s.prefix + "outage:{outage}!charged" }

// chargedScript is the outage barrier's script, loaded on first use.
var chargedScript = redis.NewScript(lua.Charged)

// ChargesIn records, within the store's timeout, that this node's charges
// are in, and returns how many nodes' are (the entries of the last
// chargedWindow): one call of the charged script, which scores the entries
// by Redis TIME, so that a node whose clock is off is counted all the same
// and leaves no entry that outlives the window. (The store's test Clock
// does not reach it either: the barrier is no bucket.) A record that went
// in less than chargedShared ago stands for a new one: its count is
// returned.
func (s *RedisStore) ChargesIn(ctx context.Context) (int64, error) {
	return s.barrier.record(ctx, s, 0, chargedShared)
}

// nodeBarrier is a store's side of the outage barrier: its last record in
// the set of nodes whose charges are in.
type nodeBarrier struct {
	mu sync.Mutex // held across a record: concurrent callers share one
	// sent and done are when the last record that went in was sent and
	// when its reply came (zero: none); n is the count it returned.
	sent, done time.Time
	n          int64
	// answering is set while an answer to chargingMsg is in flight.
	answering atomic.Bool
}

// record records this node in the set and returns the count, unless the
// last record was sent less than sentWithin ago or came back less than
// doneWithin ago: then it returns that record's count.
func (b *nodeBarrier) record(ctx context.Context, s *RedisStore, sentWithin, doneWithin time.Duration) (int64, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.done.IsZero() && (time.Since(b.sent) < sentWithin || time.Since(b.done) < doneWithin) {
		return b.n, nil
	}
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	sent := time.Now()
	n, err := chargedScript.Run(ctx, s.client, []string{s.chargedKey()}, s.id, chargedWindow.Milliseconds()).Int64()
	if err != nil {
		return 0, err
	}
	b.sent, b.done, b.n = sent, time.Now(), n
	return n, nil
}

// owe counts the store's limiters that have local admissions to charge.
func (s *RedisStore) owe(delta int64) { s.owing.Add(delta) }

// chargingAnnounced is called when a node announces it is charging: this
// node, if none of its limiters has anything to charge, adds itself to the
// set of nodes whose charges are in, in the background, unless its entry
// there is less than chargedAnswerEvery old or an answer is in flight. An
// answer that fails is tried again every chargedPoll while it can still
// shorten the grace (returnGraceMax).
func (s *RedisStore) chargingAnnounced() {
	if s.owing.Load() > 0 || !s.barrier.answering.CompareAndSwap(false, true) {
		return
	}
	heard := time.Now()
	go func() {
		defer s.barrier.answering.Store(false)
		for {
			_, err := s.barrier.record(context.Background(), s, chargedAnswerEvery, 0)
			if err == nil || time.Since(heard) >= returnGraceMax || !sleepOrStop(chargedPoll, s.stop) {
				return
			}
		}
	}()
}

// Charge charges each key's bucket what the local fallback admitted from it
// (token and leaky buckets, and quotas with their seeds: see
// Charge.Period), or a settlement (Limiter.Settle: token buckets and quotas);
// the others are skipped: one script call per key, queued like refunds and
// sent together, bounded by the store's timeout. A charge may leave a
// bucket in debt beyond its capacity: the key's next requests then wait
// for the refill the outage already spent. It goes through the circuit
// breaker as a decision does, and returns the first error.
func (s *RedisStore) Charge(ctx context.Context, charges []Charge) error {
	allowed, probe := s.breaker.allow()
	if !allowed {
		return ErrBreakerOpen
	}
	ctx, cancel := s.timeoutContext(ctx)
	defer cancel()
	calls := make([]*call, 0, len(charges))
	for i := range charges {
		ch := &charges[i]
		if ch.empty() || !ch.Rule.chargeable() {
			continue
		}
		cost, aux := int64(1), any(lua.ChargeAux-min(ch.Ticks, lua.MaxChargeDebt))
		if ch.outage() {
			cost, aux = 1+ch.Rule.quotaCapped(ch.Ticks), lua.SeedAux-ch.Rule.quotaSeed(ch.Seen, ch.Period)
		}
		calls = append(calls, &call{
			script: s.refund,
			done:   make(chan struct{}, 1),
			keys:   []string{s.Key(ch.Rule.bucket, ch.Key)},
			rules:  []*Rule{ch.Rule},
			costs:  []int64{cost},
			aux:    []any{aux},
		})
	}
	var firstErr error
	for _, err := range s.sendAll(ctx, calls) {
		firstErr = orErr(firstErr, err)
	}
	switch {
	case firstErr == nil:
		if s.breaker.succeed() {
			s.bans.breakerClosed()
		}
	case probe:
		s.breaker.Failure()
	}
	return firstErr
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
		s.bans.breakerClosed()
	}
	return nil
}
