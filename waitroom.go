package fleetlimit

import (
	"container/heap"
	"errors"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/fleetlimit/caddy-fleetlimit/limiter"
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

// A request's wait: a leaky bucket zone holds an admitted request for its
// turn, and a token bucket zone with soft_shed for the delay the limiter
// computed in the decision (limiter.Result.Delay), each in the zone's
// waitRoom.

// shedOnlyCounted reports whether a zone's delay is a dry run's soft shed:
// counted (as the delay it would ask), never waited for.
func shedOnlyCounted(d *zoneDecision) bool {
	return d.zone.SoftShed > 0 && d.req.Rule.DryRun()
}

// hdrDelay reports how long a leaky bucket held the request, in
// milliseconds.
const hdrDelay = "X-Ratelimit-Delay"

// errClientGone ends a request whose client left while it waited for its
// turn in a leaky bucket, or for a soft shed's delay.
var errClientGone = errors.New("client went away while waiting for its turn")

// delayOf returns the decision of the zone (a leaky bucket, or a token
// bucket that sheds softly) that delays an admitted request longest; nil
// when none delays it.
func delayOf(ds []zoneDecision) *zoneDecision {
	var longest *zoneDecision
	for i := range ds {
		if ds[i].zone.room != nil && !shedOnlyCounted(&ds[i]) && ds[i].res.Delay > 0 &&
			(longest == nil || ds[i].res.Delay > longest.res.Delay) {
			longest = &ds[i]
		}
	}
	return longest
}

// turnOf returns how long the leaky bucket zones of an admitted request
// delay it: the longest wait no waiting room cuts short.
func turnOf(ds []zoneDecision) time.Duration {
	var turn time.Duration
	for i := range ds {
		if ds[i].req.Rule.Algorithm() == limiter.LeakyBucket {
			turn = max(turn, ds[i].res.Delay)
		}
	}
	return turn
}

// wait holds an admitted request in its place for its turn when a leaky
// bucket zone delayed it (or for its delay, when a zone sheds softly), and
// releases it early if the client goes away: it keeps its charge, unless a
// count_status zone does not count its 499 (see ServeHTTP). When the room
// takes its place back for another key, a soft shed's delay ends there,
// and the request waits only for its leaky buckets' turn, if any.
func (h *Handler) wait(w http.ResponseWriter, r *http.Request, ds []zoneDecision, place *roomPlace) error {
	d := delayOf(ds)
	if d == nil {
		return nil
	}
	delay := d.res.Delay
	w.Header()[hdrDelay] = []string{delayMillis(delay)}
	if ce := h.logger.Check(zap.DebugLevel, "rate limit delayed request"); ce != nil {
		ce.Write(zap.String("zone", d.zone.Name), zap.Duration("delay", delay))
	}
	start := time.Now()
	t := time.NewTimer(delay)
	defer t.Stop()
	cut := place.cut
	for {
		select {
		case <-t.C:
			return nil
		case <-cut:
			waited := time.Since(start)
			turn := turnOf(ds)
			if ce := h.logger.Check(zap.DebugLevel, "rate limit delay cut short for another key's place"); ce != nil {
				ce.Write(zap.String("zone", d.zone.Name), zap.Duration("waited", waited), zap.Duration("turn", turn))
			}
			if waited >= turn {
				// A cut that lost the race with the timer by a few
				// scheduling ticks waited past the delay: the request was
				// told the delay, at most max_delay.
				w.Header()[hdrDelay] = []string{delayMillis(min(waited, delay))}
				return nil
			}
			w.Header()[hdrDelay] = []string{delayMillis(turn)}
			t.Reset(turn - waited)
			cut = nil
		case <-r.Context().Done():
			return caddyhttp.Error(499, errClientGone)
		}
	}
}

// delayMillis is a delay in X-RateLimit-Delay: whole milliseconds, rounded
// up.
func delayMillis(d time.Duration) string {
	return strconv.FormatInt(int64((d+time.Millisecond-1)/time.Millisecond), 10)
}
