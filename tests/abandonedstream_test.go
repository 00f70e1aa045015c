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
