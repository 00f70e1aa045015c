package limiter

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetlimit/caddy-fleetlimit/internal/redistest"
)

// TestPoliciesRedisMatchesMemory replays random traces of every policy
// through the Lua script and the memory store on one controlled clock:
// every algorithm (concurrency included), reserves, dry-run zones, bans
// (dry-run bans too), requests of several zones, and refunds at random
// later times (concurrency slots and charges refunded, also after
// their window turned). Every decision and every Result field must be the
// same, and so must what the buckets and bans count.
func TestPoliciesRedisMatchesMemory(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	decisions := 2500
	if raceEnabled {
		decisions = 1200
	}
	for seed := range 3 {
		t.Run(fmt.Sprint("seed ", seed), func(t *testing.T) {
			t.Parallel()
			clk := newTestClock(epoch + int64(seed)*1e12)
			rs := newRedisStore(t, RedisOptions{Address: srv.Addr, KeyPrefix: fmt.Sprintf("pol%d:", seed), Clock: clk})
			p := newPolicyTrace(t, rs, newMemory(t, clk), clk, uint64(seed), policyRules(t),
				[]string{"198.51.100.7", "2001:db8::1", "user@example.com"}, 4)
			p.run(decisions)
			p.requireCoverage()
		})
	}
}

// policyRules returns the zones of the policy traces: every algorithm,
// some with bans, some dry runs (one with a ban), some whose charges are
// refunded, some that shed softly (with prefetch, and in a dry run). Windows last at least 2s (the sliding log) or 10s (the
// counters, whose state carries the window's index modulo 1024: 1024
// windows must outlast the run); concurrency leases outlast the longest
// wait of a refund in the trace, so that no slot expires in Redis while
// the memory store, which has no leases, still counts it.
func policyRules(t testing.TB) []*Rule {
	ban := Ban{Duration: 30 * time.Second, After: 3, Window: 10 * time.Second}
	lease := 10 * time.Minute
	return []*Rule{
		mustConfig(t, RuleConfig{Name: "tb", Rate: 3, Per: time.Second, Burst: 3, SoftShed: 60, SoftShedMaxDelay: 300 * time.Millisecond}),
		mustConfig(t, RuleConfig{Name: "tbr", Rate: 10, Per: time.Minute, Refunds: true}),
		mustConfig(t, RuleConfig{Name: "tbban", Rate: 2, Per: time.Second, Burst: 2, Ban: ban}),
		mustConfig(t, RuleConfig{Name: "tbdry", Rate: 1, Per: 2 * time.Second, DryRun: true, SoftShed: 30,
			Ban: Ban{Duration: 30 * time.Second, After: 2, Window: 10 * time.Second}}),
		mustConfig(t, RuleConfig{Name: "lb", Algorithm: LeakyBucket, Rate: 5, Per: time.Second, Burst: 4, Refunds: true}),
		mustConfig(t, RuleConfig{Name: "lbban", Algorithm: LeakyBucket, Rate: 3, Per: time.Second, Burst: 10,
			MaxDelay: 700 * time.Millisecond, Ban: ban}),
		mustConfig(t, RuleConfig{Name: "fw", Algorithm: FixedWindow, Rate: 5, Per: 10 * time.Second, Refunds: true}),
		mustConfig(t, RuleConfig{Name: "fwban", Algorithm: FixedWindow, Rate: 4, Per: 10 * time.Second,
			Ban: Ban{Duration: time.Minute, After: 2, Window: 20 * time.Second}}),
		mustConfig(t, RuleConfig{Name: "sw", Algorithm: SlidingWindow, Rate: 4, Per: 10 * time.Second, Refunds: true}),
		mustConfig(t, RuleConfig{Name: "swdry", Algorithm: SlidingWindow, Rate: 6, Per: 20 * time.Second, DryRun: true, Ban: ban}),
		mustConfig(t, RuleConfig{Name: "log", Algorithm: SlidingLog, Rate: 3, Per: 2 * time.Second, Refunds: true}),
		mustConfig(t, RuleConfig{Name: "logban", Algorithm: SlidingLog, Rate: 10, Per: time.Minute, Ban: ban}),
		mustConfig(t, RuleConfig{Name: "cc", Algorithm: Concurrency, Rate: 3, Lease: lease}),
		mustConfig(t, RuleConfig{Name: "ccban", Algorithm: Concurrency, Rate: 2, Lease: lease, Ban: ban}),
		mustConfig(t, RuleConfig{Name: "ccdry", Algorithm: Concurrency, Rate: 1, Lease: lease, DryRun: true}),
		mustConfig(t, RuleConfig{Name: "tbpf", Rate: 20, Per: time.Second, Burst: 20, Prefetch: 8, SoftShed: 50}),
		mustConfig(t, RuleConfig{Name: "fwpf", Algorithm: FixedWindow, Rate: 30, Per: 10 * time.Second, Prefetch: 6, Refunds: true}),
		mustConfig(t, RuleConfig{Name: "fwwide", Algorithm: FixedWindow, Rate: 3_000_000, Per: 10 * time.Second, Refunds: true}),
	}
}

