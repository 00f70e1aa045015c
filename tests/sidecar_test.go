package tests

import (
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fleetlimit/caddy-fleetlimit/internal/localfleet"
	"github.com/fleetlimit/caddy-fleetlimit/internal/redistest"
)

// The sidecar tests run the recipes of docs/sidecar.md: Caddy as the rate
// limiter of nginx (auth_request) and as a JSON decision service. Their
// configurations are the page's, with smaller limits (so that a denial
// comes after a few requests) and the test's ports.

// requireNginx returns the nginx binary, and skips the test without one,
// or fails it in CI (CI set), where .ci/run installs nginx.
func requireNginx(t *testing.T) string {
	t.Helper()
	bin := localfleet.NginxBinary()
	if bin == "" {
		if os.Getenv("CI") != "" {
			t.Fatal("nginx is required by this test and is not installed (.ci/run installs it: apt-get install nginx)")
		}
		t.Skip("nginx is not installed (apt-get install nginx); CI is not set, so this test is skipped")
	}
	return bin
}

// sidecarNginxSite is the decision site that nginx asks, as in
// docs/sidecar.md: per_client allows 5 a minute (one token every 12 s)
// per API key, else per client address; login 2 a minute per address on
// /login. Denials become 403, the only refusal auth_request passes on.
func sidecarNginxSite(redis string) string {
	return fmt.Sprintf(`
	rate_limit {
		%s
		zone per_client {
			key {header.X-API-Key} {header.X-Real-IP}
			rate 5 1m
		}
		zone login {
			key {header.X-Real-IP}
			rate 2 1m
			match {
				path /login
			}
		}
	}
	respond 200

	handle_errors 429 {
		respond 403
	}`, redis)
}

// sidecarNginxConf is nginx's part, as in docs/sidecar.md, in front of
// the upstream app, asking the decision nodes. Beyond the page: the
// readiness location, the Host header (localfleet's nodes serve the site
// as host 127.0.0.1, where the page's site has no host name), and /open/,
// which fails open as the page shows.
func sidecarNginxConf(port int, nodes []*localfleet.Node, app string) string {
	var servers strings.Builder
	for _, n := range nodes {
		fmt.Fprintf(&servers, "\t\tserver 127.0.0.1:%d;\n", n.Port)
	}
	return fmt.Sprintf(`
	upstream fleetlimit {
%s		keepalive 8;
	}
	upstream app {
		server %s;
	}

	server {
		listen 127.0.0.1:%d;

		auth_request_set $fleetlimit_retry_after $upstream_http_retry_after;
		auth_request_set $fleetlimit_ratelimit $upstream_http_ratelimit;
		auth_request_set $fleetlimit_policy $upstream_http_ratelimit_policy;
		auth_request_set $fleetlimit_limit $upstream_http_x_ratelimit_limit;
		auth_request_set $fleetlimit_remaining $upstream_http_x_ratelimit_remaining;
		auth_request_set $fleetlimit_reset $upstream_http_x_ratelimit_reset;
		add_header Retry-After $fleetlimit_retry_after always;
		add_header RateLimit $fleetlimit_ratelimit always;
		add_header RateLimit-Policy $fleetlimit_policy always;
		add_header X-RateLimit-Limit $fleetlimit_limit always;
		add_header X-RateLimit-Remaining $fleetlimit_remaining always;
		add_header X-RateLimit-Reset $fleetlimit_reset always;

		location / {
			auth_request /_fleetlimit;
			error_page 403 = @fleetlimit_denied;
			proxy_pass http://app;
		}
		location /login {
			auth_request /_fleetlimit_login;
			error_page 403 = @fleetlimit_denied;
			proxy_pass http://app;
		}
		location /open/ {
			auth_request /_fleetlimit;
			error_page 403 = @fleetlimit_denied;
			error_page 500 = @app;
			proxy_pass http://app;
		}
		location @app {
			proxy_pass http://app;
		}

		location = /_fleetlimit {
			internal;
			proxy_pass http://fleetlimit/;
			include fleetlimit_params;
		}
		location = /_fleetlimit_login {
			internal;
			proxy_pass http://fleetlimit/login;
			include fleetlimit_params;
		}
		location @fleetlimit_denied {
			default_type application/json;
			return 429 '{"error":"too many requests"}\n';
		}

		location = /nginx-ready {
			return 204;
		}
	}`, servers.String(), app, port)
}

