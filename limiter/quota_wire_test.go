package limiter

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/fleetlimit/caddy-fleetlimit/internal/redistest"
	"github.com/fleetlimit/caddy-fleetlimit/lua"
	"github.com/redis/go-redis/v9"
)

// The quota's wire format, pinned as TestWireArgs, TestWireRedis and
// TestWireReply pin the others': a plan (a token bucket and a monthly quota
// in Berlin on one key), a cost and reserve the month can never admit, and
// a daily quota that denies, at the golden time (Tuesday 14 November 2023,
// 22:13:20 UTC, 23:13:20 in Berlin) with the node's clock at the same time.

// quotaWireBatch returns the golden quota batch, one request per call.
func quotaWireBatch(t testing.TB) [][]Request {
	berlin := mustLoc(t, "Europe/Berlin")
	rate := mustConfig(t, RuleConfig{Name: "api", Rate: 10, Per: time.Second})
	month := mustConfig(t, RuleConfig{Name: "api.quota", Algorithm: Quota, Rate: 1000, Period: Month, Location: berlin})
	day := mustConfig(t, RuleConfig{Name: "trial", Algorithm: Quota, Rate: 1, Period: Day})
	return [][]Request{
		{{Rule: rate, Key: "alice", Cost: 1}, {Rule: month, Key: "alice", Cost: 1}},
		{{Rule: month, Key: "alice", Cost: 998, Reserve: 10}},
		{{Rule: day, Key: "bob", Cost: 1}},
		{{Rule: day, Key: "bob", Cost: 1}},
	}
}

// quotaWireArgs returns the golden quota batch's command and its calls.
func quotaWireArgs(t testing.TB, s *RedisStore) ([]any, []*call) {
	var calls []*call
	for _, reqs := range quotaWireBatch(t) {
		c := &call{}
		s.fill(c, s.script, reqs, nil, nil)
		calls = append(calls, c)
	}
	at, _ := strconv.ParseInt(wireClock, 10, 64)
	p := pipeline{clock: newTestClock(at)}
	return p.scriptArgs(&scriptCall{script: s.script, calls: calls}, wireClock, true), calls
}

// TestWireQuotaArgs: the quota batch's exact KEYS and ARGV. The month's
// three periods are October, November and December 2023 in Berlin (the
// golden time is past the middle of November); the day's are 14, 15 and
// 16 November in UTC.
func TestWireQuotaArgs(t *testing.T) {
	t.Parallel()
	s := &RedisStore{prefix: "w:", script: redis.NewScript(lua.Decide)}
	args, _ := quotaWireArgs(t, s)
	const want = `3
w:api:{alice}
w:api.quota~quota:{alice}
w:trial~quota:{bob}
1700000000000000
3
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
0
0
6
1696111200000000
1698793200000000
1701385200000000
1000
0
0
0
0
0
0
0
6
1699920000000000
1700006400000000
1700092800000000
1
0
0
0
0
0
0
0
0
9
15
-2
23
1
1
0
2
1
0
2
998
100
3
1
0
4
`
	if got := wireText(args[2:]); got != want {
		t.Errorf("arguments (numkeys, KEYS, ARGV), one a line:\n%s\nwant:\n%s", got, want)
	}
	for i, v := range []string{"2023-10-01T00:00:00+02:00", "2023-11-01T00:00:00+01:00", "2023-12-01T00:00:00+01:00"} {
		if want := mustTime(t, v).UnixMicro(); args[3+3+2+lua.RuleArgs+lua.RuleP1-1+i] != want {
			t.Errorf("the month's period %d starts at %v, want %d (%s)", i, args[3+3+2+lua.RuleArgs+lua.RuleP1-1+i], want, v)
		}
	}
}

// TestWireQuotaRedis: the scripts answer the quota batch with the exact
// reply, which decodes into the exact results, and the keys expire at
// their periods' ends.
func TestWireQuotaRedis(t *testing.T) {
	t.Parallel()
	r := redistest.Start(t)
	s := newRedisStore(t, RedisOptions{Address: r.Addr, KeyPrefix: "w:"})
	args, calls := quotaWireArgs(t, s)
	reply, err := s.client.Do(context.Background(), args...).Slice()
	if err != nil {
		t.Fatal(err)
	}
	const want = `1700000000000000
1
0
100000
0
0
1
0
1385200000000
2592000000000
0
-1700000000000000
2
1
1385200000000
2592000000000
0
1700000000000000
1
0
6400000000
86400000000
0
-1700000000000000
0
1
6400000000
86400000000
0
`
	if got := wireText(reply); got != want {
		t.Errorf("reply, one value a line:\n%s\nwant:\n%s", got, want)
	}
	const results = `true [{Allowed:true Remaining:9 RetryAfter:0s ResetAfter:100ms Delay:0s Period:0s Unknown:false DryRun:false Banned:false BanStarted:false owed:100000 at:1700000000000000 spares:0} {Allowed:true Remaining:999 RetryAfter:0s ResetAfter:384h46m40s Delay:0s Period:720h0m0s Unknown:false DryRun:false Banned:false BanStarted:false owed:1 at:1700000000000000 spares:0}]
false [{Allowed:false Remaining:999 RetryAfter:-1ns ResetAfter:384h46m40s Delay:0s Period:720h0m0s Unknown:false DryRun:false Banned:false BanStarted:false owed:1 at:1700000000000000 spares:0}]
true [{Allowed:true Remaining:0 RetryAfter:0s ResetAfter:1h46m40s Delay:0s Period:24h0m0s Unknown:false DryRun:false Banned:false BanStarted:false owed:1 at:1700000000000000 spares:0}]
false [{Allowed:false Remaining:0 RetryAfter:1h46m40s ResetAfter:1h46m40s Delay:0s Period:24h0m0s Unknown:false DryRun:false Banned:false BanStarted:false owed:1 at:1700000000000000 spares:0}]
`
	if got := decodeWire(t, reply, quotaWireBatch(t), calls); got != results {
		t.Errorf("results:\n%s\nwant:\n%s", got, results)
	}
	// The month's key lives until 1 December 00:00 in Berlin, counted
	// from the script's (fixed) time; the day's until 15 November UTC.
	for key, left := range map[string]int64{"w:api.quota~quota:{alice}": 1385200000, "w:trial~quota:{bob}": 6400000} {
		ms, err := strconv.ParseInt(r.MustDo("PTTL", key), 10, 64)
		if err != nil || ms > left || ms < left-60_000 {
			t.Errorf("%s expires in %d ms (%v), want %d", key, ms, err, left)
		}
	}
}
