package tests

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// streamApp is the upstream of the tests of abandoned streams: an LLM that
// answers 200 at once, streams its answer for ms milliseconds (a chunk
// every 100 ms) and reports the tokens used, n, in an X-Tokens-Used
// trailer; with h, it also sends X-Tokens-Used: h in the header (a
// provisional figure the trailer replaces). /quick answers 200 at once and
// reports nothing.
func streamApp(t *testing.T) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if path.Base(r.URL.Path) == "quick" {
			return
		}
		q := r.URL.Query()
		if h := q.Get("h"); h != "" {
			w.Header().Set("X-Tokens-Used", h)
		}
		w.Header().Set("Trailer", "X-Tokens-Used")
		w.WriteHeader(http.StatusOK)
		ms, _ := strconv.Atoi(q.Get("ms"))
		for end := time.Now().Add(time.Duration(ms) * time.Millisecond); ; {
			if _, err := fmt.Fprintln(w, "chunk"); err != nil {
				return
			}
			w.(http.Flusher).Flush()
			if !time.Now().Before(end) {
				break
			}
			select {
			case <-r.Context().Done():
				return
			case <-time.After(100 * time.Millisecond):
			}
		}
		w.Header().Set("X-Tokens-Used", q.Get("n")) // the trailer
	}))
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}

// abandon sends method path with key on n and hangs up after leave (as
// curl -m does), whatever has come of the answer by then; it returns the
// status, 0 when none had come.
func abandon(t *testing.T, n *node, method, path, key string, leave time.Duration) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), leave)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, n.URL+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("X-Key", key)
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	if _, err := io.Copy(io.Discard, resp.Body); err == nil {
		t.Errorf("%s %s: the whole answer came within %v, want the client to leave mid-stream", method, path, leave)
	}
	return resp.StatusCode
}

// remainingOf returns zone's remaining tokens (RateLimit's r) in r's
// fields, or -1 when it reports none.
func remainingOf(r response, zone string) int {
	m := regexp.MustCompile(`"` + regexp.QuoteMeta(zone) + `";r=(\d+)`).FindStringSubmatch(r.Header.Get("RateLimit"))
	if m == nil {
		return -1
	}
	v, _ := strconv.Atoi(m[1])
	return v
}

// TestCountStatusStreamAbandoned: behind count_status 2xx, a streamed 200
// whose client hangs up mid-body (Caddy's reverse_proxy then aborts the
// handler with a panic of http.ErrAbortHandler) is a 200, and keeps its
// charge: the status written is the status.
func TestCountStatusStreamAbandoned(t *testing.T) {
	t.Parallel()
	n := startCaddy(t, "", `
	rate_limit {
		zone work {
			key {header.X-Key}
			rate 10 1h
			count_status 2xx
		}
	}
	reverse_proxy `+streamApp(t)+` {
		flush_interval -1
	}`)
	var wg sync.WaitGroup
	for range 3 {
		wg.Go(func() {
			if s := abandon(t, n, http.MethodGet, "/slow?ms=2000&n=1", "curl", time.Second); s != http.StatusOK {
				t.Errorf("streamed answer: status %d, want 200 before the client leaves", s)
			}
		})
	}
	wg.Wait()
	time.Sleep(300 * time.Millisecond) // a refund would have landed by now
	r := n.get("/quick", "X-Key: curl")
	// 10 tokens, 3 streams charged, 1 now.
	if got := remainingOf(r, "work"); r.Status != http.StatusOK || got != 6 {
		t.Fatalf("after three streamed 200s whose client left mid-body: %d, remaining %d (%q); want 200 and 6 (each stream keeps its charge)",
			r.Status, got, r.Header.Get("RateLimit"))
	}
}

