package tests

import (
	"encoding/base64"
	"fmt"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fleetlimit/caddy-fleetlimit/internal/localfleet"
	"github.com/fleetlimit/caddy-fleetlimit/internal/redistest"
)

// loginApp is the application behind Caddy in the count_status tests: a
// login that succeeds (200) when the request carries X-Password: right and
// fails (401) otherwise. It counts both per user (X-User).
type loginApp struct {
	mu         sync.Mutex
	ok, failed map[string]int
}

func (a *loginApp) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	user := r.Header.Get("X-User")
	a.mu.Lock()
	defer a.mu.Unlock()
	if r.Header.Get("X-Password") == "right" {
		a.ok[user]++
		fmt.Fprintf(w, "welcome, %s\n", user)
		return
	}
	a.failed[user]++
	http.Error(w, "wrong password", http.StatusUnauthorized)
}

// counts returns how many logins of user succeeded and failed.
func (a *loginApp) counts(user string) (ok, failed int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.ok[user], a.failed[user]
}

// startLoginApp serves a loginApp on a loopback port until the test ends,
// and returns it with its host:port.
func startLoginApp(t *testing.T) (*loginApp, string) {
	t.Helper()
	app := &loginApp{ok: map[string]int{}, failed: map[string]int{}}
	srv := httptest.NewServer(app) // listens on 127.0.0.1
	t.Cleanup(srv.Close)
	return app, strings.TrimPrefix(srv.URL, "http://")
}

// loginSite is a login route guarded by a count_status 401 zone of 5 per
// 15 minutes per user, in front of the app at upstream.
func loginSite(redis, algorithm, upstream string) string {
	return fmt.Sprintf(`
	rate_limit {
		%s
		zone login {
			key {header.X-User}
			algorithm %s
			rate 5 15m
			count_status 401
		}
	}
	reverse_proxy %s`, redis, algorithm, upstream)
}

// TestCountStatusRefunds: behind count_status 401 at rate 5 15m, with a
// real upstream, 100 successful logins of one user all pass (each is
// charged before it passes and refunded after its 200), and then exactly 5
// failed logins are admitted and every later one is denied. On Redis with
// three nodes (the refund calls per request are measured from Redis'
// EVALSHA count and the nodes' decisions), and on the memory store; with
// the token bucket and with the sliding window (whose refunds find the
// window the charge was counted in).
func TestCountStatusRefunds(t *testing.T) {
	t.Parallel()
	for _, alg := range []string{"token_bucket", "sliding_window"} {
		t.Run("redis/"+alg, func(t *testing.T) {
			t.Parallel()
			testCountStatusRedis(t, alg)
		})
		t.Run("memory/"+alg, func(t *testing.T) {
			t.Parallel()
			testCountStatusMemory(t, alg)
		})
	}
}

// successfulLogins is how many successful logins each scenario sends.
const successfulLogins = 100

// testCountStatusRedis runs the scenario on three nodes sharing one Redis.
func testCountStatusRedis(t *testing.T, alg string) {
	r := redistest.Start(t)
	app, upstream := startLoginApp(t)
	nodes := startFleet(t, 3, loginSite(redisBlock(r), alg, upstream))
	const user = "alice"

	// Successful logins, one after the other, round robin over the nodes.
	calls0, decisions0 := scriptsRun(t, r), storeDecisions(t, nodes)
	oks := map[int]int{}
	minLeft := int64(5) // the fewest tokens a response reported left
	for i := range successfulLogins {
		resp := sendLogin(t, nodes[i%len(nodes)], "X-User: "+user, "X-Password: right")
		oks[resp.Status]++
		if left, ok := xRateLimitRemaining(resp.Header); ok && left < minLeft {
			minLeft = left
		}
	}
	if oks[200] != successfulLogins {
		t.Fatalf("%d successful logins through 3 nodes: %v, want all 200 (each charge refunded)", successfulLogins, oks)
	}
	// The refunds run after the responses: wait until Redis has seen one
	// script call per decision and per refund, then until the count
	// stays put.
	decisions := storeDecisions(t, nodes) - decisions0
	calls := waitScriptCalls(t, r, calls0+decisions+successfulLogins) - calls0
	refunds := calls - decisions
	perRequest := float64(refunds) / successfulLogins
	t.Logf("refund calls per request for count_status (%s, Redis, 3 nodes): %.2f (%d EVALSHA = %d decisions + %d refunds, for %d successful logins); fewest tokens left seen: %d",
		alg, perRequest, calls, decisions, refunds, successfulLogins, minLeft)
	if decisions != successfulLogins || refunds != successfulLogins {
		t.Errorf("%d successful logins made %d decisions and %d refund calls, want one of each per login", successfulLogins, decisions, refunds)
	}

	// Failed logins: exactly 5 pass, the rest are denied, and none is
	// refunded (a 401 is counted).
	calls1, decisions1 := scriptsRun(t, r), storeDecisions(t, nodes)
	answers := failedLogins(t, nodes, []string{"X-User: " + user, "X-Password: wrong"}, 5, 15)
	checkFailedLogins(t, answers, true)
	decisions = storeDecisions(t, nodes) - decisions1
	if failedCalls := settledScriptCalls(t, r) - calls1; failedCalls != decisions {
		t.Errorf("%d failed logins: %d script calls for %d decisions, want no refund", len(answers), failedCalls, decisions)
	}
	checkLoginApp(t, app, user)
	checkLoginCounts(t, nodes, len(answers)-5)
}