// sidecarNginxParams is the page's fleetlimit_params: what every
// decision subrequest sends.
const sidecarNginxParams = `proxy_pass_request_body off;
proxy_set_header Content-Length "";
proxy_set_header X-Real-IP $remote_addr;
proxy_set_header X-Original-URI $request_uri;
proxy_set_header X-Original-Method $request_method;
proxy_http_version 1.1;
proxy_set_header Connection "";
proxy_next_upstream error;
proxy_connect_timeout 1s;
proxy_read_timeout 5s;
# The test's nodes serve the host 127.0.0.1.
proxy_set_header Host 127.0.0.1;
`

// upstreamCounter is the app behind nginx: it counts the requests it got
// per path and API key, and answers 403 on /forbidden and 500 on
// /open/fail (the app's own errors, which nginx must pass unchanged).
type upstreamCounter struct {
	mu   sync.Mutex
	seen map[string]int
}

func (u *upstreamCounter) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	u.mu.Lock()
	u.seen[r.URL.Path+" "+r.Header.Get("X-API-Key")]++
	u.mu.Unlock()
	switch r.URL.Path {
	case "/forbidden":
		http.Error(w, "the app says no", http.StatusForbidden)
		return
	case "/open/fail":
		http.Error(w, "the app failed", http.StatusInternalServerError)
		return
	}
	fmt.Fprintf(w, "app: %s\n", r.URL.Path)
}

func (u *upstreamCounter) count(path, key string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.seen[path+" "+key]
}

// retryAfterRange is the Retry-After that a denial may carry when the
// bucket, full at the first decision, needs wait from it until it can
// admit the denied request: whole seconds, rounded up, of wait less the
// time between the two decisions, which lies between the two requests'
// round trips (first sent to denial answered, first answered to denial
// sent). A millisecond of slack on the late side for the store's units.
func retryAfterRange(wait time.Duration, firstSent, firstDone, sent, done time.Time) (lo, hi int64) {
	ceil := func(d time.Duration) int64 { return int64(math.Ceil(d.Seconds())) }
	return ceil(wait - done.Sub(firstSent)), ceil(wait - sent.Sub(firstDone) + time.Millisecond)
}

// TestSidecarNginx puts a real nginx in front of an app, asking two Caddy
// decision nodes that share one Redis (round robin, so decisions
// alternate nodes) through auth_request: one API key is admitted exactly
// 5 times (its burst), then answered 429 with a Retry-After that follows
// from the rate, and the rate limit fields reach the client on 200 and
// 429; the app sees exactly the admitted requests. Per-route zones follow
// nginx's locations, the client cannot choose its address, the app's own
// 403 passes unchanged, and with no decision node left nginx fails
// closed (500), or open where configured.
func TestSidecarNginx(t *testing.T) {
	t.Parallel()
	sc := startNginxSidecar(t)
	sc.checkBurstThenDenied(t)

	// Another key has its own bucket.
	if resp := sc.get(t, "/api/items", "X-API-Key: sidecar-k2"); resp.Status != 200 || resp.Header.Get("X-RateLimit-Remaining") != "4" {
		t.Errorf("sidecar-k2: %d, remaining %q; want 200 and 4", resp.Status, resp.Header.Get("X-RateLimit-Remaining"))
	}
	sc.admitted++

	// Without an API key the bucket is the client's address as nginx saw
	// it: an X-Real-IP the client sends changes nothing.
	for i, spoof := range []string{"203.0.113.7", "203.0.113.8"} {
		resp := sc.get(t, "/api/items", "X-Real-IP: "+spoof)
		if resp.Status != 200 || resp.Header.Get("X-RateLimit-Remaining") != strconv.Itoa(4-i) {
			t.Errorf("X-Real-IP %s: %d, remaining %q; want 200 and %d (one bucket for 127.0.0.1)", spoof, resp.Status, resp.Header.Get("X-RateLimit-Remaining"), 4-i)
		}
		sc.admitted++
	}

	sc.checkLoginZone(t)

	// The app's own 403 reaches the client as it is.
	if resp := sc.get(t, "/forbidden", "X-API-Key: sidecar-k3"); resp.Status != 403 || resp.Body != "the app says no\n" || resp.Header.Get("Retry-After") != "" || resp.Header.Get("X-RateLimit-Remaining") != "4" {
		t.Errorf("the app's 403: %d, Retry-After %q, remaining %q; want 403 as the app sent it, with the fields", resp.Status, resp.Header.Get("Retry-After"), resp.Header.Get("X-RateLimit-Remaining"))
	}
	sc.admitted++
	// ... and so does its 500 where nginx fails open.
	if resp := sc.get(t, "/open/fail", "X-API-Key: sidecar-k3"); resp.Status != 500 || resp.Body != "the app failed\n" {
		t.Errorf("the app's 500 on /open/: %d %q, want the app's 500", resp.Status, resp.Body)
	}
	sc.admitted++

	sc.checkDecisionsOnBothNodes(t)

	// No decision node left: nginx answers 500 (fails closed), and
	// /open/ passes the request to the app (fails open).
	for _, n := range sc.nodes {
		n.Stop()
	}
	if resp := sc.get(t, "/api/items", "X-API-Key: sidecar-k4"); resp.Status != 500 {
		t.Errorf("with no decision node: %d, want 500", resp.Status)
	}
	if resp := sc.get(t, "/open/x", "X-API-Key: sidecar-k4"); resp.Status != 200 || resp.Body != "app: /open/x\n" {
		t.Errorf("with no decision node, /open/: %d %q, want the app's 200", resp.Status, resp.Body)
	}
	if n := sc.up.count("/api/items", "sidecar-k4"); n != 0 {
		t.Errorf("the app got %d requests that no node decided, want 0", n)
	}
}

