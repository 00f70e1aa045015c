package limiter

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/fleetlimit/caddy-fleetlimit/internal/redistest"
	"github.com/fleetlimit/caddy-fleetlimit/lua"
	"github.com/redis/go-redis/v9"
)

// The wire format's golden tests, as go-redis/redis_rate's Lua tests
// pin its scripts: a fixed batch makes exactly these arguments, the
// scripts answer them with exactly this reply (on a real Redis, at a fixed
// time), and a reply decodes into exactly these results. A position or
// value changed on one side only (package lua's positions and the Go side
// reading them, or a script) fails at least one of them.

// wireClock is the fixed time (us) the golden batch is decided at.
const wireClock = "1700000000000000"

// wireBatch returns the golden batch's requests, one per call: a token
// bucket with prefetch (alice's bucket shared by two requests), a dry-run
// fixed window with a ban and a reserve, a request of no zones, a
// concurrency slot, a token bucket whose ban starts and then holds, and a
// soft-shedding token bucket whose request leaves it 3 tokens past its
// threshold (a delay of 300ms, their refill).
func wireBatch(t testing.TB) [][]Request {
	api := mustConfig(t, RuleConfig{Name: "api", Rate: 10, Per: time.Second, Burst: 20, Prefetch: 4})
	login := mustConfig(t, RuleConfig{Name: "login", Algorithm: FixedWindow, Rate: 1, Per: time.Minute, DryRun: true,
		Ban: Ban{Duration: time.Minute, After: 1, Window: 10 * time.Second}})
	slots := mustConfig(t, RuleConfig{Name: "slots", Algorithm: Concurrency, Rate: 2, Lease: 30 * time.Second})
	strict := mustConfig(t, RuleConfig{Name: "strict", Rate: 1, Per: time.Minute, Burst: 1,
		Ban: Ban{Duration: time.Minute, After: 1, Window: 10 * time.Second}})
	shed := mustConfig(t, RuleConfig{Name: "shed", Rate: 10, Per: time.Second, SoftShed: 50})
	return [][]Request{
		{{Rule: api, Key: "alice", Cost: 1}, {Rule: login, Key: "alice", Cost: 1, Reserve: 20}},
		{{Rule: api, Key: "bob", Cost: 2}},
		{},
		{{Rule: slots, Key: "alice", Cost: 1, Slot: "s1"}, {Rule: api, Key: "alice", Cost: 1}},
		{{Rule: login, Key: "carol", Cost: 1}},
		{{Rule: login, Key: "carol", Cost: 1}},
		{{Rule: strict, Key: "dave", Cost: 1}},
		{{Rule: strict, Key: "dave", Cost: 1}},
		{{Rule: strict, Key: "dave", Cost: 1}},
		{{Rule: shed, Key: "erin", Cost: 8}},
	}
}

// wireArgs returns the golden batch's EVALSHA command, and its calls.
func wireArgs(t testing.TB, s *RedisStore) ([]any, []*call) {
	var calls []*call
	for _, reqs := range wireBatch(t) {
		c := &call{}
		s.fill(c, s.script, reqs, nil, nil)
		calls = append(calls, c)
	}
	var p pipeline
	return p.scriptArgs(&scriptCall{script: s.script, calls: calls}, wireClock, true), calls
}

// wireText renders values as Redis receives or returns them, one a line.
func wireText(vals []any) string {
	var b strings.Builder
	for _, v := range vals {
		fmt.Fprintf(&b, "%v\n", v)
	}
	return b.String()
}

// TestWireArgs: the golden batch's exact KEYS and ARGV.
func TestWireArgs(t *testing.T) {
	t.Parallel()
	s := &RedisStore{prefix: "w:", script: redis.NewScript(lua.Decide)}
	args, _ := wireArgs(t, s)
	if args[0] != "evalsha" || args[1] != s.script.Hash() {
		t.Fatalf("command %v %v", args[0], args[1])
	}
	if got := wireText(args[2:]); got != wireArgsGolden {
		t.Errorf("arguments (numkeys, KEYS, ARGV), one a line:\n%s\nwant:\n%s", got, wireArgsGolden)
	}
}

