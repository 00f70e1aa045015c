package observe

import (
	"context"
	"errors"
	"sync"
	"time"
)

// The admin API never waits on a stalled Redis: each of its reads of a
// Redis store goes through a cachedRead, which reuses a fresh read and
// answers with the last value read, marked stale, when a refresh does not
// answer by the request's deadline (docs/design.md, "Reads that never wait
// on a stalled Redis").

// maxCachedReads bounds how many distinct reads (arguments: zones, limits)
// a cachedRead keeps; the least recently asked for goes first.
const maxCachedReads = 16

// errNoReading is the error of a read that has no value yet and whose
// first refresh did not answer in time.
var errNoReading = errors.New("redis has not answered yet (the read goes on in the background)")

// reading is what a cachedRead serves: the last value read, when, whether
// it is stale, and why.
type reading[T any] struct {
	// val is the last value read; ok says there is one.
	val T
	ok  bool
	// at is when val was read, by this node's clock.
	at time.Time
	// stale says val is not the answer of the latest read: that read
	// failed or has not answered yet.
	stale bool
	// err is why the latest read gave no value: its error, or
	// errNoReading while it runs with no value before it.
	err error
}

// cachedRead is the last reads of a Redis store, by their arguments.
type cachedRead[T any] struct {
	mu      sync.Mutex
	entries map[string]*cachedEntry[T]
}

// cachedEntry is one read's last value and the refresh in flight.
type cachedEntry[T any] struct {
	val     T
	ok      bool
	at      time.Time     // when val was read
	err     error         // the latest refresh's error; nil when it answered
	asked   time.Time     // when a request last asked for it
	pending chan struct{} // closed when the refresh in flight ends; nil: none
}

// get returns the read of key: the last one if it is younger than maxAge,
// else what a refresh (read, with a context of timeout under base) answers
// by deadline, else the last one, stale. A refresh in flight is never
// started twice: requests that come meanwhile wait for the same one, until
// their own deadlines. base ends the refreshes when the store goes away.
func (c *cachedRead[T]) get(base context.Context, key string, maxAge time.Duration, deadline time.Time, timeout time.Duration, read func(context.Context) (T, error)) reading[T] {
	c.mu.Lock()
	e := c.entry(key)
	if e.ok && e.err == nil && e.pending == nil && time.Since(e.at) < maxAge {
		r := e.reading()
		c.mu.Unlock()
		return r
	}
	if e.pending == nil {
		e.pending = make(chan struct{})
		go c.refresh(base, e, timeout, read)
	}
	done := e.pending
	c.mu.Unlock()

	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return e.reading()
}

// edit replaces each value held by what f makes of it (f must not change
// its argument: requests may hold it).
func (c *cachedRead[T]) edit(f func(T) T) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, e := range c.entries {
		if e.ok {
			e.val = f(e.val)
		}
	}
}

// entry returns key's entry, made (and the least recently asked for
// dropped, beyond maxCachedReads) if need be. c.mu is held.
func (c *cachedRead[T]) entry(key string) *cachedEntry[T] {
	now := time.Now()
	if e := c.entries[key]; e != nil {
		e.asked = now
		return e
	}
	if c.entries == nil {
		c.entries = make(map[string]*cachedEntry[T])
	}
	if len(c.entries) >= maxCachedReads {
		var oldest string
		for k, e := range c.entries {
			if oldest == "" || e.asked.Before(c.entries[oldest].asked) {
				oldest = k
			}
		}
		delete(c.entries, oldest) // a refresh in flight ends on its own
	}
	e := &cachedEntry[T]{asked: now}
	c.entries[key] = e
	return e
}

// refresh reads e's value anew and ends e's refresh in flight.
func (c *cachedRead[T]) refresh(base context.Context, e *cachedEntry[T], timeout time.Duration, read func(context.Context) (T, error)) {
	ctx, cancel := context.WithTimeout(base, timeout)
	v, err := read(ctx)
	cancel()
	c.mu.Lock()
	defer c.mu.Unlock()
	if err == nil {
		e.val, e.ok, e.at = v, true, time.Now()
	}
	e.err = err
	close(e.pending)
	e.pending = nil
}

// reading is what the entry serves now. c.mu is held.
func (e *cachedEntry[T]) reading() reading[T] {
	r := reading[T]{val: e.val, ok: e.ok, at: e.at, err: e.err}
	if e.pending != nil && e.err == nil {
		r.err = errNoReading
		if e.ok {
			r.err = nil // a value, stale: the refresh has not answered yet
		}
	}
	r.stale = e.ok && (e.pending != nil || e.err != nil)
	return r
}
