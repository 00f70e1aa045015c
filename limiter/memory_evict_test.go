package limiter

import (
	"strconv"
	"testing"
	"time"
)

// TestMemoryMaxKeysFlood floods a store bounded to 6,400 keys with 200,000
// new keys, each spending one token of a bucket that takes 864 s to refill
// (rate 100 per 24h), while a hot key of the same zone is kept drained: the
// store never holds more than its bound, the flood's buckets are evicted
// and counted, and the hot key, far from full, stays exact throughout.
func TestMemoryMaxKeysFlood(t *testing.T) {
	t.Parallel()
	clk := newTestClock(epoch)
	s := newMemory(t, clk)
	s.SetMaxKeys(6400)
	if s.MaxKeys() != 6400 {
		t.Fatalf("MaxKeys() = %d, want 6400", s.MaxKeys())
	}
	r := mustRule(t, "api", 100, 24*time.Hour, 100)
	other := mustRule(t, "other", 100, 24*time.Hour, 100)

	admittedHot := 0
	const flood = 200_000
	for i := range flood {
		if ok, _ := decideOne(t, s, r, "flood-"+strconv.Itoa(i), 1); !ok {
			t.Fatalf("new key %d denied", i)
		}
		if i%100 == 0 {
			if ok, _ := decideOne(t, s, r, "hot", 1); ok {
				admittedHot++
			}
		}
		clk.add(10) // 200,000 keys in 2 s
		if n := s.Len(); n > s.MaxKeys() {
			t.Fatalf("after %d keys the store holds %d buckets, bound %d", i+1, n, s.MaxKeys())
		}
	}
	// The hot key had its burst of 100 and at most what 2 s refill of
	// 100 per 24 h gives: nothing. Eviction would have given it more.
	if admittedHot != 100 {
		t.Fatalf("hot key admitted %d times during the flood, want exactly its burst of 100", admittedHot)
	}
	ev := s.Evictions("api")
	if want := uint64(flood + 1 - s.MaxKeys()); ev < want {
		t.Fatalf("Evictions(api) = %d, want at least %d", ev, want)
	}
	if s.Evictions("other") != 0 {
		t.Fatalf("Evictions(other) = %d, want 0", s.Evictions("other"))
	}
	// A zone that had nothing evicted keeps its count apart.
	decideOne(t, s, other, "x", 1)
	if s.Evictions("other") != 0 {
		t.Fatal("an admission is not an eviction")
	}
}

// TestMemoryMaxKeysTakesFullBucketsFirst: a bucket that is full again is
// evicted before one that is not, and is not counted as an eviction (it
// loses nothing).
func TestMemoryMaxKeysTakesFullBucketsFirst(t *testing.T) {
	t.Parallel()
	clk := newTestClock(epoch)
	s := newMemory(t, clk)
	short := mustRule(t, "short", 1, time.Second, 1)
	long := mustRule(t, "long", 1, time.Hour, 1)
	// Fill every shard with short buckets, then let them all refill, and
	// only then bound the store to one bucket per shard.
	for i := range 1000 {
		decideOne(t, s, short, "s"+strconv.Itoa(i), 1)
	}
	clk.add(2_000_000)
	s.SetMaxKeys(numShards)
	for i := range 1000 {
		decideOne(t, s, long, "l"+strconv.Itoa(i), 1)
	}
	if ev := s.Evictions("short"); ev != 0 {
		t.Fatalf("full buckets counted as %d evictions, want 0", ev)
	}
	if ev := s.Evictions("long"); ev == 0 {
		t.Fatal("1000 long buckets in 64 places evicted none")
	}
	if s.Len() > numShards {
		t.Fatalf("Len() = %d, bound %d", s.Len(), numShards)
	}
}

// TestMemoryMaxKeysAsSet: MaxKeys is the bound as it was set, not its
// rounding to the shards (the dashboard shows it: "of 500000", not "of
// 500032"), and the store holds at most that rounding: a few dozen more.
func TestMemoryMaxKeysAsSet(t *testing.T) {
	t.Parallel()
	clk := newTestClock(epoch)
	s := newMemory(t, clk)
	for _, n := range []int{500_000, 20_000, 100, 1, 0} {
		s.SetMaxKeys(n)
		if got := s.MaxKeys(); got != n {
			t.Errorf("SetMaxKeys(%d): MaxKeys() = %d", n, got)
		}
	}
	s.SetMaxKeys(100)
	r := mustRule(t, "api", 100, 24*time.Hour, 100)
	for i := range 2_000 {
		decideOne(t, s, r, "k"+strconv.Itoa(i), 1)
		clk.add(1)
	}
	if n := s.Len(); n > 2*numShards {
		t.Fatalf("max_keys 100: the store holds %d buckets, want at most one per shard over the bound (%d)", n, 2*numShards)
	}
}

// TestMemoryMaxKeysSlidingLogs: sliding logs count towards the bound and
// are evicted too.
func TestMemoryMaxKeysSlidingLogs(t *testing.T) {
	t.Parallel()
	clk := newTestClock(epoch)
	s := newMemory(t, clk)
	s.SetMaxKeys(640)
	r, err := NewRule(RuleConfig{Name: "log", Algorithm: SlidingLog, Rate: 5, Per: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 10_000 {
		if ok, _ := decideOne(t, s, r, "k"+strconv.Itoa(i), 1); !ok {
			t.Fatalf("new key %d denied", i)
		}
		clk.add(1)
	}
	if s.Len() > s.MaxKeys() {
		t.Fatalf("Len() = %d, bound %d", s.Len(), s.MaxKeys())
	}
	if s.Evictions(r.bucket) == 0 {
		t.Fatal("no sliding log evicted")
	}
}

// TestMemorySetSweepInterval: a store created with an hourly sweep sweeps
// at the new interval once it is changed (the sweep_interval option).
func TestMemorySetSweepInterval(t *testing.T) {
	t.Parallel()
	clk := newTestClock(epoch)
	s := NewMemoryStore(MemoryOptions{Sweep: time.Hour, Clock: clk})
	t.Cleanup(func() { _ = s.Close() })
	r := mustRule(t, "z", 1000, time.Second, 0)
	for i := range 10 {
		decideOne(t, s, r, strconv.Itoa(i), 1)
	}
	clk.add(1000)
	time.Sleep(20 * time.Millisecond)
	if s.Len() != 10 {
		t.Fatalf("an hourly sweeper dropped buckets after 20ms: %d left", s.Len())
	}
	s.SetSweepInterval(time.Millisecond)
	deadline := time.Now().Add(10 * time.Second)
	for s.Len() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("the sweeper left %d full buckets for 10s after the interval became 1ms", s.Len())
		}
		time.Sleep(time.Millisecond)
	}
}
