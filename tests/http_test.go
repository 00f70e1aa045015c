package tests

import (
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fleetlimit/caddy-fleetlimit/internal/redistest"
)

// stores runs a test once with the memory store and once with Redis.
func stores(t *testing.T, f func(t *testing.T, redisBlock string)) {
	t.Run("memory", func(t *testing.T) {
		t.Parallel()
		f(t, "")
	})
	t.Run("redis", func(t *testing.T) {
		t.Parallel()
		r := redistest.Start(t)
		// A generous timeout: these tests count what Redis decides, and a
		// decision that timed out on a busy machine would be decided by
		// the default on_error local, on the node's own buckets.
		f(t, fmt.Sprintf("redis {\n\taddress %s\n\ttimeout 2s\n}", r.Addr))
	})
}

func TestCountsAndHeaders(t *testing.T) {
	t.Parallel()
	stores(t, func(t *testing.T, redis string) {
		n := startCaddy(t, "", fmt.Sprintf(`
	rate_limit {
		%s
		zone api {
			rate 5 1h
		}
	}
	respond "ok"`, redis))

		// Five tokens per hour: one token every 720 s.
		for i := 1; i <= 5; i++ {
			r := n.get("/")
			if r.Status != 200 || r.Body != "ok" {
				t.Fatalf("request %d: status %d body %q, want 200 ok", i, r.Status, r.Body)
			}
			wantRL := fmt.Sprintf(`"api";r=%d;t=%d`, 5-i, 720*i)
			check(t, r, "Ratelimit-Policy", `"api";q=5;w=3600`)
			check(t, r, "Ratelimit", wantRL)
			check(t, r, "X-Ratelimit-Limit", "5")
			check(t, r, "X-Ratelimit-Remaining", strconv.Itoa(5-i))
			check(t, r, "X-Ratelimit-Reset", strconv.Itoa(720*i))
			if v := r.Header.Get("Retry-After"); v != "" {
				t.Errorf("request %d: admitted response has Retry-After %q", i, v)
			}
		}
		r := n.get("/")
		if r.Status != 429 {
			t.Fatalf("6th request: status %d, want 429", r.Status)
		}
		check(t, r, "Retry-After", "720")
		check(t, r, "Ratelimit", `"api";r=0;t=3600`)
		check(t, r, "X-Ratelimit-Remaining", "0")
		check(t, r, "Ratelimit-Policy", `"api";q=5;w=3600`)
	})
}

func check(t *testing.T, r response, name, want string) {
	t.Helper()
	if got := r.Header.Get(name); got != want {
		t.Errorf("%s: got %q, want %q", name, got, want)
	}
}

// checkSeconds checks that the header name reads as format with a number
// of seconds from lo to hi.
func checkSeconds(t *testing.T, r response, name, format string, lo, hi int) {
	t.Helper()
	got := r.Header.Get(name)
	for s := lo; s <= hi; s++ {
		if got == fmt.Sprintf(format, s) {
			return
		}
	}
	t.Errorf("%s: got %q, want %q with %d to %d seconds", name, got, format, lo, hi)
}

func TestRefillAndRetryAfter(t *testing.T) {
	t.Parallel()
	stores(t, func(t *testing.T, redis string) {
		n := startCaddy(t, "", fmt.Sprintf(`
	rate_limit {
		%s
		zone fast {
			rate 1 1s
			burst 2
		}
	}
	respond "ok"`, redis))
		got := n.statuses(3, "/")
		if got[200] != 2 || got[429] != 1 {
			t.Fatalf("burst of 2: got %v, want two 200 and one 429", got)
		}
		r := n.get("/")
		if r.Status != 429 {
			t.Fatalf("still empty: status %d", r.Status)
		}
		// A token takes 1 s (slow enough that a busy machine's requests
		// do not refill one between them); Retry-After rounds up.
		check(t, r, "Retry-After", "1")
		time.Sleep(1100 * time.Millisecond)
		if r := n.get("/"); r.Status != 200 {
			t.Fatalf("after 1.1s one token is back: status %d", r.Status)
		}
		if r := n.get("/"); r.Status != 429 {
			t.Fatalf("and only one: status %d", r.Status)
		}
		time.Sleep(2100 * time.Millisecond) // full again (2 tokens)
		got = n.statuses(3, "/")
		if got[200] != 2 || got[429] != 1 {
			t.Fatalf("after a full refill: got %v, want two 200 and one 429", got)
		}
	})
}