// pendingRefund is what a trace refunds later: zones of an admitted
// request (its concurrency slots, and the charges that its response does
// not count), with Decide's results for them, due at microsecond due.
type pendingRefund struct {
	due     int64
	reqs    []Request
	results []Result
}

// policyTrace replays a random trace of decisions and refunds through a
// Redis store whose script reads a test clock and a memory store on the
// same clock, and fails at the first difference.
type policyTrace struct {
	t       *testing.T
	rs      *RedisStore
	ms      *MemoryStore
	clk     *testClock
	rng     *rand.Rand
	rules   []*Rule
	keys    []string
	spread  int // one zone in spread takes a key of its own
	slots   int // concurrency slots named so far
	pending []pendingRefund
	counts  map[string]int
	// began is when (wall time) the current decision's step began: the
	// simulated clock has not caught up with the real time since, which a
	// busy machine may stretch (see compareBuckets).
	began time.Time
}

// newPolicyTrace returns a trace over rules and client keys, drawn from
// seed; one zone of a request in spread takes another key than the
// request's (on a Cluster: another slot, most likely).
func newPolicyTrace(t *testing.T, rs *RedisStore, ms *MemoryStore, clk *testClock, seed uint64, rules []*Rule, keys []string, spread int) *policyTrace {
	return &policyTrace{t: t, rs: rs, ms: ms, clk: clk, rng: rand.New(rand.NewPCG(seed, 0xb60283a)),
		rules: rules, keys: keys, spread: spread, counts: map[string]int{}}
}

// run replays decisions requests, with the refunds that fall due between
// them.
func (p *policyTrace) run(decisions int) {
	t := p.t
	t.Helper()
	ctx := context.Background()
	prevWall := time.Now()
	for n := range decisions {
		// Redis expires keys on its own clock, after the TTL the script
		// set: simulated time runs faster than real time (see
		// replayTrace), so that Redis never drops a key the simulated
		// clock still counts.
		wall := time.Now()
		p.clk.add(2*int64(wall.Sub(prevWall)/time.Microsecond) + 5000)
		prevWall, p.began = wall, wall
		p.step()
		p.refundDue(ctx, n)
		reqs := p.request()
		got, want := make([]Result, len(reqs)), make([]Result, len(reqs))
		sent := time.Now()
		okR, err := p.rs.Decide(ctx, reqs, got)
		if err != nil {
			t.Fatalf("decision %d: redis: %v", n, err)
		}
		okM, err := p.ms.Decide(ctx, reqs, want)
		if err != nil {
			t.Fatalf("decision %d: memory: %v", n, err)
		}
		if okR != okM || !equalResults(got, want) {
			t.Fatalf("decision %d at +%dus, %s:\nredis  %v %+v\nmemory %v %+v",
				n, p.clk.now()-epoch, describePolicies(reqs), okR, got, okM, want)
		}
		p.count(reqs, okR, got)
		if okR {
			p.schedule(reqs, got)
		}
		p.compareBuckets(n, reqs, sent)
	}
}

// step advances the clock by a random step: often none, mostly less than
// the windows, now and then more than a window.
func (p *policyTrace) step() {
	switch x := p.rng.IntN(10); {
	case x < 4:
	case x < 7:
		p.clk.add(p.rng.Int64N(100_000))
	case x < 9:
		p.clk.add(p.rng.Int64N(1_500_000))
	default:
		p.clk.add(p.rng.Int64N(20_000_000))
	}
}

