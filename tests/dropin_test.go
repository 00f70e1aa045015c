package tests

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// loadJSON replaces the node's configuration with a JSON one through the
// admin API (POST /load), as a user of caddy-ratelimit's JSON config does.
// handlers is the JSON of the server's routes; the server keeps the node's
// port and admin endpoint, and trusts X-Forwarded-For from loopback, so
// that tests can send requests from several client IPs.
func (n *node) loadJSON(routes string) {
	n.t.Helper()
	cfg := fmt.Sprintf(`{
	"admin": {"listen": %q, "config": {"persist": false}},
	"apps": {"http": {"servers": {"dropin": {
		"listen": ["127.0.0.1:%d"],
		"automatic_https": {"disable": true},
		"trusted_proxies": {"source": "static", "ranges": ["127.0.0.0/8"]},
		"client_ip_headers": ["X-Forwarded-For"],
		"routes": %s
	}}}}
}`, n.Admin, n.Port, routes)
	if !json.Valid([]byte(cfg)) {
		n.t.Fatalf("invalid JSON config:\n%s", cfg)
	}
	resp, err := http.Post("http://"+n.Admin+"/load", "application/json", strings.NewReader(cfg))
	if err != nil {
		n.t.Fatalf("POST /load: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		n.t.Fatalf("POST /load: %d %s\ncaddy output:\n%s", resp.StatusCode, body, n.log.String())
	}
}

// startJSON starts a node and loads the JSON routes into it.
func startJSON(t *testing.T, routes string) *node {
	t.Helper()
	n := startCaddy(t, "", `respond "starting"`)
	n.loadJSON(routes)
	return n
}

// TestDropinJSON runs mholt/caddy-ratelimit's JSON handler config
// unchanged: max_events per window and then 429 with Retry-After, per key,
// a zone limited by its matchers, and admission again once the window has
// moved on.
func TestDropinJSON(t *testing.T) {
	t.Parallel()
	n := startJSON(t, `[{"handle": [
		{
			"handler": "rate_limit",
			"rate_limits": {
				"api": {"key": "{http.request.header.X-Key}", "window": "2s", "max_events": 3},
				"writes": {"match": [{"method": ["POST"]}], "key": "static", "window": 60000000000, "max_events": 1}
			},
			"distributed": {"write_interval": "5s", "read_interval": "5s"},
			"sweep_interval": "1m"
		},
		{"handler": "static_response", "body": "I'm behind the rate limiter!"}
	]}]`)
	if got := n.statuses(3, "/", "X-Key: a"); got[200] != 3 {
		t.Fatalf("max_events 3: the first three got %v", got)
	}
	r := n.get("/", "X-Key: a")
	retry, _ := strconv.Atoi(r.Header.Get("Retry-After"))
	if r.Status != 429 || retry < 1 || retry > 2 {
		t.Fatalf("the fourth in the window: %d Retry-After %q, want 429 and 1 to 2", r.Status, r.Header.Get("Retry-After"))
	}
	if p := r.Header.Get("RateLimit-Policy"); !strings.Contains(p, `"api";q=3;w=2`) {
		t.Errorf("RateLimit-Policy %q does not carry the api zone's 3 per 2s", p)
	}
	if r := n.get("/", "X-Key: b"); r.Status != 200 {
		t.Errorf("another key: %d, want 200", r.Status)
	}
	// The writes zone applies to POST only, one for everyone a minute.
	if r := n.do(http.MethodPost, "/", "X-Key: c"); r.Status != 200 {
		t.Errorf("first POST: %d, want 200", r.Status)
	}
	r = n.do(http.MethodPost, "/", "X-Key: d")
	retry, _ = strconv.Atoi(r.Header.Get("Retry-After"))
	if r.Status != 429 || retry < 59 || retry > 60 {
		t.Errorf("second POST (static key): %d Retry-After %q, want 429 and 59 to 60", r.Status, r.Header.Get("Retry-After"))
	}
	time.Sleep(2100 * time.Millisecond)
	if r := n.get("/", "X-Key: a"); r.Status != 200 {
		t.Errorf("after the window: %d, want 200", r.Status)
	}
	waitLog(t, n, "'distributed' block of caddy-ratelimit is accepted and ignored")
	if !strings.Contains(n.log.String(), "'distributed' block of caddy-ratelimit is accepted and ignored") {
		t.Errorf("no warning about the distributed block:\n%s", n.log.String())
	}
}

// TestDropinSharedBucket: a caddy-ratelimit zone without a key is one
// bucket for all clients, as it was in that plugin; a fleetlimit zone
// without a key is one bucket per client IP.
func TestDropinSharedBucket(t *testing.T) {
	t.Parallel()
	n := startJSON(t, `[
		{"match": [{"path": ["/shared"]}], "handle": [
			{"handler": "rate_limit", "log_denials": "debug", "rate_limits": {"shared": {"window": "1m", "max_events": 2}}},
			{"handler": "static_response", "body": "ok"}
		]},
		{"match": [{"path": ["/perip"]}], "handle": [
			{"handler": "rate_limit", "zones": [{"name": "perip", "rate": 2, "per": 60000000000}]},
			{"handler": "static_response", "body": "ok"}
		]}
	]`)
	ip1, ip2 := "X-Forwarded-For: 192.0.2.1", "X-Forwarded-For: 198.51.100.2"
	for i, c := range []struct {
		header string
		want   int
	}{{ip1, 200}, {ip2, 200}, {ip1, 429}, {ip2, 429}} {
		if r := n.get("/shared", c.header); r.Status != c.want {
			t.Errorf("/shared request %d (%s): %d, want %d (one bucket of 2 for all)", i+1, c.header, r.Status, c.want)
		}
	}
	for _, ip := range []string{ip1, ip2} {
		if got := n.statuses(3, "/perip", ip); got[200] != 2 || got[429] != 1 {
			t.Errorf("/perip from %s: %v, want 2 admitted and 1 denied (a bucket per client IP)", ip, got)
		}
	}
}

// TestDropinLogDenials: with log_denials info, a thousand denials of one
// key in about a second make a line per second with caddy-ratelimit's
// fields, so fail2ban-style filters match without the log flooding; with
// off, none. The jitter of caddy-ratelimit's reading is warned about once.
func TestDropinLogDenials(t *testing.T) {
	t.Parallel()
	routes := func(level string) string {
		return `[{"handle": [
			{"handler": "rate_limit", "log_denials": "` + level + `", "jitter": 20,
			 "rate_limits": {"login": {"key": "{http.request.header.X-Key}", "window": "1m", "max_events": 1}}},
			{"handler": "static_response", "body": "ok"}
		]}]`
	}
	n := startJSON(t, routes("info"))
	// Caddy's output reaches the test through a pipe, a little after the
	// fact: wait for the line, then count.
	waitLog(t, n, "caddy-ratelimit read it as up to 20 times the wait")
	if c := strings.Count(n.log.String(), "caddy-ratelimit read it as up to 20 times the wait"); c != 1 {
		t.Errorf("%d jitter warnings for one load, want 1:\n%s", c, n.log.String())
	}
	if r := n.get("/", "X-Key: k"); r.Status != 200 {
		t.Fatalf("first request: %d", r.Status)
	}
	start := time.Now()
	n.flood(1000, "X-Key: k")
	elapsed := time.Since(start)
	waitLog(t, n, `"msg":"rate limit exceeded"`)
	settleLog(n)
	lines := deniedLines(t, n.log.String())
	if max := int(elapsed/time.Second) + 2; len(lines) < 1 || len(lines) > max {
		t.Fatalf("1000 denials in %v: %d info lines, want 1 to %d", elapsed, len(lines), max)
	}
	for _, l := range lines {
		for _, f := range []string{"zone", "wait", "remote_ip", "key_digest", "cost", "retry_after"} {
			if _, ok := l[f]; !ok {
				t.Errorf("line without %q: %v", f, l)
			}
		}
		if l["level"] != "info" || l["zone"] != "login" || l["remote_ip"] != "127.0.0.1" {
			t.Errorf("line %v", l)
		}
	}

	n.loadJSON(routes("off"))
	settleLog(n)
	before := len(deniedLines(t, n.log.String()))
	n.flood(200, "X-Key: k")
	settleLog(n)
	if after := len(deniedLines(t, n.log.String())); after != before {
		t.Errorf("log_denials off: %d new lines", after-before)
	}
}

// flood sends count GET requests from 8 workers and fails the test on any
// status but 429.
func (n *node) flood(count int, headers ...string) {
	n.t.Helper()
	var wg sync.WaitGroup
	var mu sync.Mutex
	got := map[int]int{}
	per := count / 8
	for w := range 8 {
		k := per
		if w == 7 {
			k = count - 7*per
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range k {
				r, err := n.Do(http.MethodGet, "/", headers...)
				mu.Lock()
				if err != nil {
					got[-1]++
				} else {
					got[r.Status]++
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if got[429] != count {
		n.t.Fatalf("flood of %d: %v, want all 429", count, got)
	}
}

// deniedLines returns the JSON log lines of denials in Caddy's output.
func deniedLines(t *testing.T, log string) []map[string]any {
	t.Helper()
	return logLines(t, log, "rate limit exceeded")
}

// logLines returns the JSON log lines whose message is msg in Caddy's
// output. It fails the test on such a line that is not JSON.
func logLines(t *testing.T, log, msg string) []map[string]any {
	t.Helper()
	quoted, _ := json.Marshal(msg)
	var lines []map[string]any
	sc := bufio.NewScanner(strings.NewReader(log))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		b := sc.Bytes()
		if !bytes.Contains(b, quoted) {
			continue
		}
		var l map[string]any
		if err := json.Unmarshal(b, &l); err != nil {
			t.Fatalf("log line is not JSON: %s", b)
		}
		if l["msg"] == msg {
			lines = append(lines, l)
		}
	}
	return lines
}
