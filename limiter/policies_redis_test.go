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
		w := 10 * time.Minute
		clk := newTestClock(windowStart(epoch, w) + 1_000_000)
		rs := newRedisStore(t, RedisOptions{Addresses: cl.Addrs(), Cluster: true, KeyPrefix: "ms:", Clock: clk})
		ms := newMemory(t, clk)
		red := &policyStore{Store: rs, clk: clk, rs: rs}
		mem := &policyStore{Store: ms, clk: clk, ms: ms}
		cc := mustConfig(t, RuleConfig{Name: "cc", Algorithm: Concurrency, Rate: 1, Lease: time.Hour})
		ban := mustConfig(t, RuleConfig{Name: "ban", Rate: 1, Per: time.Hour,
			Ban: Ban{Duration: 5 * time.Minute, After: 2, Window: time.Minute}})
		fw := mustConfig(t, RuleConfig{Name: "fw", Algorithm: FixedWindow, Rate: 2, Per: w, Refunds: true})
		keys := onDistinctNodes(t, cl, rs, []*Rule{cc, ban, fw})
		kc, kb, kf := keys[0], keys[1], keys[2]

		// both decides on both stores and requires the same answer.
		both := func(what string, reqs ...Request) (bool, []Result) {
			t.Helper()
			okR, got := decide(t, rs, reqs...)
			okM, want := decide(t, ms, reqs...)
			if okR != okM || !equalResults(got, want) {
				t.Fatalf("%s, %s:\ncluster %v %+v\nmemory  %v %+v", what, describePolicies(reqs), okR, got, okM, want)
			}
			return okR, got
		}
		refundBoth := func(reqs []Request, results []Result) {
			t.Helper()
			refund(t, rs, reqs, results)
			refund(t, ms, reqs, results)
		}
		// held requires both stores to count slots in cc and
		// requests in fw's current window.
		held := func(what string, slots, count int64) {
			t.Helper()
			for _, s := range []*policyStore{red, mem} {
				if n, m := s.stored(t, cc, kc), s.stored(t, fw, kf); n != slots || m != count {
					t.Fatalf("%s: %d slots held and %d in the window, want %d and %d (redis: %v)", what, n, m, slots, count, s.rs != nil)
				}
			}
		}
		three := func(slot string) []Request {
			return []Request{{Rule: cc, Key: kc, Cost: 1, Slot: slot}, {Rule: ban, Key: kb, Cost: 1}, {Rule: fw, Key: kf, Cost: 1}}
		}
		if groups := rs.groupBySlot(three("x")); len(groups) != 3 {
			t.Fatalf("the request's zones sit on %d slots, want 3", len(groups))
		}

		r1 := three("s1")
		ok, res1 := both("the first request", r1...)
		if !ok {
			t.Fatalf("the first request was denied: %+v", res1)
		}
		held("admitted", 1, 1)
		refundBoth([]Request{r1[0], r1[2]}, []Result{res1[0], res1[2]}) // its end; fw counts its status out
		held("refunded", 0, 0)

		ok, res := both("the ban zone's first denial", three("s2")...)
		if ok || !res[0].Allowed || res[0].Remaining != 1 || res[1].Allowed || res[1].Banned {
			t.Fatalf("the ban zone's first denial: %v %+v", ok, res)
		}
		held("denied by another slot", 0, 0)
		ok, res = both("the ban zone's second denial", three("s3")...)
		if ok || public(res[1]) != (Result{Banned: true, BanStarted: true, RetryAfter: 5 * time.Minute, ResetAfter: 5 * time.Minute}) {
			t.Fatalf("the ban zone's second denial: %v %+v, want the ban started", ok, res)
		}
		held("ban started", 0, 0)
		clk.add(60_000_000)
		ok, res = both("banned", three("s4")...)
		if ok || public(res[1]) != (Result{Banned: true, RetryAfter: 4 * time.Minute, ResetAfter: 4 * time.Minute}) {
			t.Fatalf("a minute into the ban: %v %+v", ok, res)
		}
		held("banned", 0, 0)

		// Refunds with their charge's time across a window's turn.
		two := func(slot string) []Request {
			return []Request{{Rule: cc, Key: kc, Cost: 1, Slot: slot}, {Rule: fw, Key: kf, Cost: 1}}
		}
		r5 := two("s5")
		ok, res5 := both("in the first window", r5...)
		if !ok {
			t.Fatal("denied in the first window")
		}
		clk.set(windowStart(clk.now(), w) + int64(w/time.Microsecond) + 1_000_000) // the next window
		if ok, _ := both("slot held, next window", two("s6")...); ok {
			t.Fatal("a second slot admitted")
		}
		held("denied by the held slot in the next window", 1, 0)
		refundBoth(r5[:1], res5[:1]) // r5 ends
		if ok, _ := both("after the refund", two("s7")...); !ok {
			t.Fatal("denied after the refund")
		}
		held("admitted in the next window", 1, 1)
		// r5's response is not counted after all: its charge was in the
		// previous window, which this one does not count.
		refundBoth(r5[1:], res5[1:])
		held("a refund of the previous window's charge", 1, 1)
		if ok, _ := both("the window's second request", Request{Rule: fw, Key: kf, Cost: 1}); !ok {
			t.Fatal("the window's second request was denied")
		}
		if ok, _ := both("the window's third request", Request{Rule: fw, Key: kf, Cost: 1}); ok {
			t.Fatal("a third request in a window of 2 admitted")
		}
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
