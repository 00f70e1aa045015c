package chaos

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// hugeCost is the cost the hugecost client sends now and then: the largest
// int64, which wraps any sum it enters.
const hugeCost = int64(1<<63 - 1)

// request is what a client observed of one of its requests.
type request struct {
	id      string
	client  *Client
	target  int
	key     string // the X-Key sent ("" for none)
	cost    int64  // the X-Cost sent
	node    int
	sent    time.Time
	done    time.Time
	status  int           // 0 on a transport error or an abort
	denier  string        // the zone a 429 named
	reason  string        // the error a 429 gave
	gen     string        // X-Gen of the answer
	fromApp bool          // the answer carries X-Upstream
	fields  bool          // the answer carries rate limit fields
	delayed bool          // a leaky bucket or a soft shed held it (X-Ratelimit-Delay)
	delay   time.Duration // how long, as X-Ratelimit-Delay says
	hungUp  bool          // the client hung up after a streamed answer's first chunk
	head    bool          // a HEAD: its answer has no body, so no trailer
	rls     bool          // a ShouldRateLimit call of the RLS client: 200 is OK, 429 OVER_LIMIT
	err     string
}

// load runs the scenario's clients against the nodes' URLs until ctx ends,
// and returns every request they sent.
func (s *Scenario) load(ctx context.Context, urls func(i int) string, nodes int) []*request {
	var (
		mu  sync.Mutex
		all []*request
		wg  sync.WaitGroup
	)
	for _, c := range s.Clients {
		for w := range c.Workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				got := s.runWorker(ctx, c, w, urls, nodes)
				mu.Lock()
				all = append(all, got...)
				mu.Unlock()
			}()
		}
	}
	wg.Wait()
	return all
}

// runWorker is one worker of client c: one request at a time, to a node
// drawn at random, over keep-alive connections.
func (s *Scenario) runWorker(ctx context.Context, c *Client, w int, urls func(i int) string, nodes int) []*request {
	r := rand.New(rand.NewPCG(s.Seed, uint64(c.ID*16+w)))
	tr := &http.Transport{MaxIdleConnsPerHost: 2, DisableCompression: true}
	bindSource(tr, c)
	defer tr.CloseIdleConnections()
	timeout := 5 * time.Second
	if c.Abort > 0 {
		timeout = c.Abort
	}
	cl := &http.Client{Transport: tr, Timeout: timeout}
	var out []*request
	for i := 0; ctx.Err() == nil; i++ {
		q := &request{id: fmt.Sprintf("%d-%d-%d", c.ID, w, i), client: c, target: c.Targets[i%len(c.Targets)], key: c.Key, cost: c.Cost, node: r.IntN(nodes)}
		if c.Rotate > 0 {
			q.key = fmt.Sprintf("%s-%d", c.Key, (i/c.Rotate)*8+w)
		}
		if c.HugeCostEvery > 0 && i%c.HugeCostEvery == c.HugeCostEvery-1 {
			q.cost = hugeCost
		}
		s.send(cl, urls(q.node), q, i)
		if ctx.Err() != nil && q.status == 0 && c.Abort == 0 {
			break // the load ended while this request was in flight
		}
		out = append(out, q)
		if c.Pace > 0 {
			select {
			case <-ctx.Done():
			case <-time.After(c.Pace):
			}
		}
	}
	return out
}

// send sends request q, its client's i-th, to the node at base and records
// what came back.
func (s *Scenario) send(cl *http.Client, base string, q *request, i int) {
	c := q.client
	q.head = c.method(i) == http.MethodHead
	req, err := http.NewRequest(c.method(i), base+s.Targets[q.target].Path, nil)
	if err != nil {
		q.err = err.Error()
		return
	}
	h := req.Header
	h.Set("X-Req", q.id)
	if q.key != "" {
		h.Set("X-Key", q.key)
	}
	h.Set("X-Cost", strconv.FormatInt(q.cost, 10))
	h.Set("X-Tier", c.Tier)
	h.Set("X-Reserve", strconv.Itoa(c.Reserve))
	h.Set("X-Status", strconv.Itoa(c.Status))
	if c.Sleep > 0 {
		h.Set("X-Sleep", strconv.Itoa(int(c.Sleep/time.Millisecond)))
	}
	if c.Abort > 0 {
		h.Set("X-Abort", "1")
	}
	c.askStream(h, i)
	q.sent = time.Now()
	resp, err := cl.Do(req)
	if err != nil {
		q.done = time.Now()
		q.err = err.Error()
		return
	}
	body, hungUp, err := readBody(resp, c.hangsUp(i))
	resp.Body.Close()
	q.done = time.Now()
	q.hungUp = hungUp
	if err != nil {
		q.err = "reading the body: " + err.Error()
	}
	q.status = resp.StatusCode
	q.fromApp = resp.Header.Get("X-Upstream") != ""
	q.gen = resp.Header.Get("X-Gen")
	q.fields, q.delayed = rateLimitFields(resp.Header)
	q.delay = delayField(resp.Header)
	if q.status == http.StatusTooManyRequests {
		denier, reason, _ := strings.Cut(string(body), denialSeparator)
		q.denier, q.reason = strings.TrimSpace(denier), strings.TrimSpace(reason)
	}
}
