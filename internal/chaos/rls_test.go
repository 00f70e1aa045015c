package chaos

import (
	"strings"
	"testing"
	"time"
)

// TestRLSCallsCountInTheBound: the RLS client's calls answered OK spend
// the bucket of the zone they name beside the HTTP requests of the same
// key, at their hits; calls answered OVER_LIMIT spend nothing. The
// requests alone stay within the bound; with the calls they exceed it.
func TestRLSCallsCountInTheBound(t *testing.T) {
	t.Parallel()
	z := &Zone{Name: "z0", Algorithm: TokenBucket, Rate: 10, Per: time.Second, Burst: 10, Cost: 1, OnError: "local", Reserve: 20}
	s := &Scenario{Topology: Memory, Nodes: 1, Zones: []*Zone{z}, Targets: []*Target{{Path: "/t0", Zones: []int{0}}},
		RLS: &RLSLoad{Zones: []int{0}, Key: "k", Hits: 2, Workers: 1}}
	start := time.Date(2025, 3, 30, 12, 0, 0, 0, time.UTC)
	o := &observed{seen: map[string]seenRequest{}}
	// 6 requests of k in 0.5 s: within burst + rate x 0.5 = 15, and
	// within the reserve's bound (8 + 5) too.
	for i := range 6 {
		at := start.Add(time.Duration(i) * 100 * time.Millisecond)
		q := &request{id: string(rune('a' + i)), client: &Client{Cost: 1, Reserve: 20}, key: "k", cost: 1, sent: at, done: at, status: 200}
		o.requests = append(o.requests, q)
		o.seen[q.id] = seenRequest{at: at, status: 200}
	}
	c := &checker{s: s, o: o}
	if n := c.checkBounds(); n != 1 || len(c.out) != 0 {
		t.Fatalf("the requests alone: %d buckets checked, violations %v; want 1 and none", n, c.out)
	}
	// 4 calls answered OK (8 tokens) and many answered OVER_LIMIT: 14
	// tokens, within 15, the bound without the reserve (a call keeps
	// none).
	for i := range 20 {
		at := start.Add(time.Duration(i) * 25 * time.Millisecond)
		q := &request{id: "rls-" + string(rune('a'+i)), client: rlsClient(s.RLS), key: "k", cost: 2, sent: at, done: at, status: 429, rls: true}
		if i < 4 {
			q.status = 200
		}
		o.rlsCalls = append(o.rlsCalls, q)
	}
	c = &checker{s: s, o: o}
	if c.checkBounds(); len(c.out) != 0 || c.tightest.Tokens != 14 {
		t.Fatalf("with the calls: tightest %+v, violations %v; want 14 tokens and none", c.tightest, c.out)
	}
	// One more call answered OK: 16 tokens, above 15.
	o.rlsCalls[4].status = 200
	c = &checker{s: s, o: o}
	c.checkBounds()
	if len(c.out) != 1 || c.out[0].Invariant != InvBound || !strings.Contains(c.out[0].Detail, "admitted 16 tokens") {
		t.Fatalf("with a fifth call admitted: violations %v, want the bound's with 16 tokens", c.out)
	}
}

// TestRLSCallsAnswered: an RLS call that failed is a violation, but while
// its node was killed.
func TestRLSCallsAnswered(t *testing.T) {
	t.Parallel()
	s := &Scenario{Zones: []*Zone{{Name: "z0"}}, RLS: &RLSLoad{Zones: []int{0}, Key: "k", Hits: 1, Workers: 1}}
	start := time.Date(2025, 3, 30, 12, 0, 0, 0, time.UTC)
	down := &request{id: "rls-0", sent: start.Add(100 * time.Millisecond), done: start.Add(200 * time.Millisecond), err: "unavailable", rls: true}
	o := &observed{rlsCalls: []*request{down}, windows: []window{{kind: FaultNodeKill, start: start, end: start.Add(150 * time.Millisecond)}}}
	c := &checker{s: s, o: o}
	c.checkRLS()
	if len(c.out) != 0 {
		t.Fatalf("a call failed while its node was down: %v, want no violation", c.out)
	}
	late := &request{id: "rls-1", sent: start.Add(5 * time.Second), done: start.Add(5 * time.Second), err: "unavailable", rls: true}
	o.rlsCalls = append(o.rlsCalls, late)
	c = &checker{s: s, o: o}
	c.checkRLS()
	if len(c.out) != 1 || c.out[0].Invariant != InvRLS {
		t.Fatalf("a call failed outside any fault: %v, want an rls violation", c.out)
	}
}

// TestDrawRLS: some seeds draw an RLS client, on the key of a steady
// client and zones of its targets that the service can spend, and the
// rules name those zones.
func TestDrawRLS(t *testing.T) {
	t.Parallel()
	with := 0
	for seed := uint64(1); seed <= 40; seed++ {
		s := Draw(seed, Options{})
		if s.RLS == nil {
			continue
		}
		with++
		steady := false
		for _, c := range s.Clients {
			if c.Kind == KindSteady && c.Key == s.RLS.Key {
				steady = true
			}
		}
		if !steady {
			t.Errorf("seed %d: the RLS key %q is no steady client's", seed, s.RLS.Key)
		}
		rules := s.rlsRules()
		for _, zi := range s.RLS.Zones {
			if !s.rlsShareable(zi) {
				t.Errorf("seed %d: zone %s is not one the service can spend", seed, s.Zones[zi].Name)
			}
			if !strings.Contains(rules, "zone: "+s.Zones[zi].Name+"\n") {
				t.Errorf("seed %d: the rules do not name zone %s:\n%s", seed, s.Zones[zi].Name, rules)
			}
		}
	}
	if with == 0 || with == 40 {
		t.Errorf("%d of 40 seeds draw an RLS client, want some", with)
	}
}