// request draws the next request: one to three zones, mostly of one key,
// costs mostly 1 (also 0, up to the burst, and one above it), a reserve
// for a third of the zones, and a slot of its own for each concurrency
// zone.
func (p *policyTrace) request() []Request {
	zones := p.rng.Perm(len(p.rules))[:1+p.rng.IntN(3)]
	reqs := make([]Request, len(zones))
	key := p.keys[p.rng.IntN(len(p.keys))]
	for i, z := range zones {
		r := p.rules[z]
		q := Request{Rule: r, Key: key}
		if p.rng.IntN(p.spread) == 0 {
			q.Key = p.keys[p.rng.IntN(len(p.keys))]
		}
		switch x := p.rng.IntN(20); {
		case x < 12:
			q.Cost = 1
		case x < 14:
			q.Cost = 0
		case x < 19:
			q.Cost = p.rng.Int64N(r.burst + 1)
		default:
			q.Cost = r.burst + 1
		}
		if p.rng.IntN(3) == 0 {
			q.Reserve = []int64{10, 30, 50, 90, 99}[p.rng.IntN(5)]
		}
		if r.alg == Concurrency {
			p.slots++
			q.Slot = "slot-" + strconv.Itoa(p.slots)
		}
		reqs[i] = q
	}
	return reqs
}

// schedule queues the refund of an admitted request: its concurrency
// zones always (their slots are refunded when the request ends), and for
// one request in three (a response its zones do not count) a random
// choice of its other zones; due within 25s, so that refunds come well
// within the leases, and refunds of window charges come in the same
// window or one or two windows later.
func (p *policyTrace) schedule(reqs []Request, results []Result) {
	countStatus := p.rng.IntN(3) == 0
	var pr pendingRefund
	for i, q := range reqs {
		if q.Rule.alg == Concurrency || (countStatus && p.rng.IntN(2) == 0) {
			pr.reqs, pr.results = append(pr.reqs, q), append(pr.results, results[i])
		}
	}
	if len(pr.reqs) == 0 {
		return
	}
	switch x := p.rng.IntN(10); {
	case x < 5:
		pr.due = p.clk.now() + p.rng.Int64N(1_000_000)
	case x < 8:
		pr.due = p.clk.now() + p.rng.Int64N(12_000_000)
	default:
		pr.due = p.clk.now() + p.rng.Int64N(25_000_000)
	}
	p.pending = append(p.pending, pr)
}

// refundDue refunds, in both stores and in the order they were
// scheduled, the refunds due by now.
func (p *policyTrace) refundDue(ctx context.Context, n int) {
	t := p.t
	t.Helper()
	now := p.clk.now()
	left := p.pending[:0]
	for _, pr := range p.pending {
		if pr.due > now {
			left = append(left, pr)
			continue
		}
		if err := p.rs.Refund(ctx, pr.reqs, pr.results); err != nil {
			t.Fatalf("before decision %d: redis refund of %s: %v", n, describePolicies(pr.reqs), err)
		}
		if err := p.ms.Refund(ctx, pr.reqs, pr.results); err != nil {
			t.Fatalf("before decision %d: memory refund of %s: %v", n, describePolicies(pr.reqs), err)
		}
		p.counts["refunds"]++
		for i, q := range pr.reqs {
			r := q.Rule
			switch {
			case r.alg == Concurrency:
				p.counts["slots refunded"]++
			case r.windowUS > 0 && pr.results[i].at/r.windowUS != now/r.windowUS:
				p.counts["window refunds after the window turned"]++
			case r.windowUS > 0:
				p.counts["window refunds"]++
			}
		}
		p.compareBuckets(n, pr.reqs, time.Now())
	}
	clear(p.pending[len(left):])
	p.pending = left
}

// count records what a decision covered.
func (p *policyTrace) count(reqs []Request, ok bool, got []Result) {
	if p.rs.cluster && len(p.rs.groupBySlot(reqs)) > 1 {
		p.counts["requests on several slots"]++
		if !ok {
			p.counts["requests on several slots denied"]++
		}
	}
	for i, q := range reqs {
		res := got[i]
		switch {
		case res.BanStarted && res.DryRun:
			p.counts["dry-run bans started"]++
		case res.BanStarted:
			p.counts["bans started"]++
		case res.Banned:
			p.counts["banned"]++
		case res.DryRun:
			p.counts["dry-run denials"]++
		case res.RetryAfter == Never:
			p.counts["never"]++
		case !res.Allowed && q.Reserve > 0:
			p.counts["denied with a reserve"]++
		case res.Allowed && ok && q.Reserve > 0:
			p.counts["admitted with a reserve"]++
		}
		if res.Allowed && ok && res.Delay > 0 && q.Rule.shedMaxUS > 0 {
			p.counts["soft shed delays"]++
		}
		if q.Rule.alg == Concurrency && !res.Banned {
			if res.Allowed && ok {
				p.counts["concurrency admitted"]++
			} else if !res.Allowed {
				p.counts["concurrency denied"]++
			}
		}
	}
}

