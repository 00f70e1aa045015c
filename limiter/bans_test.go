package limiter

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"testing"
	"time"
)

// listedBanRule is a token bucket of one token a minute that bans a key for d
// after 2 denials within a minute.
func listedBanRule(t testing.TB, name string, d time.Duration) *Rule {
	t.Helper()
	return mustConfig(t, RuleConfig{Name: name, Rate: 1, Per: time.Minute,
		Ban: Ban{Duration: d, After: 2, Window: time.Minute}})
}

// banKeyOf sends requests of key through l until one is answered banned, and
// returns that result; it fails the test after a few.
func banKeyOf(t *testing.T, l *Limiter, r *Rule, key string) Result {
	t.Helper()
	res := make([]Result, 1)
	for range 5 {
		l.Decide(context.Background(), []Request{{Rule: r, Key: key, Cost: 1}}, res)
		if res[0].Banned {
			return res[0]
		}
	}
	t.Fatalf("%s was never banned in %s", key, r.Name())
	return Result{}
}

// TestMemoryBanRegistry: the bans a memory store's zones start are listed
// with their start, end and denials, by zone, those ending last first; a
// dry-run zone's would-be ban is not; a ban that ended is not.
func TestMemoryBanRegistry(t *testing.T) {
	t.Parallel()
	c := newTestClock(epoch)
	s := newMemory(t, c)
	l := New(s, Options{})
	short, long := listedBanRule(t, "short", time.Minute), listedBanRule(t, "long", time.Hour)
	dry := mustConfig(t, RuleConfig{Name: "dry", Rate: 1, Per: time.Minute, DryRun: true,
		Ban: Ban{Duration: time.Hour, After: 2, Window: time.Minute}})

	if res := banKeyOf(t, l, short, "k1"); !res.BanStarted {
		t.Fatalf("the ban's first answer %+v, want BanStarted", res)
	}
	c.add(int64(time.Second / time.Microsecond))
	banKeyOf(t, l, long, "k2")
	c.add(int64(time.Second / time.Microsecond))
	banKeyOf(t, l, short, "k3")
	res := make([]Result, 1)
	for range 4 {
		l.Decide(context.Background(), []Request{{Rule: dry, Key: "k4", Cost: 1}}, res)
	}

	bans, err := l.Bans(context.Background(), []string{"short", "long", "dry", "none"}, 10)
	if err != nil {
		t.Fatal(err)
	}
	got := fmt.Sprint(bansOf(bans))
	want := "[long/k2 short/k3 short/k1]"
	if got != want {
		t.Fatalf("bans %s, want %s", got, want)
	}
	b := bans[2]
	start := time.UnixMicro(epoch).UTC()
	if !b.Start.Equal(start) || !b.End.Equal(start.Add(time.Minute)) || b.Denials != 2 || b.Bucket != "short" ||
		b.Left != time.Minute-2*time.Second {
		t.Errorf("k1's ban %+v, want from %s for a minute, 2 denials, 58s left", b, start)
	}
	if bans, _ := l.Bans(context.Background(), []string{"short"}, 1); fmt.Sprint(bansOf(bans)) != "[short/k3]" {
		t.Errorf("one ban of short: %v, want the one ending last", bansOf(bans))
	}

	// A minute later the short bans have ended: only the long one is left.
	c.add(int64(time.Minute / time.Microsecond))
	bans, _ = l.Bans(context.Background(), []string{"short", "long"}, 10)
	if got := fmt.Sprint(bansOf(bans)); got != "[long/k2]" {
		t.Errorf("a minute later: %s, want [long/k2]", got)
	}
}

func bansOf(bans []BanRecord) []string {
	out := make([]string, len(bans))
	for i, b := range bans {
		out[i] = b.Zone + "/" + b.Key
	}
	return out
}

// TestMemoryUnban: Unban lifts a ban at once (the next request is decided
// by the bucket again), forgets the denials counted towards the next one,
// takes the ban off the registry, and says when there was none.
func TestMemoryUnban(t *testing.T) {
	t.Parallel()
	c := newTestClock(epoch)
	s := newMemory(t, c)
	l := New(s, Options{})
	r := listedBanRule(t, "unban", time.Hour)
	banKeyOf(t, l, r, "k")
	rec, lifted, err := l.Unban(context.Background(), r, "k")
	if err != nil || !lifted {
		t.Fatalf("Unban: %v, lifted %v", err, lifted)
	}
	if rec.Zone != "unban" || rec.Key != "k" || rec.Denials != 2 || rec.Left != time.Hour ||
		!rec.Start.Equal(time.UnixMicro(epoch)) {
		t.Errorf("lifted %+v", rec)
	}
	if bans, _ := l.Bans(context.Background(), []string{"unban"}, 10); len(bans) != 0 {
		t.Errorf("still listed: %v", bansOf(bans))
	}
	// The bucket is empty (one token a minute): denied, not banned, and
	// it takes two denials again to ban.
	res := make([]Result, 1)
	l.Decide(context.Background(), []Request{{Rule: r, Key: "k", Cost: 1}}, res)
	if res[0].Allowed || res[0].Banned {
		t.Fatalf("after the unban: %+v, want a plain denial", res[0])
	}
	l.Decide(context.Background(), []Request{{Rule: r, Key: "k", Cost: 1}}, res)
	if !res[0].BanStarted {
		t.Fatalf("the second denial after the unban: %+v, want a new ban", res[0])
	}
	if _, lifted, err := l.Unban(context.Background(), r, "other"); lifted || err != nil {
		t.Errorf("Unban of a key never banned: lifted %v, %v", lifted, err)
	}
	if _, _, err := New(failingStore{}, Options{}).Unban(context.Background(), r, "k"); !errors.Is(err, ErrNoBanRegistry) {
		t.Errorf("Unban through a store without bans: %v", err)
	}
}