func TestHandleErrorsShapesDenial(t *testing.T) {
	t.Parallel()
	n := startCaddy(t, "", `
	rate_limit {
		zone login {
			rate 1 1h
		}
	}
	respond "ok"
	handle_errors 429 {
		header Content-Type application/problem+json
		respond `+"`"+`{"title":"Too Many Requests","zone":"{http.rate_limit.exceeded.name}","status":{http.error.status_code}}`+"`"+` 429
	}`)
	if r := n.get("/"); r.Status != 200 {
		t.Fatalf("first: %d", r.Status)
	}
	r := n.get("/")
	if r.Status != 429 {
		t.Fatalf("second: status %d, want 429", r.Status)
	}
	check(t, r, "Content-Type", "application/problem+json")
	var body struct {
		Title, Zone string
		Status      int
	}
	if err := json.Unmarshal([]byte(r.Body), &body); err != nil {
		t.Fatalf("body %q: %v", r.Body, err)
	}
	if body.Zone != "login" || body.Status != 429 || body.Title != "Too Many Requests" {
		t.Errorf("body %+v", body)
	}
	// The rate limit fields survive the error route.
	check(t, r, "Retry-After", "3600")
	check(t, r, "X-Ratelimit-Remaining", "0")
}

func TestZonesComposeAndDenialChargesNoZone(t *testing.T) {
	t.Parallel()
	stores(t, func(t *testing.T, redis string) {
		n := startCaddy(t, "", fmt.Sprintf(`
	rate_limit {
		%s
		zone per_user {
			key {header.X-User}
			rate 3 1h
		}
		zone global {
			key everyone
			rate 5 1h
		}
	}
	respond "ok"`, redis))
		// With Redis, repeated denials are answered by the node's deny
		// cache, which consults only the zone that denied: RateLimit then
		// lists that zone alone (the policy still lists both).
		cached := redis != ""
		// alice spends 3: her zone is empty, global has 2 left.
		if got := n.statuses(3, "/", "X-User: alice"); got[200] != 3 {
			t.Fatalf("alice: %v", got)
		}
		// alice is denied by per_user; global must not be charged.
		for range 4 {
			r := n.get("/", "X-User: alice")
			if r.Status != 429 {
				t.Fatalf("alice 4th: %d", r.Status)
			}
			checkMembers(t, r, `"per_user";r=0;t=3600, "global";r=2;t=2160`, `"per_user";r=0;t=3600`, cached)
			check(t, r, "X-Ratelimit-Remaining", "0")
			check(t, r, "Ratelimit-Policy", `"per_user";q=3;w=3600, "global";q=5;w=3600`)
		}
		// bob gets exactly the two global tokens alice's denials did not spend.
		if got := n.statuses(3, "/", "X-User: bob"); got[200] != 2 || got[429] != 1 {
			t.Fatalf("bob: %v, want 2 admitted then 1 denied by global", got)
		}
		r := n.get("/", "X-User: bob")
		checkMembers(t, r, `"per_user";r=1;t=2400, "global";r=0;t=3600`, `"global";r=0;t=3600`, cached)
		// The legacy fields report the zone with the least remaining.
		check(t, r, "X-Ratelimit-Limit", "5")
	})
}

// checkMembers checks the RateLimit field: exactly want, or, when a cached
// denial may have answered, the denying zone's member alone.
func checkMembers(t *testing.T, r response, want, cachedWant string, cached bool) {
	t.Helper()
	got := r.Header.Get("Ratelimit")
	if got != want && (!cached || got != cachedWant) {
		t.Errorf("Ratelimit: got %q, want %q", got, want)
	}
}

