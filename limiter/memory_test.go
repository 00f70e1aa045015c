package limiter

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestMemoryMultiZoneAtomic(t *testing.T) {
	t.Parallel()
	clk := newTestClock(epoch)
	s := newMemory(t, clk)
	wide := mustRule(t, "wide", 3, time.Second, 5)
	narrow := mustRule(t, "narrow", 3, time.Second, 2)
	both := []Request{{Rule: wide, Key: "k", Cost: 1}, {Rule: narrow, Key: "k", Cost: 1}}
	results := make([]Result, 2)
	for i := range 2 {
		ok, err := s.Decide(context.Background(), both, results)
		if err != nil || !ok {
			t.Fatalf("request %d: %v %v %+v", i, ok, err, results)
		}
	}
	for i := range 10 {
		ok, err := s.Decide(context.Background(), both, results)
		if err != nil || ok {
			t.Fatalf("request %d past the narrow burst: %v %v", i, ok, err)
		}
		want := []Result{
			{Allowed: true, Remaining: 3, ResetAfter: 666_667 * time.Microsecond},
			{Remaining: 0, RetryAfter: 333_334 * time.Microsecond, ResetAfter: 666_667 * time.Microsecond},
		}
		if public(results[0]) != want[0] || public(results[1]) != want[1] {
			t.Fatalf("denied by one zone: %+v, want %+v", results, want)
		}
	}
	// The denied requests charged nothing: the wide zone still has 3.
	if _, res := decideOne(t, s, wide, "k", 0); res.Remaining != 3 {
		t.Fatalf("wide zone after denials: %+v, want 3 remaining", res)
	}
	for i := range 3 {
		if ok, _ := decideOne(t, s, wide, "k", 1); !ok {
			t.Fatalf("wide zone alone, request %d denied", i)
		}
	}

	// Many zones, more than the store's inline buffers, some sharing a
	// shard: one denial charges none of them.
	var many []Request
	for i := range 12 {
		many = append(many, Request{Rule: mustRule(t, fmt.Sprint("z", i), 1, time.Hour, 2), Key: "k", Cost: 1})
	}
	many[7].Cost = 3 // above its burst: never admissible
	results = make([]Result, len(many))
	for range 3 {
		if ok, err := s.Decide(context.Background(), many, results); ok || err != nil {
			t.Fatalf("12 zones, one impossible: %v %v", ok, err)
		}
	}
	for i, q := range many {
		if _, res := decideOne(t, s, q.Rule, q.Key, 0); res.Remaining != 2 {
			t.Fatalf("zone %d was charged by a denied request: %+v", i, res)
		}
	}
	many[7].Cost = 1
	for i := range 2 {
		if ok, err := s.Decide(context.Background(), many, results); !ok || err != nil {
			t.Fatalf("12 zones, request %d: %v %v %+v", i, ok, err, results)
		}
	}
	if ok, _ := s.Decide(context.Background(), many, results); ok {
		t.Fatal("12 zones admitted past their burst")
	}
}

func TestMemoryZonesDoNotShareBuckets(t *testing.T) {
	t.Parallel()
	clk := newTestClock(epoch)
	s := newMemory(t, clk)
	// Same numbers, different zone names; and zone/key pairs whose
	// concatenation is the same.
	pairs := []struct{ zone, key string }{
		{"x", "k"}, {"y", "k"}, {"x", "k2"}, {"ab", "c"}, {"a", "bc"}, {"a:b", "c"}, {"a", "b:c"},
	}
	rules := map[string]*Rule{}
	for _, p := range pairs {
		if rules[p.zone] == nil {
			rules[p.zone] = mustRule(t, p.zone, 2, time.Second, 0)
		}
	}
	for i, p := range pairs {
		for j := range 2 {
			if ok, _ := decideOne(t, s, rules[p.zone], p.key, 1); !ok {
				t.Fatalf("zone %q key %q, request %d denied: its bucket was shared with an earlier pair", p.zone, p.key, j)
			}
		}
		if ok, _ := decideOne(t, s, rules[p.zone], p.key, 1); ok {
			t.Fatalf("zone %q key %q admitted past its burst", p.zone, p.key)
		}
		for _, q := range pairs[i+1:] {
			if _, res := decideOne(t, s, rules[q.zone], q.key, 0); res.Remaining != 2 {
				t.Fatalf("draining zone %q key %q took from zone %q key %q: %+v", p.zone, p.key, q.zone, q.key, res)
			}
		}
	}
	if n := s.Len(); n != len(pairs) {
		t.Fatalf("Len() = %d, want %d", n, len(pairs))
	}
}

