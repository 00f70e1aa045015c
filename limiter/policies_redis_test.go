package limiter

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/fleetlimit/caddy-fleetlimit/internal/redistest"
)

// TestConcurrencyLeaseFreesDeadNodeSlots: the slots of a node that died
// holding them (it never refunds them) are freed for the other nodes when
// their lease ends: exactly then on the script's clock, and after the lease
// on Redis TIME. The key lives as long as its last lease.
func TestConcurrencyLeaseFreesDeadNodeSlots(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	ctx := context.Background()

	t.Run("script clock", func(t *testing.T) {
		t.Parallel()
		r := mustConfig(t, RuleConfig{Name: "cc", Algorithm: Concurrency, Rate: 3, Lease: time.Minute})
		clk := newTestClock(epoch)
		dead := newRedisStore(t, RedisOptions{Address: srv.Addr, KeyPrefix: "clk:", Clock: clk})
		alive := newRedisStore(t, RedisOptions{Address: srv.Addr, KeyPrefix: "clk:", Clock: clk})
		t0 := clk.now()
		for i := range 3 {
			if ok, res := decide(t, dead, Request{Rule: r, Key: "k", Cost: 1, Slot: fmt.Sprint("dead-", i)}); !ok {
				t.Fatalf("slot %d: %+v", i, public(res[0]))
			}
		}
		key := dead.Key(r.Bucket(), "k")
		if pttl, err := dead.Client().PTTL(ctx, key).Result(); err != nil || pttl <= 0 || pttl > time.Minute {
			t.Fatalf("PTTL %s = %s, %v; want at most the lease of 1m", key, pttl, err)
		}
		for _, at := range []int64{t0 + 30_000_000, t0 + 60_000_000 - 1} {
			clk.set(at)
			if ok, res := decide(t, alive, Request{Rule: r, Key: "k", Cost: 1, Slot: "alive-early"}); ok || res[0].RetryAfter != slotRetry {
				t.Fatalf("at +%dus, within the dead node's leases: %v %+v, want denied", at-t0, ok, public(res[0]))
			}
		}
		clk.set(t0 + 60_000_000)
		if ok, res := decide(t, alive, Request{Rule: r, Key: "k", Cost: 1, Slot: "alive"}); !ok || res[0].Remaining != 2 {
			t.Fatalf("when the leases end: %v %+v, want admitted with the dead node's 3 slots free", ok, public(res[0]))
		}
		if n, err := alive.Client().ZCard(ctx, key).Result(); err != nil || n != 1 {
			t.Fatalf("ZCARD %s = %d, %v; want 1 (the dead node's slots pruned)", key, n, err)
		}
	})

	t.Run("redis time", func(t *testing.T) {
		t.Parallel()
		lease := 300 * time.Millisecond
		r := mustConfig(t, RuleConfig{Name: "cc", Algorithm: Concurrency, Rate: 2, Lease: lease})
		dead := newRedisStore(t, RedisOptions{Address: srv.Addr, KeyPrefix: "time:"})
		alive := newRedisStore(t, RedisOptions{Address: srv.Addr, KeyPrefix: "time:"})
		start := time.Now()
		for i := range 2 {
			if ok, res := decide(t, dead, Request{Rule: r, Key: "k", Cost: 1, Slot: fmt.Sprint("dead-", i)}); !ok {
				t.Fatalf("slot %d: %+v", i, public(res[0]))
			}
		}
		admitted := time.Now() // the leases end by admitted + lease, on Redis TIME
		ok, _ := decide(t, alive, Request{Rule: r, Key: "k", Cost: 1, Slot: "alive-early"})
		if ok && time.Since(start) < lease/2 { // on a loaded machine the leases may be over already
			t.Fatal("admitted within the dead node's leases")
		}
		time.Sleep(time.Until(admitted.Add(lease + 50*time.Millisecond)))
		if ok, res := decide(t, alive, Request{Rule: r, Key: "k", Cost: 1, Slot: "alive"}); !ok {
			t.Fatalf("after the leases: %+v, want admitted", public(res[0]))
		}
	})
}

