package fleetlimit

import (
	"strconv"
	"sync"
	"testing"
)

// isCut reports whether the room took p back.
func isCut(p *roomPlace) bool {
	select {
	case <-p.cut:
		return true
	default:
		return false
	}
}

// fill enters n requests of key, all of which must get a place.
func fill(t *testing.T, w *waitRoom, key string, n int) []*roomPlace {
	t.Helper()
	var ps []*roomPlace
	for i := range n {
		p := w.enter(key)
		if p == nil {
			t.Fatalf("request %d of key %q turned away", i+1, key)
		}
		ps = append(ps, p)
	}
	return ps
}

// TestWaitRoomTakesBackFairShare: a lone key may use the whole room; a
// second key takes places back from it, the oldest first, until each
// holds its fair part (3 of 6), and a key at its fair part is turned away.
func TestWaitRoomTakesBackFairShare(t *testing.T) {
	t.Parallel()
	w := newWaitRoom(6, true)
	a := fill(t, w, "a", 6)
	if w.enter("a") != nil {
		t.Fatal("a key holding the whole room got a seventh place")
	}
	b := fill(t, w, "b", 3)
	for i, p := range a {
		if want := i < 3; isCut(p) != want {
			t.Errorf("key a's place %d cut short: %v, want %v (the oldest go first)", i+1, isCut(p), want)
		}
	}
	if w.enter("b") != nil || w.enter("a") != nil {
		t.Error("a key holding its fair part (3 of 6, two keys) got another place in a full room")
	}
	if waiting, away := w.counts(); waiting != 6 || away != 3 {
		t.Errorf("counts: %d waiting, %d turned away; want 6 and 3", waiting, away)
	}
	// Places cut short are gone already; leaving them changes nothing.
	for _, p := range a {
		p.leave()
	}
	if waiting, _ := w.counts(); waiting != 3 || len(w.keys) != 1 || w.keys["b"].held != 3 {
		t.Errorf("after key a left: %d waiting, keys %v; want key b's 3", waiting, w.keys)
	}
	for _, p := range b {
		if isCut(p) {
			t.Error("a place of key b was cut short")
		}
		p.leave()
	}
	if waiting, _ := w.counts(); waiting != 0 || len(w.keys) != 0 || len(w.byHeld) != 0 {
		t.Errorf("an empty room: %d waiting, %d keys remembered", waiting, len(w.keys))
	}
}

// TestWaitRoomKeyFlood: with more keys than places, each new key takes a
// place back from one holding one: none is turned away, and the room
// never holds more than its places nor remembers more keys.
func TestWaitRoomKeyFlood(t *testing.T) {
	t.Parallel()
	w := newWaitRoom(3, true)
	var live []*roomPlace
	for i := range 1000 {
		p := w.enter("k" + strconv.Itoa(i))
		if p == nil {
			t.Fatalf("key %d, holding nothing, turned away", i)
		}
		live = append(live, p)
		if waiting, _ := w.counts(); waiting > 3 || len(w.keys) > 3 || len(w.byHeld) != len(w.keys) {
			t.Fatalf("after key %d: %d waiting, %d keys remembered; want at most 3", i, waiting, len(w.keys))
		}
	}
	cut := 0
	for _, p := range live {
		if isCut(p) {
			cut++
		}
		p.leave()
	}
	if cut != 997 {
		t.Errorf("%d places cut short, want 997 (all but the last three)", cut)
	}
	if waiting, _ := w.counts(); waiting != 0 || len(w.keys) != 0 {
		t.Errorf("an empty room: %d waiting, %d keys remembered", waiting, len(w.keys))
	}
}

// TestWaitRoomLeakyNeverTakesBack: a leaky bucket's room passes no request
// before its turn: a full room turns every request away, whatever its key.
func TestWaitRoomLeakyNeverTakesBack(t *testing.T) {
	t.Parallel()
	w := newWaitRoom(2, false)
	a := fill(t, w, "a", 2)
	if w.enter("b") != nil || w.enter("a") != nil {
		t.Fatal("a full leaky bucket room gave a place")
	}
	if isCut(a[0]) || isCut(a[1]) {
		t.Fatal("a leaky bucket room cut a wait short")
	}
	a[0].leave()
	p := w.enter("b")
	if p == nil {
		t.Fatal("a free place refused")
	}
	if waiting, away := w.counts(); waiting != 2 || away != 2 {
		t.Errorf("counts: %d waiting, %d turned away; want 2 and 2", waiting, away)
	}
}

// TestWaitRoomConcurrent: requests of a few keys entering and leaving at
// once leave the room empty, and it never holds more than its places.
func TestWaitRoomConcurrent(t *testing.T) {
	t.Parallel()
	w := newWaitRoom(4, true)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 2000 {
				p := w.enter("k" + strconv.Itoa((g+i)%5))
				if waiting, _ := w.counts(); waiting > 4 {
					t.Errorf("%d waiting in a room of 4", waiting)
					return
				}
				if p != nil {
					p.leave()
				}
			}
		})
	}
	wg.Wait()
	if waiting, _ := w.counts(); waiting != 0 || len(w.keys) != 0 || len(w.byHeld) != 0 {
		t.Errorf("after all left: %d waiting, %d keys remembered", waiting, len(w.keys))
	}
}
