package tests

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fleetlimit/caddy-fleetlimit/internal/keyflood"
	"github.com/fleetlimit/caddy-fleetlimit/internal/redistest"
)

// floodCase is one key flood through a real Caddy: a zone of 100 per 24h
// keyed on a header (a bucket holding one request takes 864 s to be full
// again, so nothing expires during the flood), and an attacker sending a
// new key with every request.
type floodCase struct {
	redis   string // the redis block, or "" for the memory store
	keys    int    // new keys in the flood
	maxKeys int    // the handler's max_keys (0: default)
}

// floodKeys returns the flood size: want, unless FLEETLIMIT_FLOOD_KEYS
// says otherwise (to measure larger floods by hand).
func floodKeys(want int) int {
	if n, err := strconv.Atoi(os.Getenv("FLEETLIMIT_FLOOD_KEYS")); err == nil && n > 0 {
		return n
	}
	return want
}

// rssMB returns the Caddy process's resident memory in MB.
func rssMB(t *testing.T, n *node) float64 {
	t.Helper()
	m, err := n.Metrics()
	if err != nil {
		t.Fatalf("reading metrics: %v", err)
	}
	return m.Sum("process_resident_memory_bytes") / 1e6
}

// runKeyFlood floods a node and checks what must hold whatever the store:
// every flood request is answered, a hot key drained before the flood
// stays exact throughout, and the node's memory stays below rssBound MB
// above its memory before the flood. It returns the node for more checks.
func runKeyFlood(t *testing.T, c floodCase, rssBound float64) *node {
	maxKeys := ""
	if c.maxKeys > 0 {
		maxKeys = "max_keys " + strconv.Itoa(c.maxKeys)
	}
	n := startCaddy(t, "", fmt.Sprintf(`
	rate_limit {
		%s
		%s
		zone flood {
			key {header.X-Key}
			rate 100 24h
		}
	}
	respond "ok"`, c.redis, maxKeys))

	// The hot key spends its burst: from now on it is denied for a day.
	if got := n.statuses(101, "/", "X-Key: hot"); got[200] != 100 || got[429] != 1 {
		t.Fatalf("hot key before the flood: %v, want its burst of 100 then 429", got)
	}
	before := rssMB(t, n)

	var sent atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	// The hot client: one request every 5 ms during the flood.
	hot := &hotClient{}
	wg.Go(func() { hot.run(t, n, stop) })
	// Memory at each million keys.
	rss := map[int]float64{}
	wg.Go(func() { sampleRSS(t, n, &sent, stop, rss) })

	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	start := time.Now()
	res, err := keyflood.Run(ctx, keyflood.Flood{
		Addr: strings.TrimPrefix(n.URL, "http://"), Prefix: "f-", Requests: c.keys,
		Conns: 4, Depth: 32, Sent: &sent,
	})
	took := time.Since(start)
	close(stop)
	wg.Wait()
	after := rssMB(t, n)
	if err != nil {
		t.Fatalf("flood: %v\ncaddy output:\n%s", err, n.log.String())
	}
	if res.Status[200] != c.keys {
		t.Errorf("flood answers %v: want every new key admitted (%d)", res.Status, c.keys)
	}

	t.Logf("%d new keys in %s (%.0f/s); RSS %.1f MB before, %.1f MB after (%.0f B per flood key above before)",
		c.keys, took.Round(time.Millisecond), float64(c.keys)/took.Seconds(), before, after, (after-before)*1e6/float64(c.keys))
	for m := 1_000_000; m <= c.keys; m += 1_000_000 {
		if v, ok := rss[m]; ok {
			t.Logf("RSS at %d keys: %.1f MB", m, v)
		}
	}
	hot.check(t, took)
	if grew := after - before; grew > rssBound {
		t.Errorf("RSS grew %.1f MB during the flood, bound %.1f MB", grew, rssBound)
	}
	return n
}

// hotClient is a client of the hot key during a flood: what it was
// answered, and how fast.
type hotClient struct {
	admitted, denied int
	lat              []time.Duration
}

// run sends a request of the hot key every 5 ms until stop.
func (h *hotClient) run(t *testing.T, n *node, stop <-chan struct{}) {
	cl := &http.Client{Timeout: 10 * time.Second}
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-stop:
			return
		case <-tick.C:
		}
		req, _ := http.NewRequest(http.MethodGet, n.URL+"/", nil)
		req.Header.Set("X-Key", "hot")
		t0 := time.Now()
		resp, err := cl.Do(req)
		if err != nil {
			t.Errorf("hot client: %v", err)
			return
		}
		resp.Body.Close()
		h.lat = append(h.lat, time.Since(t0))
		switch resp.StatusCode {
		case 200:
			h.admitted++
		case 429:
			h.denied++
		default:
			t.Errorf("hot client: status %d", resp.StatusCode)
		}
	}
}