func TestZoneMatcherAndCost(t *testing.T) {
	t.Parallel()
	stores(t, func(t *testing.T, redis string) {
		n := startCaddy(t, "", fmt.Sprintf(`
	rate_limit /api/* {
		%s
		zone writes {
			key static
			rate 10 1h
			cost {header.X-Cost}
			match {
				method POST
			}
		}
	}
	respond "ok"`, redis))
		// GET: the zone does not apply, so no fields at all.
		r := n.get("/api/x")
		if r.Status != 200 || r.Header.Get("Ratelimit") != "" || r.Header.Get("X-Ratelimit-Limit") != "" {
			t.Fatalf("GET: %d %v", r.Status, r.Header)
		}
		// Outside the handler's path matcher: untouched.
		if r := n.do("POST", "/other", "X-Cost: 100"); r.Status != 200 || r.Header.Get("Ratelimit") != "" {
			t.Fatalf("POST /other: %d %v", r.Status, r.Header)
		}
		r = n.do("POST", "/api/x", "X-Cost: 4")
		if r.Status != 200 {
			t.Fatalf("cost 4: %d", r.Status)
		}
		check(t, r, "X-Ratelimit-Remaining", "6")
		r = n.do("POST", "/api/x", "X-Cost: 7")
		if r.Status != 429 {
			t.Fatalf("cost 7 with 6 left: %d", r.Status)
		}
		check(t, r, "X-Ratelimit-Remaining", "6")
		check(t, r, "Retry-After", "360") // one token of 10/h
		r = n.do("POST", "/api/x", "X-Cost: 6")
		if r.Status != 200 {
			t.Fatalf("cost 6 with 6 left: %d", r.Status)
		}
		// Bad costs: a clear 400, nothing charged, no panic.
		for _, c := range []string{"abc", "-1", "1.5", "99999999999999999999999"} {
			if r := n.do("POST", "/api/x", "X-Cost: "+c); r.Status != 400 {
				t.Errorf("cost %q: status %d, want 400", c, r.Status)
			}
		}
		if r := n.do("POST", "/api/x"); r.Status != 400 {
			t.Errorf("missing cost: status %d, want 400", r.Status)
		}
		// A cost of 0 only looks; a cost above the burst can never pass.
		if r := n.do("POST", "/api/x", "X-Cost: 0"); r.Status != 200 {
			t.Errorf("cost 0: status %d", r.Status)
		}
		r = n.do("POST", "/api/x", "X-Cost: 11")
		if r.Status != 429 || r.Header.Get("Retry-After") != "" {
			t.Errorf("cost above burst: status %d Retry-After %q, want 429 without Retry-After", r.Status, r.Header.Get("Retry-After"))
		}
	})
}

func TestHeaderModes(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"ietf", "legacy", "both", "none"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			n := startCaddy(t, "", fmt.Sprintf(`
	rate_limit {
		zone z {
			rate 2 1m
		}
		headers %s
	}
	respond "ok"`, mode))
			r := n.get("/")
			ietf := r.Header.Get("Ratelimit") != "" && r.Header.Get("Ratelimit-Policy") != ""
			legacy := r.Header.Get("X-Ratelimit-Limit") != "" && r.Header.Get("X-Ratelimit-Remaining") != "" && r.Header.Get("X-Ratelimit-Reset") != ""
			wantIETF, wantLegacy := mode == "ietf" || mode == "both", mode == "legacy" || mode == "both"
			if ietf != wantIETF || legacy != wantLegacy {
				t.Errorf("ietf fields %v (want %v), legacy fields %v (want %v): %v", ietf, wantIETF, legacy, wantLegacy, r.Header)
			}
			n.get("/")
			if r := n.get("/"); r.Status != 429 || r.Header.Get("Retry-After") != "30" {
				t.Errorf("denial: %d, Retry-After %q (want 30 whatever the header mode)", r.Status, r.Header.Get("Retry-After"))
			}
		})
	}
}

func TestKeys(t *testing.T) {
	t.Parallel()
	r := redistest.Start(t)
	n := startCaddy(t, "", fmt.Sprintf(`
	rate_limit {
		redis {
			address %s
			key_prefix "t:"
		}
		zone k {
			key {header.X-API-Key} {client_ip}
			rate 1 1h
		}
	}
	respond "ok"`, r.Addr))
	// Without the header the key is the client IP, in the namespace of
	// the second alternative.
	if got := n.statuses(2, "/"); got[200] != 1 || got[429] != 1 {
		t.Fatalf("by ip: %v", got)
	}
	// A hostile key: huge, with braces and control bytes. It gets its own
	// bucket, stored under a bounded key that keeps the hash tag intact.
	hostile := strings.Repeat("}{x", 3000) + " \xc3\xa9 end"
	if got := n.statuses(2, "/", "X-API-Key: "+hostile); got[200] != 1 || got[429] != 1 {
		t.Fatalf("hostile key: %v", got)
	}
	if got := n.statuses(2, "/", "X-API-Key: abc123"); got[200] != 1 || got[429] != 1 {
		t.Fatalf("plain key: %v", got)
	}
	// The zone's buckets (the fleet counters and the denial feed have
	// keys of their own, written once a second).
	keys := strings.Split(r.MustDo("KEYS", "t:k:*"), "\n")
	if len(keys) != 3 {
		t.Fatalf("want 3 bucket keys, got %q", keys)
	}
	sawIP, sawPlain, sawHashed := false, false, false
	for _, k := range keys {
		if !strings.HasPrefix(k, "t:k:{") || !strings.HasSuffix(k, "}") || strings.Count(k, "{") != 1 || strings.Count(k, "}") != 1 {
			t.Errorf("key %q breaks the t:k:{...} structure", k)
		}
		if len(k) > 80 {
			t.Errorf("key %q is %d bytes", k, len(k))
		}
		switch {
		case k == "t:k:{2,127.0.0.1}": // the second alternative's namespace
			sawIP = true
		case k == "t:k:{abc123}":
			sawPlain = true
		case strings.HasPrefix(k, "t:k:{#"):
			sawHashed = true
		}
	}
	if !sawIP || !sawPlain || !sawHashed {
		t.Errorf("keys %q: want the IP, the plain key and a hashed key", keys)
	}
}

