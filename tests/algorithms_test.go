package tests

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestAlgorithmsThroughCaddy(t *testing.T) {
	t.Parallel()
	stores(t, func(t *testing.T, redis string) {
		n := startCaddy(t, "", fmt.Sprintf(`
	rate_limit {
		%s
		zone fixed {
			key {header.X-Key}
			algorithm fixed_window
			rate 3 1h
			match {
				path /fixed
			}
		}
		zone sliding {
			key {header.X-Key}
			algorithm sliding_window
			rate 3 1h
			match {
				path /sliding
			}
		}
		zone log {
			key {header.X-Key}
			algorithm sliding_log
			rate 3 2s
			match {
				path /log
			}
		}
	}
	respond "ok"`, redis))

		// Fixed window: 3 per hour, windows aligned to the clock; a denial
		// waits for the next window.
		if got := n.statuses(3, "/fixed", "X-Key: a"); got[200] != 3 {
			t.Fatalf("fixed: %v", got)
		}
		r := n.get("/fixed", "X-Key: a")
		end := time.Now().Truncate(time.Hour).Add(time.Hour)
		retry, _ := strconv.Atoi(r.Header.Get("Retry-After"))
		if want := int(time.Until(end).Seconds()); r.Status != 429 || retry < want-2 || retry > want+2 {
			t.Errorf("fixed, 4th: %d Retry-After %d, want 429 until the hour ends (%d s)", r.Status, retry, want)
		}
		check(t, r, "Ratelimit-Policy", `"fixed";q=3;w=3600`)

		// Sliding window: 3 per hour.
		if got := n.statuses(4, "/sliding", "X-Key: a"); got[200] != 3 || got[429] != 1 {
			t.Errorf("sliding: %v, want 3 admitted and 1 denied", got)
		}

		// Sliding log: exactly 3 in any 2 s.
		if got := n.statuses(4, "/log", "X-Key: a"); got[200] != 3 || got[429] != 1 {
			t.Fatalf("log: %v", got)
		}
		r = n.get("/log", "X-Key: a")
		check(t, r, "Retry-After", "2")
		time.Sleep(2100 * time.Millisecond)
		if got := n.statuses(4, "/log", "X-Key: a"); got[200] != 3 || got[429] != 1 {
			t.Errorf("log after the window: %v, want 3 admitted again", got)
		}
	})
}

// TestLeakyBucketShapes sends a burst at a leaky bucket of 10 per second:
// the requests are admitted one every 100 ms, each told its delay, and
// those that would wait beyond max_delay are denied.
func TestLeakyBucketShapes(t *testing.T) {
	t.Parallel()
	stores(t, func(t *testing.T, redis string) {
		n := startCaddy(t, "debug", fmt.Sprintf(`
	rate_limit {
		%s
		zone shape {
			key {header.X-Key}
			algorithm leaky_bucket
			rate 10 1s
			burst 20
			max_delay 450ms
		}
	}
	respond "ok"`, redis))
		checkBurstShaped(t, n)

		// A client that gives up while waiting is released.
		time.Sleep(time.Second) // the queue drains
		for range 4 {
			n.get("/", "X-Key: gone") // 0, 100, 200, 300 ms queued
		}
		cl := &http.Client{Timeout: 50 * time.Millisecond}
		req, _ := http.NewRequest("GET", n.URL+"/", nil)
		req.Header.Set("X-Key", "gone")
		if _, err := cl.Do(req); err == nil {
			t.Fatal("the request should have timed out on the client side")
		}
		deadline := time.Now().Add(2 * time.Second)
		for !strings.Contains(n.log.String(), "client went away while waiting for its turn") {
			if time.Now().After(deadline) {
				t.Fatalf("no sign that the waiting request was released:\n%s", n.log.String())
			}
			time.Sleep(20 * time.Millisecond)
		}
	})
}

