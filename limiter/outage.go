package limiter

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// The outage ledger: what local buckets admitted while the store could not
// decide, charged to the store when it answers again.

// maxOutageKeys bounds the ledger of the keys decided locally during an
// outage.
const maxOutageKeys = 1 << 16

// outageKey names a key's bucket in a zone.
type outageKey struct {
	bucket, key string
}

// owed is what a key's local bucket admitted since the outage began.
type owed struct {
	rule  *Rule // the zone's rule
	local *Rule // the local rule it was last decided on
	n     int64 // that rule's divisor
	key   string
	// admitted is the tokens the local bucket admitted (a quota's: in
	// the period that starts at microsecond period).
	admitted int64
	// seen is a quota key's count that Redis last gave this node in the
	// period, until a charge took it to Redis (the seed); 0: none.
	seen, period int64
	// started reports that the key's local bucket started from what Redis
	// last said (a quota key may enter the ledger before it is decided
	// locally: see ledgerQuotas).
	started bool
	// charging is closed when the charge in flight ends; nil: none.
	charging chan struct{}
}

// outage is a limiter's ledger of local admissions to charge.
type outage struct {
	// clock is the local store's (see outage.now), set by New.
	clock   Clock
	mu      sync.Mutex
	entries map[outageKey]*owed
	// pending is len(entries): the request path reads it alone while
	// the store is healthy.
	pending  atomic.Int64
	flushing atomic.Bool
	pinging  atomic.Bool
	awaiting atomic.Bool // awaitFleetCharges runs
	// graceUntil is when the grace after Redis came back ends (unix
	// nanoseconds; 0: none).
	graceUntil atomic.Int64
	// charged and full count the charges made and the keys the full
	// ledger left out.
	charged, full atomic.Uint64
}

// now returns the time, in microseconds, by which the ledger finds a
// quota's period: the clock of the local store, which decides the local
// quotas and files their counts in its periods.
func (o *outage) now() int64 { return o.clock.Now().UnixMicro() }

// seed is called for each zone decided locally before the decision: a key
// not yet in the ledger enters it, and its local bucket starts from what
// the deny cache last heard of the shared bucket. It returns the key's
// entry, or nil when the ledger is full.
func (l *Limiter) seed(q *Request, local *Rule, n int64) *owed {
	o := &l.out
	k := outageKey{q.Rule.bucket, q.Key}
	o.mu.Lock()
	defer o.mu.Unlock()
	e := o.entries[k]
	switch {
	case e != nil:
		e.local, e.n = local, n
	case len(o.entries) >= maxOutageKeys:
		o.full.Add(1)
		return nil
	default:
		e = l.enter(q.Rule, q.Key, local, n)
	}
	if e.started {
		return e
	}
	e.started = true
	m, ok := l.local.(*MemoryStore)
	switch {
	case !ok:
	case q.Rule.alg == Quota:
		// The node's share of the count Redis last gave it, rounded up:
		// the seed, or the count the deny cache still holds once the
		// seed went in with a charge (a key first decided here in the
		// grace after Redis came back).
		heard := e.seen
		if l.cache != nil {
			if c, ok := l.cache.lastQuota(q.Rule, q.Key, e.period); ok {
				heard = max(heard, c)
			}
		}
		m.startQuotaAt(local, q.Key, ceilDiv(heard, max(1, n)), e.period)
	default:
		var left int64 // microseconds until the shared bucket is full: 0 when never seen
		if l.cache != nil && q.Rule.remembered() {
			left, _ = l.cache.lastOwed(q.Rule, q.Key)
		}
		m.startAt(local, q.Key, left)
	}
	return e
}

// enter adds a key's entry to the ledger (o.mu held): a quota key's with
// the period it is in by this node's clock, and the count Redis last gave
// this node in it.
func (l *Limiter) enter(r *Rule, key string, local *Rule, n int64) *owed {
	o := &l.out
	if o.entries == nil {
		o.entries = make(map[outageKey]*owed)
	}
	e := &owed{rule: r, local: local, n: n, key: key}
	if r.alg == Quota {
		e.period, _ = r.periodAt(l.out.now())
		if l.cache != nil {
			e.seen, _ = l.cache.lastQuota(r, key, e.period)
		}
	}
	o.entries[outageKey{r.bucket, key}] = e
	l.setPending(int64(len(o.entries)))
	return e
}

