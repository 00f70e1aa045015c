package observe

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"
)

// TestCachedReadNeverWaitsOnASlowRead: a read of Redis that does not answer
// within the wait leaves the caller with the last value read, marked stale
// with the time it was read; the slow read goes on off the caller, at most
// one at a time, and its answer is served once it comes.
func TestCachedReadNeverWaitsOnASlowRead(t *testing.T) {
	t.Parallel()
	var c cachedRead[int]
	var reads atomic.Int32
	block := make(chan struct{})
	value := atomic.Int32{}
	value.Store(1)
	read := func(ctx context.Context) (int, error) {
		reads.Add(1)
		select {
		case <-block:
		case <-ctx.Done():
			return 0, ctx.Err()
		}
		return int(value.Load()), nil
	}
	const wait, maxAge, timeout = 30 * time.Millisecond, 50 * time.Millisecond, 10 * time.Second
	get := func() (reading[int], time.Duration) {
		start := time.Now()
		r := c.get(context.Background(), "k", maxAge, start.Add(wait), timeout, read)
		return r, time.Since(start)
	}

	// No value yet, and the read does not answer: an error, in time.
	r, took := get()
	t.Logf("first read, not answered: %s", took)
	if r.ok || r.err == nil || took > wait+500*time.Millisecond {
		t.Fatalf("unanswered first read: %+v after %s, want an error within %s", r, took, wait)
	}
	close(block) // Redis answers from now on
	r = readUntil(t, get, func(r reading[int]) bool { return r.ok }, "no value after the read could answer")
	if r.val != 1 || r.stale || r.at.IsZero() {
		t.Fatalf("answered read: %+v, want 1, fresh, with its time", r)
	}
	firstAt := r.at

	// Redis stalls: reads block until their context ends.
	block = make(chan struct{})
	value.Store(2)
	time.Sleep(maxAge)
	before := reads.Load()
	for i := range 5 {
		r, took = get()
		t.Logf("stalled read %d: %s", i, took)
		if took > wait+500*time.Millisecond {
			t.Fatalf("a get waited %s on a stalled read, want at most %s (and a margin)", took, wait)
		}
		if !r.ok || r.val != 1 || !r.stale || !r.at.Equal(firstAt) {
			t.Fatalf("stalled read %d: %+v, want the last value (1), stale, read at %s", i, r, firstAt)
		}
	}
	if n := reads.Load() - before; n != 1 {
		t.Fatalf("%d reads in flight for 5 gets of a stalled Redis, want 1", n)
	}

	// Redis answers again: the read in flight ends, and its value is served.
	close(block)
	r = readUntil(t, get, func(r reading[int]) bool { return r.ok && r.val == 2 && !r.stale }, "no fresh value after Redis answered again")
	if !r.at.After(firstAt) {
		t.Fatalf("a fresh value read at %s, not after %s", r.at, firstAt)
	}
}

// readUntil calls get every 5ms until what it reads satisfies ok, for at
// most 5 s, and returns that reading.
func readUntil(t *testing.T, get func() (reading[int], time.Duration), ok func(reading[int]) bool, what string) reading[int] {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		r, _ := get()
		if ok(r) {
			return r
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: still %+v after 5 s", what, r)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestCachedReadFailureKeepsLastValue: a read that fails serves the last
// value, stale, with the failure.
func TestCachedReadFailureKeepsLastValue(t *testing.T) {
	t.Parallel()
	var c cachedRead[string]
	fail := errors.New("redis: connection refused")
	var broken atomic.Bool
	read := func(context.Context) (string, error) {
		if broken.Load() {
			return "", fail
		}
		return "v", nil
	}
	get := func() reading[string] {
		return c.get(context.Background(), "k", 0, time.Now().Add(time.Second), time.Second, read)
	}
	if r := get(); !r.ok || r.stale || r.val != "v" {
		t.Fatalf("healthy read: %+v", r)
	}
	broken.Store(true)
	r := get()
	if !r.ok || !r.stale || r.val != "v" || !errors.Is(r.err, fail) {
		t.Fatalf("failed read: %+v, want the last value, stale, with the error", r)
	}
}
