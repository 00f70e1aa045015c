package limiter

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fleetlimit/caddy-fleetlimit/internal/redistest"
	"github.com/fleetlimit/caddy-fleetlimit/lua"
)

// quotaNode returns a node's limiter on a Redis store with a short timeout
// and a breaker that opens at the first failure, a deny cache and local
// fallback buckets.
func quotaNode(t *testing.T, srv *redistest.Server) *Limiter {
	t.Helper()
	rs := newRedisStore(t, RedisOptions{Address: srv.Addr, Timeout: 100 * time.Millisecond,
		MaxWait: 200 * time.Millisecond, BreakerFailures: 1, BreakerCooldown: 50 * time.Millisecond})
	local := NewMemoryStore(MemoryOptions{})
	t.Cleanup(func() { _ = local.Close() })
	l := New(rs, Options{Cache: NewDenyCache(DenyCacheOptions{}), Local: local})
	t.Cleanup(l.Close)
	return l
}

// quotaAdmits decides requests of cost 1 for the key on each node in turn
// until every node was denied (by Redis, or by its local quota when want
// is LocalDenied) in the same round, and returns how many were admitted,
// and how many of them by Redis.
func quotaAdmits(t *testing.T, nodes []*Limiter, r *Rule, key string, want Outcome) (n, onRedis int64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		denied := 0
		for _, l := range nodes {
			switch out := l.Decide(context.Background(), []Request{{Rule: r, Key: key, Cost: 1}}, make([]Result, 1)); out {
			case Allowed:
				n++
				onRedis++
			case LocalAllowed:
				n++
			case want:
				denied++
			case Denied, LocalDenied:
				// The other kind of denial: Redis still deciding as
				// it stops, or the local fallback as it returns.
			default:
				t.Fatalf("decision %s", out)
			}
		}
		if denied == len(nodes) {
			return n, onRedis
		}
		time.Sleep(2 * time.Millisecond)
	}
	t.Fatalf("the nodes admitted %d and did not all deny (%s) within 10s", n, want)
	return n, onRedis
}

// TestQuotaOutageRestartEmpty: two nodes spend 20 of a key's daily quota of
// 30 on Redis; Redis is killed, the nodes admit on their local quotas (15
// each), and Redis comes back empty. Over the three the key gets the quota
// once: the local counts start from what Redis last said (10 each), what
// they admitted is charged to Redis when it returns, and the empty Redis is
// seeded from the highest count the nodes saw (20), not from zero.
func TestQuotaOutageRestartEmpty(t *testing.T) {
	srv := redistest.Start(t)
	nodes := []*Limiter{quotaNode(t, srv), quotaNode(t, srv)}
	r, err := NewRule(RuleConfig{Name: "q", Algorithm: Quota, Rate: 30, Period: Day, FleetSize: 2})
	if err != nil {
		t.Fatal(err)
	}
	var before int64
	for i := range 20 {
		out := nodes[i%2].Decide(context.Background(), []Request{{Rule: r, Key: "k", Cost: 1}}, make([]Result, 1))
		if out != Allowed {
			t.Fatalf("request %d of 20 on Redis: %s", i+1, out)
		}
		before++
	}
	srv.Stop()
	local, _ := quotaAdmits(t, nodes, r, "k", LocalDenied)
	srv.Restart()
	after, _ := quotaAdmits(t, nodes, r, "k", Denied)
	t.Logf("a daily quota of 30: %d admitted on Redis, %d on the local quotas while it was down, %d after it came back empty",
		before, local, after)
	if total := before + local + after; total > 30 {
		t.Fatalf("%d + %d + %d = %d admitted of a daily quota of 30", before, local, after, total)
	}
}

// TestQuotaOutageSeedsKeysNotDecided: one node spent 25 of a key's daily
// quota of 30 on Redis, and decides only another key while Redis is down;
// the other node, which never heard of the key, admits it on its local
// quota (15). Redis comes back empty: the first node's charges seed it with
// the count it heard (25), so that with the other node's 15 the key is
// spent, and Redis admits it nothing more. (Until every node's charges are
// in, the first node may still admit the key on its local quota, from its
// share of 25: 2.)
func TestQuotaOutageSeedsKeysNotDecided(t *testing.T) {
	srv := redistest.Start(t)
	a, b := quotaNode(t, srv), quotaNode(t, srv)
	r, err := NewRule(RuleConfig{Name: "q", Algorithm: Quota, Rate: 30, Period: Day, FleetSize: 2})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 25 {
		if out := a.Decide(context.Background(), []Request{{Rule: r, Key: "k", Cost: 1}}, make([]Result, 1)); out != Allowed {
			t.Fatalf("request %d of 25 on Redis: %s", i+1, out)
		}
	}
	srv.Stop()
	if out := a.Decide(context.Background(), []Request{{Rule: r, Key: "other", Cost: 1}}, make([]Result, 1)); out != LocalAllowed {
		t.Fatalf("another key with Redis down: %s", out)
	}
	local, _ := quotaAdmits(t, []*Limiter{b}, r, "k", LocalDenied)
	srv.Restart()
	after, onRedis := quotaAdmits(t, []*Limiter{b, a}, r, "k", Denied)
	t.Logf("a daily quota of 30: 25 admitted on Redis through one node, %d on the other's local quota, %d after Redis came back empty (%d by Redis)",
		local, after, onRedis)
	if onRedis != 0 || after > 2 {
		t.Fatalf("Redis came back empty and the key got %d more (%d by Redis), spent as it was (25 heard by one node, %d admitted locally by the other)",
			after, onRedis, local)
	}
}

