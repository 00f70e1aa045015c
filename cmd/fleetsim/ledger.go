package main

import (
	"math"
	"sync/atomic"
)

// The ledger: what each client key was offered and admitted, and when its
// first request was sent and its last answer came, so that every bucket can
// be held to its exact bound burst + rate x elapsed.

// keyStat counts one client key's requests. Times are nanoseconds since the
// load began, plus one (0: no request yet).
type keyStat struct {
	offered  atomic.Int64 // requests sent
	eligible atomic.Int64 // requests that no other zone denied
	admitted atomic.Int64 // requests admitted (cost 1 each)
	first    atomic.Int64 // earliest send
	last     atomic.Int64 // latest answer
}

// note records one request of the key.
func (k *keyStat) note(send, answer int64, eligible, admitted bool) {
	k.offered.Add(1)
	if eligible {
		k.eligible.Add(1)
	}
	if admitted {
		k.admitted.Add(1)
	}
	storeMin(&k.first, send+1)
	storeMax(&k.last, answer+1)
}

// storeMin lowers v to x unless it holds a lower nonzero value.
func storeMin(v *atomic.Int64, x int64) {
	for {
		cur := v.Load()
		if cur != 0 && cur <= x {
			return
		}
		if v.CompareAndSwap(cur, x) {
			return
		}
	}
}

// storeMax raises v to x unless it holds a higher value.
func storeMax(v *atomic.Int64, x int64) {
	for {
		cur := v.Load()
		if cur >= x {
			return
		}
		if v.CompareAndSwap(cur, x) {
			return
		}
	}
}

// limit is one zone's rule as the ledger checks it: rate tokens a second,
// into a bucket of burst.
type limit struct {
	rate, burst int64
}

// bound returns the most tokens a bucket can admit between a first request
// sent at first and a last answer at last (nanoseconds): the bucket starts
// full, and refills at rate while the requests run.
func (l limit) bound(first, last int64) float64 {
	return float64(l.burst) + float64(l.rate)*float64(last-first)/1e9
}

// classResult is what a class of keys (by Zipf rank) was offered and
// admitted, against the exact bound of each of its buckets.
type classResult struct {
	Name   string
	Lo, Hi int // ranks [Lo, Hi)
	// Keys is how many keys of the class had a request.
	Keys int
	// Offered, Eligible and Admitted sum the keys' requests: sent, not
	// denied by another zone, admitted.
	Offered, Eligible, Admitted int64
	// Reachable sums, per key, min(eligible, floor(bound)): what an exact
	// limiter could at most have admitted.
	Reachable int64
	// Over is how many keys were admitted above their bound, and Excess
	// by how many tokens in all. Both must be 0.
	Over   int
	Excess int64
}

// Ratio is admitted over reachable: under 1, the class was under-admitted.
func (c *classResult) Ratio() float64 {
	if c.Reachable == 0 {
		return math.NaN()
	}
	return float64(c.Admitted) / float64(c.Reachable)
}

// add accounts one key's counts.
func (c *classResult) add(offered, eligible, admitted, first, last int64, l limit) {
	if offered == 0 {
		return
	}
	c.Keys++
	c.Offered += offered
	c.Eligible += eligible
	c.Admitted += admitted
	b := l.bound(first, last)
	c.Reachable += min(eligible, int64(math.Floor(b+1e-9)))
	if float64(admitted) > b+1e-6 {
		c.Over++
		c.Excess += admitted - int64(math.Floor(b+1e-9))
	}
}

// classes splits ranks [0, keys) into hot (the top 0.01%, at least one
// key), warm (down to the top 1%) and cold (the rest).
func classes(keys int) []classResult {
	hot := max(1, keys/10000)
	warm := min(max(hot+1, keys/100), keys)
	var cs []classResult
	lo := 0
	for i, hi := range []int{hot, warm, keys} {
		if hi > lo {
			cs = append(cs, classResult{Name: []string{"hot", "warm", "cold"}[i], Lo: lo, Hi: hi})
			lo = hi
		}
	}
	return cs
}

// summarize accounts every key of stats into its class.
func summarize(stats []keyStat, l limit) []classResult {
	cs := classes(len(stats))
	for i := range cs {
		c := &cs[i]
		for k := c.Lo; k < c.Hi; k++ {
			s := &stats[k]
			c.add(s.offered.Load(), s.eligible.Load(), s.admitted.Load(), s.first.Load()-1, s.last.Load()-1, l)
		}
	}
	return cs
}
