package limiter

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fleetlimit/caddy-fleetlimit/internal/redistest"
	"github.com/fleetlimit/caddy-fleetlimit/lua"
	"github.com/redis/go-redis/v9"
)

// A run (lua.RunOf) is a batch's consecutive identical requests of one
// zone, sent as one zone argument. The decide script answers it as if its
// requests had come one by one: the same replies, the same state left in
// Redis. These tests send the same batches both ways, at the same fixed
// time, to two key prefixes of one Redis, and compare.

// runRules returns rules of every algorithm, with and without what makes
// the fixed window decide a run one request at a time (a ban, a dry run,
// a prefetch). Their buckets live for seconds at least, so that none
// expires (in Redis' real time) between the two calls compared.
func runRules(t testing.TB) []*Rule {
	return []*Rule{
		mustConfig(t, RuleConfig{Name: "fw", Algorithm: FixedWindow, Rate: 5, Per: time.Minute}),
		mustConfig(t, RuleConfig{Name: "fwban", Algorithm: FixedWindow, Rate: 5, Per: time.Minute,
			Ban: Ban{Duration: time.Minute, After: 2, Window: 10 * time.Second}}),
		mustConfig(t, RuleConfig{Name: "fwdry", Algorithm: FixedWindow, Rate: 5, Per: time.Minute, DryRun: true}),
		mustConfig(t, RuleConfig{Name: "fwpre", Algorithm: FixedWindow, Rate: 40, Per: time.Minute, Prefetch: 4}),
		mustConfig(t, RuleConfig{Name: "tb", Rate: 10, Per: time.Minute, Burst: 5}),
		mustConfig(t, RuleConfig{Name: "shed", Rate: 10, Per: time.Minute, Burst: 8, SoftShed: 50}),
		mustConfig(t, RuleConfig{Name: "sw", Algorithm: SlidingWindow, Rate: 5, Per: time.Minute}),
		mustConfig(t, RuleConfig{Name: "log", Algorithm: SlidingLog, Rate: 5, Per: time.Minute}),
		mustConfig(t, RuleConfig{Name: "leaky", Algorithm: LeakyBucket, Rate: 10, Per: time.Minute, Burst: 3, MaxDelay: time.Minute}),
		mustConfig(t, RuleConfig{Name: "quota", Algorithm: Quota, Rate: 5, Period: Month, Location: time.UTC}),
	}
}

// runBatches returns, for a rule, batches whose runs cross its limit:
// runs of cost 1 and 2, a reserve, a run that only checks (cost 0), a
// run between other requests (another key, none, two zones), and a cost
// that can never fit.
func runBatches(r *Rule) [][][]Request {
	one := func(key string, cost, reserve int64) []Request {
		return []Request{{Rule: r, Key: key, Cost: cost, Reserve: reserve}}
	}
	repeat := func(n int, q []Request) [][]Request {
		out := make([][]Request, n)
		for i := range out {
			out[i] = q
		}
		return out
	}
	mixed := append(repeat(3, one("a", 1, 0)), one("b", 1, 0), nil,
		[]Request{{Rule: r, Key: "a", Cost: 1}, {Rule: r, Key: "b", Cost: 1}})
	mixed = append(mixed, repeat(4, one("a", 1, 0))...)
	return [][][]Request{
		repeat(9, one("a", 1, 0)),
		append(repeat(4, one("a", 2, 0)), repeat(3, one("a", 1, 1))...),
		append(repeat(3, one("a", 0, 0)), repeat(2, one("a", 1, 0))...),
		mixed,
		repeat(3, one("a", 1000, 0)),
	}
}

// decideBatch sends a batch in one script call, with or without runs, at
// the fixed time at, and returns each request's reply values and results.
func decideBatch(t *testing.T, s *RedisStore, batch [][]Request, runs bool, at int64) string {
	t.Helper()
	var calls []*call
	for _, reqs := range batch {
		c := &call{}
		s.fill(c, s.script, reqs, nil, nil)
		calls = append(calls, c)
	}
	p := pipeline{clock: newTestClock(at)}
	args := p.scriptArgs(&scriptCall{script: s.script, calls: calls}, fmt.Sprint(at), runs)
	reply, err := s.client.Do(context.Background(), args...).Slice()
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, reqs := range batch {
		n := replyLen(len(reqs))
		if len(reply) < n {
			t.Fatalf("reply too short: %d values left for a request of %d zones", len(reply), len(reqs))
		}
		res := make([]Result, len(reqs))
		ok, err := decodeReply(reply[:n], reqs, res)
		fmt.Fprintf(&b, "%v %v %v", reply[:n], ok, err)
		for _, r := range res {
			fmt.Fprintf(&b, " {%v %d %s %s %s}", r.Allowed, r.Remaining, r.RetryAfter, r.ResetAfter, r.Delay)
		}
		b.WriteString("\n")
		reply = reply[n:]
	}
	if len(reply) != 0 {
		t.Fatalf("%d reply values left over", len(reply))
	}
	return b.String()
}