// testCountStatusMemory runs the scenario on one node's memory store.
func testCountStatusMemory(t *testing.T, alg string) {
	app, upstream := startLoginApp(t)
	n := startCaddy(t, "", loginSite("", alg, upstream))
	const user = "bob"
	oks := map[int]int{}
	for range successfulLogins {
		oks[sendLogin(t, n.Node, "X-User: "+user, "X-Password: right").Status]++
	}
	if oks[200] != successfulLogins {
		t.Fatalf("%d successful logins: %v, want all 200 (each charge refunded)", successfulLogins, oks)
	}
	// No store call to count here: the last refund may still be on its
	// way, so a failed login may find its token missing for a moment
	// (failedLogins retries until 5 have passed).
	answers := failedLogins(t, []*localfleet.Node{n.Node}, []string{"X-User: " + user, "X-Password: wrong"}, 5, 15)
	checkFailedLogins(t, answers, false)
	checkLoginApp(t, app, user)
	checkLoginCounts(t, []*localfleet.Node{n.Node}, len(answers)-5)
}

// TestCountStatusBasicAuth: count_status 401 in front of Caddy's own
// basic_auth (rate_limit runs just before it), keyed by {client_ip}: the
// 401 is basic_auth's handler error, not a written response, and counts
// as 401. 20 good logins pass and are refunded, then exactly 5 bad ones
// are admitted.
func TestCountStatusBasicAuth(t *testing.T) {
	t.Parallel()
	n := startCaddy(t, "", `
	rate_limit {
		zone login {
			key {client_ip}
			rate 5 15m
			count_status 401
		}
	}
	basic_auth {
		alice `+openSesameHash+`
	}
	respond "welcome, {http.auth.user.id}"`)
	basic := func(password string) string {
		return "Authorization: Basic " + base64.StdEncoding.EncodeToString([]byte("alice:"+password))
	}
	for i := 1; i <= 20; i++ {
		if r := sendLogin(t, n.Node, basic("open-sesame")); r.Status != 200 || r.Body != "welcome, alice" {
			t.Fatalf("good login %d: %d %q, want 200 (each charge refunded)", i, r.Status, r.Body)
		}
	}
	answers := failedLogins(t, []*localfleet.Node{n.Node}, []string{basic("wrong")}, 5, 10)
	checkFailedLogins(t, answers, false)
	// A good login now finds no token either: the bad ones were counted.
	if r := sendLogin(t, n.Node, basic("open-sesame")); r.Status != 429 {
		t.Errorf("good login after 5 bad ones: %d, want 429", r.Status)
	}
}

// openSesameHash is the bcrypt hash (cost 4, for speed) of "open-sesame".
const openSesameHash = "$2a$04$Sgkd0VS0PqUPqJjM6MC/HuTJC00xvMQS13J/KkttLyHrrDK3N4dL."

// failedLogins sends failed logins (GET /login with headers), round robin
// over nodes, one at a time, until admit of them have been answered 401 or
// 20 s have passed, and then extra more; it returns the statuses in order.
func failedLogins(t *testing.T, nodes []*localfleet.Node, headers []string, admit, extra int) []int {
	t.Helper()
	var answers []int
	admitted := 0
	deadline := time.Now().Add(20 * time.Second)
	for i := 0; admitted < admit; i++ {
		if time.Now().After(deadline) || i >= 1000 {
			t.Fatalf("failed logins: %v, and fewer than %d admitted after %d tries", answers, admit, i)
		}
		st := sendLogin(t, nodes[i%len(nodes)], headers...).Status
		answers = append(answers, st)
		if st == http.StatusUnauthorized {
			admitted++
		} else {
			time.Sleep(20 * time.Millisecond) // a refund is still on its way
		}
	}
	for i := range extra {
		answers = append(answers, sendLogin(t, nodes[(len(answers)+i)%len(nodes)], headers...).Status)
	}
	return answers
}

