package tests

import (
	"bufio"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fleetlimit/caddy-fleetlimit/internal/localfleet"
	"github.com/fleetlimit/caddy-fleetlimit/internal/redistest"
)

// llmApp is the upstream of the cost_header tests: an LLM that reports
// the tokens a prompt used in X-Tokens-Used, in the header or (streamed)
// in a trailer.
type llmApp struct {
	// gate, if set, holds the /used answers until three prompts are in
	// flight, so that all three are admitted before any settles.
	gate chan struct{}
	once sync.Once
	mu   sync.Mutex
	seen int
}

func (a *llmApp) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	n := r.URL.Query().Get("n")
	switch r.URL.Path {
	case "/used": // the header (with a gate, once three prompts are in flight)
		if a.gate != nil {
			a.mu.Lock()
			a.seen++
			if a.seen == 3 {
				a.once.Do(func() { close(a.gate) })
			}
			a.mu.Unlock()
			select {
			case <-a.gate:
			case <-time.After(10 * time.Second):
			}
		}
		w.Header().Set("X-Tokens-Used", n)
		fmt.Fprintln(w, "answer")
	case "/stream": // the count in a trailer, after a streamed body
		w.Header().Set("Trailer", "X-Tokens-Used")
		for i := range 3 {
			fmt.Fprintf(w, "chunk %d\n", i)
			w.(http.Flusher).Flush()
			time.Sleep(20 * time.Millisecond)
		}
		w.Header().Set("X-Tokens-Used", n)
	case "/slow": // the header, then a stream the client leaves
		if n != "" {
			w.Header().Set("X-Tokens-Used", n)
		} else {
			w.Header().Set("Trailer", "X-Tokens-Used")
		}
		for i := range 100 {
			if _, err := fmt.Fprintf(w, "chunk %d\n", i); err != nil {
				return
			}
			w.(http.Flusher).Flush()
			select {
			case <-r.Context().Done():
				return
			case <-time.After(50 * time.Millisecond):
			}
		}
		w.Header().Set("X-Tokens-Used", "400") // the trailer, never reached
	}
}

// llmSite is an LLM gateway: 250 tokens a second per key, burst 500, each
// prompt admitted on 1 and settled on what the upstream reports.
func llmSite(redis, upstream string) string {
	return fmt.Sprintf(`
	rate_limit {
		%s
		zone llm {
			key {header.X-Key}
			rate 250 1s
			burst 500
			cost_header X-Tokens-Used
		}
	}
	reverse_proxy %s {
		flush_interval -1
	}`, redis, upstream)
}

// bucketPTTL returns how long the key's bucket of zone llm takes to be
// full again, by its Redis TTL (the bucket expires when it is full), in
// milliseconds; 0 when it is full.
func bucketPTTL(t *testing.T, r *redistest.Server, key string) int64 {
	t.Helper()
	v, err := r.Do("PTTL", "rl:llm:{"+key+"}")
	if err != nil {
		t.Fatalf("PTTL: %v", err)
	}
	n, _ := strconv.ParseInt(v, 10, 64)
	return max(n, 0)
}

