package limiter

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetlimit/caddy-fleetlimit/internal/redistest"
)

// newRedisStore returns a RedisStore closed when the test ends. Tests that
// are not about timeouts use a generous one, so that a loaded machine
// (the race detector, parallel packages) cannot fail them.
func newRedisStore(t testing.TB, opt RedisOptions) *RedisStore {
	t.Helper()
	if opt.Timeout == 0 {
		opt.Timeout = 5 * time.Second
	}
	s, err := NewRedisStore(opt)
	if err != nil {
		t.Fatalf("NewRedisStore: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	// Let the start-up connection and script load finish, so that tests
	// of the script cache see only their own doing.
	select {
	case <-s.warmed:
	case <-time.After(10 * time.Second):
		t.Fatal("the store's start-up connection attempt did not end")
	}
	return s
}

func TestRedisStoreOptions(t *testing.T) {
	t.Parallel()
	if _, err := NewRedisStore(RedisOptions{}); err == nil {
		t.Fatal("NewRedisStore without an address succeeded")
	}
	// Connecting is lazy: nothing listens here, and nothing needs to.
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(redistest.FreePort(t)))
	s := newRedisStore(t, RedisOptions{Address: addr})
	if got, want := s.Key("api", "203.0.113.9"), "rl:api:{203.0.113.9}"; got != want {
		t.Fatalf("Key() = %q, want %q", got, want)
	}
	s = newRedisStore(t, RedisOptions{Address: addr, KeyPrefix: "fleet:"})
	if got, want := s.Key("api", ClientKey("{evil} key")), "fleet:api:{"+ClientKey("{evil} key")+"}"; got != want {
		t.Fatalf("Key() = %q, want %q", got, want)
	}
	if k := s.Key("api", ClientKey("{evil} key")); strings.Count(k, "{") != 1 || strings.Count(k, "}") != 1 {
		t.Fatalf("Key() = %q: a client key broke the hash tag", k)
	}
}

// TestRedisMatchesMemory runs the same random traces (times, keys, costs,
// requests of one to three zones, exact and inexact rules) through the Lua
// script and the memory store on the same clock: every decision and every
// Result is the same, and so is every stored bucket value.
func TestRedisMatchesMemory(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	rules := []*Rule{
		mustRule(t, "s3", 3, time.Second, 0),
		mustRule(t, "f12345", 12345, time.Second, 300),
		mustRule(t, "d12345", 12345, time.Second, 0),
		mustRule(t, "b1", 7, time.Second, 1),
		mustRule(t, "m100", 100, time.Minute, 5),
		mustRule(t, "m999", 999, time.Minute, 0),
		mustRule(t, "h1", 1, time.Hour, 2),
		mustRule(t, "us", 1001, time.Microsecond, 4000),
		mustRule(t, "w", 10, 1500*time.Millisecond, 4),
	}
	keys := []string{"198.51.100.7", "2001:db8::1", "user@example.com", ClientKey("{not safe}")}
	decisions := 3000
	if raceEnabled {
		decisions = 1500
	}
	for seed := range 3 {
		t.Run(fmt.Sprint("seed ", seed), func(t *testing.T) {
			t.Parallel()
			var admitted, denied, never int
			next := func(rng *rand.Rand, clk *testClock) []Request {
				switch x := rng.IntN(10); {
				case x < 4: // no more
				case x < 7:
					clk.add(rng.Int64N(1000))
				case x < 9:
					clk.add(rng.Int64N(500_000))
				default:
					clk.add(rng.Int64N(600_000_000))
				}
				zones := rng.Perm(len(rules))[:1+rng.IntN(3)]
				reqs := make([]Request, len(zones))
				key := keys[rng.IntN(len(keys))]
				for i, z := range zones {
					r := rules[z]
					k := key
					if rng.IntN(4) == 0 {
						k = keys[rng.IntN(len(keys))]
					}
					var cost int64
					switch x := rng.IntN(20); {
					case x < 11:
						cost = 1
					case x < 14:
						cost = 0
					case x < 18:
						cost = rng.Int64N(r.burst + 1)
					default:
						cost = r.burst + rng.Int64N(2)
					}
					reqs[i] = Request{Rule: r, Key: k, Cost: cost}
				}
				return reqs
			}
			seen := func(reqs []Request, ok bool, got []Result) {
				switch {
				case ok:
					admitted++
				case slicesContainNever(got):
					never++
				default:
					denied++
				}
			}
			replayTrace(t, srv, fmt.Sprintf("conf%d:", seed), uint64(seed), 99, decisions, true, next, seen)
			t.Logf("%d decisions: %d admitted, %d denied, %d impossible (cost above burst)", decisions, admitted, denied, never)
			if admitted == 0 || denied == 0 || never == 0 {
				t.Fatal("the trace did not cover admissions, denials and impossible costs")
			}
		})
	}
}

// replayTrace drives a random trace through the Redis script (its time
// fixed to a test clock) and the memory store (on the same clock), and
// fails at the first decision on which they differ in any way. next
// advances the clock and returns the next request; seen is told every
// decision. With states, every tenth decision also compares the stored
// integers.
func replayTrace(t *testing.T, srv *redistest.Server, prefix string, seed, stream uint64, decisions int, states bool,
	next func(*rand.Rand, *testClock) []Request, seen func([]Request, bool, []Result)) {
	t.Helper()
	clk := newTestClock(epoch + int64(seed)*1e12)
	rs := newRedisStore(t, RedisOptions{Address: srv.Addr, KeyPrefix: prefix, Clock: clk})
	ms := newMemory(t, clk)
	rng := rand.New(rand.NewPCG(seed, stream))
	ctx := context.Background()
	prevWall := time.Now()
	for n := range decisions {
		// Redis expires a bucket on its own clock, after the TTL the
		// script set. So that no bucket expires there while the
		// simulated clock says it is not full yet, simulated time runs
		// faster than real time, with a margin: twice the real time
		// since the last decision and 5ms more, then next's step.
		wall := time.Now()
		clk.add(2*int64(wall.Sub(prevWall)/time.Microsecond) + 5000)
		prevWall = wall
		reqs := next(rng, clk)
		got := make([]Result, len(reqs))
		want := make([]Result, len(reqs))
		sent := time.Now()
		okR, err := rs.Decide(ctx, reqs, got)
		if err != nil {
			t.Fatalf("decision %d: redis: %v", n, err)
		}
		okM, err := ms.Decide(ctx, reqs, want)
		if err != nil {
			t.Fatalf("decision %d: memory: %v", n, err)
		}
		if okR != okM || !equalResults(got, want) {
			t.Fatalf("decision %d at +%dus, %s:\nredis  %v %+v\nmemory %v %+v",
				n, clk.now()-epoch, describe(reqs), okR, got, okM, want)
		}
		seen(reqs, okR, got)
		if states && n%10 == 0 {
			compareStates(t, rs, ms, reqs, clk.now(), sent)
		}
	}
}

func equalResults(a, b []Result) bool {
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return len(a) == len(b)
}

func slicesContainNever(rs []Result) bool {
	for _, r := range rs {
		if r.RetryAfter == Never {
			return true
		}
	}
	return false
}

func describe(reqs []Request) string {
	var b strings.Builder
	for _, q := range reqs {
		fmt.Fprintf(&b, "[%s key %q cost %d] ", q.Rule, q.Key, q.Cost)
	}
	return b.String()
}

// compareStates checks that Redis and the memory store hold the same
// integer for every bucket of reqs, decided at simulated time now and real
// time sent. Redis may have dropped a bucket that is full, or one whose TTL
// ran out in the real time since.
func compareStates(t *testing.T, rs *RedisStore, ms *MemoryStore, reqs []Request, now int64, sent time.Time) {
	t.Helper()
	for _, q := range reqs {
		id := ms.hash.id(q.Rule.bucket, q.Key)
		sh := &ms.shards[id[0]%numShards]
		sh.mu.Lock()
		e, inMemory := sh.m.get(id)
		st := e.state
		sh.mu.Unlock()
		v, err := rs.Client().Get(context.Background(), rs.Key(q.Rule.bucket, q.Key)).Result()
		switch {
		case errors.Is(err, redis.Nil):
			// The TTL is at least the time to full, counted from
			// when the script ran; Redis truncates times to the
			// millisecond.
			elapsed := int64(time.Since(sent)/time.Microsecond) + 2000
			if inMemory && st.fullAt()-now > elapsed {
				t.Fatalf("%s key %q: gone from Redis %dus after the decision, but the memory store's bucket %d is full only at +%dus",
					q.Rule.name, q.Key, elapsed, st, st.fullAt()-now)
			}
		case err != nil:
			t.Fatalf("GET: %v", err)
		case v != strconv.FormatInt(int64(st), 10):
			t.Fatalf("%s key %q: Redis holds %q, the memory store %d", q.Rule.name, q.Key, v, st)
		}
	}
}

func TestRedisRecoversFromScriptFlush(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	rs := newRedisStore(t, RedisOptions{Address: srv.Addr})
	r := mustRule(t, "api", 1, time.Hour, 100)
	spent := int64(0)
	for round := range 4 {
		if round > 0 {
			srv.MustDo("SCRIPT", "FLUSH")
			if got := srv.MustDo("SCRIPT", "EXISTS", scriptSHA(t, rs)); got != "0" {
				t.Fatalf("SCRIPT EXISTS after FLUSH = %q", got)
			}
		}
		for range 3 {
			ok, res := decideOne(t, rs, r, "client", 1)
			spent++
			// NOSCRIPT means the script did not run: resending it
			// charges the bucket once, not twice.
			if !ok || res.Remaining != r.burst-spent {
				t.Fatalf("round %d: %v %+v, want %d remaining", round, ok, res, r.burst-spent)
			}
		}
	}
}

func TestRedisRecoversFromRestart(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	rs := newRedisStore(t, RedisOptions{Address: srv.Addr})
	r := mustRule(t, "api", 1, time.Hour, 100)
	reqs := []Request{{Rule: r, Key: "client", Cost: 1}}
	for round := range 3 {
		if round > 0 {
			srv.Restart() // data and script cache are gone
		}
		// Several concurrent decisions, so that several pooled
		// connections are in use when the server goes away.
		var wg sync.WaitGroup
		var admitted atomic.Int64
		for range 8 {
			wg.Go(func() {
				results := make([]Result, 1)
				ok, err := rs.Decide(context.Background(), reqs, results)
				if err != nil {
					t.Errorf("round %d: %v", round, err)
				}
				if ok {
					admitted.Add(1)
				}
			})
		}
		wg.Wait()
		if t.Failed() {
			t.FailNow()
		}
		if _, res := decideOne(t, rs, r, "client", 0); admitted.Load() != 8 || res.Remaining != r.burst-8 {
			t.Fatalf("round %d: %d admitted, %d remaining; want 8 and %d", round, admitted.Load(), res.Remaining, r.burst-8)
		}
	}
}

func scriptSHA(t *testing.T, rs *RedisStore) string {
	t.Helper()
	return rs.script.Hash()
}

// TestRedisBucketStorage checks what one bucket costs Redis: a single
// integer (OBJECT ENCODING int), at most 80 bytes for a 20-byte client key
// (MEMORY USAGE), living about as long as the bucket takes to refill (PTTL).
// It runs on Redis TIME, as in production.
func TestRedisBucketStorage(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	rs := newRedisStore(t, RedisOptions{Address: srv.Addr})
	r := mustRule(t, "api", 10, time.Minute, 0) // a token every 6s
	client := ClientKey("k-0123456789abcdef01")
	if len(client) != 20 {
		t.Fatalf("client key %q is %d bytes, want 20", client, len(client))
	}
	key := rs.Key("api", client)
	if key != "rl:api:{k-0123456789abcdef01}" {
		t.Fatalf("bucket key %q", key)
	}

	_, res := decideOne(t, rs, r, client, 1)
	if enc := srv.MustDo("OBJECT", "ENCODING", key); enc != "int" {
		t.Fatalf("OBJECT ENCODING = %q, want int", enc)
	}
	usage, err := strconv.Atoi(srv.MustDo("MEMORY", "USAGE", key))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("MEMORY USAGE of %q: %d bytes", key, usage)
	if usage > 80 {
		t.Fatalf("MEMORY USAGE = %d bytes, want at most 80", usage)
	}
	checkPTTL(t, srv, key, res.ResetAfter)
	if res.ResetAfter != 6*time.Second {
		t.Fatalf("ResetAfter after one token = %s, want 6s", res.ResetAfter)
	}
	for range 9 {
		_, res = decideOne(t, rs, r, client, 1)
	}
	if res.Remaining != 0 || res.ResetAfter < 59*time.Second {
		t.Fatalf("after draining: %+v", res)
	}
	checkPTTL(t, srv, key, res.ResetAfter) // about a minute: a full refill
	// A look stores nothing.
	if _, res := decideOne(t, rs, r, "someone-else", 0); !res.Allowed {
		t.Fatalf("look: %+v", res)
	}
	if got := srv.MustDo("EXISTS", rs.Key("api", "someone-else")); got != "0" {
		t.Fatal("a cost-0 look stored a bucket")
	}
}

// checkPTTL checks that key expires when its bucket is full again: its TTL
// is ResetAfter rounded up to the millisecond, less the little time since.
func checkPTTL(t *testing.T, srv *redistest.Server, key string, reset time.Duration) {
	t.Helper()
	pttl, err := strconv.ParseInt(srv.MustDo("PTTL", key), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	ttl := time.Duration(pttl) * time.Millisecond
	t.Logf("PTTL %s, ResetAfter %s", ttl, reset)
	if ttl > reset+time.Millisecond || ttl < reset-time.Second {
		t.Fatalf("PTTL %s for a bucket full again in %s", ttl, reset)
	}
}

// TestRedisConcurrentExact hammers one key from many goroutines through one
// store, on Redis TIME with a slow rule: exactly the burst is admitted.
func TestRedisConcurrentExact(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	rs := newRedisStore(t, RedisOptions{Address: srv.Addr})
	r := mustRule(t, "slow", 10, time.Hour, 50)
	reqs := []Request{{Rule: r, Key: "hammer", Cost: 1}}
	var admitted, failed atomic.Int64
	var wg sync.WaitGroup
	for range 64 {
		wg.Go(func() {
			results := make([]Result, 1)
			for range 25 {
				ok, err := rs.Decide(context.Background(), reqs, results)
				if err != nil {
					failed.Add(1)
					t.Error(err)
					return
				}
				if ok {
					admitted.Add(1)
				}
			}
		})
	}
	wg.Wait()
	if n := admitted.Load(); n != 50 || failed.Load() != 0 {
		t.Fatalf("%d of 1600 admitted (%d errors), want exactly 50", n, failed.Load())
	}
}

// TestRedisBatchesDecisions sends concurrent decisions on many keys: the
// decisions waiting together share script calls (fewer EVALSHA than
// decisions, one MGET in each), and every bucket admits exactly its burst.
// One bucket key holds a hash: it reads as an empty bucket and is
// overwritten. One sliding log key holds a string, so its commands fail:
// that error stays with its own requests, without opening the circuit
// breaker.
func TestRedisBatchesDecisions(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	rs := newRedisStore(t, RedisOptions{Address: srv.Addr})
	r := mustRule(t, "batch", 1, time.Hour, 10)
	logRule := mustAlgRule(t, "batchlog", SlidingLog, 10, time.Hour, 0, 0)
	srv.MustDo("HSET", rs.Key(r.bucket, "client-1"), "f", "v")
	srv.MustDo("SET", rs.Key(logRule.bucket, "poison"), "not a log")
	srv.MustDo("CONFIG", "RESETSTAT")
	const workers, each = 48, 25
	var admitted [workers]atomic.Int64
	var poisonErrs, otherErrs atomic.Int64
	var wg sync.WaitGroup
	for w := range workers {
		req := Request{Rule: r, Key: "client-" + strconv.Itoa(w), Cost: 1}
		if w%8 == 0 {
			req = Request{Rule: logRule, Key: "poison", Cost: 1}
		}
		wg.Go(func() {
			reqs := []Request{req}
			results := make([]Result, 1)
			for range each {
				ok, err := rs.Decide(context.Background(), reqs, results)
				switch {
				case req.Key == "poison" && err != nil && strings.Contains(err.Error(), "WRONGTYPE"):
					poisonErrs.Add(1)
				case err != nil || req.Key == "poison":
					otherErrs.Add(1)
					t.Errorf("%s: %v, %v", req.Key, ok, err)
				case ok:
					admitted[w].Add(1)
				}
			}
		})
	}
	wg.Wait()
	for w := range workers {
		if w%8 != 0 && admitted[w].Load() != r.burst {
			t.Errorf("client-%d: %d admitted of %d, want exactly %d", w, admitted[w].Load(), each, r.burst)
		}
	}
	if n := poisonErrs.Load(); n != workers/8*each || otherErrs.Load() != 0 {
		t.Fatalf("%d WRONGTYPE errors on the poisoned key (want %d), %d other failures", n, workers/8*each, otherErrs.Load())
	}
	if n := rs.Breaker().Opened(); n != 0 {
		t.Fatal("per-request errors opened the circuit breaker")
	}
	if typ := srv.MustDo("TYPE", rs.Key(r.bucket, "client-1")); typ != "string" {
		t.Errorf("the bucket key that held a hash is now a %s", typ)
	}
	stats := commandStats(srv)
	evalsha, mget := stats["evalsha"].calls, stats["mget"].calls
	decisions := int64(workers * each)
	if evalsha >= decisions || mget != evalsha {
		t.Errorf("%d EVALSHA (%d MGET) for %d concurrent decisions: want fewer, one MGET each", evalsha, mget, decisions)
	}
	t.Logf("%d decisions in %d EVALSHA", decisions, evalsha)
}

// cmdStat is one command's line of INFO commandstats.
type cmdStat struct{ calls, usec int64 }

// commandStats returns the calls and time per command since CONFIG
// RESETSTAT, by command name.
func commandStats(srv *redistest.Server) map[string]cmdStat {
	stats := map[string]cmdStat{}
	for line := range strings.SplitSeq(srv.MustDo("INFO", "commandstats"), "\n") {
		name, fields, ok := strings.Cut(strings.TrimSpace(line), ":")
		name, isCmd := strings.CutPrefix(name, "cmdstat_")
		if !ok || !isCmd {
			continue
		}
		var st cmdStat
		for f := range strings.SplitSeq(fields, ",") {
			k, v, _ := strings.Cut(f, "=")
			switch k {
			case "calls":
				st.calls, _ = strconv.ParseInt(v, 10, 64)
			case "usec":
				st.usec, _ = strconv.ParseInt(v, 10, 64)
			}
		}
		stats[name] = st
	}
	return stats
}

// TestRedisBreakerCountsRoundTrips stalls Redis for a little longer than
// the timeout while many decisions are waiting: the decisions that fail
// were carried by at most two round trips, so a breaker that opens after
// three failures stays closed; a longer hang opens it.
func TestRedisBreakerCountsRoundTrips(t *testing.T) {
	// Not parallel: it times a stall against the timeout.
	srv := redistest.Start(t)
	const timeout = 100 * time.Millisecond
	// The stall clock off: on a starved machine it would rightly wait
	// past the timeout, outlasting the stall this test times.
	rs := newRedisStore(t, RedisOptions{Address: srv.Addr, Timeout: timeout, BreakerFailures: 3, DisableStallClock: true})
	r := mustRule(t, "stall", 1000, time.Second, 0)
	decideOne(t, rs, r, "warm", 1)
	decideAll := func(n int) (failed int64) {
		var wg sync.WaitGroup
		var f atomic.Int64
		for i := range n {
			wg.Go(func() {
				reqs := []Request{{Rule: r, Key: "k" + strconv.Itoa(i), Cost: 1}}
				if _, err := rs.Decide(context.Background(), reqs, make([]Result, 1)); err != nil {
					f.Add(1)
				}
			})
		}
		wg.Wait()
		return f.Load()
	}
	srv.Pause()
	go func() {
		time.Sleep(timeout + timeout/2)
		srv.Resume()
	}()
	if failed := decideAll(40); failed == 0 {
		t.Fatal("no decision failed while Redis stalled past the timeout")
	}
	time.Sleep(timeout) // the stall is over
	if n := rs.Breaker().Opened(); n != 0 {
		t.Fatalf("one stall of %s opened the breaker (%d times)", timeout+timeout/2, n)
	}
	if failed := decideAll(10); failed != 0 {
		t.Fatalf("%d decisions failed after the stall", failed)
	}
	srv.Pause()
	defer srv.Resume()
	deadline := time.Now().Add(2 * time.Second)
	for rs.Breaker().Opened() == 0 && time.Now().Before(deadline) {
		decideAll(10)
	}
	if rs.Breaker().Opened() == 0 {
		t.Fatal("Redis hung for 2s and the breaker did not open")
	}
}

// TestRedisTimeout pauses Redis: decisions fail with ErrStoreTimeout
// within the timeout and a small margin, and succeed again once it resumes.
func TestRedisTimeout(t *testing.T) {
	// Not parallel: it times decisions, so the CPU-bound tests must not
	// delay its timers.
	srv := redistest.Start(t)
	const timeout = 100 * time.Millisecond
	// The stall clock off: on a starved machine it would rightly wait
	// past the timeout (TestRedisStarvedNodeWaitsForReply tests it).
	rs := newRedisStore(t, RedisOptions{Address: srv.Addr, Timeout: timeout, DisableStallClock: true})
	r := mustRule(t, "api", 1000, time.Second, 0)
	decideOne(t, rs, r, "k", 1) // connected, script loaded

	srv.Pause()
	resumed := false
	defer func() {
		if !resumed {
			srv.Resume()
		}
	}()
	reqs := []Request{{Rule: r, Key: "k", Cost: 1}}
	results := make([]Result, 1)
	// A generous margin: a busy machine fires timers late (the bound
	// tells a timeout from a hang, not a fast machine from a slow one).
	margin := 400 * time.Millisecond
	if raceEnabled {
		margin = 900 * time.Millisecond
	}
	for i := range 3 {
		start := time.Now()
		_, err := rs.Decide(context.Background(), reqs, results)
		took := time.Since(start)
		if !errors.Is(err, ErrStoreTimeout) {
			t.Fatalf("decision %d with Redis paused: %v, want ErrStoreTimeout", i, err)
		}
		if took < timeout || took > timeout+margin {
			t.Fatalf("decision %d failed after %s, want %s to %s", i, took, timeout, timeout+margin)
		}
	}
	// A caller's own deadline is its own error, not the store's timeout.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := rs.Decide(ctx, reqs, results); !errors.Is(err, context.Canceled) {
		t.Fatalf("canceled context: %v, want context.Canceled", err)
	}

	srv.Resume()
	resumed = true
	deadline := time.Now().Add(5 * time.Second)
	for attempt := 1; ; attempt++ {
		_, err := rs.Decide(context.Background(), reqs, results)
		if err == nil {
			if attempt > 1 {
				t.Logf("%d decisions failed after Redis resumed", attempt-1)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Redis resumed, but decisions still fail after %d attempts: %v", attempt, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