// ledgerQuotas is called when the store fails while the ledger is empty
// (an outage begins): every quota key of which this node heard a count in
// the current period enters the ledger, so that its charge seeds Redis
// with that count when Redis returns, whether or not the key is decided
// here meanwhile, and whatever its zone's failure policy. At most half the
// ledger.
func (l *Limiter) ledgerQuotas() {
	if l.cache == nil {
		return
	}
	seen := l.cache.quotasSeen(l.out.now())
	if len(seen) == 0 {
		return
	}
	view := l.fleetSize()
	o := &l.out
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, q := range seen {
		if len(o.entries) >= maxOutageKeys/2 {
			o.full.Add(1)
			break
		}
		if q.count <= 0 || o.entries[outageKey{q.rule.bucket, q.key}] != nil {
			continue
		}
		local, n := q.rule.localFor(view) // nil, 1 under another policy than local
		l.enter(q.rule, q.key, local, n)
	}
}

// startAt sets the key's bucket under rule r to be full again in left
// microseconds (0: full now), whatever it held.
func (s *MemoryStore) startAt(r *Rule, key string, left int64) {
	if r.alg != TokenBucket && r.alg != LeakyBucket {
		return
	}
	id := s.hash.id(r.bucket, key)
	sh := &s.shards[id.shard()]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if left <= 0 {
		sh.m.remove(id)
		return
	}
	now := s.now()
	if limit := int(s.perShard.Load()); limit > 0 && !sh.m.has(id) {
		s.makeRoom(sh, limit, now)
	}
	st := State((now + left) * fracScale)
	sh.m.put(id, memEntry{state: st, expires: st.fullAt()})
}

// forget drops the seeds of the key's quotas in buckets, which a reset
// emptied: its charges stay.
func (o *outage) forget(buckets []string, key string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, b := range buckets {
		if e := o.entries[outageKey{b, key}]; e != nil {
			e.seen = 0
		}
	}
}

// startQuotaAt sets the key's count under quota r (a local rule) in the
// period that starts at microsecond start to at least count, if that
// period is the current one.
func (s *MemoryStore) startQuotaAt(r *Rule, key string, count, start int64) {
	if r.alg != Quota || count <= 0 {
		return
	}
	id := s.hash.id(r.bucket, key)
	sh := &s.shards[id.shard()]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	now := s.now()
	from, end := r.periodAt(now)
	if from != start {
		return
	}
	e, ok := sh.m.get(id)
	if ok && e.expires > now && quotaUsed(e.state, from) >= count {
		return
	}
	if limit := int(s.perShard.Load()); limit > 0 && !ok {
		s.makeRoom(sh, limit, now)
	}
	sh.m.put(id, memEntry{state: State(count*quotaTags + quotaTag(from)), expires: end})
}

// owedUS returns how many microseconds the key's bucket under rule r takes
// to be full again (0: full).
func (s *MemoryStore) owedUS(r *Rule, key string) int64 {
	id := s.hash.id(r.bucket, key)
	sh := &s.shards[id.shard()]
	sh.mu.Lock()
	e, ok := sh.m.get(id)
	sh.mu.Unlock()
	if !ok {
		return 0
	}
	return max(0, e.state.fullAt()-s.now())
}

// admittedLocally adds what a local decision admitted to the ledger.
func (o *outage) admittedLocally(e *owed, tokens int64) {
	o.mu.Lock()
	o.add(e, tokens)
	o.mu.Unlock()
}

// add adds tokens admitted (or settled) locally to an entry (o.mu held). A
// quota's count starts afresh in a new period: what the entry held of the
// period that ended, seed included, is not charged to the next.
func (o *outage) add(e *owed, tokens int64) {
	if e.rule.alg == Quota {
		if start, _ := e.rule.periodAt(o.now()); start != e.period {
			e.period, e.admitted, e.seen = start, 0, 0
		}
	}
	e.admitted += tokens
}

// chargeOf returns what a key's entry charges (o.mu held): in the zone's
// ticks, the tokens its local bucket admitted, at most this node's share
// of what the shared bucket would owe by the local bucket's state; a
// quota's, the requests its local quota admitted in the entry's period,
// with the seed.
func (l *Limiter) chargeOf(e *owed) Charge {
	r := e.rule
	if r.alg == Quota {
		return Charge{Rule: r, Key: e.key, Ticks: max(0, e.admitted), Period: e.period, Seen: e.seen}
	}
	ticks := e.admitted * r.interval
	if m, ok := l.local.(*MemoryStore); ok {
		left := m.owedUS(e.local, e.key) // microseconds
		// The local bucket owes a 1/n share of the tokens at 1/n of the
		// rate: the shared bucket owes left microseconds of its refill
		// (left*denom ticks) for the fleet, this node 1/n of it.
		ticks = min(ticks, ceilDiv(left*r.denom, max(1, e.n)))
	}
	return Charge{Rule: r, Key: e.key, Ticks: max(0, ticks)}
}

