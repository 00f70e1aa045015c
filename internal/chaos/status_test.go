package chaos

import (
	"strings"
	"testing"
	"time"
)

// TestStatusNamesFirstDeny checks that an on_error deny's 503 in a Redis
// fault is no violation, and that one outside any fault is reported with
// when and through which node the first came and how long it took, with
// that node's requests in its trace: seeds 320036 and 320079 said only
// "5 responses 503 on /t0 (on_error deny outside any fault)", which did
// not tell a node's first decisions after its start from a slow Redis.
func TestStatusNamesFirstDeny(t *testing.T) {
	t.Parallel()
	s := &Scenario{Topology: Single, Zones: []*Zone{{Name: "z0", OnError: "deny"}}, Targets: []*Target{{Path: "/t0", Zones: []int{0}}}}
	cl := &Client{Status: 200}
	start := time.Date(2025, 3, 30, 12, 0, 0, 0, time.UTC)
	at := func(node int, sent, took time.Duration) *request {
		return &request{client: cl, node: node, status: 503, sent: start.Add(sent), done: start.Add(sent + took)}
	}
	o := &observed{
		requests: []*request{at(0, 100*time.Millisecond, 150*time.Millisecond)},
		windows:  []window{{kind: FaultPause, start: start, end: start.Add(200 * time.Millisecond)}},
	}
	c := &checker{s: s, o: o}
	c.checkStatus()
	if len(c.out) != 0 {
		t.Fatalf("a 503 in a Redis pause: violations %v, want none", c.out)
	}

	o.requests = append(o.requests, at(1, 5*time.Second, 152*time.Millisecond), at(2, 6*time.Second, time.Millisecond))
	c.checkStatus()
	if len(c.out) != 1 {
		t.Fatalf("two 503s outside any fault: violations %v, want one", c.out)
	}
	v := c.out[0]
	for _, want := range []string{"2 responses 503 on /t0 (on_error deny outside any fault", "the first sent 12:00:05.000 through node 1, answered in 152ms", "after redis-sigstop ended"} {
		if !strings.Contains(v.Detail, want) {
			t.Errorf("violation %q, want it to say %q", v.Detail, want)
		}
	}
	if !strings.Contains(v.Trace, "12:00:05.000 /t0 node 1") || strings.Contains(v.Trace, "node 2") {
		t.Errorf("trace %q, want node 1's requests around the first 503 and no other node's", v.Trace)
	}
}