// nginxSidecar is nginx in front of an app, asking two Caddy decision
// nodes on one Redis, and how many requests per_client admitted so far.
type nginxSidecar struct {
	ng       *localfleet.Nginx
	up       *upstreamCounter
	nodes    []*localfleet.Node
	admitted int // requests that per_client admitted
}

// startNginxSidecar starts the app, the decision nodes and nginx; when
// the test fails, it logs their output.
func startNginxSidecar(t *testing.T) *nginxSidecar {
	t.Helper()
	bin := requireNginx(t)
	r := redistest.Start(t)
	up := &upstreamCounter{seen: map[string]int{}}
	app := httptest.NewServer(up)
	t.Cleanup(app.Close)
	nodes := startFleet(t, 2, sidecarNginxSite(redisBlock(r)))
	port := redistest.FreePort(t)
	conf := sidecarNginxConf(port, nodes, strings.TrimPrefix(app.URL, "http://"))
	ng := localfleet.StartNginx(t, bin, port, conf, "/nginx-ready", localfleet.NginxFile{Name: "fleetlimit_params", Text: sidecarNginxParams})
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("nginx output:\n%s", ng.Log.String())
			for i, n := range nodes {
				t.Logf("caddy node %d output:\n%s", i+1, n.Log.String())
			}
		}
	})
	return &nginxSidecar{ng: ng, up: up, nodes: nodes}
}

// get sends a GET through nginx.
func (sc *nginxSidecar) get(t *testing.T, path string, headers ...string) localfleet.Response {
	t.Helper()
	resp, err := sc.ng.Get(path, headers...)
	if err != nil {
		t.Fatalf("GET %s through nginx: %v", path, err)
	}
	return resp
}

