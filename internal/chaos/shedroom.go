package chaos

import (
	"fmt"
	"math/rand/v2"
	"net/http"
	"strings"
	"time"
)

// The soft shed's waiting room: in half the scenarios a zone of its own, a
// hog that fills its rooms and a guest; every request a room turned away
// must have had another of its key in flight at that node (docs/design.md,
// "The soft shed's waiting room").

// The kinds of the clients of the soft shed's room.
const (
	KindRoomHog   = "roomhog"   // several workers, as fast as answers come
	KindRoomGuest = "roomguest" // one request at a time, as fast as answers come
)

// InvShedRoom names the invariant: no key within its burst is turned away
// by another key's waiting in a soft shed's room.
const InvShedRoom = "shed_room"

// roomHoldMargin is how long after its client gave up on a request (no
// answer) the node may still hold the request's place in a room: until it
// notices the client left.
const roomHoldMargin = time.Second

// drawShedRoom adds, from its own stream, in half the
// scenarios, the soft shed's room zone, its target and its two clients.
func (s *Scenario) drawShedRoom(r *rand.Rand) {
	if r.IntN(2) == 0 {
		return
	}
	z := &Zone{Name: fmt.Sprintf("z%d", len(s.Zones)), Algorithm: TokenBucket, OnError: "local",
		Rate: 5 + r.Int64N(16), Per: time.Second, Burst: 20 + r.Int64N(40), Cost: 1,
		SoftShed: 10 + r.Int64N(40), SoftShedMaxDelay: pick(r, 500*time.Millisecond, time.Second, 2*time.Second),
		MaxWaiting: 1 + r.Int64N(3)}
	s.Zones = append(s.Zones, z)
	s.Targets = append(s.Targets, &Target{Path: "/r", Zones: []int{len(s.Zones) - 1}})
	ti, tag, tier := len(s.Targets)-1, fmt.Sprintf("%x", s.Seed%0xfff), pick(r, "gold", "default", "none")
	s.Clients = append(s.Clients,
		&Client{ID: len(s.Clients), Kind: KindRoomHog, Key: "hog-" + tag, Tier: tier, Cost: 1, Status: 200, Workers: 4 + r.IntN(3), Targets: []int{ti}},
		&Client{ID: len(s.Clients) + 1, Kind: KindRoomGuest, Key: "guest-" + tag, Tier: tier, Cost: 1, Status: 200, Workers: 1, Targets: []int{ti}})
}

// roomZone returns the zone whose waiting room turned request q away, ""
// when none did: a 429 whose error names a full room (the zone had
// admitted the request, so no denier is named).
func roomZone(q *request) string {
	if q.status != http.StatusTooManyRequests || !strings.Contains(q.reason, "waiting") {
		return ""
	}
	_, rest, ok := strings.Cut(q.reason, `zone "`)
	if !ok {
		return q.denier
	}
	name, _, _ := strings.Cut(rest, `"`)
	return name
}

// checkShedRooms checks that no request a soft-shedding zone's room turned
// away belonged to a key that held no place in that node's room: one with
// no other request in flight at that node (a request its client gave up
// on counted roomHoldMargin longer). Faults excuse none: a room is the
// node's, and whatever holds the others' places longer, the key held none.
func (c *checker) checkShedRooms() {
	zones := map[string]*Zone{}
	for _, z := range c.s.Zones {
		if z.SoftShed > 0 && !z.Global && !z.DryRun {
			zones[z.Name] = z
		}
	}
	if len(zones) == 0 {
		return
	}
	type keyNode struct {
		key  string
		node int
	}
	byKeyNode := map[keyNode][]*request{}
	for _, q := range c.o.requests {
		k := keyNode{bucketKey(q.key), q.node}
		byKeyNode[k] = append(byKeyNode[k], q)
	}
	var turned, alone int
	var first *request
	defer func() {
		if turned > 0 {
			c.figures = append(c.figures, fmt.Sprintf("soft shed rooms turned away %d requests, %d of them of a key that held no place", turned, alone))
		}
	}()
	for _, q := range c.o.requests {
		z := zones[roomZone(q)]
		if z == nil {
			continue
		}
		turned++
		if heldPlace(q, byKeyNode[keyNode{bucketKey(q.key), q.node}]) {
			continue
		}
		alone++
		if first == nil {
			first = q
		}
	}
	if first != nil {
		c.failAt(InvShedRoom, first.sent, ofKey(first.key),
			"%d of %d requests that soft shed rooms turned away belonged to a key within its burst with no other request at that node (its fair part of the room unused); first: key %s on %s through node %d at %s: %q",
			alone, turned, printable(first.key), c.s.Targets[first.target].Path, first.node, first.sent.Format("15:04:05.000"), first.reason)
	}
}

// heldPlace reports whether another of same (the requests of q's key
// through q's node) was in flight while q was, and so may have held a
// place in the room.
func heldPlace(q *request, same []*request) bool {
	for _, p := range same {
		if p == q {
			continue
		}
		end := p.done
		if p.status == 0 {
			end = end.Add(roomHoldMargin)
		}
		if !p.sent.After(q.done) && !end.Before(q.sent) {
			return true
		}
	}
	return false
}
