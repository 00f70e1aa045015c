package chaos

import (
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestShedRoomDraws: about half the seeds add the soft shed's room zone,
// its own target /r, and on it a hog of several workers and a guest of
// one; the site writes the zone's room and soft shed.
func TestShedRoomDraws(t *testing.T) {
	t.Parallel()
	with := 0
	for seed := uint64(1); seed <= 100; seed++ {
		s := Draw(seed, Options{})
		zi := -1
		for i, z := range s.Zones {
			if z.MaxWaiting > 0 && z.SoftShed > 0 {
				zi = i
			}
		}
		if zi < 0 {
			continue
		}
		with++
		z := s.Zones[zi]
		if z.Global || z.DryRun || z.Algorithm != TokenBucket || z.MaxWaiting > 3 {
			t.Errorf("seed %d: room zone %+v", seed, *z)
		}
		site := s.Site("", "127.0.0.1:1", 0)
		if !strings.Contains(site, "max_waiting "+strconv.FormatInt(z.MaxWaiting, 10)) || !strings.Contains(site, "soft_shed "+strconv.FormatInt(z.SoftShed, 10)) {
			t.Errorf("seed %d: the site does not write zone %s's room:\n%s", seed, z.Name, site)
		}
		kinds := map[string]int{}
		for _, c := range s.Clients {
			for _, ti := range c.Targets {
				if hasZone(s.Targets[ti], zi) {
					kinds[c.Kind] = c.Workers
				}
			}
		}
		if len(kinds) != 2 || kinds[KindRoomHog] < 4 || kinds[KindRoomGuest] != 1 {
			t.Errorf("seed %d: the room zone's clients (kind: workers) %v, want the hog's 4 to 6 and the guest's 1", seed, kinds)
		}
	}
	if with < 30 || with > 70 {
		t.Errorf("%d of 100 seeds drew the room zone, want about half", with)
	}
}

// TestCheckShedRooms: a request a soft shed's room turned away fails the
// invariant unless its key had another request in flight through the same
// node (which may have held a place); another key's requests, or the
// key's at another node, do not excuse it.
func TestCheckShedRooms(t *testing.T) {
	t.Parallel()
	z := &Zone{Name: "z0", Algorithm: TokenBucket, Rate: 10, Per: time.Second, Burst: 20, Cost: 1, SoftShed: 20, SoftShedMaxDelay: time.Second, MaxWaiting: 1}
	s := &Scenario{Topology: Memory, Nodes: 2, Zones: []*Zone{z}, Targets: []*Target{{Path: "/r", Zones: []int{0}}}}
	at := time.Now()
	turned := &request{id: "t", client: &Client{}, key: "guest", node: 0, sent: at, done: at.Add(5 * time.Millisecond), status: 429,
		reason: `too many requests waiting for their turn in zone "z0"`}
	run := func(others ...*request) []Violation {
		c := &checker{s: s, o: &observed{requests: append([]*request{turned}, others...)}}
		c.checkShedRooms()
		return c.out
	}
	waiting := func(key string, node int, from, to time.Duration, status int) *request {
		return &request{id: key + from.String(), client: &Client{}, key: key, node: node, sent: at.Add(from), done: at.Add(to), status: status}
	}
	if v := run(waiting("hog", 0, -time.Second, time.Second, 200)); len(v) != 1 || v[0].Invariant != InvShedRoom {
		t.Errorf("turned away for the hog's sake: %v, want a shed_room violation", v)
	}
	if v := run(waiting("guest", 1, -time.Second, time.Second, 200)); len(v) != 1 {
		t.Errorf("its own request at another node: %v, want a violation", v)
	}
	if v := run(waiting("guest", 0, -time.Second, time.Second, 200)); len(v) != 0 {
		t.Errorf("its own request waiting at the node: %v, want none", v)
	}
	if v := run(waiting("guest", 0, -time.Second, -500*time.Millisecond, 0)); len(v) != 0 {
		t.Errorf("its own request given up on 0.5 s before: %v, want none (the node may still hold it)", v)
	}
	if v := run(waiting("guest", 0, -time.Second, -500*time.Millisecond, 200)); len(v) != 1 {
		t.Errorf("its own request answered 0.5 s before: %v, want a violation", v)
	}
	denied := *turned
	denied.reason = "rate limit exceeded"
	c := &checker{s: s, o: &observed{requests: []*request{&denied}}}
	if c.checkShedRooms(); len(c.out) != 0 {
		t.Errorf("a denial by the bucket: %v, want none", c.out)
	}
}
