package limiter

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fleetlimit/caddy-fleetlimit/internal/redistest"
)

func mustLoc(t testing.TB, name string) *time.Location {
	t.Helper()
	loc, err := time.LoadLocation(name)
	if err != nil {
		t.Fatalf("time zone %s: %v", name, err)
	}
	return loc
}

func mustTime(t testing.TB, s string) time.Time {
	t.Helper()
	v, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// TestPeriodBounds pins the calendar: months, weeks from Monday and days
// in zones whose clocks change, a midnight skipped (São Paulo, November
// 2018), a midnight read twice (Havana, November 2024) and a date
// skipped whole (Samoa, 30 December 2011).
func TestPeriodBounds(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		zone       string
		period     Period
		at         string
		start, end string
		hours      float64
	}{
		{"UTC", Day, "2025-06-15T13:00:00Z", "2025-06-15T00:00:00Z", "2025-06-16T00:00:00Z", 24},
		{"UTC", Week, "2025-06-15T23:59:59Z", "2025-06-09T00:00:00Z", "2025-06-16T00:00:00Z", 168},
		{"UTC", Week, "2025-06-16T00:00:00Z", "2025-06-16T00:00:00Z", "2025-06-23T00:00:00Z", 168},
		{"UTC", Month, "2024-02-29T12:00:00Z", "2024-02-01T00:00:00Z", "2024-03-01T00:00:00Z", 29 * 24},
		// Berlin: March loses an hour (30 March), October gains one.
		{"Europe/Berlin", Month, "2025-03-31T21:59:59.999999Z", "2025-02-28T23:00:00Z", "2025-03-31T22:00:00Z", 31*24 - 1},
		{"Europe/Berlin", Month, "2025-03-31T22:00:00Z", "2025-03-31T22:00:00Z", "2025-04-30T22:00:00Z", 30 * 24},
		{"Europe/Berlin", Month, "2025-10-26T01:30:00Z", "2025-09-30T22:00:00Z", "2025-10-31T23:00:00Z", 31*24 + 1},
		{"Europe/Berlin", Day, "2025-03-30T12:00:00Z", "2025-03-29T23:00:00Z", "2025-03-30T22:00:00Z", 23},
		{"Europe/Berlin", Day, "2025-10-26T12:00:00Z", "2025-10-25T22:00:00Z", "2025-10-26T23:00:00Z", 25},
		{"Europe/Berlin", Week, "2025-03-30T21:59:59Z", "2025-03-23T23:00:00Z", "2025-03-30T22:00:00Z", 167},
		// New York: March 2025 loses an hour (9 March), November gains one.
		{"America/New_York", Month, "2025-03-15T00:00:00Z", "2025-03-01T05:00:00Z", "2025-04-01T04:00:00Z", 31*24 - 1},
		{"America/New_York", Month, "2025-12-01T04:59:59Z", "2025-11-01T04:00:00Z", "2025-12-01T05:00:00Z", 30*24 + 1},
		{"America/New_York", Day, "2025-03-09T12:00:00Z", "2025-03-09T05:00:00Z", "2025-03-10T04:00:00Z", 23},
		// São Paulo: the clocks jumped from 00:00 to 01:00 on 4 November
		// 2018, so that day starts at 01:00 -02; on 18 February 2018 they
		// went back from 00:00 to 23:00, so 17 February had 25 hours.
		// Havana reads the midnight of 3 November 2024 twice (01:00 back
		// to 00:00): the day starts at the first.
		{"America/Sao_Paulo", Day, "2018-11-04T12:00:00Z", "2018-11-04T03:00:00Z", "2018-11-05T02:00:00Z", 23},
		{"America/Sao_Paulo", Day, "2018-11-04T02:59:59Z", "2018-11-03T03:00:00Z", "2018-11-04T03:00:00Z", 24},
		{"America/Sao_Paulo", Day, "2018-02-18T02:30:00Z", "2018-02-17T02:00:00Z", "2018-02-18T03:00:00Z", 25},
		{"America/Sao_Paulo", Day, "2018-02-18T03:00:00Z", "2018-02-18T03:00:00Z", "2018-02-19T03:00:00Z", 24},
		{"America/Havana", Day, "2024-11-03T04:30:00Z", "2024-11-03T04:00:00Z", "2024-11-04T05:00:00Z", 25},
		{"America/Havana", Day, "2024-11-03T05:30:00Z", "2024-11-03T04:00:00Z", "2024-11-04T05:00:00Z", 25},
		// Samoa skipped 30 December 2011 (from -10 to +14).
		{"Pacific/Apia", Day, "2011-12-30T09:59:59Z", "2011-12-29T10:00:00Z", "2011-12-30T10:00:00Z", 24},
		{"Pacific/Apia", Day, "2011-12-30T10:00:00Z", "2011-12-30T10:00:00Z", "2011-12-31T10:00:00Z", 24},
	} {
		loc := mustLoc(t, c.zone)
		at := mustTime(t, c.at)
		s, e := c.period.bounds(at, loc)
		if !s.Equal(mustTime(t, c.start)) || !e.Equal(mustTime(t, c.end)) || e.Sub(s).Hours() != c.hours {
			t.Errorf("%s %s at %s: [%s, %s) (%gh), want [%s, %s) (%gh)", c.zone, c.period, c.at,
				s.UTC().Format(time.RFC3339), e.UTC().Format(time.RFC3339), e.Sub(s).Hours(), c.start, c.end, c.hours)
		}
	}
}