// TestQuotaRestartSeedsDenyZone: a quota whose zone fails closed is
// seeded too. A node spent 25 of a key's daily quota of 30; Redis is killed
// (the node's decisions fail closed) and comes back empty: the node's
// charge seeds it with 25, and the key gets 5 more, not 30. (The request
// that finds Redis back, the breaker's probe, may be decided before the
// seed goes in: one more.)
func TestQuotaRestartSeedsDenyZone(t *testing.T) {
	srv := redistest.Start(t)
	l := quotaNode(t, srv)
	r, err := NewRule(RuleConfig{Name: "q", Algorithm: Quota, Rate: 30, Period: Day, OnError: PolicyDeny})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 25 {
		if out := l.Decide(context.Background(), []Request{{Rule: r, Key: "k", Cost: 1}}, make([]Result, 1)); out != Allowed {
			t.Fatalf("request %d of 25 on Redis: %s", i+1, out)
		}
	}
	srv.Stop()
	if out := l.Decide(context.Background(), []Request{{Rule: r, Key: "k", Cost: 1}}, make([]Result, 1)); out != FailedClosed {
		t.Fatalf("with Redis down: %s", out)
	}
	srv.Restart()
	var after int64
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		out := l.Decide(context.Background(), []Request{{Rule: r, Key: "k", Cost: 1}}, make([]Result, 1))
		if out == Allowed {
			after++
		}
		if out == Denied {
			break
		}
		time.Sleep(2 * time.Millisecond)
	}
	t.Logf("a daily quota of 30 failing closed: 25 admitted, then %d after Redis came back empty", after)
	if after > 6 {
		t.Fatalf("Redis came back empty and admitted %d more of a daily quota of 30 that had 25", after)
	}
}

// quotaTwins are a Redis store whose scripts read a test clock and a
// memory store on the same clock, for one quota key.
type quotaTwins struct {
	t   *testing.T
	srv *redistest.Server
	rs  *RedisStore
	ms  *MemoryStore
	clk *testClock
	r   *Rule
	key string
}

func newQuotaTwins(t *testing.T, rate int64) *quotaTwins {
	srv := redistest.Start(t)
	clk := newTestClock(epoch)
	return &quotaTwins{t: t, srv: srv, clk: clk, key: "k",
		rs: newRedisStore(t, RedisOptions{Address: srv.Addr, Clock: clk}), ms: newMemory(t, clk),
		r: mustConfig(t, RuleConfig{Name: "q", Algorithm: Quota, Rate: rate, Period: Day})}
}

// charge sends ch to both stores.
func (q *quotaTwins) charge(ch Charge) {
	q.t.Helper()
	ch.Rule, ch.Key = q.r, q.key
	if err := q.rs.Charge(context.Background(), []Charge{ch}); err != nil {
		q.t.Fatalf("redis charge %+v: %v", ch, err)
	}
	_ = q.ms.Charge(context.Background(), []Charge{ch})
}

// decide decides a request of cost in both stores, and fails when they
// answer differently.
func (q *quotaTwins) decide(cost int64) {
	q.t.Helper()
	reqs := []Request{{Rule: q.r, Key: q.key, Cost: cost}}
	got, want := make([]Result, 1), make([]Result, 1)
	okR, err := q.rs.Decide(context.Background(), reqs, got)
	if err != nil {
		q.t.Fatal(err)
	}
	okM, _ := q.ms.Decide(context.Background(), reqs, want)
	if okR != okM || !equalResults(got, want) {
		q.t.Fatalf("cost %d: redis %v %+v, memory %v %+v", cost, okR, got[0], okM, want[0])
	}
}

