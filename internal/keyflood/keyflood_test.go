package keyflood

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestRunSendsEveryKeyOnce floods a real HTTP server on loopback: every
// request arrives, each with a key never sent before, and the answers are
// counted by status.
func TestRunSendsEveryKeyOnce(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	seen := map[string]bool{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		k := r.Header.Get("X-Key")
		mu.Lock()
		dup := seen[k]
		seen[k] = true
		mu.Unlock()
		if dup || !strings.HasPrefix(k, "f-") {
			w.WriteHeader(http.StatusConflict)
			return
		}
		if strings.HasSuffix(k, "7") {
			w.WriteHeader(http.StatusTooManyRequests)
			return
		}
		_, _ = w.Write([]byte("ok"))
	}))
	t.Cleanup(srv.Close)
	var sent atomic.Int64
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res, err := Run(ctx, Flood{Addr: strings.TrimPrefix(srv.URL, "http://"), Prefix: "f-", Requests: 10_000, Conns: 3, Depth: 16, Sent: &sent})
	if err != nil {
		t.Fatal(err)
	}
	if res.Status[200] != 9000 || res.Status[429] != 1000 || len(res.Status) != 2 {
		t.Fatalf("answers %v, want 9000 200s and 1000 429s", res.Status)
	}
	if sent.Load() != 10_000 || len(seen) != 10_000 {
		t.Fatalf("sent %d, server saw %d distinct keys; want 10000", sent.Load(), len(seen))
	}
}