// TestWireRedis: the scripts answer the golden batch with the exact reply
// (the decide script, on a real Redis at a fixed time), which decodes into
// the exact results.
func TestWireRedis(t *testing.T) {
	t.Parallel()
	r := redistest.Start(t)
	s := newRedisStore(t, RedisOptions{Address: r.Addr, KeyPrefix: "w:"})
	args, calls := wireArgs(t, s)
	reply, err := s.client.Do(context.Background(), args...).Slice()
	if err != nil {
		t.Fatal(err)
	}
	if got := wireText(reply); got != wireReplyGolden {
		t.Errorf("reply, one value a line:\n%s\nwant:\n%s", got, wireReplyGolden)
	}
	got := decodeWire(t, reply, wireBatch(t), calls)
	if got != wireResults {
		t.Errorf("results:\n%s\nwant:\n%s", got, wireResults)
	}
}

// wireArgsGolden is the golden batch's numkeys, KEYS and ARGV, one a
// line.
const wireArgsGolden = `7
w:api:{alice}
w:login:{alice}
w:api:{bob}
w:slots~slots:{alice}
w:login:{carol}
w:strict:{dave}
w:shed:{erin}
1700000000000000
5
0
1
100000
20
0
0
0
0
0
4
0
0
2
60000000
1
0
0
1
60000000
1
10000000
0
0
0
5
2
30000000
0
0
0
0
0
0
0
0
0
0
1
60000000
1
0
0
60000000
1
10000000
0
0
0
0
1
100000
10
0
0
0
0
0
0
500000
1000000
0
17
33
-1
48
1
-2
65
-3
81
97
1
1
0
2
1
1
1
2
0
3
1
s1
2
1
0
4
1
0
5
8
0
7
`

// wireReplyGolden is the decide script's reply to the golden batch, one
// value a line.
const wireReplyGolden = `1700000000000000
1
0
400000
3
0
6
0
20000000
0
0
1700000000000000
1
0
400000
2
0
1700000000000000
1700000000000000
1
0
0
0
0
1
400000
800000
3
0
1700000000000000
1
0
20000000
0
0
1700000000000000
4
1
20000000
0
0
1700000000000000
1
0
60000000
0
0
-1700000000000000
4
60000000
120000000
0
0
-1700000000000000
3
60000000
1
0
0
1700000000000000
1
0
800000
0
300000
`

// wireResults is what the golden batch's reply decodes into, one request
// a line.
const wireResults = `true [{Allowed:true Remaining:19 RetryAfter:0s ResetAfter:400ms Delay:0s Period:0s Unknown:false DryRun:false Banned:false BanStarted:false owed:400000 at:1700000000000000 spares:3} {Allowed:true Remaining:1 RetryAfter:-1ns ResetAfter:0s Delay:0s Period:0s Unknown:false DryRun:true Banned:false BanStarted:true owed:0 at:1700000000000000 spares:0}]
true [{Allowed:true Remaining:18 RetryAfter:0s ResetAfter:400ms Delay:0s Period:0s Unknown:false DryRun:false Banned:false BanStarted:false owed:400000 at:1700000000000000 spares:2}]
true []
true [{Allowed:true Remaining:1 RetryAfter:0s ResetAfter:0s Delay:0s Period:0s Unknown:false DryRun:false Banned:false BanStarted:false owed:0 at:1700000000000000 spares:0} {Allowed:true Remaining:15 RetryAfter:0s ResetAfter:800ms Delay:0s Period:0s Unknown:false DryRun:false Banned:false BanStarted:false owed:800000 at:1700000000000000 spares:3}]
true [{Allowed:true Remaining:0 RetryAfter:0s ResetAfter:40s Delay:0s Period:0s Unknown:false DryRun:false Banned:false BanStarted:false owed:0 at:1700000000000000 spares:0}]
true [{Allowed:true Remaining:0 RetryAfter:40s ResetAfter:40s Delay:0s Period:0s Unknown:false DryRun:true Banned:false BanStarted:true owed:0 at:1700000000000000 spares:0}]
true [{Allowed:true Remaining:0 RetryAfter:0s ResetAfter:1m0s Delay:0s Period:0s Unknown:false DryRun:false Banned:false BanStarted:false owed:60000000 at:1700000000000000 spares:0}]
false [{Allowed:false Remaining:0 RetryAfter:1m0s ResetAfter:1m0s Delay:0s Period:0s Unknown:false DryRun:false Banned:true BanStarted:true owed:0 at:1700000000000000 spares:0}]
false [{Allowed:false Remaining:0 RetryAfter:1m0s ResetAfter:1m0s Delay:0s Period:0s Unknown:false DryRun:false Banned:true BanStarted:false owed:0 at:1700000000000000 spares:0}]
true [{Allowed:true Remaining:2 RetryAfter:0s ResetAfter:800ms Delay:300ms Period:0s Unknown:false DryRun:false Banned:false BanStarted:false owed:800000 at:1700000000000000 spares:0}]
`

