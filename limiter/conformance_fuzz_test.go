package limiter

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fleetlimit/caddy-fleetlimit/internal/redistest"
)

// FuzzRedisMatchesMemory draws a rule of each of the five rate algorithms
// and the quota from extreme rates, bursts and periods (a quota: its
// calendar period and time zone from perMS; a token bucket also sheds
// softly, from 0 to 99% with a max delay of 1us to 1h, drawn from the seed
// and the rate), and replays a short trace of
// extreme costs, reserves and clock steps (from a start anywhere in 35
// years) through the Redis script and the memory store: every decision
// and field is the same. `go test` runs the seeds below; `go test -fuzz
// FuzzRedisMatchesMemory ./limiter/` searches further.
func FuzzRedisMatchesMemory(f *testing.F) {
	srv := redistest.Start(f)
	for _, s := range fuzzSeeds {
		for seed := range uint64(3) {
			f.Add(s.alg, s.rate, s.perMS, s.burst, s.cost, s.reserve, s.when, seed)
		}
	}
	var prefixes atomic.Int64
	f.Fuzz(func(t *testing.T, alg uint8, rate, perMS, burst, cost, reserve, when int64, seed uint64) {
		r, ok := fuzzRule(t, alg, rate, perMS, burst, seed)
		if !ok {
			return // not a rule (a sliding log of more keeps too large a log for a test)
		}
		clk := newTestClock(epoch + min(max(when, 0), 1<<50))
		rs := newRedisStore(t, RedisOptions{Address: srv.Addr, KeyPrefix: fmt.Sprintf("fz%d:", prefixes.Add(1)), Clock: clk})
		ms := newMemory(t, clk)
		replayFuzzTrace(t, r, clk, rs, ms, rate, cost, reserve, rand.New(rand.NewPCG(seed, uint64(rate))))
	})
}

// fuzzSeeds are FuzzRedisMatchesMemory's seed corpus, each run with
// three trace seeds.
var fuzzSeeds = []struct {
	alg                                     uint8
	rate, perMS, burst, cost, reserve, when int64
}{
	{0, 3, 1000, 3, math.MaxInt64, 50, 0},
	{1, 3, 60_000, 0, math.MaxInt64, 50, 0},
	{2, 3, 60_000, 0, math.MaxInt64 - 1, 99, 1 << 40},
	{3, 3, 60_000, 0, math.MaxInt64, 1, 0},
	{4, 3, 1000, 3, math.MaxInt64, 0, 0},
	{0, 1_000_000_000, 1, 1_000_000_000, 1_000_000_000, 99, 1 << 49},
	{0, 1, 3_600_000 * 24 * 365, 1 << 40, 1 << 40, 0, 0},
	{1, MaxWindowLimit, 1, 0, MaxWindowLimit, 99, 0},
	{1, 4_000_000, 30 * 86_400_000, 0, 3_000_000, 20, 1 << 44},
	{1, MaxFixedWindowLimit, 365 * 86_400_000, 0, math.MaxInt64, 50, 1 << 49},
	{2, 1, 10, 0, 2, 0, 0},
	{3, 1000, 3_600_000, 0, -5, 30, 0},
	{4, 1_000_000, 1, 1, 1, 99, 0},
	{4, 1, 3_600_000, 100, 100, 50, 1 << 45},
	{5, 3, 0, 0, math.MaxInt64, 50, 0},
	{5, 1, 4, 0, 1, 0, 1 << 45},
	{5, MaxQuota, 5, 0, MaxQuota, 99, 1 << 49},
	{5, 1000, 7, 0, -5, 30, 1 << 44},
}

// fuzzRule builds the fuzzer's rule from its arguments, or reports false
// where they make no rule (or a sliding log too large for a test).
func fuzzRule(t *testing.T, alg uint8, rate, perMS, burst int64, seed uint64) (*Rule, bool) {
	a := []Algorithm{TokenBucket, FixedWindow, SlidingWindow, SlidingLog, LeakyBucket, Quota}[alg%6]
	cfg := RuleConfig{Name: "fz", Algorithm: a, Rate: rate, Per: time.Duration(perMS) * time.Millisecond, Burst: burst}
	if a.windowed() {
		cfg.Burst = 0
	}
	if a == Quota {
		// The period and the zone from perMS: zones with daylight
		// saving, half-hour and whole-day changes.
		zones := []string{"UTC", "Europe/Berlin", "America/New_York", "Australia/Lord_Howe", "Pacific/Apia", "Asia/Kolkata"}
		loc, err := time.LoadLocation(zones[uint64(perMS)/3%uint64(len(zones))])
		if err != nil {
			t.Fatal(err)
		}
		cfg.Per, cfg.Burst, cfg.Period, cfg.Location = 0, 0, Day+Period(uint64(perMS)%3), loc
	}
	if a == TokenBucket {
		// Soft shed, from the seed and the rate: the fuzzer's
		// arguments and the trace's draws stay what they were.
		cfg.SoftShed = int64((seed*37 + uint64(rate)) % 100)
		cfg.SoftShedMaxDelay = []time.Duration{0, time.Microsecond, MaxSoftShedDelay, 37 * time.Millisecond}[seed%4]
		if cfg.SoftShed == 0 {
			cfg.SoftShedMaxDelay = 0
		}
	}
	r, err := NewRule(cfg)
	if err != nil || (a == SlidingLog && r.rate > 10_000) {
		return nil, false
	}
	return r, true
}

// replayFuzzTrace decides 24 requests of r, of extreme costs (the
// fuzzer's, or up to its rate) and reserves and after clock steps drawn from rng, on both stores: every
// decision and field is the same, and no result is out of bounds.
func replayFuzzTrace(t *testing.T, r *Rule, clk *testClock, rs, ms Store, rate, cost, reserve int64, rng *rand.Rand) {
	ctx := context.Background()
	prevWall := time.Now()
	perUS := max(int64(r.per/time.Microsecond), 1)
	for n := range 24 {
		// Simulated time runs faster than Redis' own (see replayTrace).
		wall := time.Now()
		clk.add(2*int64(wall.Sub(prevWall)/time.Microsecond) + 5000)
		prevWall = wall
		switch rng.IntN(4) {
		case 1:
			clk.add(rng.Int64N(min(perUS, 1<<40)))
		case 2:
			clk.add(min(2*perUS, 1<<40))
		}
		q := Request{Rule: r, Key: "k", Cost: []int64{cost, 1, 0, math.MaxInt64, rng.Int64N(max(rate, 1)) + 1}[rng.IntN(5)],
			Reserve: []int64{reserve, 0, rng.Int64N(100)}[rng.IntN(3)]}
		got, want := []Result{{}}, []Result{{}}
		qr, qm := []Request{q}, []Request{q}
		okR, err := rs.Decide(ctx, qr, got)
		if err != nil {
			t.Fatalf("decision %d: redis: %v", n, err)
		}
		okM, err := ms.Decide(ctx, qm, want)
		if err != nil {
			t.Fatalf("decision %d: memory: %v", n, err)
		}
		if okR != okM || !equalResults(got, want) {
			t.Fatalf("decision %d at +%dus, %s cost %d reserve %d:\nredis  %v %+v\nmemory %v %+v",
				n, clk.now()-epoch, r, q.Cost, q.Reserve, okR, got, okM, want)
		}
		if res := got[0]; res.Remaining < 0 || (res.Allowed && q.Cost > max(r.rate, r.burst)) {
			t.Fatalf("decision %d, %s cost %d reserve %d: %+v", n, r, q.Cost, q.Reserve, res)
		}
	}
}