// TestPoliciesClusterMatchesMemory: on a Redis Cluster of three masters, a
// request whose zones sit on different slots (a concurrency zone, a zone
// with a ban, a refundable fixed window) is decided by one script call per
// slot, and the slots that admitted are refunded when another denied,
// each with its charge's time, so that a window refunds only its own
// charge; results are the memory store's, decision by decision, and so
// are they on a random trace of every policy whose zones take keys of
// their own.
func TestPoliciesClusterMatchesMemory(t *testing.T) {
	t.Parallel()
	cl := redistest.StartCluster(t, 3)

	t.Run("multi-slot request", func(t *testing.T) {
		t.Parallel()
		c := newMultiSlotStores(t, cl)
		if groups := c.rs.groupBySlot(c.three("x")); len(groups) != 3 {
			t.Fatalf("the request's zones sit on %d slots, want 3", len(groups))
		}
		c.checkRefundOfAnAdmitted(t)
		c.checkBanAcrossSlots(t)
		c.checkRefundsAcrossAWindowsTurn(t)
	})

	t.Run("random trace", func(t *testing.T) {
		t.Parallel()
		decisions := 1500
		if raceEnabled {
			decisions = 1000
		}
		clk := newTestClock(epoch)
		rs := newRedisStore(t, RedisOptions{Addresses: cl.Addrs(), Cluster: true, KeyPrefix: "tr:", Clock: clk})
		p := newPolicyTrace(t, rs, newMemory(t, clk), clk, 11, policyRules(t),
			[]string{"198.51.100.7", "2001:db8::1", "user@example.com"}, 1)
		p.run(decisions)
		p.requireCoverage()
	})
}

// multiSlotStores is a Redis Cluster store and a memory store on one clock,
// with three zones whose keys sit on three Cluster nodes: a concurrency
// zone cc, a zone with a ban, and a refundable fixed window fw.
type multiSlotStores struct {
	w          time.Duration // fw's window
	clk        *testClock
	rs         *RedisStore
	ms         *MemoryStore
	red, mem   *policyStore
	cc, ban    *Rule
	fw         *Rule
	kc, kb, kf string // the keys of cc, ban and fw
}

// newMultiSlotStores starts both stores and finds the three zones' keys.
func newMultiSlotStores(t *testing.T, cl *redistest.Cluster) *multiSlotStores {
	c := &multiSlotStores{w: 10 * time.Minute}
	c.clk = newTestClock(windowStart(epoch, c.w) + 1_000_000)
	c.rs = newRedisStore(t, RedisOptions{Addresses: cl.Addrs(), Cluster: true, KeyPrefix: "ms:", Clock: c.clk})
	c.ms = newMemory(t, c.clk)
	c.red = &policyStore{Store: c.rs, clk: c.clk, rs: c.rs}
	c.mem = &policyStore{Store: c.ms, clk: c.clk, ms: c.ms}
	c.cc = mustConfig(t, RuleConfig{Name: "cc", Algorithm: Concurrency, Rate: 1, Lease: time.Hour})
	c.ban = mustConfig(t, RuleConfig{Name: "ban", Rate: 1, Per: time.Hour,
		Ban: Ban{Duration: 5 * time.Minute, After: 2, Window: time.Minute}})
	c.fw = mustConfig(t, RuleConfig{Name: "fw", Algorithm: FixedWindow, Rate: 2, Per: c.w, Refunds: true})
	keys := onDistinctNodes(t, cl, c.rs, []*Rule{c.cc, c.ban, c.fw})
	c.kc, c.kb, c.kf = keys[0], keys[1], keys[2]
	return c
}

// both decides on both stores and requires the same answer.
func (c *multiSlotStores) both(t *testing.T, what string, reqs ...Request) (bool, []Result) {
	t.Helper()
	okR, got := decide(t, c.rs, reqs...)
	okM, want := decide(t, c.ms, reqs...)
	if okR != okM || !equalResults(got, want) {
		t.Fatalf("%s, %s:\ncluster %v %+v\nmemory  %v %+v", what, describePolicies(reqs), okR, got, okM, want)
	}
	return okR, got
}

// refundBoth refunds results on both stores.
func (c *multiSlotStores) refundBoth(t *testing.T, reqs []Request, results []Result) {
	t.Helper()
	refund(t, c.rs, reqs, results)
	refund(t, c.ms, reqs, results)
}

// held requires both stores to count slots in cc and requests in fw's
// current window.
func (c *multiSlotStores) held(t *testing.T, what string, slots, count int64) {
	t.Helper()
	for _, s := range []*policyStore{c.red, c.mem} {
		if n, m := s.stored(t, c.cc, c.kc), s.stored(t, c.fw, c.kf); n != slots || m != count {
			t.Fatalf("%s: %d slots held and %d in the window, want %d and %d (redis: %v)", what, n, m, slots, count, s.rs != nil)
		}
	}
}

// three is a request of all three zones, holding slot in cc.
func (c *multiSlotStores) three(slot string) []Request {
	return []Request{{Rule: c.cc, Key: c.kc, Cost: 1, Slot: slot}, {Rule: c.ban, Key: c.kb, Cost: 1}, {Rule: c.fw, Key: c.kf, Cost: 1}}
}