// TestCostHeader: three Caddy nodes on one Redis in front of an LLM that
// reports the tokens each prompt used.
//   - Three prompts sent at once, one per node, each admitted on cost 1,
//     each answered with X-Tokens-Used: 500: the bucket (burst 500) owes
//     1,500 tokens, 1,000 beyond its capacity. The key's next prompts are
//     denied, with a Retry-After that counts the whole debt, until the
//     refill (250/s) has repaid it: about 4s.
//   - A streamed answer with the count in a trailer is settled on it.
//   - A client that leaves mid-stream is charged what the upstream reported
//     in the header, or, when the cost was to come in a trailer, the most
//     a settlement charges: its up-front cost plus the burst.
func TestCostHeader(t *testing.T) {
	t.Parallel()
	r := redistest.Start(t)
	app := &llmApp{gate: make(chan struct{})}
	srv := httptest.NewServer(app)
	t.Cleanup(srv.Close)
	nodes := startFleet(t, 3, llmSite(redisBlock(r), strings.TrimPrefix(srv.URL, "http://")))

	t.Run("debt", func(t *testing.T) { checkCostDebtRepaid(t, r, nodes) })

	t.Run("trailer", func(t *testing.T) {
		resp, err := nodes[1].Do("GET", "/stream?n=300", "X-Key: bob")
		if err != nil || resp.Status != http.StatusOK || !strings.Contains(resp.Body, "chunk 2") {
			t.Fatalf("streamed prompt: %v %+v", err, resp)
		}
		// 300 tokens at 250/s: the bucket is full again in 1.2s.
		waitFor(t, 5*time.Second, "the trailer's settlement", func() bool { return bucketPTTL(t, r, "bob") > 900 })
		t.Logf("after a streamed answer whose trailer reported 300 tokens, the bucket is full again in %dms", bucketPTTL(t, r, "bob"))
	})

	t.Run("client leaves", func(t *testing.T) {
		for _, c := range []struct {
			key, query string
			want       string
		}{
			{"carol", "?n=200", "the 200 tokens the header reported"},
			{"dave", "", "its cost plus the burst: the trailer never came"},
		} {
			leaveMidStream(t, nodes[2], "/slow"+c.query, c.key)
			// 200 tokens at 250/s: full again in 0.8s; 501: in 2s.
			owes := map[string]int64{"carol": 500, "dave": 1500}[c.key]
			var ms int64
			waitFor(t, 5*time.Second, "the settlement of "+c.key, func() bool { ms = bucketPTTL(t, r, c.key); return ms > owes })
			if ms > owes+600 {
				t.Errorf("%s left mid-stream: the bucket owes %dms, want it charged %s", c.key, ms, c.want)
			}
			t.Logf("%s left mid-stream and was charged %s: the bucket owes %dms", c.key, c.want, ms)
		}
	})

	var settled, lost float64
	for _, n := range nodes {
		m, err := n.Metrics()
		if err != nil {
			t.Fatal(err)
		}
		settled += m.Sum("caddy_rate_limit_settlements_total", "zone", "llm", "result", "charged")
		lost += m.Sum("caddy_rate_limit_settlements_total", "zone", "llm", "result", "lost")
	}
	t.Logf("settlements charged across the nodes: %.0f, lost: %.0f", settled, lost)
	if settled < 5 || lost != 0 {
		t.Errorf("settlements charged %.0f (want at least 5: three prompts, a trailer, a header), lost %.0f (want 0)", settled, lost)
	}
}