// checkBurstThenDenied: one API key gets its burst of 5 with the fields,
// then nginx's 429s with a Retry-After that follows from the rate; the
// app sees the 5.
func (sc *nginxSidecar) checkBurstThenDenied(t *testing.T) {
	t.Helper()
	const key = "X-API-Key: sidecar-k1"
	var firstSent, firstDone time.Time
	for i := range 5 {
		sent := time.Now()
		resp := sc.get(t, "/api/items", key)
		if i == 0 {
			firstSent, firstDone = sent, time.Now()
		}
		if resp.Status != 200 || resp.Body != "app: /api/items\n" {
			t.Fatalf("request %d: %d %q, want 200 from the app", i+1, resp.Status, resp.Body)
		}
		sc.admitted++
		h := resp.Header
		wantFields(t, fmt.Sprintf("200 #%d", i+1), h, map[string]string{
			"RateLimit-Policy":      `"per_client";q=5;w=60`,
			"X-RateLimit-Limit":     "5",
			"X-RateLimit-Remaining": strconv.Itoa(4 - i),
			"Retry-After":           "",
		})
		if rl := h.Get("RateLimit"); !strings.HasPrefix(rl, fmt.Sprintf(`"per_client";r=%d;t=`, 4-i)) {
			t.Errorf("200 #%d: RateLimit %q, want r=%d", i+1, rl, 4-i)
		}
		if reset, err := strconv.Atoi(h.Get("X-RateLimit-Reset")); err != nil || reset < 1 || reset > 60 {
			t.Errorf("200 #%d: X-RateLimit-Reset %q, want 1 to 60 seconds", i+1, h.Get("X-RateLimit-Reset"))
		}
	}
	for i := range 3 {
		sent := time.Now()
		resp := sc.get(t, "/api/items", key)
		done := time.Now()
		if resp.Status != 429 || resp.Body != `{"error":"too many requests"}`+"\n" || resp.Header.Get("Content-Type") != "application/json" {
			t.Fatalf("request %d: %d %q (%s), want nginx's 429", 6+i, resp.Status, resp.Body, resp.Header.Get("Content-Type"))
		}
		h := resp.Header
		wantFields(t, fmt.Sprintf("429 #%d", i+1), h, map[string]string{
			"RateLimit-Policy":      `"per_client";q=5;w=60`,
			"X-RateLimit-Limit":     "5",
			"X-RateLimit-Remaining": "0",
		})
		if rl := h.Get("RateLimit"); !strings.HasPrefix(rl, `"per_client";r=0;t=`) {
			t.Errorf("429 #%d: RateLimit %q, want r=0", i+1, rl)
		}
		// The 6th token comes 12 s (60 s / 5) after the first decision.
		lo, hi := retryAfterRange(12*time.Second, firstSent, firstDone, sent, done)
		if ra, err := strconv.ParseInt(h.Get("Retry-After"), 10, 64); err != nil || ra < lo || ra > hi {
			t.Errorf("429 #%d: Retry-After %q, want %d to %d", i+1, h.Get("Retry-After"), lo, hi)
		} else {
			t.Logf("429 #%d: Retry-After %d (from the rule and the timings: %d to %d)", i+1, ra, lo, hi)
		}
	}
	if n := sc.up.count("/api/items", "sidecar-k1"); n != 5 {
		t.Errorf("the app got %d requests of sidecar-k1, want 5 (the burst)", n)
	}
}

// checkLoginZone: nginx's location picks the path Caddy sees, so /login's
// zone applies (2 a minute per address) with per_client.
func (sc *nginxSidecar) checkLoginZone(t *testing.T) {
	t.Helper()
	for i := range 3 {
		resp := sc.get(t, "/login", "X-API-Key: sidecar-login")
		want := 200
		if i == 2 {
			want = 429
		}
		if resp.Status != want {
			t.Fatalf("/login #%d: %d, want %d", i+1, resp.Status, want)
		}
		if rl := resp.Header.Get("RateLimit"); !strings.Contains(rl, fmt.Sprintf(`"login";r=%d;`, max(0, 1-i))) {
			t.Errorf("/login #%d: RateLimit %q, want the login zone with r=%d", i+1, rl, max(0, 1-i))
		}
		if want == 200 {
			sc.admitted++
		} else if resp.Header.Get("Retry-After") == "" {
			t.Errorf("/login #%d: 429 without Retry-After", i+1)
		}
	}
	if n := sc.up.count("/login", "sidecar-login"); n != 2 {
		t.Errorf("the app got %d requests on /login, want 2", n)
	}
}

// checkDecisionsOnBothNodes: both nodes decided, every decision in Redis:
// per_client admitted what the client saw admitted and denied
// sidecar-k1's 3.
func (sc *nginxSidecar) checkDecisionsOnBothNodes(t *testing.T) {
	t.Helper()
	var allowed, denied float64
	for i, n := range sc.nodes {
		m, err := n.Metrics()
		if err != nil {
			t.Fatalf("node %d metrics: %v", i+1, err)
		}
		a := m.Sum("caddy_rate_limit_decisions_total", "zone", "per_client", "outcome", "allowed")
		d := m.Sum("caddy_rate_limit_decisions_total", "zone", "per_client", "outcome", "denied")
		all := m.Sum("caddy_rate_limit_decisions_total")
		t.Logf("node %d: per_client allowed %v, denied %v; all zones %v", i+1, a, d, all)
		if a+d == 0 {
			t.Errorf("node %d decided nothing for per_client: nginx did not spread the decisions", i+1)
		}
		for _, o := range []string{"allowed", "denied"} {
			all -= m.Sum("caddy_rate_limit_decisions_total", "outcome", o)
		}
		if all != 0 {
			t.Errorf("node %d: %v decisions without Redis (outcomes other than allowed and denied)", i+1, all)
		}
		allowed += a
		denied += d
	}
	if allowed != float64(sc.admitted) || denied != 3 {
		t.Errorf("per_client: %v allowed and %v denied over both nodes, want %d and 3", allowed, denied, sc.admitted)
	}
}

