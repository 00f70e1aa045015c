package tests

import (
	"context"
	"net/http"
	"testing"
	"time"
)

// TestCountStatusRefundAfterAbandonedDelay: a request that a leaky_bucket
// zone delays and a count_status zone charges, whose client goes away
// during the delay (answered 499, not a counted status), gets its
// count_status charge back: the next successful login of the user passes.
func TestCountStatusRefundAfterAbandonedDelay(t *testing.T) {
	t.Parallel()
	_, upstream := startLoginApp(t)
	n := startCaddy(t, "", `
	rate_limit {
		zone shape {
			key {header.X-Shape}
			algorithm leaky_bucket
			rate 1 10s
			burst 5
		}
		zone login {
			key {header.X-User}
			rate 1 15m
			count_status 401
		}
	}
	reverse_proxy `+upstream)
	// The shaper's first request of a key passes at once, the second
	// waits 10 s.
	if r := sendLogin(t, n.Node, "X-Shape: s", "X-User: carol", "X-Password: right"); r.Status != 200 {
		t.Fatalf("first login: %d %q", r.Status, r.Body)
	}
	// Its refund goes in after the response, in the background: wait for
	// it, so that the login zone does not deny the next login at once.
	waitRemaining(t, n, "login", "carol", 1)
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, n.URL+"/login", nil)
	req.Header.Set("X-Shape", "s")
	req.Header.Set("X-User", "carol")
	req.Header.Set("X-Password", "right")
	if resp, err := http.DefaultClient.Do(req); err == nil {
		resp.Body.Close()
		t.Fatalf("the delayed login was answered %d within 1 s, want a delay of about 10 s", resp.StatusCode)
	}
	// A login on another shaper key is not delayed: it must find the
	// user's token back (the abandoned request was answered 499).
	var got []int
	deadline := time.Now().Add(10 * time.Second)
	for {
		r := sendLogin(t, n.Node, "X-Shape: other", "X-User: carol", "X-Password: right")
		got = append(got, r.Status)
		if r.Status == 200 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("logins after a request abandoned during its delay: %v (last RateLimit: %q), want 200 (its count_status charge refunded)", got, r.Header.Get("RateLimit"))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// waitRemaining waits, for at most 10 s, until the key's first rule in
// zone has want tokens left, as the admin key lookup reads them.
func waitRemaining(t *testing.T, n *node, zone, key string, want int64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		got, body := n.lookUp(zone, key)
		if len(got.Keys) > 0 && len(got.Keys[0].Rules) > 0 && got.Keys[0].Rules[0].Remaining == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("key %q of zone %s never had %d tokens left: %s", key, zone, want, body)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