// TestMemoryConcurrentExactBound hammers a few keys from many goroutines
// with two-zone requests in random zone order, on a clock that does not
// move: each key admits exactly the narrower burst, and the wider zone is
// charged for exactly those requests.
func TestMemoryConcurrentExactBound(t *testing.T) {
	t.Parallel()
	clk := newTestClock(epoch)
	s := newMemory(t, clk)
	wide := mustRule(t, "wide", 100, time.Second, 0)
	narrow := mustRule(t, "narrow", 60, time.Minute, 0)
	keys := []string{"10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4", "10.0.0.5"}
	workers, each := 32, 3000
	if raceEnabled {
		each = 1000
	}
	var admitted [5]atomic.Int64
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 1))
			reqs := make([]Request, 2)
			results := make([]Result, 2)
			for range each {
				k := rng.IntN(len(keys))
				reqs[0] = Request{Rule: wide, Key: keys[k], Cost: 1}
				reqs[1] = Request{Rule: narrow, Key: keys[k], Cost: 1}
				if rng.IntN(2) == 0 {
					reqs[0], reqs[1] = reqs[1], reqs[0]
				}
				ok, err := s.Decide(context.Background(), reqs, results)
				if err != nil {
					t.Error(err)
					return
				}
				if ok {
					admitted[k].Add(1)
				}
			}
		})
	}
	wg.Wait()
	for k, key := range keys {
		if n := admitted[k].Load(); n != 60 {
			t.Errorf("key %s: %d admitted, want exactly 60", key, n)
		}
		if _, res := decideOne(t, s, wide, key, 0); res.Remaining != 40 {
			t.Errorf("key %s: the wide zone has %d left, want 40", key, res.Remaining)
		}
		if _, res := decideOne(t, s, narrow, key, 0); res.Remaining != 0 {
			t.Errorf("key %s: the narrow zone has %d left, want 0", key, res.Remaining)
		}
	}
}

func TestMemorySweep(t *testing.T) {
	t.Parallel()
	clk := newTestClock(epoch)
	s := newMemory(t, clk)
	r := mustRule(t, "z", 3, time.Second, 0)
	for i := range 99 {
		decideOne(t, s, r, strconv.Itoa(i), int64(1+i%3)) // full again in (1+i%3)/3 s
	}
	if n := s.Len(); n != 99 {
		t.Fatalf("Len() = %d, want 99", n)
	}
	// A token takes 333333 1/3 us: a bucket charged one token is full at
	// +333334us, not a microsecond sooner.
	clk.add(333_333)
	s.Sweep()
	if n := s.Len(); n != 99 {
		t.Fatalf("after sweeping at +333333us: Len() = %d, want 99", n)
	}
	clk.add(1)
	s.Sweep()
	if n := s.Len(); n != 66 {
		t.Fatalf("after sweeping at +333334us: Len() = %d, want 66", n)
	}
	clk.set(epoch + 666_667)
	s.Sweep()
	if n := s.Len(); n != 33 {
		t.Fatalf("after sweeping at +666667us: Len() = %d, want 33", n)
	}
	// What is left kept its state: a bucket charged 3 tokens has 2 back.
	if _, res := decideOne(t, s, r, "2", 0); res.Remaining != 2 || res.ResetAfter != 333_333*time.Microsecond {
		t.Fatalf("a bucket kept by the sweep: %+v", res)
	}
	clk.set(epoch + 1_000_000)
	s.Sweep()
	if n := s.Len(); n != 0 {
		t.Fatalf("after every bucket is full: Len() = %d, want 0", n)
	}

	// A table left less than an eighth full shrinks (100,000 keys put
	// ~1560 in each of the 64 shards, whose tables grow to 4096 slots).
	n := 100_000
	for i := range n {
		decideOne(t, s, r, strconv.Itoa(i), 1)
	}
	if got := s.Len(); got != n {
		t.Fatalf("Len() = %d, want %d", got, n)
	}
	clk.add(1_000_000)
	s.Sweep()
	if got := s.Len(); got != 0 {
		t.Fatalf("after the sweep: Len() = %d, want 0", got)
	}
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		slots := len(sh.m.slots)
		sh.mu.Unlock()
		if slots > minTableSlots {
			t.Fatalf("shard %d: %d slots after emptying, want at most %d", i, slots, minTableSlots)
		}
	}
	if ok, _ := decideOne(t, s, r, "again", 1); !ok || s.Len() != 1 {
		t.Fatal("a rebuilt store does not keep buckets")
	}
}

// TestMemorySweeper checks that the background sweeper runs, and that
// Close stops it.
func TestMemorySweeper(t *testing.T) {
	t.Parallel()
	clk := newTestClock(epoch)
	s := NewMemoryStore(MemoryOptions{Sweep: time.Millisecond, Clock: clk})
	r := mustRule(t, "z", 1000, time.Second, 0)
	for i := range 10 {
		decideOne(t, s, r, strconv.Itoa(i), 1)
	}
	clk.add(1000)
	deadline := time.Now().Add(10 * time.Second)
	for s.Len() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("the sweeper left %d full buckets for 10s", s.Len())
		}
		time.Sleep(time.Millisecond)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestMemoryBytesPerKey inserts a million keys and measures the heap they