// wantFields checks response fields; "" wants the field absent.
func wantFields(t *testing.T, what string, h http.Header, want map[string]string) {
	t.Helper()
	for name, v := range want {
		if got := h.Get(name); got != v {
			t.Errorf("%s: %s %q, want %q", what, name, got, v)
		}
	}
}

// sidecarDecideSite is the JSON decision service of docs/sidecar.md:
// GET /decide?zone=NAME&key=KEY[&cost=N]; api allows 5 a minute (one
// token every 12 s), login 3.
func sidecarDecideSite(redis string) string {
	return fmt.Sprintf(`
	@decide {
		path /decide
		query zone=api zone=login
		query key=*
		not query key=
	}
	handle @decide {
		map {query.cost} {decide_cost} {
			"" 1
			default {query.cost}
		}
		rate_limit {
			%s
			zone api {
				key {query.key}
				rate 5 1m
				cost {decide_cost}
				match {
					query zone=api
				}
			}
			zone login {
				key {query.key}
				rate 3 1m
				cost {decide_cost}
				match {
					query zone=login
				}
			}
		}
		header Content-Type application/json
		respond `+"`"+`{"allowed":true,"remaining":{http.response.header.X-RateLimit-Remaining},"reset":{http.response.header.X-RateLimit-Reset}}`+"`"+` 200
	}
	handle {
		header Content-Type application/json
		respond `+"`"+`{"error":"usage: GET /decide?zone=api|login&key=KEY[&cost=N]"}`+"`"+` 400
	}

	handle_errors 429 {
		map {http.response.header.Retry-After} {decide_retry_after} {
			"" null
			default {http.response.header.Retry-After}
		}
		header Content-Type application/json
		respond `+"`"+`{"allowed":false,"zone":"{http.rate_limit.exceeded.name}","retry_after":{decide_retry_after}}`+"`"+` 429
	}
	handle_errors 400 {
		header Content-Type application/json
		respond `+"`"+`{"error":"cost must be a whole number, at most the zone's burst"}`+"`"+` 400
	}`, redis)
}

// TestSidecarDecideJSON asks the JSON decision service of a Caddy node
// directly: admissions with costs, a cost of 0 that only reports, a 429
// with the zone and a Retry-After that follows from the rate, a cost that
// can never pass, malformed questions, and two zones at once (a denial
// by one charges neither).
func TestSidecarDecideJSON(t *testing.T) {
	t.Parallel()
	r := redistest.Start(t)
	d := decideService{t: t, n: startCaddy(t, "", sidecarDecideSite(redisBlock(r)))}
	d.checkCostsAndRetryAfter()

	// A cost above the burst can never pass: no retry_after.
	a := d.ask("zone=api&key=j1&cost=9")
	d.want("cost 9", a, 429, `{"allowed":false,"zone":"api","retry_after":null}`)
	if a.header.Get("Retry-After") != "" {
		t.Errorf("cost 9: Retry-After %q, want none", a.header.Get("Retry-After"))
	}

	// Malformed questions.
	d.want("cost x", d.ask("zone=api&key=j1&cost=x"), 400, `{"error":"cost must be a whole number, at most the zone's burst"}`)
	usage := `{"error":"usage: GET /decide?zone=api|login&key=KEY[&cost=N]"}`
	for _, q := range []string{"zone=nope&key=j1", "zone=api", "zone=api&key=", "key=j1"} {
		d.want(q, d.ask(q), 400, usage)
	}

	// Two zones at once: api denies, so login is not charged.
	if a := d.ask("zone=api&zone=login&key=j1&cost=2"); a.status != 429 || a.body["allowed"] != false || a.body["zone"] != "api" {
		t.Errorf("api and login: %d %v, want 429 in zone api", a.status, a.body)
	}
	if a := d.ask("zone=login&key=j1"); a.status != 200 || a.body["remaining"] != 2.0 {
		t.Errorf("login after the denial: %d %v, want allowed with 2 remaining (3 less this one)", a.status, a.body)
	}
	// Another key has its own bucket.
	if a := d.ask("zone=api&key=j2&cost=5"); a.status != 200 || a.body["remaining"] != 0.0 {
		t.Errorf("j2: %d %v, want allowed with 0 remaining", a.status, a.body)
	}
}

