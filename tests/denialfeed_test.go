package tests

import (
	"encoding/json"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fleetlimit/caddy-fleetlimit/internal/redistest"
	"github.com/fleetlimit/caddy-fleetlimit/observe"
)

// denialFeed is GET /rate_limit/denials.
type denialFeed struct {
	Node   string `json:"node"`
	Stores []struct {
		Name   string `json:"name"`
		Source string `json:"source"`
		Error  string `json:"error"`
	} `json:"stores"`
	Denials []struct {
		Time      time.Time `json:"time"`
		Zone      string    `json:"zone"`
		KeyDigest string    `json:"key_digest"`
		Key       string    `json:"key"`
		Method    string    `json:"method"`
		Host      string    `json:"host"`
		Path      string    `json:"path"`
		Route     string    `json:"route"`
		ClientIP  string    `json:"client_ip"`
		Node      string    `json:"node"`
		Banned    bool      `json:"banned"`
		DryRun    bool      `json:"dry_run"`
	} `json:"denials"`
}

// denials reads the node's denial feed, and its body as sent.
func (n *node) denials(query string) (denialFeed, string) {
	n.t.Helper()
	body := n.adminGet("/rate_limit/denials" + query)
	var f denialFeed
	if err := json.Unmarshal([]byte(body), &f); err != nil {
		n.t.Fatalf("denials: %v\n%s", err, body)
	}
	return f, body
}

// waitDenials polls the node's feed until cond holds, and fails the test
// with the last feed when it does not within timeout.
func (n *node) waitDenials(what, query string, timeout time.Duration, cond func(denialFeed) bool) (denialFeed, string) {
	n.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		f, body := n.denials(query)
		if cond(f) {
			return f, body
		}
		if time.Now().After(deadline) {
			n.t.Fatalf("the denial feed never showed %s within %s; it shows:\n%s", what, timeout, body)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// feedKey is the client key node i is denied on: a secret that must never
// show in the feed without log_key.
func feedKey(i int) string { return fmt.Sprintf("sk_live_feed_%d", i) }

// TestDenialFeedFleet: three nodes share one Redis and each denies its own
// client; any node's feed lists the denials of all three, each naming the
// node that made it, with the key's digest and the client's network, the
// path without its query, and never the key or the address.
func TestDenialFeedFleet(t *testing.T) {
	t.Parallel()
	r := redistest.Start(t)
	site := fmt.Sprintf(`
	rate_limit {
		key_digest_secret %s
		redis {
			address %s
			timeout 2s
		}
		zone feed {
			key {header.X-Key}
			rate 1 1h
		}
	}
	respond "ok"`, digestSecret, r.Addr)
	nodes := make([]*node, 3)
	var wg sync.WaitGroup
	for i := range nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			nodes[i] = startCaddy(t, "", site)
		}()
	}
	wg.Wait()
	ids := map[string]int{} // node id -> node index
	for i, nd := range nodes {
		// One admitted, two denied, on this node's own key.
		if got := nd.statuses(3, "/items?token=query-secret", "X-Key: "+feedKey(i)); got[200] != 1 || got[429] != 2 {
			t.Fatalf("node %d: %v, want 1 admitted and 2 denied", i+1, got)
		}
		ids[nd.stats("?series=0").Node] = i
	}
	if len(ids) != 3 {
		t.Fatalf("node ids %v: want three different ones", ids)
	}

	// The writers send once a second: poll node 1 until it lists all six.
	f, body := nodes[0].waitDenials("six denials from three nodes", "?zone=feed", 20*time.Second, func(f denialFeed) bool {
		return len(f.Denials) == 6
	})
	if len(f.Stores) != 1 || f.Stores[0].Source != "fleet" || f.Stores[0].Error != "" {
		t.Errorf("stores %+v, want the Redis store's fleet feed", f.Stores)
	}
	checkFeedNamesEachNode(t, f, ids, nodes)
	if !sort.SliceIsSorted(f.Denials, func(i, j int) bool { return f.Denials[i].Time.After(f.Denials[j].Time) }) {
		t.Errorf("not newest first:\n%s", body)
	}
	for _, secret := range []string{"sk_live_feed", `"client_ip":"127.0.0.1"`, "query-secret"} {
		if strings.Contains(body, secret) {
			t.Errorf("the feed shows %q:\n%s", secret, body)
		}
	}
	// Every node reads the same feed.
	for i, nd := range nodes[1:] {
		if f, _ := nd.denials("?zone=feed"); len(f.Denials) != 6 {
			t.Errorf("node %d lists %d denials, want 6", i+2, len(f.Denials))
		}
	}
	if one, _ := nodes[2].denials("?zone=feed&limit=1"); len(one.Denials) != 1 || one.Denials[0] != f.Denials[0] {
		t.Errorf("limit=1: %+v, want the newest, %+v", one.Denials, f.Denials[:1])
	}

	checkFeedStream(t, r)
}

