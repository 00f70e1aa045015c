package tests

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fleetlimit/caddy-fleetlimit/internal/redistest"
)

// keyLookup is GET /rate_limit/keys/<zone>/<key>.
type keyLookup struct {
	Zone   string `json:"zone"`
	Note   string `json:"note"`
	Stores []struct {
		Name   string `json:"name"`
		Source string `json:"source"`
		Error  string `json:"error"`
	} `json:"stores"`
	Keys []struct {
		Store       string `json:"store"`
		KeyDigest   string `json:"key_digest"`
		Key         string `json:"key"`
		Zone        string `json:"zone"`
		Alternative int    `json:"alternative"`
		Error       string `json:"error"`
		Ban         *struct {
			Until       time.Time `json:"until"`
			SecondsLeft int64     `json:"seconds_left"`
		} `json:"ban"`
		DenialsTowardsBan int64 `json:"denials_towards_ban"`
		LastRule          *struct {
			Tier string `json:"tier"`
			Rate int64  `json:"rate"`
		} `json:"last_rule"`
		Rules []struct {
			Tier         string    `json:"tier"`
			Algorithm    string    `json:"algorithm"`
			Rate         int64     `json:"rate"`
			Burst        int64     `json:"burst"`
			Remaining    int64     `json:"remaining"`
			Full         bool      `json:"full"`
			ResetSeconds int64     `json:"reset_seconds"`
			Reset        time.Time `json:"reset"`
			SlotsHeld    *int64    `json:"slots_held"`
			Quota        *struct {
				Used  int64 `json:"used"`
				Limit int64 `json:"limit"`
			} `json:"quota"`
		} `json:"rules"`
	} `json:"keys"`
}

// keyReset is DELETE /rate_limit/keys/<zone>/<key>.
type keyReset struct {
	Reset []struct {
		Store       string `json:"store"`
		KeyDigest   string `json:"key_digest"`
		Alternative int    `json:"alternative"`
		Buckets     int    `json:"buckets"`
	} `json:"reset"`
	Note  string `json:"note"`
	Error string `json:"error"`
}

// lookUp asks n's admin API for key in zone (escaped into the path).
func (n *node) lookUp(zone, key string) (keyLookup, string) {
	n.t.Helper()
	st, body := n.adminDo(http.MethodGet, "/rate_limit/keys/"+zone+"/"+url.PathEscape(key))
	if st != 200 {
		n.t.Fatalf("GET keys/%s: %d %s", zone, st, body)
	}
	var l keyLookup
	if err := json.Unmarshal([]byte(body), &l); err != nil {
		n.t.Fatalf("GET keys/%s: %v\n%s", zone, err, body)
	}
	return l, body
}

// resetKeyOn asks n's admin API to reset key in zone.
func (n *node) resetKeyOn(zone, key string) (keyReset, string) {
	n.t.Helper()
	st, body := n.adminDo(http.MethodDelete, "/rate_limit/keys/"+zone+"/"+url.PathEscape(key))
	if st != 200 {
		n.t.Fatalf("DELETE keys/%s: %d %s", zone, st, body)
	}
	var r keyReset
	if err := json.Unmarshal([]byte(body), &r); err != nil {
		n.t.Fatalf("DELETE keys/%s: %v\n%s", zone, err, body)
	}
	return r, body
}

// keySite is a zone of 5 tokens an hour per X-Key, on the store redis
// ("" for the memory store), whose errors answer their message.
const keySite = `
	rate_limit {
		key_digest_secret %s
		%s
		zone api {
			key {header.X-Key}
			rate 1 1h
			burst 5
		}
	}
	handle_errors 429 {
		respond "{http.error.message}" 429
	}
	respond "ok"`

// drainEverywhere sends key's requests round the nodes until every node
// answers 429.
func drainEverywhere(t *testing.T, nodes []*node, key string) {
	t.Helper()
	for range 40 {
		denied := 0
		for _, n := range nodes {
			if n.get("/x", "X-Key: "+key).Status == 429 {
				denied++
			}
		}
		if denied == len(nodes) {
			return
		}
	}
	t.Fatalf("%s was never denied on all %d nodes", key, len(nodes))
}

