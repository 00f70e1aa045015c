package limiter

import (
	"math/rand/v2"
	"testing"
)

// TestBucketTableMatchesMap drives a bucketTable and a Go map with the same
// random puts, removals and sweeps (ids crowded onto few home slots, so
// that runs wrap around the table's end and removals shift buckets back)
// and checks after every step that both hold the same buckets.
func TestBucketTableMatchesMap(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	var tab bucketTable
	want := map[bucketID]memEntry{}
	id := func() bucketID {
		// 512 distinct ids whose homes fall on few slots.
		n := rng.Uint64N(512)
		return bucketID{(n%7)<<8 | n<<40 | 1, n}
	}
	check := func(step int) {
		t.Helper()
		if tab.n != len(want) {
			t.Fatalf("step %d: %d buckets, want %d", step, tab.n, len(want))
		}
		for k, e := range want {
			if got, ok := tab.get(k); !ok || got != e {
				t.Fatalf("step %d: bucket %v = %v %v, want %v", step, k, got, ok, e)
			}
		}
		seen := 0
		for _, s := range tab.slots {
			if s.id != (bucketID{}) {
				seen++
				if _, ok := want[s.id]; !ok {
					t.Fatalf("step %d: the table holds %v, removed", step, s.id)
				}
			}
		}
		if seen != len(want) {
			t.Fatalf("step %d: %d occupied slots, want %d", step, seen, len(want))
		}
	}
	for step := range 20000 {
		switch op := rng.IntN(10); {
		case op < 6:
			k, e := id(), memEntry{state: State(step), expires: rng.Int64N(1000)}
			tab.put(k, e)
			want[k] = e
		case op < 9:
			k := id()
			tab.remove(k)
			delete(want, k)
		default:
			now := rng.Int64N(300)
			tab.sweep(now)
			for k, e := range want {
				if e.expires <= now {
					delete(want, k)
				}
			}
		}
		check(step)
	}
	if len(tab.slots) < minTableSlots || tab.n*4 > len(tab.slots)*3 {
		t.Fatalf("%d buckets in %d slots: more than three quarters full", tab.n, len(tab.slots))
	}
}

// TestBucketTableSample: sample picks the bucket that expires first among
// those it reads, stops at one already expired, and reports an empty table.
func TestBucketTableSample(t *testing.T) {
	var tab bucketTable
	if _, _, ok := tab.sample(8, 0); ok {
		t.Fatal("an empty table sampled a bucket")
	}
	for i := range 4 {
		tab.put(bucketID{uint64(i+1) << 8, 0}, memEntry{expires: int64(100 + i)})
	}
	// Four buckets, a sample of eight: it reads them all.
	if id, exp, ok := tab.sample(8, 0); !ok || exp != 100 || id != (bucketID{1 << 8, 0}) {
		t.Fatalf("sample: %v %d %v, want the bucket expiring at 100", id, exp, ok)
	}
	// Shrinks once the sweep leaves it nearly empty.
	for i := range 1000 {
		tab.put(bucketID{uint64(i+10) << 8, 1}, memEntry{expires: 5})
	}
	grown := len(tab.slots)
	tab.sweep(50)
	if tab.n != 4 || len(tab.slots) >= grown {
		t.Fatalf("after the sweep: %d buckets in %d slots (was %d slots), want 4 in fewer", tab.n, len(tab.slots), grown)
	}
}