// TestQuotaWindow: the periods sent to Redis hold the node's time in their
// middle, consecutive periods never share a tag, and a whole year of days,
// weeks and months in a zone with daylight saving follows on without gap.
func TestQuotaWindow(t *testing.T) {
	t.Parallel()
	loc := mustLoc(t, "Europe/Berlin")
	for _, p := range []Period{Day, Week, Month} {
		r := mustConfig(t, RuleConfig{Name: "q", Algorithm: Quota, Rate: 10, Period: p, Location: loc})
		at := mustTime(t, "2024-12-30T00:00:00Z").UnixMicro()
		var last int64
		for i := range 800 {
			w := r.quotaWindowAt(at)
			if !(w.b[0] < w.b[1] && w.b[1] < w.b[2]) || at < w.b[0] || at >= w.b[2] {
				t.Fatalf("%s at %d: window %v does not hold the time", p, at, w.b)
			}
			if quotaTag(w.b[0]) == quotaTag(w.b[1]) || quotaTag(w.b[1]) == quotaTag(w.b[2]) {
				t.Fatalf("%s: periods %v share a tag", p, w.b)
			}
			s, e := r.periodAt(at)
			if i > 0 && s != last && s != at {
				t.Fatalf("%s: a period starts at %d, the previous ended at %d", p, s, last)
			}
			last = e
			at = e // the next period's first instant
			if at > mustTime(t, "2026-01-01T00:00:00Z").UnixMicro() {
				break
			}
		}
	}
}

// TestQuotaMemoryMonthEnd: a monthly quota in Berlin, on the memory store,
// across the end of March 2025 (a month of 31 days less the hour daylight
// saving took): denied until the first instant of April, then counted
// afresh, with the periods' lengths as w.
func TestQuotaMemoryMonthEnd(t *testing.T) {
	t.Parallel()
	clk := newTestClock(mustTime(t, "2025-03-31T21:59:58Z").UnixMicro())
	ms := newMemory(t, clk)
	q := mustConfig(t, RuleConfig{Name: "plan", Algorithm: Quota, Rate: 3, Period: Month, Location: mustLoc(t, "Europe/Berlin")})
	for i := range 3 {
		ok, res := decide(t, ms, Request{Rule: q, Key: "k", Cost: 1})
		if !ok || res[0].Remaining != int64(2-i) || res[0].ResetAfter != 2*time.Second || res[0].Period != 743*time.Hour {
			t.Fatalf("request %d: %v %+v", i+1, ok, res[0])
		}
	}
	ok, res := decide(t, ms, Request{Rule: q, Key: "k", Cost: 1})
	if ok || res[0].RetryAfter != 2*time.Second || res[0].Remaining != 0 {
		t.Fatalf("the 4th in March: %v %+v, want denied until April", ok, res[0])
	}
	clk.set(mustTime(t, "2025-03-31T21:59:59.999999Z").UnixMicro())
	if ok, res = decide(t, ms, Request{Rule: q, Key: "k", Cost: 1}); ok || res[0].RetryAfter != time.Microsecond {
		t.Fatalf("a microsecond before April: %v %+v", ok, res[0])
	}
	clk.set(mustTime(t, "2025-03-31T22:00:00Z").UnixMicro()) // 1 April, 00:00 CEST
	ok, res = decide(t, ms, Request{Rule: q, Key: "k", Cost: 1})
	if !ok || res[0].Remaining != 2 || res[0].Period != 720*time.Hour || res[0].ResetAfter != 720*time.Hour {
		t.Fatalf("1 April: %v %+v", ok, res[0])
	}
	// A refund of March's charge gives nothing back in April; April's
	// own does.
	march := Result{at: mustTime(t, "2025-03-31T21:59:58Z").UnixMicro()}
	refund(t, ms, []Request{{Rule: q, Key: "k", Cost: 1}}, []Result{march})
	refund(t, ms, []Request{{Rule: q, Key: "k", Cost: 1}}, res)
	if _, res = decide(t, ms, Request{Rule: q, Key: "k", Cost: 0}); res[0].Remaining != 3 {
		t.Fatalf("after the refunds: %+v, want 3 left", res[0])
	}
}

