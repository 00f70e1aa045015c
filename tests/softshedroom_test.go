package tests

import (
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"testing"
	"time"
)

// TestSoftShedRoomFairShare: one key that fills a soft_shed zone's waiting
// room (max_waiting 5) does not turn another key away. The second key's
// first request past the threshold is delayed, not denied: a place is
// taken back from the key holding the most, whose request that would end
// its wait soonest is passed on at once. The first key, then holding more
// than its fair part, is turned away (429, charged nothing). (It was: the
// second key's 11th request answered 429 with 89 tokens left.)
func TestSoftShedRoomFairShare(t *testing.T) {
	t.Parallel()
	n := startCaddy(t, "", `
	rate_limit {
		zone api {
			key {header.X-Key}
			rate 20 1m
			burst 100
			soft_shed 10 4s
			max_waiting 5
		}
	}
	handle_errors 429 {
		respond "{http.error.message}" 429
	}
	respond "ok"`)

	// Key a: its first 10 tokens pass at once; the next 5 wait 3 s (a
	// token's refill), then 4 s each (the max delay), and fill the room.
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	done := fillWaitingRoom(t, ctx, n, "a")

	// Key b: within its burst, never denied because of key a.
	first := time.Now()
	for i := range 10 {
		if r := n.get("/", "X-Key: b"); r.Status != 200 || r.Header.Get("X-Ratelimit-Delay") != "" {
			t.Fatalf("key b, request %d: %d, delay %q; want 200 at once", i+1, r.Status, r.Header.Get("X-Ratelimit-Delay"))
		}
	}
	eleventh := make(chan response, 1)
	start := time.Now()
	sending := start.Sub(first) // the refill while key b sent its first ten
	go func() {
		r, err := n.Do(http.MethodGet, "/", "X-Key: b")
		if err != nil {
			r.Status = -1
		}
		eleventh <- r
	}()

	// Key b's place was taken back from key a: the request of key a whose
	// wait would have ended first (3 s) is passed on at once.
	var held []roomWait
	select {
	case w := <-done:
		held = append(held, w)
		if w.status != 200 || w.took > 2500*time.Millisecond {
			t.Errorf("key a's first request to leave the room: %d after %s; want 200, its 3 s wait cut short", w.status, w.took)
		}
	case r := <-eleventh:
		t.Fatalf("key b's 11th request, with key a holding the room: %d %q (RateLimit %q); want 200 after its delay",
			r.Status, r.Body, r.Header.Get("RateLimit"))
	}
	// Key a now holds more than its fair part of the room (4 places, with
	// two keys waiting): its next request is turned away, charged nothing.
	if r := n.get("/", "X-Key: a"); r.Status != 429 || r.Body != `too many requests waiting for their turn in zone "api"` {
		t.Errorf("key a's 16th request: %d %q; want 429 from the waiting room", r.Status, r.Body)
	}

	r := <-eleventh
	if r.Status != 200 {
		t.Fatalf("key b's 11th request: %d %q (RateLimit %q); want 200 after its delay", r.Status, r.Body, r.Header.Get("RateLimit"))
	}
	// Its delay: the refill of one token (3 s), less what refilled while
	// key b sent its first ten (a few milliseconds on a quiet machine).
	least := int((3*time.Second - sending - 100*time.Millisecond) / time.Millisecond)
	if ms, err := strconv.Atoi(r.Header.Get("X-Ratelimit-Delay")); err != nil || ms < least || ms > 3000 ||
		time.Since(start) < time.Duration(ms)*time.Millisecond {
		t.Errorf("key b's 11th request: X-RateLimit-Delay %q after %s; want %d to 3000 ms (its first ten took %s), waited",
			r.Header.Get("X-Ratelimit-Delay"), time.Since(start), least, sending)
	}
	checkOthersWaitedWholeDelay(t, held, done)
	waitFor(t, 5*time.Second, "the room to empty", func() bool { return roomWaiting(t, n) == 0 })
}

// roomWait is how a request that waited in the room was answered, and
// after how long (status -1: no answer).
type roomWait struct {
	status int
	took   time.Duration
}

// fillWaitingRoom sends key's first 10 requests, which pass at once, then
// 5 more in order that wait and fill the room (max_waiting 5); it returns
// where the 5 report when answered.
func fillWaitingRoom(t *testing.T, ctx context.Context, n *node, key string) <-chan roomWait {
	t.Helper()
	for i := range 10 {
		if r := n.get("/", "X-Key: "+key); r.Status != 200 || r.Header.Get("X-Ratelimit-Delay") != "" {
			t.Fatalf("key %s, request %d: %d, delay %q; want 200 at once", key, i+1, r.Status, r.Header.Get("X-Ratelimit-Delay"))
		}
	}
	done := make(chan roomWait, 5)
	for range 5 {
		go func() {
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, n.URL+"/", nil)
			req.Header.Set("X-Key", key)
			start := time.Now()
			w := roomWait{status: -1}
			if resp, err := http.DefaultClient.Do(req); err == nil {
				resp.Body.Close()
				w.status = resp.StatusCode
			}
			w.took = time.Since(start)
			done <- w
		}()
		time.Sleep(20 * time.Millisecond) // in order
	}
	waitFor(t, 5*time.Second, "key "+key+" to hold the whole room", func() bool { return roomWaiting(t, n) == 5 })
	return done
}

// checkOthersWaitedWholeDelay: the other four requests of key a (the
// first, cut short, is in held already) waited their whole delay.
func checkOthersWaitedWholeDelay(t *testing.T, held []roomWait, done <-chan roomWait) {
	t.Helper()
	for range 4 {
		held = append(held, <-done)
	}
	for _, w := range held[1:] {
		if w.status != 200 || w.took < 3500*time.Millisecond {
			t.Errorf("key a's waits: %+v; want 200 after 4 s but for the one cut short", held)
			break
		}
	}
}

// roomWaiting returns how many requests wait in the node's only zone's
// waiting room, from the stats.
func roomWaiting(t *testing.T, n *node) int64 {
	t.Helper()
	var doc struct {
		Zones []struct {
			Queue struct {
				Waiting int64 `json:"waiting"`
			} `json:"queue"`
		} `json:"zones"`
	}
	if err := json.Unmarshal([]byte(n.adminGet("/rate_limit/stats?series=0")), &doc); err != nil || len(doc.Zones) != 1 {
		t.Fatalf("stats: %v %+v", err, doc)
	}
	return doc.Zones[0].Queue.Waiting
}
