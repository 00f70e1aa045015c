package fleetlimit

import (
	"container/heap"
	"sync"
)

// DefaultMaxWaiting is how many requests of a leaky bucket zone, or of a
// token bucket zone with soft_shed, a node holds waiting at once when the
// zone sets no max_waiting.
const DefaultMaxWaiting = 1024

// waitRoom bounds how many requests of a zone this node holds waiting at
// once: a leaky bucket's for their turn, a soft-shedding zone's for their
// delay. Each holds a connection and a goroutine, so a burst of slow
// clients must not hold them without bound. A request enters while the
// room has a free place. In a full room:
//
//   - a request whose key already holds its fair part of the room,
//     max(1, ⌊max / k⌋) places with k the keys waiting counting its own, is
//     turned away (answered 429 and charged nothing): its own load;
//   - otherwise, in a room that takes places back (soft_shed: a delay only
//     spreads what the zone admitted anyway), the key holding the most
//     gives up its oldest place: that request is passed on at once (its
//     place's cut is closed), and the new one waits in its place. A
//     leaky bucket's room never takes a place back (a shaper passes no
//     request before its turn): the request is turned away.
//
// So a key within its burst is never turned away by a soft-shedding room
// because of other keys, the room never holds more than max requests,
// however many keys send, and it remembers only the keys that wait.
type waitRoom struct {
	max       int64
	takesBack bool // soft_shed: a full room takes a place back for a key below its share

	mu      sync.Mutex
	waiting int64
	keys    map[string]*roomKey // the keys with a request waiting
	byHeld  roomKeys            // the same keys, a max-heap by places held
	// turnedAway counts the requests turned away since the zone was
	// provisioned.
	turnedAway uint64
}

// roomKey is a key with requests waiting in a room, and their places,
// oldest first.
type roomKey struct {
	key         string
	held        int64
	first, last *roomPlace
	index       int // in byHeld
}

// roomPlace is one request's place in a room.
type roomPlace struct {
	room       *waitRoom
	key        *roomKey // nil once the place is given up
	prev, next *roomPlace
	// cut is closed when the room takes the place back: the request
	// waits no longer.
	cut chan struct{}
}

// newWaitRoom returns a room of places places; takesBack as for waitRoom.
func newWaitRoom(places int64, takesBack bool) *waitRoom {
	return &waitRoom{max: places, takesBack: takesBack, keys: map[string]*roomKey{}}
}

// enter takes a place in the room for a request of key, or returns nil
// (and counts the request turned away) when the room has none for it.
func (w *waitRoom) enter(key string) *roomPlace {
	w.mu.Lock()
	defer w.mu.Unlock()
	k := w.keys[key]
	if w.waiting >= w.max && !w.takeBack(k) {
		w.turnedAway++
		return nil
	}
	if k == nil {
		k = &roomKey{key: key}
		w.keys[key] = k
		heap.Push(&w.byHeld, k)
	}
	p := &roomPlace{room: w, key: k, prev: k.last, cut: make(chan struct{})}
	if k.last != nil {
		k.last.next = p
	} else {
		k.first = p
	}
	k.last = p
	k.held++
	heap.Fix(&w.byHeld, k.index)
	w.waiting++
	return p
}

// takeBack frees a place in the full room for a request of k (nil: a key
// with none), and reports whether it did: when the room takes places
// back, k holds less than its fair part, and another key holds more than
// k. That key's oldest place is cut short.
func (w *waitRoom) takeBack(k *roomKey) bool {
	if !w.takesBack {
		return false
	}
	var held int64
	keys := int64(len(w.keys))
	if k != nil {
		held = k.held
	} else {
		keys++
	}
	top := w.byHeld[0] // the room is full: some key holds a place
	if held >= max(1, w.max/keys) || top.held <= held {
		return false
	}
	p := top.first
	w.giveUp(p)
	close(p.cut)
	return true
}

// leave gives back the place, unless the room took it back already.
func (p *roomPlace) leave() {
	w := p.room
	w.mu.Lock()
	defer w.mu.Unlock()
	if p.key != nil {
		w.giveUp(p)
	}
}

// giveUp removes a place from the room; w.mu is held.
func (w *waitRoom) giveUp(p *roomPlace) {
	k := p.key
	if p.prev != nil {
		p.prev.next = p.next
	} else {
		k.first = p.next
	}
	if p.next != nil {
		p.next.prev = p.prev
	} else {
		k.last = p.prev
	}
	p.key, p.prev, p.next = nil, nil, nil
	w.waiting--
	if k.held--; k.held == 0 {
		heap.Remove(&w.byHeld, k.index)
		delete(w.keys, k.key)
		return
	}
	heap.Fix(&w.byHeld, k.index)
}

// counts returns how many requests wait now, and how many were turned
// away since the zone was provisioned.
func (w *waitRoom) counts() (int64, uint64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.waiting, w.turnedAway
}

// roomKeys is a max-heap of a room's keys by the places they hold
// (container/heap).
type roomKeys []*roomKey

func (h roomKeys) Len() int           { return len(h) }
func (h roomKeys) Less(i, j int) bool { return h[i].held > h[j].held }
func (h roomKeys) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].index, h[j].index = i, j
}
func (h *roomKeys) Push(x any) {
	k := x.(*roomKey)
	k.index = len(*h)
	*h = append(*h, k)
}
func (h *roomKeys) Pop() any {
	old := *h
	k := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	return k
}