// quotaTrace is a trace of requests around calendar boundaries in zones
// whose clocks change, for the stores to agree on: quotas of each period
// with a token bucket on the same key in the same request (a plan: a rate
// and a quota), costs and reserves, and steps of the clock that cross the
// boundaries (a DST day's end, a month's end in Berlin and New York).
type quotaStep struct {
	at   string    // the clock, or "" to keep it
	reqs []Request // nil: refund the previous step's charges instead
}

func quotaTrace(t testing.TB) []quotaStep {
	berlin, ny := mustLoc(t, "Europe/Berlin"), mustLoc(t, "America/New_York")
	month := mustConfig(t, RuleConfig{Name: "month", Algorithm: Quota, Rate: 5, Period: Month, Location: berlin})
	day := mustConfig(t, RuleConfig{Name: "day", Algorithm: Quota, Rate: 3, Period: Day, Location: ny, Refunds: true})
	week := mustConfig(t, RuleConfig{Name: "week", Algorithm: Quota, Rate: 4, Period: Week})
	rate := mustConfig(t, RuleConfig{Name: "rate", Rate: 10, Per: time.Second, Burst: 2})
	plan := func(cost int64) []Request {
		return []Request{{Rule: rate, Key: "a", Cost: 1}, {Rule: month, Key: "a", Cost: cost}}
	}
	one := func(r *Rule, cost, reserve int64) []Request {
		return []Request{{Rule: r, Key: "b", Cost: cost, Reserve: reserve}}
	}
	return []quotaStep{
		{"2025-03-31T21:59:58Z", plan(1)}, {"", plan(2)}, {"", plan(1)}, // the rate denies the third
		{"2025-03-31T21:59:59Z", plan(1)}, {"", plan(1)}, {"", plan(1)}, // 5 of 5, then denied by the quota
		{"2025-03-31T21:59:59.999999Z", plan(1)},
		{"2025-03-31T22:00:00Z", plan(5)}, {"2025-03-31T22:00:01Z", plan(1)}, {"", plan(6)},
		{"2025-10-31T22:59:59Z", plan(1)}, {"2025-10-31T23:00:00Z", plan(1)},
		{"2025-03-09T04:59:58Z", one(day, 1, 0)}, {"", one(day, 1, 0)}, {"", one(day, 1, 0)}, {"", one(day, 1, 0)},
		// 9 March in New York: 23 hours. A refund gives its charge back.
		{"2025-03-09T05:00:00Z", one(day, 2, 30)}, {"", one(day, 1, 0)}, {"", nil}, {"", one(day, 1, 0)}, {"", one(day, 4, 0)},
		{"2025-03-10T03:59:59Z", one(day, 1, 0)}, {"2025-03-10T04:00:00Z", one(day, 3, 0)},
		// A refund of Sunday's charge gives nothing back on Monday.
		{"2025-06-15T23:59:59Z", one(week, 4, 0)}, {"2025-06-16T00:00:00Z", nil}, {"", one(week, 4, 0)}, {"", one(week, 1, 0)},
		{"", []Request{{Rule: week, Key: "c", Cost: 1}, {Rule: day, Key: "c", Cost: 1}, {Rule: month, Key: "c", Cost: 0}}},
	}
}

// replayQuota runs the trace on a store and returns its decisions as text.
func replayQuota(t *testing.T, clk *testClock, s Store) []string {
	t.Helper()
	var out []string
	var last []Request
	var charged []Result
	for i, st := range quotaTrace(t) {
		if st.at != "" {
			clk.set(mustTime(t, st.at).UnixMicro())
		}
		if st.reqs == nil {
			refund(t, s, last, charged)
			continue
		}
		ok, res := decide(t, s, st.reqs...)
		last, charged = st.reqs, append([]Result(nil), res...)
		for j := range res {
			res[j].at = 0
		}
		out = append(out, fmt.Sprintf("%d %s: %v %+v", i, time.UnixMicro(clk.now()).UTC().Format(time.RFC3339Nano), ok, res))
	}
	return out
}

