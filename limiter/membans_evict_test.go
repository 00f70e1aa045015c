package limiter

import (
	"context"
	"strconv"
	"testing"
	"time"
)

// TestMemoryBansCountAgainstMaxKeys: a key-rotating client of a zone with
// a ban leaves a denial count per key beside its bucket; those count
// against max_keys and are evicted like buckets, so the store holds at
// most max_keys entries in all however many keys rotate through it.
func TestMemoryBansCountAgainstMaxKeys(t *testing.T) {
	t.Parallel()
	clk := newTestClock(epoch)
	s := newMemory(t, clk)
	s.SetMaxKeys(256)
	r := mustConfig(t, RuleConfig{Name: "rot", Rate: 1, Per: time.Hour, Burst: 1,
		Ban: Ban{Duration: time.Hour, After: 1000, Window: time.Hour}})
	for i := range 20_000 {
		key := "k" + strconv.Itoa(i)
		for range 2 { // admitted, then denied: a bucket and a denial count
			if _, err := s.Decide(context.Background(), []Request{{Rule: r, Key: key, Cost: 1}}, make([]Result, 1)); err != nil {
				t.Fatal(err)
			}
		}
	}
	if n, bans := s.Len(), s.banEntries(); n > s.MaxKeys() {
		t.Fatalf("%d entries (%d of them denial counts and bans) after 20,000 rotating keys, want at most max_keys %d", n, bans, s.MaxKeys())
	}
	// A ban in force outlives the denial counts around it.
	ban := mustConfig(t, RuleConfig{Name: "ban", Rate: 1, Per: time.Hour, Burst: 1,
		Ban: Ban{Duration: time.Hour, After: 1, Window: time.Hour}})
	for range 2 {
		s.Decide(context.Background(), []Request{{Rule: ban, Key: "mallory", Cost: 1}}, make([]Result, 1))
	}
	for i := range 2_000 {
		key := "r" + strconv.Itoa(i)
		for range 2 {
			s.Decide(context.Background(), []Request{{Rule: r, Key: key, Cost: 1}}, make([]Result, 1))
		}
	}
	res := make([]Result, 1)
	s.Decide(context.Background(), []Request{{Rule: ban, Key: "mallory", Cost: 1}}, res)
	if !res[0].Banned {
		t.Fatalf("the ban in force was evicted by denial counts: %+v", res[0])
	}
}

// banEntries returns how many denial counts and bans the store holds.
func (s *MemoryStore) banEntries() int {
	n := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		n += len(sh.bans)
		sh.mu.Unlock()
	}
	return n
}
