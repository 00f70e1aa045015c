package tests

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fleetlimit/caddy-fleetlimit/internal/localfleet"
)

// slowUpstream is an application behind Caddy's reverse_proxy, on
// loopback, that takes its time and records, per key (the X-Key header),
// how many requests it serves at once and the most it ever served at once.
//
//   - /slow answers after 200 ms (slowDelay);
//   - /hold answers when its client goes away (Caddy cancels the proxied
//     request when its own client does, or dies), or after holdLimit;
//   - anything else answers at once.
//
// A request with an X-Req header closes the channel expected for that id
// (see expect) when it arrives, so that a test can act once the request is
// in the application.
type slowUpstream struct {
	// URL is the server's base URL, http://127.0.0.1:port.
	URL string

	mu       sync.Mutex
	inFlight map[string]int
	maxSeen  map[string]int
	arrivals map[string]chan struct{}
}

// slowDelay is how long /slow takes.
const slowDelay = 200 * time.Millisecond

// holdLimit bounds how long /hold holds a request whose client stays.
const holdLimit = 30 * time.Second

// startSlowUpstream starts a slowUpstream, stopped when the test ends.
func startSlowUpstream(t *testing.T) *slowUpstream {
	t.Helper()
	u := &slowUpstream{inFlight: map[string]int{}, maxSeen: map[string]int{}, arrivals: map[string]chan struct{}{}}
	srv := httptest.NewServer(u)
	t.Cleanup(func() {
		srv.CloseClientConnections()
		srv.Close()
	})
	u.URL = srv.URL
	return u
}

func (u *slowUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	key := r.Header.Get("X-Key")
	u.mu.Lock()
	u.inFlight[key]++
	u.maxSeen[key] = max(u.maxSeen[key], u.inFlight[key])
	if ch, ok := u.arrivals[r.Header.Get("X-Req")]; ok {
		close(ch)
		delete(u.arrivals, r.Header.Get("X-Req"))
	}
	u.mu.Unlock()
	defer func() {
		u.mu.Lock()
		u.inFlight[key]--
		u.mu.Unlock()
	}()
	var wait time.Duration
	switch r.URL.Path {
	case "/slow":
		wait = slowDelay
	case "/hold":
		wait = holdLimit
	}
	if wait > 0 {
		timer := time.NewTimer(wait)
		defer timer.Stop()
		select {
		case <-timer.C:
		case <-r.Context().Done():
			return
		}
	}
	w.Write([]byte("app " + r.URL.Path))
}

// expect returns a channel closed when the request with X-Req id arrives.
func (u *slowUpstream) expect(id string) <-chan struct{} {
	ch := make(chan struct{})
	u.mu.Lock()
	u.arrivals[id] = ch
	u.mu.Unlock()
	return ch
}

// forget drops the channel of a request that will not arrive.
func (u *slowUpstream) forget(id string) {
	u.mu.Lock()
	delete(u.arrivals, id)
	u.mu.Unlock()
}

// current returns how many requests of key the application serves now.
func (u *slowUpstream) current(key string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.inFlight[key]
}

// greatest returns the most requests of key the application served at once.
func (u *slowUpstream) greatest(key string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.maxSeen[key]
}

// waitCurrent polls until the application serves want requests of key at
// once, and fails the test after timeout.
func (u *slowUpstream) waitCurrent(t *testing.T, key string, want int, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for u.current(key) != want {
		if time.Now().After(deadline) {
			t.Fatalf("the application serves %d requests of key %q, not %d, after %s", u.current(key), key, want, timeout)
		}
		time.Sleep(5 * time.Millisecond) // a poll, not a synchronization
	}
}

// held is what holdRequests got: the requests that arrived in the
// application, holding their slots, and the answers of the others.
type held struct {
	// arrived counts the requests that are in the application.
	arrived int
	// answered holds the statuses of the requests answered before they
	// could arrive (a denial: 429), or -1 for a transport error.
	answered []int
	// release ends the requests that arrived (their clients go away) and
	// waits for every request to be done.
	release func()
}

// holdRequests sends n /hold requests of key at once, spread over nodes,
// and waits until each has either arrived in the application or been
// answered (at most timeout).
func (u *slowUpstream) holdRequests(t *testing.T, nodes []*localfleet.Node, key string, n int, timeout time.Duration) held {
	t.Helper()
	type answer struct {
		status int
		err    error
	}
	var h held
	var wg sync.WaitGroup
	cancels := make([]context.CancelFunc, n)
	answers := make([]chan answer, n)
	arrivals := make([]<-chan struct{}, n)
	ids := make([]string, n)
	for i := range n {
		ids[i] = fmt.Sprintf("hold-%d", holdSeq.Add(1))
		arrivals[i] = u.expect(ids[i])
		var ctx context.Context
		ctx, cancels[i] = context.WithCancel(context.Background())
		answers[i] = make(chan answer, 1)
		url := nodes[i%len(nodes)].URL + "/hold"
		wg.Go(func() {
			status, _, err := getLimited(ctx, holdClient, url, "X-Key: "+key, "X-Req: "+ids[i])
			answers[i] <- answer{status, err}
		})
	}
	h.release = func() {
		for _, c := range cancels {
			c()
		}
		wg.Wait()
	}
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	for i := range n {
		select {
		case <-arrivals[i]:
			h.arrived++
		case a := <-answers[i]:
			u.forget(ids[i])
			if a.err != nil {
				h.answered = append(h.answered, -1)
			} else {
				h.answered = append(h.answered, a.status)
			}
		case <-timer.C:
			h.release()
			t.Fatalf("request %d of %d of key %q neither arrived in the application nor was answered within %s", i+1, n, key, timeout)
		}
	}
	return h
}

// holdSeq numbers the requests of holdRequests.
var holdSeq atomic.Int64

// holdClient sends the requests of holdRequests.
var holdClient = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 16}, Timeout: holdLimit + 10*time.Second}

// resetGreatest starts the record of key's greatest concurrency anew.
func (u *slowUpstream) resetGreatest(key string) {
	u.mu.Lock()
	u.maxSeen[key] = u.inFlight[key]
	u.mu.Unlock()
}