// TestMemoryBanRegistryBound: a zone's registry keeps MaxBanRecords bans:
// a new one makes room by pruning the bans that ended, else by dropping one
// that ends early (of a few sampled), never the new one; other zones keep
// theirs.
func TestMemoryBanRegistryBound(t *testing.T) {
	t.Parallel()
	c := newTestClock(epoch)
	s := newMemory(t, c)
	s.recordBan(banNote{zone: "other", bucket: "other", key: "x", start: epoch, end: epoch + 5, denials: 1})
	for i := range MaxBanRecords + 10 {
		s.recordBan(banNote{zone: "z", bucket: "z", key: fmt.Sprint(i), start: epoch, end: epoch + 1_000_000 + int64(i), denials: 1})
	}
	bans, _ := s.Bans(context.Background(), []string{"z"}, 2*MaxBanRecords)
	if len(bans) != MaxBanRecords || bans[0].Key != fmt.Sprint(MaxBanRecords+9) {
		t.Fatalf("%d bans, the first %s; want %d, the last recorded first", len(bans), bans[0].Key, MaxBanRecords)
	}
	if bans, _ := s.Bans(context.Background(), []string{"other"}, 10); len(bans) != 1 {
		t.Errorf("another zone lost its ban to z's bound: %v", bansOf(bans))
	}
	// Two seconds later every ban of z has ended: a new one prunes them.
	c.add(2_000_000)
	s.recordBan(banNote{zone: "z", bucket: "z", key: "new", start: c.now(), end: c.now() + 1_000_000, denials: 1})
	if n := len(s.banList.zones["z"]); n != 1 {
		t.Errorf("%d bans kept in z, want the new one only", n)
	}
}

// TestUnbanForgetsDenyCaches: a lifted ban leaves the deny caches of every
// limiter on the store (a handler each), and a cache whose limiter is gone
// leaves the store's set by itself.
func TestUnbanForgetsDenyCaches(t *testing.T) {
	t.Parallel()
	c := newTestClock(epoch)
	s := newMemory(t, c)
	r := listedBanRule(t, "caches", time.Hour)
	a := New(s, Options{Cache: NewDenyCache(DenyCacheOptions{})})
	banKeyOf(t, a, r, "k")
	// b decides through the same store with a cache of its own, and goes
	// afterwards (its configuration unloaded).
	func() {
		b := New(s, Options{Cache: NewDenyCache(DenyCacheOptions{})})
		res := make([]Result, 1)
		b.Decide(context.Background(), []Request{{Rule: r, Key: "k", Cost: 1}}, res)
		if !res[0].Banned || a.Cache().Len() == 0 || b.Cache().Len() != 1 {
			t.Fatalf("both caches should hold the ban: %+v, %d and %d buckets", res[0], a.Cache().Len(), b.Cache().Len())
		}
		if _, lifted, err := s.Unban(context.Background(), "caches", r.Bucket(), "k"); !lifted || err != nil {
			t.Fatalf("Unban: %v, %v", lifted, err)
		}
		if a.Cache().Len() != 0 || b.Cache().Len() != 0 {
			t.Errorf("the caches still hold %d and %d buckets", a.Cache().Len(), b.Cache().Len())
		}
	}()

	// b's cache leaves the set once collected (the second forget, a second
	// after the unban, holds it until then).
	for i := 0; len(s.banList.caches.live()) > 1; i++ {
		if i == 300 {
			t.Fatalf("%d caches in the set, want 1: a dropped limiter's cache stays", len(s.banList.caches.live()))
		}
		runtime.GC()
		time.Sleep(20 * time.Millisecond)
	}
	New(s, Options{Cache: NewDenyCache(DenyCacheOptions{})}) // adding prunes
	s.banList.caches.mu.Lock()
	n := len(s.banList.caches.caches)
	s.banList.caches.mu.Unlock()
	if n > 2 {
		t.Errorf("%d weak pointers kept, want at most 2", n)
	}
	runtime.KeepAlive(a)
}