// requireCoverage fails the test when the trace missed a policy.
func (p *policyTrace) requireCoverage() {
	p.t.Helper()
	p.t.Logf("covered: %v", p.counts)
	need := []string{"bans started", "banned", "dry-run denials", "dry-run bans started", "never",
		"denied with a reserve", "admitted with a reserve", "concurrency admitted", "concurrency denied",
		"refunds", "slots refunded", "window refunds", "window refunds after the window turned", "soft shed delays"}
	if p.rs.cluster {
		need = append(need, "requests on several slots", "requests on several slots denied")
	}
	for _, k := range need {
		if p.counts[k] == 0 {
			p.t.Errorf("the trace covered no %s", k)
		}
	}
}

// compareBuckets checks that Redis and the memory store count the same in
// the buckets and bans of reqs at the clock's time: the debt of a token or
// leaky bucket, a window's counts, a sliding log's entries, the slots held
// (their lease not yet over), a ban and the denials counted towards one.
// The values themselves may differ where they mean the same (a Cluster's
// charge and refund rewrite a window state in the current window's form).
// A Redis key whose TTL ran out in the real time since sent (the store's
// call), or since the step began (real time that the simulated clock has
// not caught up with yet, when the machine is busy), may be gone while the
// memory store's bucket still counts for the few milliseconds that TTLs
// round away.
func (p *policyTrace) compareBuckets(n int, reqs []Request, sent time.Time) {
	t := p.t
	t.Helper()
	now := p.clk.now()
	if !p.began.IsZero() && p.began.Before(sent) {
		sent = p.began
	}
	slack := int64(time.Since(sent)/time.Microsecond) + 2000
	for _, q := range reqs {
		r := q.Rule
		mem, memExpires := p.memBucket(r, q.Key, now)
		red, inRedis := p.redisBucket(r, q.Key, now)
		if mem != red && (inRedis || memExpires-now > slack) {
			t.Fatalf("after decision %d at +%dus: %s key %q: redis counts %s, memory %s",
				n, now-epoch, r.name, q.Key, red, mem)
		}
		if r.ban.enabled() {
			p.compareBan(n, r, q.Key, now, slack)
		}
	}
}

// memBucket returns what the memory store's bucket counts at now, and when
// it stops counting anything.
func (p *policyTrace) memBucket(r *Rule, key string, now int64) (string, int64) {
	id := p.ms.hash.id(r.bucket, key)
	sh := &p.ms.shards[id.shard()]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if r.alg == SlidingLog {
		lb := sh.logs[id]
		if lb == nil {
			return logCounts(r, nil, now), 0
		}
		return logCounts(r, lb.entries, now), lb.expires
	}
	e, ok := sh.m.get(id)
	if !ok || e.expires <= now {
		return stateCounts(r, 0, now), 0
	}
	return stateCounts(r, e.state, now), e.expires
}

