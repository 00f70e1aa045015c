package limiter

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fleetlimit/caddy-fleetlimit/internal/redistest"
	"github.com/fleetlimit/caddy-fleetlimit/lua"
)

// TestPeekRedisMatchesMemory: after the same random trace of every policy
// (policyRules), the peek script and the memory store read the same state
// of every zone's bucket and ban, on one controlled clock; and reading
// writes nothing: the script runs under EVAL_RO, which refuses any write,
// and Redis' keys and the decisions that follow are as they were.
func TestPeekRedisMatchesMemory(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	clk := newTestClock(epoch)
	rs := newRedisStore(t, RedisOptions{Address: srv.Addr, KeyPrefix: "peek:", Clock: clk})
	ms := newMemory(t, clk)
	rules := append(policyRules(t), mustConfig(t, RuleConfig{Name: "qt", Algorithm: Quota, Rate: 50, Period: Day}))
	keys := []string{"198.51.100.7", "user@example.com"}
	rng := rand.New(rand.NewPCG(7, 7))
	ctx := context.Background()
	p := &peekCheck{srv: srv, rs: rs, ms: ms, clk: clk, rules: rules, seen: map[string]bool{}, wall: time.Now()}
	for step := range 600 {
		r, key := rules[rng.IntN(len(rules))], keys[rng.IntN(len(keys))]
		cost := int64(1 + rng.IntN(2))
		if r.alg == Concurrency {
			cost = 1
		}
		req := []Request{{Rule: r, Key: key, Cost: cost, Slot: fmt.Sprint("s", step)}}
		got := make([]Result, 1)
		want := make([]Result, 1)
		if _, err := rs.Decide(ctx, slices.Clone(req), got); err != nil {
			t.Fatal(err)
		}
		_, _ = ms.Decide(ctx, slices.Clone(req), want)
		// The test clock runs ahead of the real one: Redis expires keys
		// by real time, and a key it dropped must be full by the test
		// clock too (a key the test clock calls full reads full from
		// Redis whether it expired there or not).
		clk.add(int64(rng.IntN(200_000)) + time.Since(p.wall).Microseconds())
		p.wall = time.Now()
		if step%20 != 19 {
			continue
		}
		clk.add(100_000)
		for _, key := range keys {
			p.check(t, step, key)
		}
	}
	for _, what := range []string{"ban", "token_bucket", "sliding_log", "concurrency", "fixed_window", "quota"} {
		if !p.seen[what] {
			t.Errorf("the trace never peeked a %s that was not full", what)
		}
	}
}

// peekCheck compares the Redis and the memory store's peeks of rules on
// one test clock, and notes in seen what it saw that was not full.
type peekCheck struct {
	srv   *redistest.Server
	rs    *RedisStore
	ms    *MemoryStore
	clk   *testClock
	rules []*Rule
	seen  map[string]bool
	wall  time.Time // when the test clock last caught up with real time
}

// check peeks key on both stores: they read the same, Redis' keys are as
// they were, and the peek script runs under EVAL_RO.
func (p *peekCheck) check(t *testing.T, step int, key string) {
	t.Helper()
	ctx := context.Background()
	before := dumpKeys(t, p.srv, "peek:*")
	// The real time the dumps took, on the test clock too: a busy
	// machine spends hundreds of ms on them.
	p.clk.add(time.Since(p.wall).Microseconds())
	p.wall = time.Now()
	fromRedis, err := p.rs.Peek(ctx, p.rules, key)
	if err != nil {
		t.Fatalf("redis peek: %v", err)
	}
	fromMemory, _ := p.ms.Peek(ctx, p.rules, key)
	for i := range p.rules {
		a, b := fromRedis[i], fromMemory[i]
		a.At, b.At = time.Time{}, time.Time{}
		if a != b {
			t.Fatalf("step %d, zone %s, key %s: redis peeks %+v, memory %+v", step, p.rules[i].name, key, a, b)
		}
		if a.BanLeft > 0 {
			p.seen["ban"] = true
		}
		if a.Remaining < p.rules[i].burst {
			p.seen[p.rules[i].alg.String()] = true
		}
	}
	checkPeekWroteNothing(t, p.srv, step, before, dumpKeys(t, p.srv, "peek:*"))
	k, args := p.rs.peekArgs(p.rules, key)
	cmd := append([]any{"eval_ro", lua.Peek, len(k)}, toAny(k)...)
	if err := p.rs.client.Do(ctx, append(cmd, args...)...).Err(); err != nil {
		t.Fatalf("the peek script under EVAL_RO, which refuses writes: %v", err)
	}
}

