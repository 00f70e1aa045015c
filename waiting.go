package fleetlimit

import "sync/atomic"

// DefaultMaxWaiting is how many requests of a leaky bucket zone a node
// holds waiting for their turn at once when the zone sets no max_waiting.
const DefaultMaxWaiting = 1024

// waitRoom bounds how many requests of a leaky bucket zone this node holds
// waiting for their turn at once: each holds a connection and a goroutine,
// so a burst of slow clients must not hold them without bound. A request
// that finds it full is answered 429 and charged nothing.
type waitRoom struct {
	max        int64
	waiting    atomic.Int64
	turnedAway atomic.Uint64
}

// enter takes a place in the room, or reports false (and counts the
// request turned away) when it is full.
func (w *waitRoom) enter() bool {
	if w.waiting.Add(1) > w.max {
		w.waiting.Add(-1)
		w.turnedAway.Add(1)
		return false
	}
	return true
}

// leave gives back a place taken by enter.
func (w *waitRoom) leave() { w.waiting.Add(-1) }

// counts returns how many requests wait now, and how many were turned
// away since the zone was provisioned.
func (w *waitRoom) counts() (int64, uint64) { return w.waiting.Load(), w.turnedAway.Load() }