// decideService asks a node's JSON decision service (sidecarDecideSite).
type decideService struct {
	t *testing.T
	n *node
}

// decideAnswer is the decision service's answer: its status, fields and
// JSON body.
type decideAnswer struct {
	status int
	header http.Header
	body   map[string]any
}

// ask sends GET /decide?query and requires a JSON answer.
func (d decideService) ask(query string) decideAnswer {
	d.t.Helper()
	resp := d.n.get("/decide?" + query)
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		d.t.Fatalf("%s: Content-Type %q, want application/json (body %q)", query, ct, resp.Body)
	}
	var body map[string]any
	if err := json.Unmarshal([]byte(resp.Body), &body); err != nil {
		d.t.Fatalf("%s: %d, body %q is not JSON: %v", query, resp.Status, resp.Body, err)
	}
	return decideAnswer{resp.Status, resp.Header, body}
}

// want requires the answer a to query to be status with the JSON body.
func (d decideService) want(query string, a decideAnswer, status int, body string) {
	d.t.Helper()
	var wantBody map[string]any
	if err := json.Unmarshal([]byte(body), &wantBody); err != nil {
		d.t.Fatal(err)
	}
	if a.status != status || fmt.Sprint(a.body) != fmt.Sprint(wantBody) {
		d.t.Errorf("%s: %d %v, want %d %v", query, a.status, a.body, status, wantBody)
	}
}

// checkCostsAndRetryAfter: costs of 3, 1 and 0 are admitted with what
// remains; a cost of 2 with one token left is denied with the zone and a
// Retry-After that follows from the rate.
func (d decideService) checkCostsAndRetryAfter() {
	t := d.t
	t.Helper()
	firstSent := time.Now()
	a := d.ask("zone=api&key=j1&cost=3")
	firstDone := time.Now()
	if a.status != 200 || a.body["allowed"] != true || a.body["remaining"] != 2.0 {
		t.Fatalf("cost 3: %d %v, want allowed with 2 remaining", a.status, a.body)
	}
	if reset, ok := a.body["reset"].(float64); !ok || reset < 1 || reset > 60 || a.header.Get("RateLimit") == "" || a.header.Get("RateLimit-Policy") != `"api";q=5;w=60` {
		t.Errorf("cost 3: reset %v, RateLimit %q, RateLimit-Policy %q", a.body["reset"], a.header.Get("RateLimit"), a.header.Get("RateLimit-Policy"))
	}
	if a := d.ask("zone=api&key=j1"); a.status != 200 || a.body["remaining"] != 1.0 {
		t.Errorf("default cost: %d %v, want allowed with 1 remaining", a.status, a.body)
	}
	if a := d.ask("zone=api&key=j1&cost=0"); a.status != 200 || a.body["remaining"] != 1.0 {
		t.Errorf("cost 0: %d %v, want 200 with 1 remaining (it only reports)", a.status, a.body)
	}

	// Two tokens are wanted, one is there; the second comes 12 s after
	// the first decision.
	sent := time.Now()
	a = d.ask("zone=api&key=j1&cost=2")
	done := time.Now()
	lo, hi := retryAfterRange(12*time.Second, firstSent, firstDone, sent, done)
	ra, _ := a.body["retry_after"].(float64)
	if a.status != 429 || a.body["allowed"] != false || a.body["zone"] != "api" || ra < float64(lo) || ra > float64(hi) || a.header.Get("Retry-After") != strconv.Itoa(int(ra)) {
		t.Errorf("cost 2: %d %v, Retry-After %q; want 429 in zone api, retry_after %d to %d", a.status, a.body, a.header.Get("Retry-After"), lo, hi)
	} else {
		t.Logf("cost 2: retry_after %v (from the rule and the timings: %d to %d)", ra, lo, hi)
	}
	if a.header.Get("X-RateLimit-Remaining") != "1" || a.header.Get("RateLimit-Policy") != `"api";q=5;w=60` {
		t.Errorf("cost 2: X-RateLimit-Remaining %q, RateLimit-Policy %q", a.header.Get("X-RateLimit-Remaining"), a.header.Get("RateLimit-Policy"))
	}
}
