package tests

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fleetlimit/caddy-fleetlimit/internal/redistest"
)

// banList is GET /rate_limit/bans.
type banList struct {
	Stores []struct {
		Name   string `json:"name"`
		Source string `json:"source"`
		Error  string `json:"error"`
	} `json:"stores"`
	Bans []banEntry `json:"bans"`
}

// banEntry is a ban as the admin API shows it.
type banEntry struct {
	Zone        string    `json:"zone"`
	Store       string    `json:"store"`
	KeyDigest   string    `json:"key_digest"`
	Key         string    `json:"key"`
	Start       time.Time `json:"start"`
	End         time.Time `json:"end"`
	SecondsLeft int64     `json:"seconds_left"`
	Denials     int64     `json:"denials"`
}

// adminDo sends a request to the node's admin endpoint and returns the
// status and the body.
func (n *node) adminDo(method, path string) (int, string) {
	n.t.Helper()
	req, err := http.NewRequest(method, "http://"+n.Admin+path, nil)
	if err != nil {
		n.t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		n.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// waitBans polls the node's bans until cond holds, and fails the test with
// the last list when it does not within 10 s.
func (n *node) waitBans(what string, cond func(banList) bool) (banList, string) {
	n.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		body := n.adminGet("/rate_limit/bans")
		var l banList
		if err := json.Unmarshal([]byte(body), &l); err != nil {
			n.t.Fatalf("bans: %v\n%s", err, body)
		}
		if cond(l) {
			return l, body
		}
		if time.Now().After(deadline) {
			n.t.Fatalf("the bans never showed %s; they show:\n%s", what, body)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// storeCalls is how many decisions the node sent to its store so far.
func (n *node) storeCalls() float64 {
	n.t.Helper()
	v, _ := metric(n.scrape(), "caddy_rate_limit_store_duration_seconds_count")
	return v
}

// banned reports whether a response is the 429 of a banned key (the site
// answers its errors with their message).
func banned(r response) bool {
	return r.Status == 429 && strings.Contains(r.Body, "key banned")
}

// banKey sends requests of key to path on n until one is answered banned,
// and returns how many were denied before it, and when the banning request
// was sent and answered.
func banKey(t *testing.T, n *node, path, key string) (denied int, sent, answered time.Time) {
	t.Helper()
	for range 500 {
		sent = time.Now()
		r := n.get(path, "X-Key: "+key)
		switch {
		case banned(r):
			return denied, sent, time.Now()
		case r.Status == 429:
			denied++
		case r.Status != 200:
			t.Fatalf("%s: %d %s", path, r.Status, r.Body)
		}
	}
	t.Fatalf("%s was never banned on %s", key, path)
	return
}

const banSite = `
	rate_limit {
		key_digest_secret %s
		redis {
			address %s
			timeout 2s
		}
		zone short {
			key {header.X-Key}
			rate 100 1s
			burst 2
			ban 3s after 5 in 1m
			match {
				path /short
			}
		}
		zone long {
			key {header.X-Key}
			rate 100 1s
			burst 2
			ban 1h after 5 in 1m
			match {
				path /long
			}
		}
	}
	handle_errors 429 {
		respond "{http.error.message}" 429
	}
	respond "ok"`

// TestBanFleet: three nodes share one Redis. A key denied five times is
// banned for the whole fleet: every node answers it 429 with a Retry-After
// of the ban's time left until the ban ends, from its deny cache (Redis
// hears of the key about once per node), and 200 after. The admin API of
// any node lists the ban with its key's digest only; DELETE on one node
// lifts another ban at once on every node.
func TestBanFleet(t *testing.T) {
	t.Parallel()
	r := redistest.Start(t)
	nodes := startBanFleet(t, r)

	// Five denials ban the key: the fifth answers "banned". (A zone with
	// a ban keeps no bucket in the deny cache: every denial reaches Redis,
	// and counts.)
	const key = "sk_live_mallory"
	denied, sent, answered := banKey(t, nodes[0], "/short", key)
	if denied != 4 {
		t.Errorf("%d plain denials before the ban, want 4 (the fifth bans)", denied)
	}

	// Any node lists it, with the key's digest and never the key.
	l, body := nodes[1].waitBans("the short ban", func(l banList) bool { return len(l.Bans) == 1 })
	b := l.Bans[0]
	if b.Zone != "short" || b.KeyDigest != keyDigest(key) || b.Key != "" || strings.Contains(body, key) ||
		b.Denials != 5 || b.End.Sub(b.Start) != 3*time.Second || b.SecondsLeft < 1 || b.SecondsLeft > 3 ||
		len(l.Stores) != 1 || l.Stores[0].Source != "fleet" || b.Store != "redis:"+r.Addr {
		t.Errorf("the ban listed: %s\nwant zone short, %s's digest %s only, 5 denials, 3s", body, key, keyDigest(key))
	}

	checkBanFromDenyCache(t, r, nodes, key, sent)

	// After the ban: the bucket has long refilled, every node admits.
	time.Sleep(time.Until(answered.Add(3*time.Second + 300*time.Millisecond)))
	for i, n := range nodes {
		if resp := n.get("/short", "X-Key: "+key); resp.Status != 200 {
			t.Errorf("node %d after the ban: %d %q, want 200", i+1, resp.Status, resp.Body)
		}
		time.Sleep(20 * time.Millisecond) // two tokens back: the burst is 2
	}
	nodes[2].waitBans("no ban once it ended", func(l banList) bool { return len(l.Bans) == 0 })

	checkBanLiftedOnEveryNode(t, r, nodes)
}

// startBanFleet starts three nodes of banSite on r, and waits until each
// node's store listens on the ban channel.
func startBanFleet(t *testing.T, r *redistest.Server) []*node {
	t.Helper()
	site := fmt.Sprintf(banSite, digestSecret, r.Addr)
	nodes := make([]*node, 3)
	var wg sync.WaitGroup
	for i := range nodes {
		wg.Go(func() { nodes[i] = startCaddy(t, "", site) })
	}
	wg.Wait()
	deadline := time.Now().Add(10 * time.Second)
	for r.MustDo("PUBSUB", "NUMSUB", "rl:bans") != "rl:bans\n3" {
		if time.Now().After(deadline) {
			t.Fatalf("PUBSUB NUMSUB rl:bans = %q, want 3 subscribers", r.MustDo("PUBSUB", "NUMSUB", "rl:bans"))
		}
		time.Sleep(50 * time.Millisecond)
	}
	return nodes
}

// checkBanFromDenyCache: until the ban of key (sent at sent) ends, every
// node answers 429 and the ban's time left, and asks Redis about once to
// learn the ban.
func checkBanFromDenyCache(t *testing.T, r *redistest.Server, nodes []*node, key string, sent time.Time) {
	t.Helper()
	var calls [3]float64
	for i, n := range nodes {
		calls[i] = n.storeCalls()
	}
	scripts := scriptCalls(t, r)
	requests := 0
	for time.Since(sent) < 3*time.Second-500*time.Millisecond {
		for i, n := range nodes {
			resp := n.get("/short", "X-Key: "+key)
			retry, err := strconv.Atoi(resp.Header.Get("Retry-After"))
			if !banned(resp) || err != nil || retry < 1 || retry > 3 {
				t.Fatalf("node %d, %s into the ban: %d %q, Retry-After %q; want 429 banned, 1 to 3 s",
					i+1, time.Since(sent).Round(time.Millisecond), resp.Status, resp.Body, resp.Header.Get("Retry-After"))
			}
			// The fields tell the same: nothing is back before the ban ends.
			if reset := resp.Header.Get("X-RateLimit-Reset"); reset != strconv.Itoa(retry) {
				t.Fatalf("node %d: X-RateLimit-Reset %q with Retry-After %d; want the ban's rest in both", i+1, reset, retry)
			}
			requests++
		}
		time.Sleep(20 * time.Millisecond)
	}
	scripts = scriptCalls(t, r) - scripts
	var during [3]float64
	for i, n := range nodes {
		during[i] = n.storeCalls() - calls[i]
		if during[i] > 2 {
			t.Errorf("node %d asked Redis %v times during the ban, want at most 2 (once to learn it)", i+1, during[i])
		}
	}
	t.Logf("Redis calls during a ban: %d banned requests on 3 nodes in %s: store calls per node %v, EVALSHA in Redis %d",
		requests, (3*time.Second - 500*time.Millisecond), during, scripts)
	if scripts > 6 {
		t.Errorf("%d script calls in Redis during the ban, want at most 6", scripts)
	}
}

// checkBanLiftedOnEveryNode: a ban of an hour, lifted by its digest on
// node 1: no node answers it banned any more, and its keys are gone from
// Redis.
func checkBanLiftedOnEveryNode(t *testing.T, r *redistest.Server, nodes []*node) {
	t.Helper()
	const eve = "sk_live_eve"
	banKey(t, nodes[1], "/long", eve)
	for i, n := range nodes {
		if resp := n.get("/long", "X-Key: "+eve); !banned(resp) {
			t.Fatalf("node %d: %d %q, want banned", i+1, resp.Status, resp.Body)
		}
	}
	nodes[2].waitBans("the long ban", func(l banList) bool { return len(l.Bans) == 1 && l.Bans[0].Zone == "long" })
	if st, body := nodes[0].adminDo(http.MethodDelete, "/rate_limit/bans/long/nobody"); st != 404 {
		t.Errorf("DELETE of a key not banned: %d %s, want 404", st, body)
	}
	st, body := nodes[0].adminDo(http.MethodDelete, "/rate_limit/bans/long/"+keyDigest(eve))
	if st != 200 || !strings.Contains(body, `"key_digest":"`+keyDigest(eve)+`"`) || strings.Contains(body, eve) || strings.Contains(body, `"error"`) {
		t.Fatalf("DELETE: %d %s", st, body)
	}
	lifted := time.Now()
	for _, k := range []string{"rl:long:{" + eve + "}!ban", "rl:long:{" + eve + "}!den"} {
		if got := r.MustDo("EXISTS", k); got != "0" {
			t.Errorf("EXISTS %s = %s after the DELETE, want 0", k, got)
		}
	}
	// The lifting node forgot the ban before it answered; the others as
	// the channel's message arrives, a moment later. (The bucket may not
	// have refilled yet, if all this took less than 20 ms: a plain denial
	// is no ban.)
	if resp := nodes[0].get("/long", "X-Key: "+eve); banned(resp) {
		t.Errorf("node 1 right after the DELETE: %d %q, want no ban", resp.Status, resp.Body)
	}
	time.Sleep(300 * time.Millisecond)
	for i, n := range nodes[1:] {
		if resp := n.get("/long", "X-Key: "+eve); resp.Status != 200 {
			t.Errorf("node %d %s after the DELETE: %d %q, want 200", i+2, time.Since(lifted).Round(time.Millisecond), resp.Status, resp.Body)
		}
		time.Sleep(20 * time.Millisecond) // two tokens back: the burst is 2
	}
	nodes[1].waitBans("no ban once lifted", func(l banList) bool { return len(l.Bans) == 0 })
	if st, body := nodes[2].adminDo(http.MethodDelete, "/rate_limit/bans/long/"+keyDigest(eve)); st != 404 {
		t.Errorf("a second DELETE: %d %s, want 404", st, body)
	}
}