// settle charges the ledger's entries of a request's zones before the
// store decides it: a node does not let Redis admit a key ahead of what it
// admitted locally. A zone whose charge another request is making waits
// for it. It returns the store's error when a charge failed: the request
// then takes its zones' failure policy, and the charge is made later.
//
// Charges are sent only once the store has decided again (storeUp): a
// charge is not idempotent, and one sent to a Redis that is hung could run
// when it resumes, after this node gave up on it and charged again. While
// the store is not known to be back, the request goes to the store as it
// is: the breaker's probe, one request per cooldown.
func (l *Limiter) settle(ctx context.Context, reqs []Request) error {
	ch, ok := l.store.(charger)
	if !ok || !l.storeUp.Load() {
		return nil
	}
	for {
		var wait chan struct{}
		var mine []*owed
		var charges []Charge
		var snap []int64
		o := &l.out
		o.mu.Lock()
		for i := range reqs {
			e := o.entries[outageKey{reqs[i].Rule.bucket, reqs[i].Key}]
			switch {
			case e == nil:
			case e.charging != nil:
				wait = e.charging
			default:
				e.charging = make(chan struct{})
				mine = append(mine, e)
				snap = append(snap, e.admitted)
				charges = append(charges, l.chargeOf(e))
			}
		}
		o.mu.Unlock()
		if len(mine) > 0 {
			err := l.sendCharges(ctx, ch, mine, charges, snap)
			if err != nil {
				return err
			}
		}
		if wait == nil {
			return nil
		}
		select {
		case <-wait:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// sendCharges sends the charges of the entries (each taken, with the
// tokens it had admitted in snap) and ends them: an entry charged leaves
// the ledger (or keeps what its bucket admitted meanwhile; a quota's seed
// went in with its charge), one that failed stays for later.
func (l *Limiter) sendCharges(ctx context.Context, ch charger, mine []*owed, charges []Charge, snap []int64) error {
	err := ch.Charge(ctx, charges)
	if err != nil && ctx.Err() == nil {
		l.storeUp.Store(false)
	}
	o := &l.out
	grace := time.Now().UnixNano() < o.graceUntil.Load() // keep the entries: local until it ends
	o.mu.Lock()
	for i, e := range mine {
		if err == nil && e.period == charges[i].Period { // a quota's period that ended took nothing
			o.charged.Add(1)
			e.admitted -= snap[i]
			e.seen = 0
			if e.admitted <= 0 && !grace {
				delete(o.entries, outageKey{e.rule.bucket, e.key})
			}
		}
		close(e.charging)
		e.charging = nil
	}
	l.setPending(int64(len(o.entries)))
	o.mu.Unlock()
	return err
}

// flushCharges charges, in the background, every entry of the ledger: the
// store has just decided, so it is back. One flush runs at a time.
func (l *Limiter) flushCharges() {
	ch, ok := l.store.(charger)
	if !ok || !l.out.flushing.CompareAndSwap(false, true) {
		return
	}
	go func() {
		if need, ok := l.flushAll(ch); ok {
			l.awaitFleetCharges(need) // in the grace, until the fleet's are in
		}
	}()
}

// flushAll charges every entry of the ledger, and reports whether all went
// in, and the largest divisor of their local buckets.
func (l *Limiter) flushAll(ch charger) (need int64, ok bool) {
	defer l.out.flushing.Store(false)
	o := &l.out
	o.mu.Lock()
	all := make([]*owed, 0, len(o.entries))
	need = 1
	for _, e := range o.entries {
		all = append(all, e)
		need = max(need, e.n)
	}
	o.mu.Unlock()
	for len(all) > 0 { // each entry once, maxBatch at a time
		var mine []*owed
		var snap []int64
		var charges []Charge
		o.mu.Lock()
		for len(all) > 0 && len(mine) < maxBatch {
			e := all[0]
			all = all[1:]
			if e.charging == nil && o.entries[outageKey{e.rule.bucket, e.key}] == e {
				e.charging = make(chan struct{})
				mine = append(mine, e)
				snap = append(snap, e.admitted)
				charges = append(charges, l.chargeOf(e))
			}
		}
		o.mu.Unlock()
		if len(mine) == 0 {
			continue // the requests are charging these
		}
		if err := l.sendCharges(context.Background(), ch, mine, charges, snap); err != nil {
			return need, false // the store is away again: the next decision it makes flushes
		}
	}
	return need, true
}

// setStoreUp records whether the store's last call decided; when it comes
// back with charges to make, the grace begins.
func (l *Limiter) setStoreUp(up bool) {
	if l.storeUp.Load() == up {
		return
	}
	// The grace begins before the store is marked up: a request that
	// saw it up and no grace would let Redis decide ahead of the other
	// nodes' charges.
	if up && l.out.pending.Load() > 0 {
		l.out.graceUntil.Store(time.Now().Add(returnGraceMax).UnixNano())
		l.storeUp.Store(up)
		l.announceCharging()
		return
	}
	l.storeUp.Store(up)
	if up {
		l.nothingToCharge()
	}
}

// errAwayWithCharges is the failure of a request that awayWithCharges
// kept from the store.
var errAwayWithCharges = fmt.Errorf("%w: this node has charges to make and waits for Redis to answer a PING", ErrBreakerOpen)

// awayWithCharges reports whether the request is to be decided on the
// local buckets because the store has not answered since it failed and
// this node has charges to make: Redis would otherwise decide the request
// ahead of them. It starts a check of the store (a PING through the
// breaker, one at a time, in the background), whose success begins the
// grace.
func (l *Limiter) awayWithCharges(reqs []Request) bool {
	if l.storeUp.Load() || !l.allLocal(reqs) {
		return false
	}
	p, ok := l.store.(pinger)
	if !ok {
		return false
	}
	if l.out.pinging.CompareAndSwap(false, true) {
		go func() {
			defer l.out.pinging.Store(false)
			if p.Ping(context.Background()) == nil {
				l.setStoreUp(true)
				l.flushCharges()
			}
		}()
	}
	return true
}

// allLocal reports whether every zone of the request has the local policy
// (a request with others cannot be decided on local buckets alone).
func (l *Limiter) allLocal(reqs []Request) bool {
	if l.local == nil {
		return false
	}
	for i := range reqs {
		if r := reqs[i].Rule; r.onError != PolicyLocal || r.local == nil {
			return false
		}
	}
	return true
}

// returning reports whether the request is to be decided on the local
// buckets during the grace after Redis came back: every zone of it has the
// local policy (the others would be left undecided).
func (l *Limiter) returning(reqs []Request) bool {
	until := l.out.graceUntil.Load()
	if until == 0 {
		return false
	}
	if time.Now().UnixNano() >= until {
		l.out.graceUntil.CompareAndSwap(until, 0)
		l.flushCharges() // what the grace admitted
		return false
	}
	return l.allLocal(reqs)
}

// OutageCharges returns how many keys' local admissions were charged to
// the store, how many keys wait to be, and how many a full ledger left out.
func (l *Limiter) OutageCharges() (charged uint64, pending int64, left uint64) {
	return l.out.charged.Load(), l.out.pending.Load(), l.out.full.Load()
}

// chargeBarrier is a store shared by the fleet that can count the nodes
// whose charges are in: the Redis store.
type chargeBarrier interface {
	// ChargesIn records that this node's charges are in and returns how
	// many nodes' are, within chargedWindow.
	ChargesIn(ctx context.Context) (int64, error)
}

// awaitFleetCharges is run by a node whose charges are in, in its grace:
// it records them and ends the grace once need nodes' are in, or lets it
// run out.
func (l *Limiter) awaitFleetCharges(need int64) {
	b, ok := l.store.(chargeBarrier)
	if !ok || !l.out.awaiting.CompareAndSwap(false, true) {
		return
	}
	defer l.out.awaiting.Store(false)
	t := time.NewTicker(chargedPoll)
	defer t.Stop()
	for {
		until := l.out.graceUntil.Load()
		if until == 0 || time.Now().UnixNano() >= until {
			return
		}
		if n, err := b.ChargesIn(context.Background()); err == nil && n >= need {
			l.out.graceUntil.CompareAndSwap(until, time.Now().UnixNano()) // returning() ends it
			return
		}
		<-t.C
	}
}

// nothingToCharge records, in the background, that this node (whose store
// came back, with no charges to make) does not hold the others' grace up.
func (l *Limiter) nothingToCharge() {
	if b, ok := l.store.(chargeBarrier); ok {
		go func() { _, _ = b.ChargesIn(context.Background()) }()
	}
}

// owingStore is a store that knows whether any of its limiters has local
// admissions to charge: the Redis store.
type owingStore interface {
	owe(delta int64)
}

// setPending records the ledger's length, and tells the store when the
// limiter starts or stops owing charges. l.out.mu is held.
func (l *Limiter) setPending(n int64) {
	was := l.out.pending.Swap(n)
	s, ok := l.store.(owingStore)
	switch {
	case !ok:
	case was == 0 && n > 0:
		s.owe(1)
	case was > 0 && n == 0:
		s.owe(-1)
	}
}

// announceCharging tells the fleet, in the background, that this node is
// back with charges to make, so that the nodes with none add themselves to
// the set at once.
func (l *Limiter) announceCharging() {
	if s, ok := l.store.(*RedisStore); ok {
		s.bans.publish(chargingMsg)
	}
}