func TestReloadKeepsState(t *testing.T) {
	t.Parallel()
	stores(t, func(t *testing.T, redis string) {
		site := func(rate int, body string) string {
			return fmt.Sprintf(`
	rate_limit {
		%s
		zone api {
			rate %d 1h
		}
	}
	respond %q`, redis, rate, body)
		}
		n := startCaddy(t, "", site(3, "v1"))
		drained := time.Now()
		if got := n.statuses(4, "/"); got[200] != 3 || got[429] != 1 {
			t.Fatalf("before reload: %v", got)
		}
		n.reload("", site(3, "v2"))
		r := n.get("/")
		if r.Status != 429 {
			t.Fatalf("after reload the bucket must still be empty: %d %q", r.Status, r.Body)
		}
		check(t, r, "Retry-After", "1200") // a token of 3 per hour
		// A new limit governs the next decisions, on the same bucket. The
		// bucket keeps the time it needs to refill completely (an hour):
		// at 6 per hour that is still an empty bucket, now refilling a
		// token every 600 s.
		n.reload("", site(6, "v3"))
		r = n.get("/")
		if r.Status != 429 {
			t.Fatalf("after raising the limit: %d %q", r.Status, r.Body)
		}
		check(t, r, "Ratelimit-Policy", `"api";q=6;w=3600`)
		// The bucket refills from when it was drained: the seconds the
		// reloads took (more than one on a busy machine) are off the wait.
		waited := int(time.Since(drained)/time.Second) + 1
		checkSeconds(t, r, "Retry-After", "%d", 600-waited, 600)
		checkSeconds(t, r, "Ratelimit", `"api";r=0;t=%d`, 3600-waited, 3600)
	})
}

