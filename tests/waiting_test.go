package tests

import (
	"encoding/json"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestLeakyBucketWaitingRoom: a leaky bucket zone with max_waiting 2 holds
// at most 2 requests of a burst waiting for their turn on a node: the
// others are answered 429 at once, with Retry-After their wait, and are
// charged nothing; the stats show the room. (Without it a burst of slow
// clients held a goroutine and a connection each, without bound.)
func TestLeakyBucketWaitingRoom(t *testing.T) {
	t.Parallel()
	n := startCaddy(t, "", `
	rate_limit {
		zone shaper {
			key {header.X-Key}
			algorithm leaky_bucket
			rate 2 1s
			burst 20
			max_delay 5s
			max_waiting 2
		}
	}
	handle_errors 429 {
		respond "{http.error.message}" 429
	}
	respond "ok"`)

	// The first request passes at once; the next ones wait 0.5 s, 1 s, ...
	if r := n.get("/", "X-Key: k"); r.Status != 200 {
		t.Fatalf("first request: %d", r.Status)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	got := map[int]int{}
	var retries []string
	for range 6 {
		wg.Go(func() {
			r := n.get("/", "X-Key: k")
			mu.Lock()
			defer mu.Unlock()
			got[r.Status]++
			if r.Status == 429 {
				if !strings.Contains(r.Body, "too many requests waiting") {
					t.Errorf("429 body %q, want the waiting room's error", r.Body)
				}
				retries = append(retries, r.Header.Get("Retry-After"))
			}
		})
		time.Sleep(20 * time.Millisecond) // in order, all within the first wait
	}
	// While two wait, the stats show them.
	checkRoomInStats(t, n)
	wg.Wait()
	if got[200] != 2 || got[429] != 4 {
		t.Fatalf("a burst of 6 behind a room of 2: %v, want two passed after their wait and four 429", got)
	}
	for _, ra := range retries {
		if s, err := strconv.Atoi(ra); err != nil || s < 1 || s > 5 {
			t.Errorf("Retry-After %q, want the wait (1 to 5 s)", ra)
		}
	}
	// The four turned away were charged nothing: once the two waits are
	// over (1 s), the queue holds what 3 admitted left, and the next
	// request waits little (X-RateLimit-Delay), not the 2 s and more that
	// 7 charges would still make it wait.
	r := n.get("/", "X-Key: k")
	delay, err := strconv.Atoi(r.Header.Get("X-Ratelimit-Delay"))
	if r.Header.Get("X-Ratelimit-Delay") == "" {
		delay, err = 0, nil
	}
	if r.Status != 200 || err != nil || delay >= 1500 {
		t.Fatalf("after the burst: %d, X-RateLimit-Delay %q ms: the requests turned away were charged", r.Status, r.Header.Get("X-Ratelimit-Delay"))
	}
}

// checkRoomInStats: the stats' queue of the node's only zone shows the
// room while two wait and four were turned away.
func checkRoomInStats(t *testing.T, n *node) {
	t.Helper()
	var q struct {
		MaxDelay   string `json:"max_delay"`
		MaxWaiting int64  `json:"max_waiting"`
		Waiting    int64  `json:"waiting"`
		TurnedAway uint64 `json:"turned_away"`
	}
	var doc struct {
		Zones []struct {
			Name  string          `json:"name"`
			Queue json.RawMessage `json:"queue"`
		} `json:"zones"`
	}
	if err := json.Unmarshal([]byte(n.adminGet("/rate_limit/stats")), &doc); err != nil || len(doc.Zones) != 1 {
		t.Fatalf("stats: %v %+v", err, doc)
	}
	if err := json.Unmarshal(doc.Zones[0].Queue, &q); err != nil {
		t.Fatalf("queue %s: %v", doc.Zones[0].Queue, err)
	}
	if q.MaxDelay != "5s" || q.MaxWaiting != 2 || q.Waiting != 2 || q.TurnedAway != 4 {
		t.Errorf("the stats' queue while two wait: %+v, want max_delay 5s, max_waiting 2, 2 waiting, 4 turned away", q)
	}
}