// TestKeyResetFleet: three nodes share one Redis (single, Cluster,
// Sentinel). A key drained to 429 on all three reads 0 remaining on each;
// a DELETE through one node lets the key through on all three at once (the
// reset's latency to each node is logged: from the DELETE's answer until
// the node admits the key), the lookup reads the bucket refilled, a key
// not reset stays denied, and a key named by its digest is reset too.
func TestKeyResetFleet(t *testing.T) {
	t.Parallel()
	topologies := []struct {
		name  string
		redis func(t *testing.T) string
	}{
		{"single", func(t *testing.T) string { return redisBlock(redistest.Start(t)) }},
		{"cluster", func(t *testing.T) string {
			c := redistest.StartCluster(t, 3)
			return fmt.Sprintf("redis {\n\t\t\taddress %s\n\t\t\ttimeout 2s\n\t\t}", strings.Join(c.Addrs(), " "))
		}},
		{"sentinel", func(t *testing.T) string {
			s := redistest.StartSentinel(t)
			return fmt.Sprintf("redis {\n\t\t\tsentinel %s %s\n\t\t\ttimeout 2s\n\t\t}", s.MasterName(), strings.Join(s.SentinelAddrs(), " "))
		}},
	}
	for _, topo := range topologies {
		t.Run(topo.name, func(t *testing.T) {
			fleet := startFleet(t, 3, fmt.Sprintf(keySite, digestSecret, topo.redis(t)))
			nodes := make([]*node, len(fleet))
			for i, n := range fleet {
				nodes[i] = &node{Node: n, t: t, log: n.Log}
			}
			resetThroughOneNode(t, nodes)
		})
	}
}