func TestRedisDownFailsOpen(t *testing.T) {
	t.Parallel()
	r := redistest.Start(t)
	n := startCaddy(t, "", fmt.Sprintf(`
	rate_limit {
		redis {
			address %s
			password s3cret-pa55
			timeout 50ms
		}
		zone api {
			rate 1 1h
			on_error allow
		}
	}
	respond "ok"`, r.Addr))
	// The server has no password: every decision fails, every request passes.
	r.Stop()
	var slow atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 25 {
				t0 := time.Now()
				if resp := n.get("/"); resp.Status != 200 {
					t.Errorf("redis down: status %d, want 200 (fail open)", resp.Status)
				}
				if time.Since(t0) > time.Second {
					slow.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	if slow.Load() > 0 {
		t.Errorf("%d requests took over a second with redis down", slow.Load())
	}
	elapsed := time.Since(start)
	settleLog(n) // the output arrives through a pipe, a little after the fact
	out := n.log.String()
	lines := strings.Count(out, "rate limit store failed")
	if lines == 0 {
		t.Fatalf("no failure logged; output:\n%s", out)
	}
	if max := int(elapsed/time.Second) + 2; lines > max {
		t.Errorf("%d failure lines in %s: logged more than once a second", lines, elapsed)
	}
	if strings.Contains(out, "s3cret-pa55") {
		t.Errorf("the redis password appears in the log")
	}
}

func TestRedisTimeoutFailsOpenWithinTimeout(t *testing.T) {
	t.Parallel()
	r := redistest.Start(t)
	n := startCaddy(t, "", fmt.Sprintf(`
	rate_limit {
		redis {
			address %s
			timeout 40ms
		}
		zone api {
			key {header.X-Key}
			rate 1 1h
		}
	}
	respond "ok"`, r.Addr))
	if got := n.statuses(2, "/", "X-Key: known"); got[200] != 1 || got[429] != 1 {
		t.Fatalf("redis up: %v", got)
	}
	r.Pause()
	defer r.Resume()
	var worst time.Duration
	for i := range 20 {
		t0 := time.Now()
		if resp := n.get("/", fmt.Sprintf("X-Key: new-%d", i)); resp.Status != 200 {
			t.Fatalf("redis hung: status %d, want 200 (fail open)", resp.Status)
		}
		worst = max(worst, time.Since(t0))
	}
	t.Logf("slowest request with redis hung: %s (timeout 40ms)", worst)
	if worst > 500*time.Millisecond {
		t.Errorf("a request took %s with a 40ms timeout", worst)
	}
	// The key Redis denied stays denied without Redis: its token cannot be
	// back before an hour, and this node's deny cache knows it. A denial
	// that asked Redis would have met the timeout or the open breaker and
	// taken the failure policy (a 200 here, or a local bucket's own
	// Retry-After), so the 429 shows it did not wait for Redis; the time
	// is bounded too, generously (timeout + 50% + 20ms at the 95th
	// percentile of 20 requests), so that a busy machine cannot fail it.
	var cached []time.Duration
	for range 20 {
		t0 := time.Now()
		resp := n.get("/", "X-Key: known")
		cached = append(cached, time.Since(t0))
		if retry, _ := strconv.Atoi(resp.Header.Get("Retry-After")); resp.Status != 429 || retry < 3590 || retry > 3600 {
			t.Fatalf("denied key with redis hung: %d Retry-After %q, want 429 from the deny cache with about an hour to wait", resp.Status, resp.Header.Get("Retry-After"))
		}
	}
	slices.Sort(cached)
	const timeout = 40 * time.Millisecond
	bound := timeout + timeout/2 + 20*time.Millisecond
	p95 := cached[len(cached)*95/100-1]
	t.Logf("cached denials with redis hung: median %s, p95 %s, max %s (bound %s)", cached[len(cached)/2], p95, cached[len(cached)-1], bound)
	if p95 > bound {
		t.Errorf("cached denials took %s at the 95th percentile, above %s: they must not wait for Redis", p95, bound)
	}
	r.Resume()
	// Exact limiting is back once Redis answers again.
	deadline := time.Now().Add(5 * time.Second)
	for n.get("/", "X-Key: new-0").Status != 429 {
		if time.Now().After(deadline) {
			t.Fatal("limiting did not resume after redis came back")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestTwoNodesShareOneBucket(t *testing.T) {
	t.Parallel()
	r := redistest.Start(t)
	site := fmt.Sprintf(`
	rate_limit {
		redis {
			address %s
		}
		zone api {
			key shared
			rate 20 1h
		}
	}
	respond "ok"`, r.Addr)
	a, b := startCaddy(t, "", site), startCaddy(t, "", site)
	var admitted atomic.Int64
	var wg sync.WaitGroup
	for _, n := range []*node{a, b, a, b} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 25 {
				if n.get("/").Status == 200 {
					admitted.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	if got := admitted.Load(); got != 20 {
		t.Fatalf("two nodes admitted %d of 100 requests, want exactly the burst of 20", got)
	}
}

func TestSecretsStayOutOfLogs(t *testing.T) {
	t.Parallel()
	r := redistest.Start(t, "--requirepass", "hunter2-secret")
	n := startCaddy(t, "debug", fmt.Sprintf(`
	rate_limit {
		key_digest_secret digest-s3cret-value
		redis {
			address %s
			password hunter2-secret
		}
		zone api {
			key {header.X-API-Key}
			rate 1 1h
		}
	}
	respond "ok"`, r.Addr))
	if got := n.statuses(3, "/", "X-API-Key: sk_live_TOPSECRETKEY"); got[200] != 1 || got[429] != 2 {
		t.Fatalf("with a password: %v", got)
	}
	settleLog(n) // the output arrives through a pipe, a little after the fact
	out := n.log.String()
	denialLine := false
	for _, line := range strings.Split(out, "\n") {
		denialLine = denialLine || strings.Contains(line, `"logger":"http.handlers.rate_limit","msg":"rate limit exceeded","zone":"api"`) &&
			strings.Contains(line, `"key_digest":"`)
	}
	if !denialLine {
		t.Errorf("no debug line of the module for the denial:\n%s", out)
	}
	// The password appears nowhere. The API key appears in none of this
	// module's lines (Caddy's own debug error log dumps request headers,
	// which is the operator's choice of log level and filters).
	for _, line := range strings.Split(out, "\n") {
		if strings.Contains(line, "hunter2-secret") {
			t.Errorf("the redis password appears in Caddy's output: %s", line)
		}
		if strings.Contains(line, "digest-s3cret-value") {
			t.Errorf("the key digest secret appears in Caddy's output: %s", line)
		}
		if strings.Contains(line, `"logger":"http.handlers.rate_limit"`) && strings.Contains(line, "sk_live_TOPSECRETKEY") {
			t.Errorf("the client key appears in the module's log: %s", line)
		}
	}
}