// checkCostDebtRepaid: three prompts at once, one per node, each admitted
// on cost 1 and answered with X-Tokens-Used: 500, leave the key owing
// 1,000 tokens beyond its burst; its next prompts are denied with a
// Retry-After that counts the whole debt, until the refill has repaid it.
func checkCostDebtRepaid(t *testing.T, r *redistest.Server, nodes []*localfleet.Node) {
	var wg sync.WaitGroup
	statuses := make([]int, len(nodes))
	for i, n := range nodes {
		wg.Go(func() {
			resp, err := n.Do("GET", "/used?n=500", "X-Key: alice")
			if err != nil {
				t.Errorf("prompt through node %d: %v", i, err)
				return
			}
			statuses[i] = resp.Status
		})
	}
	wg.Wait()
	if fmt.Sprint(statuses) != "[200 200 200]" {
		t.Fatalf("three prompts at once: %v, want all admitted on their up-front cost", statuses)
	}
	settledAt := time.Now()
	// The settlements go after the responses: wait for the third.
	waitFor(t, 5*time.Second, "the three settlements", func() bool { return bucketPTTL(t, r, "alice") > 5000 })
	owed, landed := bucketPTTL(t, r, "alice"), time.Since(settledAt)
	resp, err := nodes[0].Do("GET", "/used?n=1", "X-Key: alice")
	if err != nil {
		t.Fatal(err)
	}
	deniedAt := time.Now()
	retry, _ := strconv.Atoi(resp.Header.Get("Retry-After"))
	if resp.Status != http.StatusTooManyRequests || retry < 4 {
		t.Fatalf("a prompt while the key owes %dms of refill: %d, Retry-After %q; want 429 and at least 4s", owed, resp.Status, resp.Header.Get("Retry-After"))
	}
	// Poll (each probe is denied, and costs nothing) until a prompt
	// passes again.
	var repaid time.Duration
	var probes int
	for range 200 {
		n := nodes[probes%len(nodes)]
		probes++
		resp, err := n.Do("GET", "/used?n=1", "X-Key: alice")
		if err != nil {
			t.Fatal(err)
		}
		if resp.Status == http.StatusOK {
			repaid = time.Since(deniedAt)
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("cost_header debt: 3 prompts at cost 1 reported 500 each on 3 nodes; the bucket (burst 500, 250/s) owed %dms of refill (%d tokens) %v after the responses; "+
		"the next prompt was denied with Retry-After %ds, and one passed again %v after it (%d probes)",
		owed, owed*250/1000, landed.Round(time.Millisecond), retry, repaid.Round(time.Millisecond), probes)
	switch {
	case repaid == 0:
		t.Fatal("no prompt passed within 200 probes: the debt was never repaid")
	case repaid < 3*time.Second:
		t.Errorf("a prompt passed %v after the denial: the debt of 1,000 tokens beyond the burst takes 4s to repay", repaid)
	case repaid > time.Duration(retry)*time.Second+3*time.Second:
		t.Errorf("a prompt passed only %v after a Retry-After of %ds", repaid, retry)
	}
}

// leaveMidStream requests path with the key on node n, reads the first
// chunk of the streamed answer and hangs up.
func leaveMidStream(t *testing.T, n *localfleet.Node, path, key string) {
	t.Helper()
	req, err := http.NewRequest("GET", n.URL+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("X-Key", key)
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr, Timeout: 10 * time.Second}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("%s: %d", path, resp.StatusCode)
	}
	line, err := bufio.NewReader(resp.Body).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "chunk") {
		t.Fatalf("%s: first chunk %q, %v", path, line, err)
	}
	resp.Body.Close() // hang up mid-stream
}

// TestCostHeaderQuota: a gateway's tokens per minute and per month, both
// settled on what the upstream reports: three prompts at cost 1 that
// report 400 tokens each spend the monthly quota of 1,000 (the third is
// admitted on its cost of 1, and then settled), and the fourth is denied
// until the month ends. On one node's memory store.
func TestCostHeaderQuota(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(&llmApp{})
	t.Cleanup(srv.Close)
	n := startCaddy(t, "", fmt.Sprintf(`
	rate_limit {
		zone llm {
			key {header.X-Key}
			rate 100000 1m
			quota 1000 per month
			cost_header X-Tokens-Used
		}
	}
	reverse_proxy %s`, strings.TrimPrefix(srv.URL, "http://")))
	var statuses []int
	var last response
	for i := range 4 {
		last = n.do("GET", "/used?n=400", "X-Key: erin")
		statuses = append(statuses, last.Status)
		if i < 3 {
			time.Sleep(200 * time.Millisecond) // the settlement lands after the response
		}
	}
	t.Logf("four prompts reporting 400 tokens each against a monthly quota of 1,000: %v; the fourth's Retry-After %ss, RateLimit %q",
		statuses, last.Header.Get("Retry-After"), last.Header.Get("RateLimit"))
	if fmt.Sprint(statuses) != "[200 200 200 429]" {
		t.Fatalf("statuses %v, want the quota spent by the third prompt's settlement", statuses)
	}
	if !strings.Contains(last.Header.Get("RateLimit"), `"llm.quota";r=0`) {
		t.Errorf("the fourth prompt's RateLimit %q does not show the quota spent", last.Header.Get("RateLimit"))
	}
}