// redisBucket returns what the Redis bucket counts at now, and whether
// Redis holds it.
func (p *policyTrace) redisBucket(r *Rule, key string, now int64) (string, bool) {
	t := p.t
	t.Helper()
	ctx, k := context.Background(), p.rs.Key(r.bucket, key)
	c := p.rs.Client()
	switch r.alg {
	case SlidingLog:
		items, err := c.ZRangeWithScores(ctx, k, 0, -1).Result()
		if err != nil {
			t.Fatalf("ZRANGE %s: %v", k, err)
		}
		log := make([]logEntry, 0, len(items))
		for _, it := range items {
			m, _ := it.Member.(string)
			parts := strings.Split(m, ":")
			if len(parts) != 3 {
				t.Fatalf("%s holds the member %q", k, m)
			}
			cost, _ := strconv.ParseInt(parts[1], 10, 64)
			log = append(log, logEntry{t: int64(it.Score), cost: cost})
		}
		return logCounts(r, log, now), len(items) > 0
	case Concurrency:
		// The slots whose lease has not ended (the script prunes the
		// others on its next decision).
		held, err := c.ZCount(ctx, k, "("+strconv.FormatInt(now, 10), "+inf").Result()
		if err != nil {
			t.Fatalf("ZCOUNT %s: %v", k, err)
		}
		return stateCounts(r, State(held), now), held > 0
	}
	v, err := c.Get(ctx, k).Int64()
	switch {
	case errors.Is(err, redis.Nil):
		return stateCounts(r, 0, now), false
	case err != nil:
		t.Fatalf("GET %s: %v", k, err)
	}
	return stateCounts(r, State(v), now), true
}

// stateCounts describes what a bucket in state s counts at now.
func stateCounts(r *Rule, s State, now int64) string {
	switch r.alg {
	case FixedWindow:
		curr, _ := r.fixedCounts(s, now)
		return fmt.Sprintf("count %d", curr)
	case SlidingWindow:
		prev, curr, _ := r.windowCounts(s, now)
		return fmt.Sprintf("counts %d, %d", prev, curr)
	case Concurrency:
		return fmt.Sprintf("%d slots", s)
	}
	return fmt.Sprintf("debt %d", r.debt(s, now))
}

// logCounts describes the entries of a sliding log still in its window at
// now.
func logCounts(r *Rule, log []logEntry, now int64) string {
	var in []string
	for _, e := range log {
		if e.t > now-r.windowUS {
			in = append(in, fmt.Sprintf("%d:%d", e.t-epoch, e.cost))
		}
	}
	slices.Sort(in)
	return "log [" + strings.Join(in, " ") + "]"
}

// compareBan checks that Redis holds the ban and the denial count that the
// memory store holds for the key in r's zone at now: "end:start:denials"
// in <bucket>!ban while a ban lasts, "denials:end" in <bucket>!den while
// its window lasts.
func (p *policyTrace) compareBan(n int, r *Rule, key string, now, slack int64) {
	t := p.t
	t.Helper()
	id := p.ms.hash.id(r.bucket, key)
	sh := &p.ms.shards[id.shard()]
	sh.mu.Lock()
	b := sh.bans[id]
	sh.mu.Unlock()
	k := p.rs.Key(r.bucket, key)
	get := func(suffix string) string {
		v, err := p.rs.Client().Get(context.Background(), k+suffix).Result()
		if err != nil && !errors.Is(err, redis.Nil) {
			t.Fatalf("GET %s%s: %v", k, suffix, err)
		}
		return v
	}
	// endOf returns the end a value names: its first number.
	endOf := func(v string, at int) int64 {
		parts := strings.Split(v, ":")
		if at >= len(parts) {
			return 0
		}
		e, _ := strconv.ParseInt(parts[at], 10, 64)
		return e
	}
	check := func(what, got, want string, end int64, gotEnd int64) {
		switch {
		case end > now && got == want:
		case end > now && got == "" && end-now <= slack:
		case end <= now && (got == "" || gotEnd <= now):
		default:
			t.Fatalf("after decision %d at +%dus: %s key %q: redis holds %s %q, memory %q (end +%dus)",
				n, now-epoch, r.name, key, what, got, want, end-epoch)
		}
	}
	ban := get("!ban")
	check("ban", ban, fmt.Sprintf("%d:%d:%d", b.banEnd, b.banStart, b.banDenials), b.banEnd, endOf(ban, 0))
	den := get("!den")
	check("denials", den, fmt.Sprintf("%d:%d", b.denials, b.countEnd), b.countEnd, endOf(den, 1))
}

// describePolicies describes requests with their policies, for failures.
func describePolicies(reqs []Request) string {
	var b strings.Builder
	for _, q := range reqs {
		fmt.Fprintf(&b, "[%s %s key %q cost %d reserve %d", q.Rule.name, q.Rule.alg, q.Key, q.Cost, q.Reserve)
		if q.Rule.dryRun {
			b.WriteString(" dry run")
		}
		if q.Slot != "" {
			fmt.Fprintf(&b, " slot %s", q.Slot)
		}
		b.WriteString("] ")
	}
	return b.String()
}
