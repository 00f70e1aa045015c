package tests

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// TestCountStatusClientLeavesMidRequest: behind count_status 2xx, a client
// that goes away after its request was passed on, before the upstream
// answered, keeps its charge: what the upstream made of it is unknown, and
// an attacker must not get unlimited upstream work by hanging up on each
// request. (The invariant checker found it, seed 6041: 645 tokens admitted
// of a bound of 110.)
func TestCountStatusClientLeavesMidRequest(t *testing.T) {
	t.Parallel()
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-time.After(3 * time.Second):
		case <-r.Context().Done():
		}
		w.WriteHeader(http.StatusOK)
	}))
	t.Cleanup(slow.Close)
	stores(t, func(t *testing.T, redis string) {
		n := startCaddy(t, "", fmt.Sprintf(`
	rate_limit {
		%s
		zone work {
			key {header.X-Key}
			rate 2 1h
			count_status 2xx
		}
	}
	reverse_proxy %s`, redis, strings.TrimPrefix(slow.URL, "http://")))
		for i := range 2 {
			ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, n.URL+"/", nil)
			req.Header.Set("X-Key", "hangup")
			if resp, err := http.DefaultClient.Do(req); err == nil {
				resp.Body.Close()
				t.Fatalf("request %d was answered %d, want the client to leave first", i, resp.StatusCode)
			}
			cancel()
		}
		time.Sleep(500 * time.Millisecond) // a refund would be in by now
		if r := n.get("/", "X-Key: hangup"); r.Status != 429 {
			t.Fatalf("after two requests whose client left mid-request: %d, want 429 (they keep their charge)", r.Status)
		}
	})
}