// checkFailedLogins checks the failed logins' answers: 5 401s (the 5
// admitted) and then only 429s; with exact, no 429 before the 5th 401
// (every refund had landed before they started).
func checkFailedLogins(t *testing.T, answers []int, exact bool) {
	t.Helper()
	counts := map[int]int{}
	fifth := -1
	for i, st := range answers {
		counts[st]++
		if st == http.StatusUnauthorized && counts[st] == 5 {
			fifth = i
		}
	}
	t.Logf("failed logins: %v", answers)
	if counts[401] != 5 || counts[401]+counts[429] != len(answers) {
		t.Fatalf("failed logins: %v (%v), want exactly 5 admitted (401), all others 429", answers, counts)
	}
	for _, st := range answers[fifth+1:] {
		if st != http.StatusTooManyRequests {
			t.Fatalf("failed logins: %v, want only 429 after the 5th 401", answers)
		}
	}
	if exact && fifth != 4 {
		t.Errorf("failed logins: %v, want the first 5 admitted (every refund had landed)", answers)
	}
}

// checkLoginApp checks that the app saw every successful login and only the
// 5 admitted failed ones.
func checkLoginApp(t *testing.T, app *loginApp, user string) {
	t.Helper()
	if ok, failed := app.counts(user); ok != successfulLogins || failed != 5 {
		t.Errorf("the app saw %d successful and %d failed logins, want %d and 5", ok, failed, successfulLogins)
	}
}

// checkLoginCounts checks the login zone's counts over the nodes: every
// admitted request is counted as allowed (also those refunded), and each
// 429 as denied.
func checkLoginCounts(t *testing.T, nodes []*localfleet.Node, denied int) {
	t.Helper()
	var allowed, den float64
	for _, m := range scrapeAll(t, nodes) {
		a, _ := metric(m, "caddy_rate_limit_decisions_total", "zone", "login", "outcome", "allowed")
		d, _ := metric(m, "caddy_rate_limit_decisions_total", "zone", "login", "outcome", "denied")
		allowed, den = allowed+a, den+d
	}
	if allowed != successfulLogins+5 || den != float64(denied) {
		t.Errorf("login zone: allowed %v and denied %v, want %d and %d", allowed, den, successfulLogins+5, denied)
	}
}

// sendLogin sends a GET /login with headers to n and fails the test on a
// transport error.
func sendLogin(t *testing.T, n *localfleet.Node, headers ...string) response {
	t.Helper()
	r, err := n.Do(http.MethodGet, "/login", headers...)
	if err != nil {
		t.Fatalf("GET /login: %v\ncaddy output:\n%s", err, n.Log.String())
	}
	return r
}

// xRateLimitRemaining returns the X-RateLimit-Remaining of a response.
func xRateLimitRemaining(h http.Header) (int64, bool) {
	var v int64
	_, err := fmt.Sscan(h.Get("X-RateLimit-Remaining"), &v)
	return v, err == nil
}

// storeDecisions is the number of store decisions the nodes made (their
// store latency histograms count one per Decide call; refunds are not
// observed there).
func storeDecisions(t *testing.T, nodes []*localfleet.Node) int64 {
	t.Helper()
	var sum float64
	for _, m := range scrapeAll(t, nodes) {
		v, _ := metric(m, "caddy_rate_limit_store_duration_seconds_count")
		sum += v
	}
	return int64(sum)
}

// evalshaStats is Redis' count of EVALSHA calls, and of those that failed
// or were rejected.
var evalshaStats = regexp.MustCompile(`cmdstat_evalsha:calls=(\d+),.*rejected_calls=(\d+),failed_calls=(\d+)`)

// scriptsRun is the number of EVALSHA calls that Redis ran without an
// error: decisions and refunds, and not the NOSCRIPT probe that each node
// sends at start, in the background, to check its credentials.
func scriptsRun(t *testing.T, r *redistest.Server) int64 {
	t.Helper()
	info := r.MustDo("INFO", "commandstats")
	if !strings.Contains(info, "cmdstat_evalsha:") {
		return 0
	}
	m := evalshaStats.FindStringSubmatch(info)
	if m == nil {
		t.Fatalf("INFO commandstats: no calls, rejected_calls and failed_calls for evalsha:\n%s", info)
	}
	var n [3]int64
	for i := range n {
		n[i], _ = strconv.ParseInt(m[i+1], 10, 64)
	}
	return n[0] - n[1] - n[2]
}

// waitScriptCalls waits up to 20 s for Redis to have run at least want
// script calls (EVALSHA, without error), then for the count to stay put, and returns it.
func waitScriptCalls(t *testing.T, r *redistest.Server, want int64) int64 {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for got := scriptsRun(t, r); got < want; got = scriptsRun(t, r) {
		if time.Now().After(deadline) {
			t.Fatalf("Redis ran %d script calls after 20 s, want at least %d (a refund is missing)", got, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return settledScriptCalls(t, r)
}

// settledScriptCalls waits until Redis' EVALSHA count has not changed for
// 500 ms (at most 10 s) and returns it.
func settledScriptCalls(t *testing.T, r *redistest.Server) int64 {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	last := scriptsRun(t, r)
	for quiet := time.Now(); time.Since(quiet) < 500*time.Millisecond && time.Now().Before(deadline); {
		time.Sleep(50 * time.Millisecond)
		if c := scriptsRun(t, r); c != last {
			last, quiet = c, time.Now()
		}
	}
	return last
}