// checkBurstShaped sends 8 requests of one key 2 ms apart: 5 are admitted
// with waits of 0 to 400 ms, none answered before its wait, and the rest
// denied.
func checkBurstShaped(t *testing.T, n *node) {
	t.Helper()
	type answer struct {
		status int
		delay  int
		at     time.Duration
	}
	answers := make([]answer, 8)
	start := time.Now()
	var wg sync.WaitGroup
	for i := range answers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := n.get("/", "X-Key: burst")
			d, _ := strconv.Atoi(r.Header.Get("X-Ratelimit-Delay"))
			answers[i] = answer{r.Status, d, time.Since(start)}
		}()
		time.Sleep(2 * time.Millisecond) // keep the arrival order
	}
	wg.Wait()
	var delays []int
	admitted := 0
	for _, a := range answers {
		switch a.status {
		case 200:
			admitted++
			delays = append(delays, a.delay)
			if a.at < time.Duration(a.delay)*time.Millisecond-5*time.Millisecond {
				t.Errorf("a request told to wait %d ms was answered after %s", a.delay, a.at)
			}
		case 429:
		default:
			t.Errorf("status %d", a.status)
		}
	}
	// 0, 100, ..., 400 ms fit max_delay 450ms (minus the few ms between
	// arrivals); the rest are denied. On a busy machine the requests may
	// reach Caddy spread over more than 100 ms, and the bucket leaks one
	// place per 100 ms of that spread: the latest arrival is bounded by
	// each answer's time less its wait.
	var arrivals time.Duration
	for _, a := range answers {
		arrivals = max(arrivals, a.at-time.Duration(a.delay)*time.Millisecond)
	}
	if most := 5 + int(arrivals/(100*time.Millisecond)); admitted < 5 || admitted > most {
		t.Errorf("admitted %d of 8 (delays %v), want 5 (at most %d, the arrivals spread over up to %s): waits of 0 to 400 ms",
			admitted, delays, most, arrivals)
	}
	maxDelay := 0
	for _, d := range delays {
		maxDelay = max(maxDelay, d)
	}
	if maxDelay < 300 || maxDelay > 400 { // arrivals spread further on a busy machine
		t.Errorf("longest delay %d ms (delays %v), want about 400", maxDelay, delays)
	}
}

// TestCaddyRatelimitForm runs mholt/caddy-ratelimit's Caddyfile unchanged:
// at most `events` in any `window`, distributed accepted with a warning.
func TestCaddyRatelimitForm(t *testing.T) {
	t.Parallel()
	n := startCaddy(t, "", `
	rate_limit {
		zone dynamic_example {
			key {header.X-Key}
			events 2
			window 3s
		}
		distributed {
			read_interval 5s
			write_interval 5s
		}
		jitter 0.5
	}
	respond "I'm behind the rate limiter!"`)
	if got := n.statuses(3, "/", "X-Key: k"); got[200] != 2 || got[429] != 1 {
		t.Fatalf("events 2 window 3s: %v", got)
	}
	// Jitter adds up to half of the wait: Retry-After in [3, 5] (rounded up).
	seen := map[string]bool{}
	for range 20 {
		r := n.get("/", "X-Key: k")
		v, _ := strconv.Atoi(r.Header.Get("Retry-After"))
		if r.Status != 429 || v < 3 || v > 5 {
			t.Fatalf("with jitter 0.5: %d Retry-After %d, want 429 and 3 to 5", r.Status, v)
		}
		seen[r.Header.Get("Retry-After")] = true
	}
	waitLog(t, n, "'distributed' block of caddy-ratelimit is accepted and ignored")
	if !strings.Contains(n.log.String(), "'distributed' block of caddy-ratelimit is accepted and ignored") {
		t.Errorf("no warning about the distributed block:\n%s", n.log.String())
	}
}

// TestIPv6Prefix: with ipv6_prefix 64 the addresses of one /64 share a
// bucket; another /64 has its own.
func TestIPv6Prefix(t *testing.T) {
	t.Parallel()
	n := startCaddy(t, "", `
	rate_limit {
		zone perip {
			key {header.X-IP}
			rate 2 1h
			ipv4_prefix 24
			ipv6_prefix 64
		}
	}
	respond "ok"`)
	for i, ip := range []string{"2001:db8:0:1::1", "2001:db8:0:1::2", "2001:db8:0:1:ffff::9"} {
		want := 200
		if i == 2 {
			want = 429
		}
		if r := n.get("/", "X-IP: "+ip); r.Status != want {
			t.Errorf("%s: %d, want %d (one bucket for the /64)", ip, r.Status, want)
		}
	}
	if r := n.get("/", "X-IP: 2001:db8:0:2::1"); r.Status != 200 {
		t.Errorf("another /64: %d, want 200", r.Status)
	}
	if got := n.statuses(3, "/", "X-IP: 192.0.2.1"); got[200] != 2 {
		t.Errorf("192.0.2.1: %v", got)
	}
	if r := n.get("/", "X-IP: 192.0.2.200"); r.Status != 429 {
		t.Errorf("192.0.2.200 shares the /24: %d, want 429", r.Status)
	}
}