// TestCostHeaderAbandoned: a stream whose cost comes only in a trailer is
// paid for however its client leaves. Three zones, one per path, burst
// 1000, refilling 1000 a day (none in the test's time):
//   - tokens (no abort): a stream its client abandons before the trailer
//     pays the most a settlement charges, its cost plus the burst (1001):
//     the key is then denied; a stream read to its end pays what the
//     trailer reports (500);
//   - capped (abort 300): an abandoned stream pays 300, and so does a
//     HEAD (no body, so no trailer), and a stream whose header reported a
//     provisional 0 before a trailer that never came.
func TestCostHeaderAbandoned(t *testing.T) {
	t.Parallel()
	n := startCaddy(t, "", `
	rate_limit {
		zone tokens {
			key {header.X-Key}
			rate 1000 24h
			cost_header X-Tokens-Used
			match {
				path /tokens/*
			}
		}
		zone capped {
			key {header.X-Key}
			rate 1000 24h
			cost_header X-Tokens-Used abort 300
			match {
				path /capped/*
			}
		}
	}
	reverse_proxy `+streamApp(t)+` {
		flush_interval -1
	}`)
	var wg sync.WaitGroup
	for _, c := range []struct{ method, path, key string }{
		{http.MethodGet, "/tokens/stream?ms=2000&n=500", "left"},
		{http.MethodGet, "/capped/stream?ms=2000&n=500", "left"},
		{http.MethodGet, "/capped/stream?ms=2000&h=0&n=500", "provisional"},
	} {
		wg.Go(func() {
			if s := abandon(t, n, c.method, c.path, c.key, time.Second); s != http.StatusOK {
				t.Errorf("%s: status %d, want 200 before the client leaves", c.path, s)
			}
		})
	}
	wg.Go(func() {
		if r := n.do(http.MethodHead, "/capped/stream?ms=200&n=500", "X-Key: head"); r.Status != http.StatusOK {
			t.Errorf("HEAD: %d", r.Status)
		}
	})
	wg.Go(func() {
		if r := n.get("/tokens/stream?ms=200&n=500", "X-Key: full"); r.Status != http.StatusOK || !strings.Contains(r.Body, "chunk") {
			t.Errorf("a stream read to its end: %d %q", r.Status, r.Body)
		}
	})
	wg.Wait()
	for _, c := range []struct {
		zone, key string
		settled   int // what the request paid in the end; -1: more than the burst
		what      string
	}{
		{"tokens", "full", 500, "a stream read to its end pays its trailer's 500"},
		{"tokens", "left", -1, "an abandoned stream pays its cost plus the burst"},
		{"capped", "left", 300, "an abandoned stream pays abort 300"},
		{"capped", "provisional", 300, "an abandoned stream pays abort 300, not the header's provisional 0"},
		{"capped", "head", 300, "a HEAD, which cannot carry a trailer, pays abort 300"},
	} {
		checkSettled(t, n, c.zone, c.key, c.settled, c.what)
	}
}

// checkSettled waits until the key's bucket in zone (burst 1000, no
// refill to speak of) shows a request of cost 1 settled on settled
// tokens: probes of /<zone>/quick, each charged 1, find the bucket at
// 1000 - settled less the probes before them (denied when settled is
// -1: beyond the burst).
func checkSettled(t *testing.T, n *node, zone, key string, settled int, what string) {
	t.Helper()
	for probes := 0; ; probes++ {
		r := n.get("/"+zone+"/quick", "X-Key: "+key)
		got := remainingOf(r, zone)
		switch {
		case settled < 0 && r.Status == http.StatusTooManyRequests:
			t.Logf("%s: denied, Retry-After %ss (RateLimit %q)", what, r.Header.Get("Retry-After"), r.Header.Get("RateLimit"))
			return
		case r.Status != http.StatusOK:
			t.Fatalf("%s: probe %d answered %d (RateLimit %q)", what, probes, r.Status, r.Header.Get("RateLimit"))
		case settled >= 0 && got == 1000-settled-probes-1:
			t.Logf("%s: remaining %d after %d probes", what, got, probes+1)
			return
		case got != 1000-1-probes-1 || probes == 20:
			// Neither settled as wanted nor yet settled at all.
			want := "denied (settled beyond the burst)"
			if settled >= 0 {
				want = fmt.Sprintf("remaining %d (settled on %d)", 1000-settled-probes-1, settled)
			}
			t.Fatalf("%s: remaining %d after %d probes (RateLimit %q), want %s",
				what, got, probes+1, r.Header.Get("RateLimit"), want)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestCostHeaderTrailerWins: an upstream that sends X-Tokens-Used: 0 in
// the header, announces the same field as a trailer and ends with 500 is
// settled on 500: the trailer wins over the header (reverse_proxy adds the
// trailer's values after the header's under the same name).
func TestCostHeaderTrailerWins(t *testing.T) {
	t.Parallel()
	n := startCaddy(t, "", `
	rate_limit {
		zone tokens {
			key {header.X-Key}
			rate 1000 24h
			cost_header X-Tokens-Used
		}
	}
	reverse_proxy `+streamApp(t)+` {
		flush_interval -1
	}`)
	if r := n.get("/tokens/both?ms=200&h=0&n=500", "X-Key: k"); r.Status != http.StatusOK {
		t.Fatalf("streamed answer: %d", r.Status)
	}
	checkSettled(t, n, "tokens", "k", 500, "a stream whose header said 0 and trailer 500")
}
