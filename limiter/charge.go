package limiter

import (
	"context"

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
	// Period makes a quota's charge an outage's: the first instant (unix
	// microseconds) of the calendar period its Ticks were admitted in,
	// and Seen the count this node last heard the store give the key in
	// that period (0: none). The store takes neither in another period;
	// in that one it raises the key's count to at least Seen, then adds
	// Ticks. 0: a settlement's charge, counted in the period it lands in.
	Period, Seen int64
}

// outage reports whether the charge is a quota's outage charge (Period).
func (ch *Charge) outage() bool { return ch.Rule.alg == Quota && ch.Period != 0 }

// empty reports whether the charge changes nothing.
func (ch *Charge) empty() bool {
	if ch.outage() {
		return ch.Ticks <= 0 && ch.Seen <= 0
	}
	return ch.Ticks <= 0
}

// charger is a store that takes charges: the Redis store.
type charger interface {
	Charge(ctx context.Context, charges []Charge) error
}

// Charge charges each key's bucket as the Redis store's Charge does, with
// the same arithmetic as the refund script's charge mode: a token or leaky
// bucket may be left owing more than its capacity, at most
// lua.MaxChargeDebt ticks; a quota's current period counts the charge
// (Limiter.Settle). It never fails.
func (s *MemoryStore) Charge(_ context.Context, charges []Charge) error {
	for i := range charges {
		ch := &charges[i]
		r := ch.Rule
		if ch.empty() || !r.chargeable() {
			continue
		}
		id := s.hash.id(r.bucket, ch.Key)
		sh := &s.shards[id.shard()]
		sh.mu.Lock()
		now := s.now()
		e, ok := sh.m.get(id)
		held := ok && e.expires > now
		if !held {
			e.state = 0
		}
		if limit := int(s.perShard.Load()); limit > 0 && !ok {
			s.makeRoom(sh, limit, now)
		}
		var st State
		var expires int64
		switch {
		case ch.outage():
			var taken bool
			if st, expires, taken = sh.quotaOutageCharge(id, r, e.state, held, now, ch); !taken {
				sh.mu.Unlock()
				continue
			}
		case r.alg == Quota:
			st, expires = r.quotaCharge(e.state, now, ch.Ticks)
		default:
			debt := r.debt(e.state, now) + r.over(e.state, now)
			st = r.stateAt(now, min(debt+min(ch.Ticks, lua.MaxChargeDebt), lua.MaxChargeDebt))
			expires = st.fullAt()
		}
		sh.m.put(id, memEntry{state: st, expires: expires})
		sh.mu.Unlock()
	}
	return nil
}

// quotaOutageCharge applies a quota's outage charge (Charge.Period) to the
// key id of the locked shard, whose entry holds state s (held: it holds
// one), as the refund script does: the shard's rebuilt map stands for the
// script's <key>!rebuilt. It returns the entry's new state and end, and
// false when the charge's period is not the current one.
func (sh *shard) quotaOutageCharge(id bucketID, r *Rule, s State, held bool, now int64, ch *Charge) (State, int64, bool) {
	added := int64(-1)
	if m, ok := sh.rebuilt[id]; ok && m.expires > now && held {
		added = int64(m.state)
	}
	st, end, after, taken := r.quotaOutage(s, held, added, now, ch)
	if !taken {
		return s, end, false
	}
	for old, m := range sh.rebuilt {
		if m.expires <= now {
			delete(sh.rebuilt, old)
		}
	}
	if after >= 0 {
		if sh.rebuilt == nil {
			sh.rebuilt = make(map[bucketID]memEntry)
		}
		sh.rebuilt[id] = memEntry{state: State(after), expires: min(now+lua.RebuiltTTL*1000, end)}
	}
	return st, end, true
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