// checkPeekWroteNothing: every key after a peek holds what it held
// before, and none is gone but by its TTL.
func checkPeekWroteNothing(t *testing.T, srv *redistest.Server, step int, before, after map[string]dumped) {
	t.Helper()
	for k, v := range after {
		if b, ok := before[k]; !ok || b.dump != v.dump {
			t.Fatalf("step %d: peeking changed %s: before %q, after %q (ttl %d, %d); GET %q", step, k, b.dump, v.dump, b.pttl, v.pttl, srv.MustDo("GET", k))
		}
	}
	for k, b := range before {
		// A key may expire meanwhile: TTLs run in real time.
		if _, ok := after[k]; !ok && (b.pttl < 0 || b.pttl > 2000) {
			t.Fatalf("step %d: peeking deleted %s (its TTL was %d ms)", step, k, b.pttl)
		}
	}
}

// dumped is a key's value, as DUMP gives it, and its TTL in milliseconds.
type dumped struct {
	dump string
	pttl int64
}

// dumpKeys returns every key matching pattern with its value's dump and
// its TTL: what Redis holds.
func dumpKeys(t *testing.T, srv *redistest.Server, pattern string) map[string]dumped {
	t.Helper()
	out := map[string]dumped{}
	for _, k := range strings.Fields(srv.MustDo("KEYS", pattern)) {
		d, err := srv.Do("DUMP", k)
		pttl, _ := strconv.ParseInt(srv.MustDo("PTTL", k), 10, 64)
		if err != nil || d == "(nil)" || pttl == -2 {
			continue // expired since KEYS
		}
		out[k] = dumped{d, pttl}
	}
	return out
}

func toAny(s []string) []any {
	out := make([]any, len(s))
	for i, v := range s {
		out[i] = v
	}
	return out
}

// TestResetKeyMemory: a drained key is full again after ResetKey, with its
// ban and concurrency slots kept, and other keys untouched; the limiter's
// spares of the key are dropped, not refunded.
func TestResetKeyMemory(t *testing.T) {
	t.Parallel()
	clk := newTestClock(epoch)
	ms := newMemory(t, clk)
	l := New(ms, Options{})
	t.Cleanup(l.Close)
	tb := mustConfig(t, RuleConfig{Name: "tb", Rate: 1, Per: time.Minute, Burst: 5})
	pf := mustConfig(t, RuleConfig{Name: "pf", Rate: 1, Per: time.Minute, Burst: 20, Prefetch: 8})
	log := mustConfig(t, RuleConfig{Name: "lg", Algorithm: SlidingLog, Rate: 3, Per: time.Minute})
	cc := mustConfig(t, RuleConfig{Name: "cc", Algorithm: Concurrency, Rate: 2})
	ctx := context.Background()
	drain := func(r *Rule, key string) int {
		n := 0
		for range 20 {
			res := make([]Result, 1)
			if l.Decide(ctx, []Request{{Rule: r, Key: key, Cost: 1}}, res) == Allowed {
				n++
			}
		}
		return n
	}
	for _, r := range []*Rule{tb, log, cc} {
		for _, k := range []string{"a", "b"} {
			drain(r, k)
		}
	}
	if l.Decide(ctx, []Request{{Rule: pf, Key: "a", Cost: 1}}, make([]Result, 1)) != Allowed || spareOf(l, pf, "a") == 0 {
		t.Fatal("the prefetching zone took no spares")
	}
	n, err := l.ResetKey(ctx, []*Rule{tb, log, cc}, "a")
	if err != nil || n != 2 {
		t.Fatalf("ResetKey = %d, %v; want the token bucket and the log reset", n, err)
	}
	if _, err := l.ResetKey(ctx, []*Rule{pf}, "a"); err != nil {
		t.Fatal(err)
	}
	if n := spareOf(l, pf, "a"); n != 0 {
		t.Errorf("the limiter still holds %d spares of the reset key", n)
	}
	st, _ := l.Peek(ctx, []*Rule{tb, log, cc}, "a")
	if st[0].Remaining != 5 || st[0].ResetAfter != 0 || st[1].Remaining != 3 || st[2].Slots != 2 {
		t.Errorf("after the reset a reads %+v; want full buckets and its 2 slots kept", st)
	}
	if got := drain(tb, "a"); got != 5 {
		t.Errorf("the reset token bucket admitted %d, want its burst, 5", got)
	}
	if got := drain(log, "a"); got != 3 {
		t.Errorf("the reset log admitted %d, want 3", got)
	}
	if got := drain(tb, "b"); got != 0 {
		t.Errorf("key b, not reset, admitted %d, want 0", got)
	}
	if returned := l.PrefetchStats(pf).Returned; returned != 0 {
		t.Errorf("%d spares were refunded; a reset drops them", returned)
	}
}