// checkFeedNamesEachNode: each denial of f names a node of the fleet
// (ids maps a node id to its index in nodes), with its own key's digest
// only, the client's network and no path, and all three nodes have theirs.
func checkFeedNamesEachNode(t *testing.T, f denialFeed, ids map[string]int, nodes []*node) {
	t.Helper()
	perNode := map[string]int{}
	for _, d := range f.Denials {
		i, ok := ids[d.Node]
		if !ok {
			t.Errorf("a denial of node %q, not one of the fleet's %v", d.Node, ids)
			continue
		}
		perNode[d.Node]++
		if d.KeyDigest != keyDigest(feedKey(i)) || d.Key != "" {
			t.Errorf("node %d's denial shows key %q, digest %q; want only %q, its key's digest", i+1, d.Key, d.KeyDigest, keyDigest(feedKey(i)))
		}
		host := strings.TrimPrefix(nodes[i].URL, "http://")
		if d.Zone != "feed" || d.Method != "GET" || d.Host != host || d.Path != "" || d.Route != "" || d.ClientIP != "127.0.0.0/24" || d.Banned || d.DryRun {
			t.Errorf("node %d's denial: %+v; want zone feed (no route), GET %s (no path without log_key) from 127.0.0.0/24", i+1, d, host)
		}
		if time.Since(d.Time).Abs() > time.Minute {
			t.Errorf("denial at %s", d.Time)
		}
	}
	if len(perNode) != 3 {
		t.Errorf("denials of %d nodes (%v), want all three", len(perNode), perNode)
	}
}

// checkFeedStream: in Redis, one capped stream per zone, under the key
// prefix, with a TTL; the stream holds no key and no address either.
func checkFeedStream(t *testing.T, r *redistest.Server) {
	t.Helper()
	const stream = "rl:denials:{feed}:feed"
	if n, _ := strconv.Atoi(r.MustDo("XLEN", stream)); n != 6 {
		t.Errorf("XLEN %s = %d, want 6", stream, n)
	}
	if ttl, _ := strconv.Atoi(r.MustDo("TTL", stream)); ttl <= 0 || ttl > int(observe.DenialRetention/time.Second) {
		t.Errorf("%s has TTL %d", stream, ttl)
	}
	if raw := r.MustDo("XRANGE", stream, "-", "+"); strings.Contains(raw, "sk_live_feed") || strings.Contains(raw, "client_ip\n127.0.0.1") || strings.Contains(raw, "query-secret") {
		t.Errorf("the stream holds a key or an address:\n%s", raw)
	}
}

// TestDenialFeedLogKey: with log_key the feed shows the key and the
// client's address as they are, in Redis as on the node.
func TestDenialFeedLogKey(t *testing.T) {
	t.Parallel()
	r := redistest.Start(t)
	n := startCaddy(t, "", fmt.Sprintf(`
	rate_limit {
		key_digest_secret %s
		log_key
		redis {
			address %s
			timeout 2s
		}
		zone feed_logkey {
			key {header.X-Key}
			rate 1 1h
		}
	}
	respond "ok"`, digestSecret, r.Addr))
	if got := n.statuses(2, "/login", "X-Key: alice@example.com"); got[429] != 1 {
		t.Fatalf("%v, want a denial", got)
	}
	f, _ := n.waitDenials("the denial", "?zone=feed_logkey", 20*time.Second, func(f denialFeed) bool { return len(f.Denials) == 1 })
	d := f.Denials[0]
	if d.Key != "alice@example.com" || d.KeyDigest != keyDigest("alice@example.com") || d.ClientIP != "127.0.0.1" || d.Path != "/login" {
		t.Errorf("with log_key: %+v, want the key and the address", d)
	}
	if f.Stores[0].Source != "fleet" {
		t.Errorf("stores %+v", f.Stores)
	}
}