// resetThroughOneNode is TestKeyResetFleet on one fleet.
func resetThroughOneNode(t *testing.T, nodes []*node) {
	drainEverywhere(t, nodes, "cust-1")
	drainEverywhere(t, nodes, "cust-other")
	for i, n := range nodes {
		l, body := n.lookUp("api", "cust-1")
		if len(l.Keys) != 1 || len(l.Keys[0].Rules) != 1 {
			t.Fatalf("node %d: lookup of cust-1: want one key with one rule:\n%s", i, body)
		}
		r := l.Keys[0].Rules[0]
		if r.Remaining != 0 || r.Full || r.ResetSeconds < 3000 || l.Keys[0].KeyDigest != keyDigest("cust-1") || l.Stores[0].Source != "fleet" {
			t.Errorf("node %d: drained cust-1 reads %+v (digest %s); want 0 remaining, full in about 5h, by the fleet:\n%s", i, r, l.Keys[0].KeyDigest, body)
		}
	}

	res, body := nodes[0].resetKeyOn("api", "cust-1")
	answered := time.Now()
	if len(res.Reset) != 1 || res.Reset[0].Buckets != 1 || res.Error != "" {
		t.Fatalf("DELETE keys/api/cust-1: want one bucket reset:\n%s", body)
	}
	// Every node polls at once, in a bounded loop, until it admits the
	// key: an admission spends a token, three of the five.
	latency := make([]time.Duration, len(nodes))
	var wg sync.WaitGroup
	for i, n := range nodes {
		wg.Go(func() {
			for end := answered.Add(2 * time.Second); ; {
				r, err := n.Do(http.MethodGet, "/x", "X-Key: cust-1")
				if err == nil && r.Status == 200 {
					latency[i] = time.Since(answered)
					return
				}
				if time.Now().After(end) {
					latency[i] = -1
					return
				}
				time.Sleep(2 * time.Millisecond)
			}
		})
	}
	wg.Wait()
	t.Logf("reset latency (DELETE answered to the node's first admission): node 0 (reset through it) %v, node 1 %v, node 2 %v", latency[0], latency[1], latency[2])
	for i, d := range latency {
		if d < 0 {
			t.Errorf("node %d still denies cust-1 2 s after the reset", i)
		}
	}
	for i, n := range nodes {
		l, body := n.lookUp("api", "cust-1")
		if r := l.Keys[0].Rules[0]; r.Remaining != 2 {
			t.Errorf("node %d: after the reset and three admissions cust-1 reads %d remaining, want 2:\n%s", i, r.Remaining, body)
		}
		if got := n.get("/x", "X-Key: cust-other").Status; got != 429 {
			t.Errorf("node %d: cust-other, not reset, answers %d, want 429", i, got)
		}
	}

	// By its digest, which node 1 saw denied.
	drainEverywhere(t, nodes, "cust-2")
	res, body = nodes[1].resetKeyOn("api", keyDigest("cust-2"))
	if len(res.Reset) != 1 || res.Reset[0].KeyDigest != keyDigest("cust-2") || res.Reset[0].Alternative != 0 || res.Reset[0].Buckets != 1 {
		t.Fatalf("DELETE keys/api/<digest of cust-2>: want cust-2's bucket reset:\n%s", body)
	}
	for i, n := range nodes {
		ok := false
		for range 100 {
			if ok = n.get("/x", "X-Key: cust-2").Status == 200; ok {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		if !ok {
			t.Errorf("node %d: cust-2, reset by its digest, is still denied 2 s later", i)
		}
	}
}

// keyMemorySite has, on the memory store, a zone of two key alternatives
// with a ban and log_key, a zone whose rate comes from a header (tiers),
// and a zone of a rate and a monthly quota.
const keyMemorySite = `
	rate_limit {
		key_digest_secret %s
		log_key
		zone api {
			key {header.X-Key} {header.X-User}
			rate 1 1h
			burst 3
			ban 1h after 5 in 1m
		}
		zone tiered {
			key {header.X-Key} {header.X-User}
			rate {header.X-Rate} 1h
		}
		zone plan {
			key {header.X-Key}
			rate 100 1h
			quota 1000 per month tz Europe/Berlin
		}
	}
	handle_errors 429 {
		respond "{http.error.message}" 429
	}
	respond "ok"`

// TestKeyLookupMemory: on the memory store a lookup reads a drained key
// (escaped in the path, a value with a slash and a space) under each key
// alternative, counts its denials towards a ban, names each tier and the
// tier that applied last; a reset refills it; the errors: an unknown zone
// (404), a bad method (405), no key (400).
func TestKeyLookupMemory(t *testing.T) {
	t.Parallel()
	n := startCaddy(t, "", fmt.Sprintf(keyMemorySite, digestSecret))
	const key = "team a/b"
	got := n.statuses(5, "/x", "X-Key: "+key, "X-Rate: 100")
	if got[200] != 3 || got[429] != 2 {
		t.Fatalf("5 requests of a burst of 3: %v", got)
	}
	n.get("/x", "X-Key: "+key, "X-Rate: 50") // a second tier, the last to apply; api denies it
	l, body := n.lookUp("api", key)
	if len(l.Keys) != 2 || l.Keys[0].Alternative != 1 || l.Keys[1].Alternative != 2 {
		t.Fatalf("lookup of a raw key in a zone of two alternatives: want it under each:\n%s", body)
	}
	first := l.Keys[0]
	if first.Key == "" || !strings.HasPrefix(first.Key, "#") || first.Rules[0].Remaining != 0 || first.DenialsTowardsBan != 3 || first.Ban != nil {
		t.Errorf("the drained key (hashed: it holds a space) reads %+v; want 0 remaining, 3 denials towards its ban, no ban:\n%s", first, body)
	}
	if l.Stores[0].Source != "node" || first.LastRule == nil || first.LastRule.Rate != 1 {
		t.Errorf("want the node's store and the zone's rule as the last applied:\n%s", body)
	}
	if second := l.Keys[1]; second.Rules[0].Remaining != 3 || !second.Rules[0].Full {
		t.Errorf("the second alternative's bucket of the same value is its own, full:\n%s", body)
	}

	tl, body := n.lookUp("tiered", key)
	tiers := tl.Keys[0].Rules
	if len(tiers) != 2 || tiers[0].Rate != 50 || tiers[1].Rate != 100 || tiers[1].Tier == "" || tiers[1].Remaining != 97 {
		t.Errorf("the tiered zone: want its two tiers, by rate, the bucket read under each (97 left under 100 an hour):\n%s", body)
	}
	if lr := tl.Keys[0].LastRule; lr == nil || lr.Rate != 50 || lr.Tier == "" {
		t.Errorf("the tiered zone's last rule: want the tier of rate 50, the last request's:\n%s", body)
	}

	// A zone's quota is shown beside it: what the key used this month.
	pl, body := n.lookUp("plan", key)
	if len(pl.Keys) != 2 || pl.Keys[1].Zone != "plan.quota" || pl.Keys[1].Rules[0].Quota == nil ||
		pl.Keys[1].Rules[0].Quota.Used != 3 || pl.Keys[1].Rules[0].Quota.Limit != 1000 || pl.Keys[0].Rules[0].Remaining != 97 {
		t.Errorf("the plan zone: want its rate (97 left) and its quota (3 of 1000 used):\n%s", body)
	}

	res, body := n.resetKeyOn("api", key)
	if len(res.Reset) != 2 || res.Reset[0].Buckets != 1 || res.Reset[1].Buckets != 0 {
		t.Errorf("DELETE: want the first alternative's bucket reset, the second full already:\n%s", body)
	}
	l, body = n.lookUp("api", key)
	if r := l.Keys[0].Rules[0]; r.Remaining != 3 || !r.Full || r.ResetSeconds != 0 {
		t.Errorf("after the reset: want a full bucket:\n%s", body)
	}
	if got := n.get("/x", "X-Key: "+key, "X-Rate: 100").Status; got != 200 {
		t.Errorf("the reset key answers %d", got)
	}

	for _, c := range []struct {
		method, path string
		status       int
		says         string
	}{
		{http.MethodGet, "/rate_limit/keys/nozone/k", 404, `no zone \"nozone\"`},
		{http.MethodDelete, "/rate_limit/keys/nozone/k", 404, `no zone \"nozone\"`},
		{http.MethodPost, "/rate_limit/keys/api/k", 405, "method not allowed"},
		{http.MethodGet, "/rate_limit/keys/api", 400, "name the key"},
		{http.MethodGet, "/rate_limit/keys?zone=api", 400, "name the key"},
	} {
		st, body := n.adminDo(c.method, c.path)
		if st != c.status || !strings.Contains(body, c.says) {
			t.Errorf("%s %s: %d %s, want %d saying %q", c.method, c.path, st, body, c.status, c.says)
		}
	}
	if strings.Contains(n.log.String(), key) {
		t.Errorf("the raw key is in the log:\n%s", n.log.String())
	}
}

// send sends a request with body to url and returns the status and the
// response body.
func (n *node) send(method, url, body string) (int, string) {
	n.t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		n.t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		n.t.Fatalf("%s %.100s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// adminSend sends a request with body to n's admin endpoint.
func (n *node) adminSend(method, path, body string) (int, string) {
	n.t.Helper()
	return n.send(method, "http://"+n.Admin+path, body)
}

// longKeySite keys a zone of 3 requests an hour on the Authorization
// header, on the store redis ("" for the memory store), and serves its
// dashboard under /ops/.
const longKeySite = `
	rate_limit {
		key_digest_secret %s
		%s
		zone api {
			key {header.Authorization}
			rate 1 1h
			burst 3
			match {
				path /x
			}
		}
	}
	handle /ops/* {
		rate_limit_dashboard
	}
	respond "ok"`

// TestKeyLookupLongKey: a zone keyed on {header.Authorization} (the docs'
// example) takes keys of any length a request can carry: a JWT of about
// 900 bytes, and one of 16,000 bytes with spaces and percent signs (near
// Caddy's default max_header_size, 16 KiB). Each is drained through Caddy,
// then looked up by its value, in the path (escaped), the query and a
// POST's body, on the admin endpoint and through the site's dashboard
// (the body: the form its lookup box sends): every form finds the drained
// bucket (0 remaining), as the zone hashed the key. A DELETE by the value
// (in the path, or as the body) resets it, and the key is admitted again.
// A body over 1 MiB is refused; the site's header limit refuses the long
// key in a query.
func TestKeyLookupLongKey(t *testing.T) {
	t.Parallel()
	stores(t, func(t *testing.T, redisBlock string) {
		n := startCaddy(t, "", fmt.Sprintf(longKeySite, digestSecret, redisBlock))
		jwt := "Bearer " + strings.Repeat("eyJzdWIiOiIxMjM0NTY3ODkwIiwicm9sZSI6ImFkbWluIn0", 18) + ".sig-_" // 900 bytes
		huge := strings.Repeat("a% b/c", 16_000/6+1)[:16_000]                                               // ends in "b": a header loses trailing spaces
		for _, c := range []struct {
			name, key   string
			resetAsBody bool
		}{{"a JWT", jwt, false}, {"16,000 bytes", huge, true}} {
			got := n.statuses(4, "/x", "Authorization: "+c.key)
			if got[200] != 3 || got[429] != 1 {
				t.Fatalf("%s: 4 requests of a burst of 3: %v", c.name, got)
			}
			lookups := map[string]func() (int, string){
				"path": func() (int, string) { return n.adminDo(http.MethodGet, "/rate_limit/keys/api/"+url.PathEscape(c.key)) },
				"query": func() (int, string) {
					return n.adminDo(http.MethodGet, "/rate_limit/keys?zone=api&key="+url.QueryEscape(c.key))
				},
				"body": func() (int, string) { return n.adminSend(http.MethodPost, "/rate_limit/keys/api", c.key) },
				"dashboard's body": func() (int, string) {
					return n.send(http.MethodPost, n.URL+"/ops/keys?zone=api", c.key)
				},
			}
			for _, form := range []string{"path", "query", "body", "dashboard's body"} {
				st, body := lookups[form]()
				var l keyLookup
				if st != 200 || json.Unmarshal([]byte(body), &l) != nil {
					t.Fatalf("%s: lookup in the %s: %d %.300s", c.name, form, st, body)
				}
				if len(l.Keys) != 1 || len(l.Keys[0].Rules) != 1 || l.Keys[0].Rules[0].Remaining != 0 || l.Keys[0].Rules[0].Full {
					t.Errorf("%s: lookup in the %s: want the drained bucket, 0 remaining:\n%s", c.name, form, body)
				}
			}
			reset := func() (int, string) {
				return n.adminDo(http.MethodDelete, "/rate_limit/keys/api/"+url.PathEscape(c.key))
			}
			if c.resetAsBody {
				reset = func() (int, string) { return n.adminSend(http.MethodDelete, "/rate_limit/keys/api", c.key) }
			}
			st, body := reset()
			var res keyReset
			if st != 200 || json.Unmarshal([]byte(body), &res) != nil || len(res.Reset) != 1 || res.Reset[0].Buckets != 1 {
				t.Fatalf("%s: reset: %d, want the drained bucket reset:\n%.300s", c.name, st, body)
			}
			if got := n.get("/x", "Authorization: "+c.key).Status; got != 200 {
				t.Errorf("%s: after the reset the key answers %d", c.name, got)
			}
		}
		if st, body := n.adminSend(http.MethodPost, "/rate_limit/keys/api", strings.Repeat("k", 1<<20+1)); st != http.StatusRequestEntityTooLarge {
			t.Errorf("a key of 1 MiB and a byte in the body: %d %s, want 413", st, body)
		}
		if r := n.get("/ops/keys?zone=api&key=" + url.QueryEscape(huge)); r.Status != http.StatusRequestHeaderFieldsTooLarge {
			t.Errorf("the 16,000-byte key escaped into the site's query: %d, want 431 (why the lookup box sends the body)", r.Status)
		}
		if strings.Contains(n.log.String(), jwt[:100]) {
			t.Errorf("the raw key is in the log:\n%s", n.log.String())
		}
	})
}