// lose makes both stores forget the key, as a Redis restarted empty does.
func (q *quotaTwins) lose() {
	q.srv.MustDo("FLUSHALL")
	id := q.ms.hash.id(q.r.bucket, q.key)
	sh := &q.ms.shards[id.shard()]
	sh.mu.Lock()
	sh.m.remove(id)
	delete(sh.rebuilt, id)
	sh.mu.Unlock()
}

// counts returns the key's count in the current period in Redis and in
// memory.
func (q *quotaTwins) counts() (red, mem int64) {
	q.t.Helper()
	now := q.clk.now()
	start, _ := q.r.periodAt(now)
	if v, err := q.rs.Client().Get(context.Background(), q.rs.Key(q.r.bucket, q.key)).Int64(); err == nil {
		red = quotaUsed(State(v), start)
	}
	id := q.ms.hash.id(q.r.bucket, q.key)
	sh := &q.ms.shards[id.shard()]
	sh.mu.Lock()
	if e, ok := sh.m.get(id); ok && e.expires > now {
		mem = quotaUsed(e.state, start)
	}
	sh.mu.Unlock()
	return red, mem
}

// TestQuotaOutageChargeOrder: three nodes' outage charges reach a Redis
// that lost the key, in every order: the count is the highest seed plus
// every charge, in Redis and in memory alike. A Redis that kept the key
// takes the charges on its count (the seeds are below it). A charge of a
// period that has ended takes nothing.
func TestQuotaOutageChargeOrder(t *testing.T) {
	q := newQuotaTwins(t, 100)
	start, _ := q.r.periodAt(q.clk.now())
	charges := []Charge{{Seen: 40, Ticks: 0}, {Seen: 0, Ticks: 7}, {Seen: 38, Ticks: 3}}
	for _, order := range [][3]int{{0, 1, 2}, {0, 2, 1}, {1, 0, 2}, {1, 2, 0}, {2, 0, 1}, {2, 1, 0}} {
		q.lose()
		for _, i := range order {
			ch := charges[i]
			ch.Period = start
			q.charge(ch)
		}
		if red, mem := q.counts(); red != 50 || mem != 50 {
			t.Fatalf("charges in the order %v on a key lost: redis counts %d, memory %d, want 50 (the seed 40 and 10 charged)", order, red, mem)
		}
		q.clk.add(int64(lua.RebuiltTTL)*1000 + 1)
	}
	// Redis kept the key at 45 (and the rebuilt count is long over): the
	// seeds are below it, the charges add.
	q.lose()
	q.charge(Charge{Seen: 45, Period: start})
	q.clk.add(int64(lua.RebuiltTTL)*1000 + 1)
	for _, ch := range charges {
		ch.Period = start
		q.charge(ch)
	}
	if red, mem := q.counts(); red != 55 || mem != 55 {
		t.Fatalf("charges on a key counting 45: redis %d, memory %d, want 55", red, mem)
	}
	// Yesterday's charge and seed: nothing.
	yesterday, _ := q.r.periodAt(start - 1)
	q.charge(Charge{Seen: 90, Ticks: 9, Period: yesterday})
	if red, mem := q.counts(); red != 55 || mem != 55 {
		t.Fatalf("a charge of the period before: redis %d, memory %d, want 55 still", red, mem)
	}
}

// TestQuotaOutageChargeTwin replays a random trace of decisions, outage
// charges (of this period and the last), settlements' charges, lost keys
// and time through Redis and the memory store, which must count the same
// after every step.
func TestQuotaOutageChargeTwin(t *testing.T) {
	q := newQuotaTwins(t, 60)
	rng := rand.New(rand.NewPCG(7, 31))
	prevWall := time.Now()
	for n := range 600 {
		wall := time.Now()
		// Simulated time runs faster than real time: Redis expires the
		// rebuilt counts on its own clock (see TestPoliciesRedisMatchesMemory).
		q.clk.add(2*int64(wall.Sub(prevWall)/time.Microsecond) + 1000)
		prevWall = wall
		start, _ := q.r.periodAt(q.clk.now())
		what := ""
		switch x := rng.IntN(20); {
		case x < 6:
			what = "decide"
			q.decide(rng.Int64N(3))
		case x < 12:
			ch := Charge{Seen: rng.Int64N(80), Ticks: rng.Int64N(12), Period: start}
			if rng.IntN(6) == 0 {
				ch.Period, _ = q.r.periodAt(start - 1)
			}
			what = fmt.Sprintf("outage charge %+v", ch)
			q.charge(ch)
		case x < 14:
			what = "settlement charge"
			q.charge(Charge{Ticks: 1 + rng.Int64N(5)})
		case x < 16:
			what = "lost"
			q.lose()
		case x < 18:
			what = "rebuilt count over"
			q.clk.add(int64(lua.RebuiltTTL)*1000 + rng.Int64N(1000))
		default:
			what = "hours pass"
			q.clk.add(rng.Int64N(8 * 3600 * 1_000_000))
		}
		if red, mem := q.counts(); red != mem {
			t.Fatalf("step %d (%s): redis counts %d, memory %d", n, what, red, mem)
		}
	}
}