// spareOf returns the spares the limiter holds of key in r's zone.
func spareOf(l *Limiter, r *Rule, key string) int64 {
	sp := l.spares.Load()
	if sp == nil {
		return 0
	}
	sp.mu.Lock()
	defer sp.mu.Unlock()
	if s := sp.m[spareKey{r.bucket, key}]; s != nil {
		return s.n
	}
	return 0
}

// TestResetKeyRedisReachesEveryNode: two stores on one Redis (two nodes),
// each with a deny cache that holds the drained key's denial: a reset
// through one lets the key through on both, the other as soon as the
// ban channel's message arrives; Peek reads the bucket full again.
func TestResetKeyRedisReachesEveryNode(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	rule := mustConfig(t, RuleConfig{Name: "rz", Rate: 1, Per: time.Hour, Burst: 3})
	ctx := context.Background()
	var nodes []*Limiter
	for range 2 {
		s := newRedisStore(t, RedisOptions{Address: srv.Addr, KeyPrefix: "rk:"})
		l := New(s, Options{Cache: NewDenyCache(DenyCacheOptions{})})
		t.Cleanup(l.Close)
		nodes = append(nodes, l)
	}
	decide := func(l *Limiter, key string) Outcome {
		return l.Decide(ctx, []Request{{Rule: rule, Key: key, Cost: 1}}, make([]Result, 1))
	}
	for range 5 {
		for _, l := range nodes {
			decide(l, "k")
			decide(l, "other")
		}
	}
	for i, l := range nodes {
		if decide(l, "k") != Denied || l.Cache().Len() == 0 {
			t.Fatalf("node %d: the key is not denied from its deny cache", i)
		}
	}
	// The other node learns the reset from the channel, whose subscriber
	// may still be connecting: wait for it to be subscribed.
	waitFor(t, "the ban channel's subscribers", func() bool {
		return strings.Contains(srv.MustDo("PUBSUB", "NUMSUB", "rk:bans"), "2")
	})
	if n, err := nodes[0].ResetKey(ctx, []*Rule{rule}, "k"); n != 1 || err != nil {
		t.Fatalf("ResetKey = %d, %v", n, err)
	}
	if got := decide(nodes[0], "k"); got != Allowed {
		t.Errorf("the node that reset the key answers %v", got)
	}
	start := time.Now()
	for decide(nodes[1], "k") != Allowed {
		if time.Since(start) > 2*time.Second {
			t.Fatal("the other node still denies the reset key 2 s later")
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Logf("the other node admitted the key %v after the reset", time.Since(start))
	if decide(nodes[1], "other") != Denied {
		t.Errorf("a key that was not reset is admitted")
	}
	st, err := nodes[1].Peek(ctx, []*Rule{rule}, "k")
	if err != nil || st[0].Remaining != 1 {
		t.Errorf("Peek after the reset and two admissions = %+v, %v; want 1 left", st, err)
	}
}