// TestQuotaRedisMatchesMemory: the trace decides the same on the memory
// store and on Redis (single, a Cluster of three masters, Sentinel), a
// plan's rate and quota in one script call, and a quota's key expires at
// its period's end.
func TestQuotaRedisMatchesMemory(t *testing.T) {
	t.Parallel()
	clk := newTestClock(0)
	want := replayQuota(t, clk, newMemory(t, clk))
	t.Logf("the trace on the memory store:\n%s", strings.Join(want, "\n"))
	for _, topo := range []string{"single", "cluster", "sentinel"} {
		t.Run(topo, func(t *testing.T) {
			t.Parallel()
			clk := newTestClock(0)
			opt := RedisOptions{KeyPrefix: "qt:", Clock: clk}
			var ttl func(key string) string
			switch topo {
			case "single":
				r := redistest.Start(t)
				opt.Address, ttl = r.Addr, func(k string) string { return r.MustDo("PTTL", k) }
			case "cluster":
				cl := redistest.StartCluster(t, 3)
				opt.Addresses, opt.Cluster, ttl = cl.Addrs(), true, func(k string) string { return cl.MustDo("PTTL", k) }
			case "sentinel":
				st := redistest.StartSentinel(t)
				opt.SentinelMaster, opt.SentinelAddresses = st.MasterName(), st.SentinelAddrs()
				ttl = func(k string) string { return st.Master().MustDo("PTTL", k) }
			}
			rs := newRedisStore(t, opt)
			got := replayQuota(t, clk, rs)
			for i := range want {
				if got[i] != want[i] {
					t.Fatalf("decision %s\nredis  %s\nmemory %s", strconv.Itoa(i), got[i], want[i])
				}
			}
			// The week's key (key "c", charged at Monday 16 June 00:00
			// UTC by the trace's last step) expires with its week.
			ms, err := strconv.ParseInt(ttl(rs.Key("week~quota", "c")), 10, 64)
			if err != nil || ms > 7*24*3600*1000 || ms < 7*24*3600*1000-60_000 {
				t.Fatalf("the week's key lives %d ms (%v), want a week", ms, err)
			}
		})
	}
}

// TestQuotaNodeSkew: nodes whose clocks are up to half a period off Redis
// send other periods, and Redis decides in the one that holds its own
// time: the same decisions as a node whose clock is right, here across the
// end of March in Berlin. A node further off gets an error, not a
// decision in the wrong period.
func TestQuotaNodeSkew(t *testing.T) {
	t.Parallel()
	r := redistest.Start(t)
	q := mustConfig(t, RuleConfig{Name: "skew", Algorithm: Quota, Rate: 2, Period: Month, Location: mustLoc(t, "Europe/Berlin")})
	redisAt := mustTime(t, "2025-03-31T21:59:59Z").UnixMicro()
	for _, skew := range []time.Duration{0, -11 * 24 * time.Hour, 14 * 24 * time.Hour, time.Second, 2 * time.Second, -time.Hour} {
		rs := newRedisStore(t, RedisOptions{Address: r.Addr, KeyPrefix: "sk" + strconv.Itoa(int(skew/time.Second)) + ":"})
		node := newTestClock(redisAt + int64(skew/time.Microsecond))
		var got []string
		for i, at := range []int64{redisAt, redisAt, redisAt, redisAt + 1_000_000} {
			reqs := []Request{{Rule: q, Key: "k", Cost: 1}}
			c := &call{}
			rs.fill(c, rs.script, reqs, nil, nil)
			p := pipeline{clock: node}
			args := p.scriptArgs(&scriptCall{script: rs.script, calls: []*call{c}}, strconv.FormatInt(at, 10), true)
			reply, err := rs.client.Do(context.Background(), args...).Slice()
			if err != nil {
				t.Fatal(err)
			}
			res := make([]Result, 1)
			ok, err := decodeReply(reply, reqs, res)
			if err != nil {
				t.Fatalf("skew %s, request %d: %v", skew, i, err)
			}
			got = append(got, fmt.Sprintf("%v %d %s %s", ok, res[0].Remaining, res[0].ResetAfter, res[0].Period))
		}
		want := fmt.Sprint([]string{"true 1 1s 743h0m0s", "true 0 1s 743h0m0s", "false 0 1s 743h0m0s", "true 1 720h0m0s 720h0m0s"})
		if fmt.Sprint(got) != want {
			t.Errorf("node clock %s off: %v, want %v", skew, got, want)
		}
	}
	// 20 days off: Redis' time is in neither period the node sends.
	rs := newRedisStore(t, RedisOptions{Address: r.Addr, KeyPrefix: "far:"})
	reqs := []Request{{Rule: q, Key: "k", Cost: 1}}
	c := &call{}
	rs.fill(c, rs.script, reqs, nil, nil)
	p := pipeline{clock: newTestClock(redisAt + int64(20*24*time.Hour/time.Microsecond))}
	args := p.scriptArgs(&scriptCall{script: rs.script, calls: []*call{c}}, strconv.FormatInt(redisAt, 10), true)
	reply, err := rs.client.Do(context.Background(), args...).Slice()
	if err != nil {
		t.Fatal(err)
	}
	if e, ok := reply[0].(error); !ok || !strings.Contains(e.Error(), "half a period") {
		t.Fatalf("a node 20 days off: reply %v, want the request's error", reply)
	}
}