// downStore is a memory store that fails every call while down is set: a
// store that goes away and comes back, for the ledger's arithmetic alone.
type downStore struct {
	*MemoryStore
	down atomic.Bool
}

func (s *downStore) Decide(ctx context.Context, reqs []Request, results []Result) (bool, error) {
	if s.down.Load() {
		return false, errors.New("store down")
	}
	return s.MemoryStore.Decide(ctx, reqs, results)
}

// TestQuotaOutageLedgerReadsTheClock: the outage ledger files a quota's
// count in the period of the clock that decides the local quota, not of
// the wall clock. The node's clock is in 2023 (any day but the wall
// clock's); the store gives a key 20 of its daily 30, then fails, and the
// node's local quota (15, fleet size 2) starts from its share of that
// count, 10: it admits 5, not 15.
func TestQuotaOutageLedgerReadsTheClock(t *testing.T) {
	clk := newTestClock(time.Date(2023, 11, 14, 12, 0, 0, 0, time.UTC).UnixMicro())
	shared := &downStore{MemoryStore: newMemory(t, clk)}
	local := newMemory(t, clk)
	l := New(shared, Options{Cache: NewDenyCache(DenyCacheOptions{Clock: clk}), Local: local})
	t.Cleanup(l.Close)
	r, err := NewRule(RuleConfig{Name: "q", Algorithm: Quota, Rate: 30, Period: Day, FleetSize: 2})
	if err != nil {
		t.Fatal(err)
	}
	decideQuota := func() Outcome {
		return l.Decide(context.Background(), []Request{{Rule: r, Key: "k", Cost: 1}}, make([]Result, 1))
	}
	for i := range 20 {
		if out := decideQuota(); out != Allowed {
			t.Fatalf("request %d of 20 on the store: %s", i+1, out)
		}
	}
	shared.down.Store(true)
	var admitted int
	for range 20 {
		if decideQuota() == LocalAllowed {
			admitted++
		}
	}
	if admitted != 5 {
		t.Fatalf("the local quota admitted %d during the outage, want 5 (its 15 less its share, 10, of the 20 the store counted)", admitted)
	}
}

// TestQuotaGraceStartsFromCountHeard: a node spent a key's daily quota of
// 30 on Redis (fleet size 2), then Redis pauses while the node decides only
// another key: the key enters the ledger with the count heard (30). Redis
// resumes; the node charges its ledger (the key's seed goes in) and, in the
// grace that follows, decides the key on its local quota. That quota starts
// from the node's share of the count heard (15 of 15): the key is denied,
// not given a fresh local quota because its seed was already sent.
func TestQuotaGraceStartsFromCountHeard(t *testing.T) {
	srv := redistest.Start(t)
	l := quotaNode(t, srv)
	r, err := NewRule(RuleConfig{Name: "q", Algorithm: Quota, Rate: 30, Period: Day, FleetSize: 2})
	if err != nil {
		t.Fatal(err)
	}
	decide := func(key string) Outcome {
		return l.Decide(context.Background(), []Request{{Rule: r, Key: key, Cost: 1}}, make([]Result, 1))
	}
	for i := range 30 {
		if out := decide("k"); out != Allowed {
			t.Fatalf("request %d of 30 on Redis: %s", i+1, out)
		}
	}
	if out := decide("k"); out != Denied {
		t.Fatalf("the 31st request on Redis: %s", out)
	}
	srv.Pause()
	if out := decide("other"); out != LocalAllowed {
		srv.Resume()
		t.Fatalf("another key with Redis paused: %s", out)
	}
	srv.Resume()
	// Both keys' charges go in (the grace waits up to returnGraceMax for
	// the other node's, which never come).
	deadline := time.Now().Add(returnGraceMax / 2)
	for charged, _, _ := l.OutageCharges(); charged < 2; charged, _, _ = l.OutageCharges() {
		if time.Now().After(deadline) {
			t.Fatalf("%d of 2 keys charged within %s of Redis' return", charged, returnGraceMax/2)
		}
		decide("other")
		time.Sleep(5 * time.Millisecond)
	}
	if l.out.graceUntil.Load() == 0 {
		t.Fatal("the grace after Redis came back was over before the key was decided")
	}
	if out := decide("k"); out != LocalDenied {
		t.Fatalf("a key whose quota (30) was spent, decided on the local quota in the grace after its seed went in: %s, want %s", out, LocalDenied)
	}
}