// TestWireReply: a canned reply (the golden one, written out) decodes into
// the exact results, without Redis.
func TestWireReply(t *testing.T) {
	t.Parallel()
	n := func(v ...int64) []any {
		out := make([]any, len(v))
		for i, x := range v {
			out[i] = x
		}
		return out
	}
	const at = 1700000000000000
	var reply []any
	reply = append(reply, n(at, 1, 0, 400000, 3, 0, 6, 0, 20000000, 0, 0)...)
	reply = append(reply, n(at, 1, 0, 400000, 2, 0)...)
	reply = append(reply, n(at)...)
	reply = append(reply, n(at, 1, 0, 0, 0, 0, 1, 400000, 800000, 3, 0)...)
	reply = append(reply, n(at, 1, 0, 20000000, 0, 0)...)
	reply = append(reply, n(at, 4, 1, 20000000, 0, 0)...)
	reply = append(reply, n(at, 1, 0, 60000000, 0, 0)...)
	reply = append(reply, n(-at, 4, 60000000, 120000000, 0, 0)...)
	reply = append(reply, n(-at, 3, 60000000, 1, 0, 0)...)
	reply = append(reply, n(at, 1, 0, 800000, 0, 300000)...)
	s := &RedisStore{prefix: "w:", script: redis.NewScript(lua.Decide)}
	_, calls := wireArgs(t, s)
	if got := decodeWire(t, reply, wireBatch(t), calls); got != wireResults {
		t.Errorf("results:\n%s\nwant:\n%s", got, wireResults)
	}
}

// decodeWire splits a batch's reply by its calls, as the batcher does, and
// renders each call's admission and results, one call a line.
func decodeWire(t *testing.T, reply []any, batch [][]Request, calls []*call) string {
	t.Helper()
	var b strings.Builder
	o := 0
	for i, reqs := range batch {
		w := replyLen(len(calls[i].keys))
		if o+w > len(reply) {
			t.Fatalf("reply of %d values ends in call %d", len(reply), i)
		}
		results := make([]Result, len(reqs))
		admit, err := decodeReply(reply[o:o+w], reqs, results)
		if err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
		fmt.Fprintf(&b, "%v %+v\n", admit, results)
		o += w
	}
	if o != len(reply) {
		t.Fatalf("reply of %d values, calls of %d", len(reply), o)
	}
	return b.String()
}

// TestWireAlgorithmIDs: the limiter's algorithms are the scripts' ids.
func TestWireAlgorithmIDs(t *testing.T) {
	t.Parallel()
	for alg, id := range map[Algorithm]int{
		TokenBucket: lua.AlgTokenBucket, SlidingWindow: lua.AlgSlidingWindow, FixedWindow: lua.AlgFixedWindow,
		SlidingLog: lua.AlgSlidingLog, LeakyBucket: lua.AlgLeakyBucket, Concurrency: lua.AlgConcurrency,
		Quota: lua.AlgQuota,
	} {
		if int(alg) != id {
			t.Errorf("%s is %d in Go, %d in the scripts", alg, alg, id)
		}
	}
}