// take: memory must be a few dozen bytes per active key.
func TestMemoryBytesPerKey(t *testing.T) {
	// Not parallel: the heap is measured, so nothing else may run.
	const n = 1_000_000
	keys := make([]string, n)
	for i := range keys {
		keys[i] = "198.51." + strconv.Itoa(i>>8) + "." + strconv.Itoa(i&255)
	}
	clk := newTestClock(epoch)
	r := mustRule(t, "api", 100, time.Minute, 0)
	reqs := []Request{{Rule: r, Cost: 1}}
	results := make([]Result, 1)

	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	s := NewMemoryStore(MemoryOptions{Sweep: time.Hour, Clock: clk})
	for _, k := range keys {
		reqs[0].Key = k
		if ok, err := s.Decide(context.Background(), reqs, results); !ok || err != nil {
			t.Fatalf("key %s: %v %v", k, ok, err)
		}
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	if got := s.Len(); got != n {
		t.Fatalf("Len() = %d, want %d", got, n)
	}
	perKey := float64(int64(after.HeapAlloc)-int64(before.HeapAlloc)) / n
	runtime.KeepAlive(keys)
	_ = s.Close()
	t.Logf("memory store: %.1f bytes per active key (%d keys, heap %.1f MB -> %.1f MB)",
		perKey, n, float64(before.HeapAlloc)/1e6, float64(after.HeapAlloc)/1e6)
	if perKey > 128 {
		t.Fatalf("%.1f bytes per active key, want at most 128", perKey)
	}
}

// TestMemoryDecideDoesNotAllocate: the memory store's hot path allocates
// nothing, admitted or denied, one zone or several.
func TestMemoryDecideDoesNotAllocate(t *testing.T) {
	// Not parallel: AllocsPerRun counts every goroutine's allocations.
	clk := newTestClock(epoch)
	s := newMemory(t, clk)
	api := mustRule(t, "api", 1000, time.Second, 0)
	login := mustRule(t, "login", 5, time.Minute, 0)
	global := mustRule(t, "global", 1_000_000, time.Second, 0)
	for _, tc := range []struct {
		name string
		reqs []Request
	}{
		{"one zone", []Request{{Rule: api, Key: "203.0.113.9", Cost: 1}}},
		{"three zones", []Request{
			{Rule: api, Key: "203.0.113.9", Cost: 1},
			{Rule: login, Key: "user@example.com", Cost: 1},
			{Rule: global, Key: "all", Cost: 2},
		}},
	} {
		results := make([]Result, len(tc.reqs))
		denied := 0
		allocs := testing.AllocsPerRun(1000, func() {
			clk.add(7)
			if ok, _ := s.Decide(context.Background(), tc.reqs, results); !ok {
				denied++
			}
		})
		if allocs != 0 {
			t.Errorf("%s: %.1f allocations per decision, want 0", tc.name, allocs)
		}
		if tc.name == "three zones" && denied == 0 {
			t.Errorf("%s: the denial path was not exercised", tc.name)
		}
	}
}

func BenchmarkMemoryDecide(b *testing.B) {
	r := mustRule(b, "api", 1_000_000, time.Second, 1000)
	b.Run("hot key", func(b *testing.B) {
		clk := newTestClock(epoch)
		s := newMemory(b, clk)
		reqs := []Request{{Rule: r, Key: "203.0.113.9", Cost: 1}}
		results := make([]Result, 1)
		b.ReportAllocs()
		for b.Loop() {
			clk.add(1)
			_, _ = s.Decide(context.Background(), reqs, results)
		}
	})
	b.Run("many keys", func(b *testing.B) {
		clk := newTestClock(epoch)
		s := newMemory(b, clk)
		keys := make([]string, 1<<16)
		for i := range keys {
			keys[i] = "2001:db8::" + strconv.FormatInt(int64(i), 16)
		}
		reqs := []Request{{Rule: r, Cost: 1}}
		results := make([]Result, 1)
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			clk.add(1)
			reqs[0].Key = keys[i&(len(keys)-1)]
			i++
			_, _ = s.Decide(context.Background(), reqs, results)
		}
	})
	b.Run("three zones", func(b *testing.B) {
		clk := newTestClock(epoch)
		s := newMemory(b, clk)
		reqs := []Request{
			{Rule: r, Key: "203.0.113.9", Cost: 1},
			{Rule: mustRule(b, "login", 1_000_000, time.Second, 0), Key: "user@example.com", Cost: 1},
			{Rule: mustRule(b, "global", 1_000_000, time.Second, 0), Key: "all", Cost: 1},
		}
		results := make([]Result, len(reqs))
		b.ReportAllocs()
		for b.Loop() {
			clk.add(1)
			_, _ = s.Decide(context.Background(), reqs, results)
		}
	})
	b.Run("many keys parallel", func(b *testing.B) {
		// The system clock: a shared test clock would be the bottleneck.
		s := NewMemoryStore(MemoryOptions{Sweep: time.Hour})
		b.Cleanup(func() { _ = s.Close() })
		keys := make([]string, 1<<16)
		for i := range keys {
			keys[i] = "2001:db8::" + strconv.FormatInt(int64(i), 16)
		}
		var seq atomic.Uint64
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			reqs := []Request{{Rule: r, Cost: 1}}
			results := make([]Result, 1)
			i := seq.Add(1) * 7919
			for pb.Next() {
				reqs[0].Key = keys[i&(1<<16-1)]
				i++
				_, _ = s.Decide(context.Background(), reqs, results)
			}
		})
	})
}