// check: during a flood that took took, the hot key was admitted no more
// than 100 per 24 h refills, and it was sent requests.
func (h *hotClient) check(t *testing.T, took time.Duration) {
	t.Helper()
	slices.Sort(h.lat)
	pct := func(p float64) time.Duration {
		if len(h.lat) == 0 {
			return 0
		}
		return h.lat[min(len(h.lat)-1, int(p*float64(len(h.lat))))]
	}
	// The hot key's bound during the flood: what 100 per 24 h refills.
	bound := 100 * took.Seconds() / 86400
	t.Logf("hot key during the flood: %d requests, %d admitted (bound %.2f), %d denied; latency p50 %s, p99 %s, max %s",
		len(h.lat), h.admitted, bound, h.denied, pct(0.5), pct(0.99), pct(1))
	if float64(h.admitted) > bound {
		t.Errorf("the hot key was admitted %d times during the flood, bound %.2f: its bucket was lost", h.admitted, bound)
	}
	if len(h.lat) == 0 {
		t.Error("the hot client sent nothing during the flood")
	}
}

// sampleRSS notes in rss the node's memory at each million keys sent,
// until stop.
func sampleRSS(t *testing.T, n *node, sent *atomic.Int64, stop <-chan struct{}, rss map[int]float64) {
	next := 1_000_000
	for {
		select {
		case <-stop:
			return
		case <-time.After(20 * time.Millisecond):
		}
		if int(sent.Load()) >= next {
			rss[next] = rssMB(t, n)
			next += 1_000_000
		}
	}
}

// TestKeyFloodMemoryStore floods a node on the memory store with 1 million
// new keys and max_keys 200000. The bound on its memory: the buckets take
// at most about 100 B of heap each (TestMemoryBytesPerKey), the garbage
// collector lets the heap grow to twice what is live (GOGC 100), and a
// flood's requests leave some garbage of their own: 200,000 x 100 B x 2 =
// 40 MB, plus 60 MB for the rest. Without max_keys, the same flood grows
// the node by several hundred MB.
func TestKeyFloodMemoryStore(t *testing.T) {
	// Not parallel: it measures memory and uses both CPUs for a minute.
	const maxKeys = 200_000
	c := floodCase{keys: floodKeys(1_000_000), maxKeys: maxKeys}
	n := runKeyFlood(t, c, maxKeys*100*2/1e6+60)
	m, err := n.Metrics()
	if err != nil {
		t.Fatal(err)
	}
	ev := m.Sum("caddy_rate_limit_evictions_total", "zone", "flood")
	t.Logf("evictions: %.0f", ev)
	if min := float64(c.keys - maxKeys - 1000); ev < min {
		t.Errorf("evictions %.0f, want at least %.0f (the keys beyond max_keys)", ev, min)
	}
}

// TestKeyFloodRedisStore floods a node on a Redis of maxmemory 8mb under
// volatile-ttl with 100,000 new keys (about 13 MB of buckets): no decision
// fails for want of memory (no oom, no breaker opening; a rare timeout of a
// machine busy with the flood is tolerated, at most 0.1%), the hot key stays
// exact (Redis evicts the buckets closest to full), and the node's own
// memory stays bounded (its deny cache is).
func TestKeyFloodRedisStore(t *testing.T) {
	// Not parallel: it measures memory and uses both CPUs.
	r := redistest.Start(t, "--maxmemory", "8mb", "--maxmemory-policy", "volatile-ttl")
	c := floodCase{redis: fmt.Sprintf("redis {\n\t\t\taddress %s\n\t\t}", r.Addr), keys: floodKeys(100_000)}
	n := runKeyFlood(t, c, 60)
	m, err := n.Metrics()
	if err != nil {
		t.Fatal(err)
	}
	errs := m.By("reason", "caddy_rate_limit_store_errors_total")
	t.Logf("store errors by reason: %v", errs)
	for reason, v := range errs {
		if v != 0 && (reason != "timeout" || v > float64(c.keys)/1000) {
			t.Errorf("store errors under volatile-ttl: %s %.0f", reason, v)
		}
	}
	evicted := r.MustDo("INFO", "stats")
	for _, line := range strings.Split(evicted, "\n") {
		if strings.HasPrefix(line, "evicted_keys:") {
			t.Logf("redis %s", strings.TrimSpace(line))
		}
	}
}
