package observe

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/fleetlimit/caddy-fleetlimit/limiter"
)

func TestCounterRing(t *testing.T) {
	t.Parallel()
	var r counterRing
	const base = 1_700_000_000
	for i := range 5 {
		r.add(base, limiter.Allowed)
		r.add(base+1, limiter.Denied)
		if i < 2 {
			r.add(base+2, limiter.FailedOpen)
		}
	}
	if c := r.sum(base+2, 3); c[limiter.Allowed] != 5 || c[limiter.Denied] != 5 || c[limiter.FailedOpen] != 2 {
		t.Fatalf("sum %v", c)
	}
	if c := r.sum(base+2, 1); c[limiter.Allowed] != 0 || c[limiter.FailedOpen] != 2 {
		t.Fatalf("last second %v", c)
	}
	// A slot reused a lap later starts from zero, and the old second is
	// gone; a second that has left the ring is not counted.
	lap := int64(len(r.slots))
	r.add(base+lap, limiter.Denied)
	if c := r.get(base + lap); c[limiter.Denied] != 1 || c[limiter.Allowed] != 0 {
		t.Fatalf("reused slot %v", c)
	}
	if c := r.get(base); c != ([limiter.NumOutcomes]uint64{}) {
		t.Fatalf("the overwritten second still reads %v", c)
	}
	r.add(base, limiter.Allowed)
	if c := r.get(base + lap); c[limiter.Allowed] != 0 {
		t.Fatalf("a late add for an old second landed in the new one: %v", c)
	}
}

func TestLatencyBuckets(t *testing.T) {
	t.Parallel()
	prev := time.Duration(0)
	for i := range latBuckets {
		up := latUpper(i)
		if up <= prev {
			t.Fatalf("bucket %d: upper bound %s not above %s", i, up, prev)
		}
		prev = up
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for range 100000 {
		d := time.Duration(rng.Int64N(int64(10 * time.Second)))
		i := latIndex(d)
		if d >= latUpper(i) || (i > 0 && d < latUpper(i-1)) {
			t.Fatalf("%s in bucket %d of [%s, %s)", d, i, latUpper(i-1), latUpper(i))
		}
		if i > 0 && float64(latUpper(i)-latUpper(i-1)) > 0.26*float64(latUpper(i)) {
			t.Fatalf("bucket %d is wider than a quarter of its bound", i)
		}
	}
	var s latencySummary
	for ms := 1; ms <= 100; ms++ {
		s.buckets[latIndex(time.Duration(ms)*time.Millisecond)]++
	}
	for _, c := range []struct {
		q    float64
		want time.Duration
	}{{.5, 50 * time.Millisecond}, {.9, 90 * time.Millisecond}, {.99, 99 * time.Millisecond}} {
		got := s.quantile(c.q)
		if got < c.want || float64(got) > 1.26*float64(c.want) {
			t.Errorf("p%v = %s, want %s within a quarter", c.q*100, got, c.want)
		}
	}
	if (&latencySummary{}).quantile(.5) != 0 {
		t.Error("a quantile of nothing")
	}
}

// TestTopKeys: the sketch finds the heavy hitters among a flood of distinct
// keys, in bounded memory, and forgets them two windows later.
func TestTopKeys(t *testing.T) {
	t.Parallel()
	tk := newTopKeys()
	const sec = 1_700_000_040 + 40 // 40 s into a window
	heavy := map[string]int{"heavy-1": 900, "heavy-2": 600, "heavy-3": 300}
	var stream []string
	for k, n := range heavy {
		for range n {
			stream = append(stream, k)
		}
	}
	for i := range 20000 {
		stream = append(stream, fmt.Sprintf("noise-%d", i))
	}
	rng := rand.New(rand.NewPCG(3, 4))
	rng.Shuffle(len(stream), func(i, j int) { stream[i], stream[j] = stream[j], stream[i] })
	for _, k := range stream {
		tk.add(k, sec)
	}
	for i := range tk.shards {
		if n := len(tk.shards[i].cur.items); n > topPerShard || len(tk.shards[i].cur.idx) != n {
			t.Fatalf("shard %d holds %d items, index %d", i, n, len(tk.shards[i].cur.idx))
		}
	}
	top, since := tk.top(sec, 3)
	if since != sec-40-topWindow {
		t.Errorf("since %d, want the start of the previous window %d", since, sec-40-topWindow)
	}
	for i, want := range []string{"heavy-1", "heavy-2", "heavy-3"} {
		if i >= len(top) || top[i].key != want {
			t.Fatalf("top %+v, want heavy-1, heavy-2, heavy-3", top)
		}
		if n := uint64(heavy[want]); top[i].count < n || top[i].count-top[i].over > n {
			t.Errorf("%s: count %d (error %d), true count %d", want, top[i].count, top[i].over, n)
		}
	}
	// The next window still shows them; the one after has forgotten.
	tk.add("late", sec+topWindow)
	if top, _ := tk.top(sec+topWindow, 1); len(top) != 1 || top[0].key != "heavy-1" {
		t.Errorf("next window: %+v", top)
	}
	if top, _ := tk.top(sec+2*topWindow, 10); len(top) != 1 || top[0].key != "late" {
		t.Errorf("two windows later: %+v, want only the key of the last window", top)
	}
	tk.add("later", sec+5*topWindow)
	if top, _ := tk.top(sec+5*topWindow, 10); len(top) != 1 || top[0].key != "later" {
		t.Errorf("after a gap: %+v", top)
	}
}