// TestDenialFeedMemoryStore: without Redis the node lists its own last
// denials, dry-run zones' would-be denials flagged.
func TestDenialFeedMemoryStore(t *testing.T) {
	t.Parallel()
	n := startCaddy(t, "", fmt.Sprintf(`
	rate_limit {
		key_digest_secret %s
		zone feed_memory {
			key {header.X-Key}
			rate 1 1h
			match {
				path /a/*
			}
		}
		zone feed_dry {
			key {header.X-Key}
			rate 1 1h
			dry_run
			match {
				path /dry
			}
		}
	}
	respond "ok"`, digestSecret))
	// feed_memory denies the second and third; feed_dry would have
	// denied them too, had it not been a dry run.
	if got := n.statuses(3, "/a/b?x=1", "X-Key: sk_memory_key"); got[200] != 1 || got[429] != 2 {
		t.Fatalf("%v, want 1 admitted and 2 denied", got)
	}
	if got := n.statuses(3, "/dry", "X-Key: sk_memory_key"); got[200] != 3 {
		t.Fatalf("dry run: %v, want all 3 admitted", got)
	}
	id := n.stats("?series=0").Node
	f, body := n.denials("")
	var mine, dry int
	for _, d := range f.Denials {
		switch d.Zone {
		case "feed_memory":
			mine++
			if d.DryRun || d.Node != id || d.KeyDigest != keyDigest("sk_memory_key") || d.ClientIP != "127.0.0.0/24" || d.Path != "" || !strings.Contains(d.Route, "/a/*") {
				t.Errorf("denial %+v", d)
			}
		case "feed_dry":
			dry++
			if !d.DryRun || d.Node != id || d.Path != "" || !strings.Contains(d.Route, "/dry") {
				t.Errorf("dry run %+v", d)
			}
		}
	}
	if mine != 2 || dry != 2 {
		t.Errorf("%d denials of feed_memory and %d would-be denials of feed_dry, want 2 each:\n%s", mine, dry, body)
	}
	if len(f.Stores) != 1 || f.Stores[0].Name != "memory" || f.Stores[0].Source != "node" {
		t.Errorf("stores %+v, want the memory store's own feed", f.Stores)
	}
	if strings.Contains(body, "sk_memory_key") || strings.Contains(body, `"client_ip":"127.0.0.1"`) {
		t.Errorf("the feed shows the key or the address:\n%s", body)
	}
	if z, _ := n.denials("?zone=feed_dry&limit=1"); len(z.Denials) != 1 || !z.Denials[0].DryRun {
		t.Errorf("zone=feed_dry: %+v", z.Denials)
	}
	checkTopDeniedNetwork(t, n)
}

// checkTopDeniedNetwork: the stats' top denied networks of feed_memory
// are 127.0.0.0/24, denied twice.
func checkTopDeniedNetwork(t *testing.T, n *node) {
	t.Helper()
	var s struct {
		Zones []struct {
			Name        string `json:"name"`
			TopNetworks struct {
				Networks []struct {
					Network string `json:"network"`
					Denied  uint64 `json:"denied"`
				} `json:"networks"`
			} `json:"top_networks"`
		} `json:"zones"`
	}
	if err := json.Unmarshal([]byte(n.adminGet("/rate_limit/stats?series=0")), &s); err != nil {
		t.Fatal(err)
	}
	for _, z := range s.Zones {
		if z.Name == "feed_memory" {
			if nets := z.TopNetworks.Networks; len(nets) != 1 || nets[0].Network != "127.0.0.0/24" || nets[0].Denied != 2 {
				t.Errorf("top networks %+v, want 127.0.0.0/24 denied twice", nets)
			}
			return
		}
	}
	t.Errorf("no feed_memory in the stats")
}
