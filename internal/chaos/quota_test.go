package chaos

import (
	"strings"
	"testing"
	"time"
)

// TestDrawQuota: about half the seeds give one zone a quota, never a
// concurrency zone nor one of the victim's, and the site writes it.
func TestDrawQuota(t *testing.T) {
	t.Parallel()
	with := 0
	for seed := range uint64(40) {
		s := Draw(seed, Options{})
		for zi, z := range s.Zones {
			if z.Quota == 0 {
				continue
			}
			with++
			if z.Algorithm == Concurrency || z.Quota < 20 || z.QuotaPer == "" || z.QuotaTZ == "" {
				t.Errorf("seed %d: zone %s drew %+v", seed, z.Name, *z)
			}
			if s.VictimTarget >= 0 {
				for _, vz := range s.Targets[s.VictimTarget].Zones {
					if vz == zi {
						t.Errorf("seed %d: the victim's zone %s has a quota", seed, z.Name)
					}
				}
			}
			if site := s.Site("", "127.0.0.1:1", 0); !strings.Contains(site, z.quotaLine()) {
				t.Errorf("seed %d: the site has no %q", seed, z.quotaLine())
			}
		}
	}
	if with < 10 || with > 30 {
		t.Errorf("%d of 40 seeds drew a quota, want about half", with)
	}
}

// TestCheckQuotas: the checker finds a key admitted beyond its quota, by
// the periods its requests touched and the named allowances of faults
// (quotaOutageShare).
func TestCheckQuotas(t *testing.T) {
	t.Parallel()
	berlin, _ := time.LoadLocation("Europe/Berlin")
	noon := time.Date(2025, 3, 30, 12, 0, 0, 0, berlin)
	at := func(from, to time.Duration) (time.Time, time.Time) { return noon.Add(from), noon.Add(to) }
	win := func(kind string, from, to time.Duration) window {
		start, end := at(from, to)
		return window{kind: kind, start: start, end: end}
	}
	const ms = time.Millisecond
	early := win(FaultKill, 50*ms, 150*ms)
	kill := win(FaultClientKill, 50*ms, 60*ms)
	restart, pause := win(FaultNodeKill, 20*ms, 40*ms), win(FaultPause, 50*ms, 150*ms)
	for _, c := range []struct {
		name      string
		onError   string
		start     time.Time
		n         int
		windows   []window
		violation bool
	}{
		{"5 of a quota of 5", "local", noon, 5, nil, false},
		{"6 of a quota of 5", "local", noon, 6, nil, true},
		// Across midnight in Berlin: two periods, 10.
		{"10 across midnight", "local", time.Date(2025, 3, 30, 23, 59, 59, 500e6, berlin), 10, nil, false},
		// A Redis outage after 5 requests through the 3 nodes in turn,
		// 100ms apart: every node heard a count that leaves its local
		// quota of 5/3 = 1 nothing (its share of 2, 3 or 4, rounded up):
		// no allowance.
		{"6 with an outage after the quota was spent", "local", noon, 6, []window{win(FaultPause, 450*ms, 550*ms)}, true},
		// An outage after one request: node 0 heard nothing before it
		// sent its request, the others nothing at all: 1 stale in 3
		// counts, one allowed (the local quotas could give out 3).
		{"6 with stale counts of 1", "local", noon, 6, []window{early}, false},
		{"7 with stale counts of 1", "local", noon, 7, []window{early}, true},
		// A CLIENT KILL: Redis may decide for some nodes while the
		// others count locally: what the local quotas could give out, 3.
		{"8 with local quotas of 3", "local", noon, 8, []window{kill}, false},
		{"9 with local quotas of 3", "local", noon, 9, []window{kill}, true},
		// Node 1 was killed and restarted just before Redis paused: it
		// knows no count and no fleet, and divides its local quota by 1:
		// the local quotas could give out 1 + 5 + 1, 3 beyond the quota
		// with the 1 admitted before.
		{"8 with a node restarted before the outage", "local", noon, 8, []window{restart, pause}, false},
		{"9 with a node restarted before the outage", "local", noon, 9, []window{restart, pause}, true},
		// A zone that fails closed, and a Redis restarted empty: what the
		// stalest node did not hear (1), and each node's probe (3).
		{"9 failing closed with a data loss of 1 and 3 probes", "deny", noon, 9, []window{early}, false},
		{"10 failing closed with a data loss of 1 and 3 probes", "deny", noon, 10, []window{early}, true},
	} {
		v := checkQuotasOf(t, c.onError, c.start, c.n, c.windows)
		if c.violation && (len(v) != 1 || v[0].Invariant != InvQuota) {
			t.Errorf("%s: %v, want a quota violation", c.name, v)
		}
		if !c.violation && len(v) != 0 {
			t.Errorf("%s: %v", c.name, v)
		}
	}
}

// checkQuotasOf returns what checkQuotas finds in n requests of one key,
// 100ms apart from start through 3 nodes in turn, in a zone with a quota
// of 5 a day in Berlin, with the fault windows given (each of node 1).
func checkQuotasOf(t *testing.T, onError string, start time.Time, n int, windows []window) []Violation {
	z := &Zone{Name: "z0", Algorithm: TokenBucket, Rate: 1000, Per: time.Second, Cost: 1, OnError: onError, Quota: 5, QuotaPer: "day", QuotaTZ: "Europe/Berlin"}
	cl := &Client{Kind: KindSteady, Cost: 1}
	s := &Scenario{Topology: Single, Nodes: 3, Zones: []*Zone{z}, Targets: []*Target{{Path: "/t0", Zones: []int{0}}}}
	for _, w := range windows {
		s.Faults = append(s.Faults, Fault{Kind: w.kind, Node: 1}) // a kill -9: of node 1
	}
	o := &observed{seen: map[string]seenRequest{}, windows: windows}
	for i := range n {
		at := start.Add(time.Duration(i) * 100 * time.Millisecond)
		q := &request{id: string(rune('a' + i)), client: cl, key: "k", cost: 1, node: i % 3, sent: at, done: at, status: 200}
		o.requests = append(o.requests, q)
		o.seen[q.id] = seenRequest{at: at, status: 200}
	}
	c := &checker{s: s, o: o}
	if figures := c.checkQuotas(); len(figures) != 1 {
		t.Errorf("figures %q, want one key's", figures)
	}
	return c.out
}

func TestPeriodsTouched(t *testing.T) {
	t.Parallel()
	berlin, _ := time.LoadLocation("Europe/Berlin")
	if n := periodsTouched(time.Date(2025, 1, 31, 12, 0, 0, 0, berlin), time.Date(2025, 3, 1, 0, 0, 0, 0, berlin), "month", berlin); n != 3 {
		t.Errorf("31 January to 1 March touches %d months, want 3", n)
	}
}