// bucketState returns what Redis holds for the keys under a prefix: each
// key (without the prefix), its type and value, and its TTL in
// milliseconds.
func bucketState(t *testing.T, r *redistest.Server, prefix string) map[string]bucketHeld {
	t.Helper()
	held := map[string]bucketHeld{}
	for _, k := range strings.Fields(r.MustDo("KEYS", prefix+"*")) {
		v, err := r.Do("DUMP", k)
		if err != nil {
			t.Fatal(err)
		}
		ttl, err := strconv.ParseInt(r.MustDo("PTTL", k), 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		held[strings.TrimPrefix(k, prefix)] = bucketHeld{r.MustDo("TYPE", k) + " " + strconv.Quote(v), ttl}
	}
	return held
}

// bucketHeld is a key's type and value, and its TTL (ms).
type bucketHeld struct {
	value string
	ttl   int64
}

// sameBuckets reports how two prefixes' buckets differ: in keys, values,
// or TTLs by more than ttlSlack. Redis counts a TTL down in real time, and
// the two calls run one after the other (on a busy machine, far apart); a
// wrong TTL is off by many seconds.
func sameBuckets(got, want map[string]bucketHeld) string {
	const ttlSlack = 1000 // ms
	var diff []string
	for k, w := range want {
		g, ok := got[k]
		switch {
		case !ok:
			diff = append(diff, k+": missing")
		case g.value != w.value:
			diff = append(diff, fmt.Sprintf("%s: %s, want %s", k, g.value, w.value))
		case g.ttl < w.ttl-ttlSlack || g.ttl > w.ttl+ttlSlack:
			diff = append(diff, fmt.Sprintf("%s: TTL %d ms, want %d", k, g.ttl, w.ttl))
		}
	}
	for k := range got {
		if _, ok := want[k]; !ok {
			diff = append(diff, k+": not expected")
		}
	}
	slices.Sort(diff)
	return strings.Join(diff, "; ")
}

// TestRunsDecideAsOneByOne: every batch, sent with its runs and one
// request at a time, gets the same replies and leaves the same buckets,
// for every algorithm; then a second batch 7 seconds later does too.
func TestRunsDecideAsOneByOne(t *testing.T) {
	t.Parallel()
	r := redistest.Start(t)
	at := time.Date(2026, 3, 1, 12, 0, 30, 0, time.UTC).UnixMicro()
	for _, rule := range runRules(t) {
		for i, batch := range runBatches(rule) {
			name := fmt.Sprintf("%s/batch%d", rule.Name(), i)
			runs := newRedisStore(t, RedisOptions{Address: r.Addr, KeyPrefix: name + "/runs:"})
			single := newRedisStore(t, RedisOptions{Address: r.Addr, KeyPrefix: name + "/one:"})
			for step, when := range []int64{at, at + 7_000_000} {
				got := decideBatch(t, runs, batch, true, when)
				want := decideBatch(t, single, batch, false, when)
				if got != want {
					t.Errorf("%s, call %d: with runs:\n%s\none by one:\n%s", name, step, got, want)
				}
				if diff := sameBuckets(bucketState(t, r, name+"/runs:"), bucketState(t, r, name+"/one:")); diff != "" {
					t.Errorf("%s, call %d: Redis holds, with runs against one by one: %s", name, step, diff)
				}
			}
		}
	}
}

// TestRunsSentAsOneArgument: a batch of identical requests is sent as one
// run, and only the decide script's calls use runs.
func TestRunsSentAsOneArgument(t *testing.T) {
	t.Parallel()
	rule := runRules(t)[0]
	s := &RedisStore{prefix: "r:", script: redis.NewScript(lua.Decide), refund: redis.NewScript(lua.Refund)}
	var calls []*call
	for range 12 {
		c := &call{}
		s.fill(c, s.script, []Request{{Rule: rule, Key: "a", Cost: 1}}, nil, nil)
		calls = append(calls, c)
	}
	var p pipeline
	args := p.scriptArgs(&scriptCall{script: s.script, calls: calls}, "0", true)
	// EVALSHA, sha, numkeys, the key, clock, rule count, the rule, the run,
	// its zone, the kind and the kind count.
	if want := 3 + 1 + 2 + len(rule.scriptArgs()) + 2 + 3 + 1; len(args) != want {
		t.Errorf("a run of 12: %d arguments, want %d: %v", len(args), want, args)
	}
	args = p.scriptArgs(&scriptCall{script: s.refund, calls: calls}, "0", false)
	if want := 3 + 1 + 2 + len(rule.scriptArgs()) + 12 + 3 + 1; len(args) != want {
		t.Errorf("12 refunds: %d arguments, want %d", len(args), want)
	}
}