// two is a request of cc and fw, holding slot in cc.
func (c *multiSlotStores) two(slot string) []Request {
	return []Request{{Rule: c.cc, Key: c.kc, Cost: 1, Slot: slot}, {Rule: c.fw, Key: c.kf, Cost: 1}}
}

// checkRefundOfAnAdmitted: an admitted request's slot and window charge
// are held, and given back by its refund.
func (c *multiSlotStores) checkRefundOfAnAdmitted(t *testing.T) {
	r1 := c.three("s1")
	ok, res1 := c.both(t, "the first request", r1...)
	if !ok {
		t.Fatalf("the first request was denied: %+v", res1)
	}
	c.held(t, "admitted", 1, 1)
	c.refundBoth(t, []Request{r1[0], r1[2]}, []Result{res1[0], res1[2]}) // its end; fw counts its status out
	c.held(t, "refunded", 0, 0)
}

// checkBanAcrossSlots: the ban zone denies, then bans, and the slots that
// admitted are refunded each time.
func (c *multiSlotStores) checkBanAcrossSlots(t *testing.T) {
	ok, res := c.both(t, "the ban zone's first denial", c.three("s2")...)
	if ok || !res[0].Allowed || res[0].Remaining != 1 || res[1].Allowed || res[1].Banned {
		t.Fatalf("the ban zone's first denial: %v %+v", ok, res)
	}
	c.held(t, "denied by another slot", 0, 0)
	ok, res = c.both(t, "the ban zone's second denial", c.three("s3")...)
	if ok || public(res[1]) != (Result{Banned: true, BanStarted: true, RetryAfter: 5 * time.Minute, ResetAfter: 5 * time.Minute}) {
		t.Fatalf("the ban zone's second denial: %v %+v, want the ban started", ok, res)
	}
	c.held(t, "ban started", 0, 0)
	c.clk.add(60_000_000)
	ok, res = c.both(t, "banned", c.three("s4")...)
	if ok || public(res[1]) != (Result{Banned: true, RetryAfter: 4 * time.Minute, ResetAfter: 4 * time.Minute}) {
		t.Fatalf("a minute into the ban: %v %+v", ok, res)
	}
	c.held(t, "banned", 0, 0)
}

// checkRefundsAcrossAWindowsTurn: refunds with their charge's time across
// a window's turn.
func (c *multiSlotStores) checkRefundsAcrossAWindowsTurn(t *testing.T) {
	r5 := c.two("s5")
	ok, res5 := c.both(t, "in the first window", r5...)
	if !ok {
		t.Fatal("denied in the first window")
	}
	c.clk.set(windowStart(c.clk.now(), c.w) + int64(c.w/time.Microsecond) + 1_000_000) // the next window
	if ok, _ := c.both(t, "slot held, next window", c.two("s6")...); ok {
		t.Fatal("a second slot admitted")
	}
	c.held(t, "denied by the held slot in the next window", 1, 0)
	c.refundBoth(t, r5[:1], res5[:1]) // r5 ends
	if ok, _ := c.both(t, "after the refund", c.two("s7")...); !ok {
		t.Fatal("denied after the refund")
	}
	c.held(t, "admitted in the next window", 1, 1)
	// r5's response is not counted after all: its charge was in the
	// previous window, which this one does not count.
	c.refundBoth(t, r5[1:], res5[1:])
	c.held(t, "a refund of the previous window's charge", 1, 1)
	if ok, _ := c.both(t, "the window's second request", Request{Rule: c.fw, Key: c.kf, Cost: 1}); !ok {
		t.Fatal("the window's second request was denied")
	}
	if ok, _ := c.both(t, "the window's third request", Request{Rule: c.fw, Key: c.kf, Cost: 1}); ok {
		t.Fatal("a third request in a window of 2 admitted")
	}
}

// onDistinctNodes returns, for each rule, a client key whose bucket in the
// store sits on a Cluster node of its own (so on a slot of its own):
// the first such keys among k0, k1, ...
func onDistinctNodes(t *testing.T, cl *redistest.Cluster, rs *RedisStore, rules []*Rule) []string {
	t.Helper()
	keys := make([]string, 0, len(rules))
	used := map[string]bool{}
	for i := 0; len(keys) < len(rules); i++ {
		if i > 10_000 {
			t.Fatal("no keys on distinct nodes")
		}
		key := fmt.Sprint("k", i)
		node := cl.NodeForSlot(keySlot(rs.Key(rules[len(keys)].Bucket(), key))).Addr
		if !used[node] {
			used[node] = true
			keys = append(keys, key)
		}
	}
	return keys
}
