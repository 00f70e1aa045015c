package localfleet

import (
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Bucket is one shared bucket of the fleet's configuration: a zone's rule
// and one client key in it. It is what the exact bound is computed for.
type Bucket struct {
	// Zone is the name of the zone whose rule the bucket follows.
	Zone string
	// Key names the client key the bucket is for (a single name for a
	// zone every client shares); it labels the bucket in reports.
	Key string
	// Rate is how many tokens the bucket gains every Per.
	Rate int64
	// Per is the period Rate is counted over.
	Per time.Duration
	// Burst is the most tokens the bucket holds, and what it starts with.
	Burst int64
	// Saturated means demand exceeds supply throughout the run, so the
	// fleet must admit at least Floor of what it could reach (no
	// over-denial).
	Saturated bool
	// Floor is the share of what a saturated bucket could reach that it
	// must admit; 0 means 0.98. A run that stalls decisions on purpose
	// (a slot migrating) sets a lower one.
	Floor float64
}

// Target is one kind of request the load sends: a path and headers, its
// cost, and the buckets it draws from (every zone that applies to it).
type Target struct {
	// Name labels the target in reports.
	Name string
	// Path is the request path, appended to a node's URL.
	Path string
	// Headers are the request's extra headers, "Name: value" each.
	Headers []string
	// Cost is the tokens an admitted request takes from each bucket.
	Cost int64
	// Buckets are the buckets the request draws from.
	Buckets []*Bucket
}

// Load is a run: connections spread evenly over the nodes, each sending the
// targets in turn as fast as answers come back, for Duration.
type Load struct {
	// Nodes are the nodes the connections go to: connection c to node
	// c mod len(Nodes).
	Nodes []*Node
	// Targets are the requests each connection sends in turn, connection
	// c starting with the c-th.
	Targets []*Target
	// Connections is how many keep-alive connections send at once, each
	// one request at a time.
	Connections int
	// Duration is how long the load runs; requests in flight at its end
	// that fail are not counted.
	Duration time.Duration
	// During, if set, is called every 100ms with the time since the start;
	// it lets a test act (reload, pause Redis) during the load.
	During func(elapsed time.Duration)
}

// TargetStats is what happened to one target's requests.
type TargetStats struct {
	// Requests counts the requests answered (or failed) during the run,
	// whatever the answer; a retried request counts once.
	Requests int64
	// Admitted counts the requests admitted (200 with rate limit fields).
	Admitted int64
	// Tokens is the tokens the admitted requests took: Admitted times the
	// target's Cost.
	Tokens int64
	// DeniedBy counts 429s by the zone that denied (from the body).
	DeniedBy map[string]int64
	// FailedOpen counts requests that passed because the store failed
	// (200 without rate limit fields); they are not in Admitted.
	FailedOpen int64
	// Retried counts requests sent again because the node reset an idle
	// keep-alive connection as they went out.
	Retried int64
	// Errors counts anything but 200 and 429, and transport errors.
	Errors int64
	// ErrorKinds counts Errors by kind: the transport error's text, or
	// "status N".
	ErrorKinds map[string]int64
	// PerNode is the tokens admitted through each node, indexed like
	// Load.Nodes.
	PerNode []int64
	// First is when the first request was sent: with Last, a window that
	// contains every decision.
	First time.Time
	// Last is when the last answer came back.
	Last time.Time
	// FirstAnswer is when the first answer came back: with LastSent, a
	// window that every decision's window contains.
	FirstAnswer time.Time
	// LastSent is when the last request was sent.
	LastSent time.Time
	// arrivals are the requests a limiter decided (admitted or denied),
	// to replay through an exact bucket (BucketStats.Reachable).
	arrivals []arrival
}

// BucketStats is a bucket's admitted total against its exact bound.
type BucketStats struct {
	// Bucket is the bucket the stats are of.
	Bucket *Bucket
	// Tokens is the tokens admitted from this bucket, over every target
	// that draws from it.
	Tokens int64
	// Elapsed is the seconds from the first request sent to the last
	// answer, over those targets.
	Elapsed float64
	// Bound is the most tokens the bucket may admit in that time:
	// Burst + Rate x Elapsed / Per.
	Bound float64
	// Ratio is Tokens / Bound: at most 1 when the bound holds.
	Ratio float64
	// Reachable is what a fleet without any over-denial must at least
	// admit: the bound over the narrow window (first answer to last
	// request sent), in whole requests of the bucket's largest cost, or,
	// if fewer, what an exact bucket admits of the requests the bucket
	// decided, replayed at the times they were sent.
	Reachable float64
	// PerNode is the tokens admitted from this bucket through each node,
	// indexed like Load.Nodes.
	PerNode []int64
	// Requests counts the requests of the targets that draw from this
	// bucket, admitted or not.
	Requests int64
}

// Report is the result of a run.
type Report struct {
	// Nodes is how many nodes the load went to.
	Nodes int
	// Duration is how long the run took, from the start to the last
	// connection's end.
	Duration time.Duration
	// Targets is what happened to each target's requests; a target that
	// sent none may be missing.
	Targets map[*Target]*TargetStats
	// Buckets are the buckets of the targets, in the order the targets
	// first name them.
	Buckets []*BucketStats
}

// Run drives the load and returns what the fleet admitted.
func Run(ctx context.Context, l Load) *Report {
	ctx, cancel := context.WithTimeout(ctx, l.Duration)
	defer cancel()
	start := time.Now()
	locals := make([]map[*Target]*TargetStats, l.Connections)
	var wg sync.WaitGroup
	for c := range l.Connections {
		wg.Add(1)
		go func() {
			defer wg.Done()
			locals[c] = runConnection(ctx, &l, c)
		}()
	}
	if l.During != nil {
		callDuring(ctx, l.During, start)
	}
	wg.Wait()

	rep := &Report{Nodes: len(l.Nodes), Duration: time.Since(start), Targets: mergeTargets(locals, len(l.Nodes))}
	rep.Buckets = bucketStats(l.Targets, rep.Targets, len(l.Nodes))
	return rep
}

// runConnection is connection c of the load: over one keep-alive
// connection to node c mod len(Nodes), it sends the targets in turn,
// starting with the c-th, until ctx ends, and returns what happened to
// each target's requests.
func runConnection(ctx context.Context, l *Load, c int) map[*Target]*TargetStats {
	nodeIdx := c % len(l.Nodes)
	node := l.Nodes[nodeIdx]
	tr := &http.Transport{MaxIdleConnsPerHost: 1, MaxConnsPerHost: 1, DisableCompression: true}
	defer tr.CloseIdleConnections()
	cl := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	st := map[*Target]*TargetStats{}
	for i := c; ctx.Err() == nil; i++ {
		t := l.Targets[i%len(l.Targets)]
		s := st[t]
		if s == nil {
			s = newTargetStats(len(l.Nodes))
			st[t] = s
		}
		sent := time.Now()
		a := sendRetrying(cl, node.URL+t.Path, t.Headers, s)
		if ctx.Err() != nil && a.err != nil {
			break // the run ended while this request was in flight
		}
		s.record(a, sent, t.Cost, nodeIdx)
	}
	return st
}

// arrival is one request a limiter decided: when it was sent, its cost,
// and the zone that denied it ("" if admitted).
type arrival struct {
	sent   time.Time
	cost   int64
	denier string
}

// newTargetStats returns empty stats for a load over nodes nodes.
func newTargetStats(nodes int) *TargetStats {
	return &TargetStats{DeniedBy: map[string]int64{}, ErrorKinds: map[string]int64{}, PerNode: make([]int64, nodes)}
}

// answer is what send returns of one request.
type answer struct {
	status  int
	limited bool // the response carries rate limit fields
	body    string
	err     error
}

// sendRetrying sends one request like send, and once more when the node
// reset the connection as it went out, counting the retry in s.
func sendRetrying(cl *http.Client, url string, headers []string, s *TargetStats) answer {
	var a answer
	a.status, a.limited, a.body, a.err = send(cl, url, headers)
	if a.err != nil && closedIdle(a.err) {
		// The node closed this keep-alive connection just as the
		// request went out (a reload shuts the old server's idle
		// connections, and a request already in flight on one is reset
		// unread). Like browsers, retry a GET once on a fresh
		// connection, and count it.
		s.Retried++
		a.status, a.limited, a.body, a.err = send(cl, url, headers)
	}
	return a
}

// record counts in s the answer to a request of cost tokens sent at sent
// through node nodeIdx, and widens s's windows to it.
func (s *TargetStats) record(a answer, sent time.Time, cost int64, nodeIdx int) {
	if s.First.IsZero() || sent.Before(s.First) {
		s.First = sent
	}
	s.Last = time.Now()
	s.LastSent = sent
	if s.FirstAnswer.IsZero() {
		s.FirstAnswer = s.Last
	}
	s.Requests++
	switch {
	case a.err != nil:
		s.Errors++
		s.ErrorKinds[a.err.Error()]++
	case a.status == http.StatusOK && !a.limited:
		s.FailedOpen++
	case a.status == http.StatusOK:
		s.Admitted++
		s.Tokens += cost
		s.PerNode[nodeIdx] += cost
		s.arrivals = append(s.arrivals, arrival{sent: sent, cost: cost})
	case a.status == http.StatusTooManyRequests:
		denier := strings.TrimSpace(a.body)
		s.DeniedBy[denier]++
		s.arrivals = append(s.arrivals, arrival{sent: sent, cost: cost, denier: denier})
	default:
		s.Errors++
		s.ErrorKinds["status "+strconv.Itoa(a.status)]++
	}
}

// callDuring calls during every 100ms with the time since start, until ctx
// ends.
func callDuring(ctx context.Context, during func(elapsed time.Duration), start time.Time) {
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			during(time.Since(start))
		}
	}
}

// mergeTargets adds up the connections' stats per target.
func mergeTargets(locals []map[*Target]*TargetStats, nodes int) map[*Target]*TargetStats {
	out := map[*Target]*TargetStats{}
	for _, st := range locals {
		for t, s := range st {
			m := out[t]
			if m == nil {
				m = newTargetStats(nodes)
				out[t] = m
			}
			m.merge(s)
		}
	}
	return out
}

// bucketTally gathers one bucket's stats from the targets that draw from
// it, and the windows its bound is computed over.
type bucketTally struct {
	stats *BucketStats
	// first and last bound the wide window: the earliest request sent
	// and the latest answer.
	first, last time.Time
	// firstAnswer and lastSent bound the narrow window: the earliest
	// answer and the latest request sent.
	firstAnswer, lastSent time.Time
	maxCost               int64 // the largest cost of a target, in tokens
	// arrivals are the requests this bucket decided: admitted, or denied
	// by its zone (one another zone denied never reached it).
	arrivals []arrival
}

// bucketStats computes the stats of every bucket of targets, in the order
// the targets first name them, from the targets' stats.
func bucketStats(targets []*Target, stats map[*Target]*TargetStats, nodes int) []*BucketStats {
	tallies := map[*Bucket]*bucketTally{}
	var order []*bucketTally
	for _, t := range targets {
		s := stats[t]
		if s == nil {
			continue
		}
		for _, b := range t.Buckets {
			bt := tallies[b]
			if bt == nil {
				bt = &bucketTally{
					stats: &BucketStats{Bucket: b, PerNode: make([]int64, nodes)},
					first: s.First, firstAnswer: s.FirstAnswer,
				}
				tallies[b] = bt
				order = append(order, bt)
			}
			bt.add(s, t.Cost)
		}
	}
	var out []*BucketStats
	for _, bt := range order {
		out = append(out, bt.finish())
	}
	return out
}

// add counts a target's stats, of requests of cost tokens, in the bucket.
func (bt *bucketTally) add(s *TargetStats, cost int64) {
	bs := bt.stats
	bs.Tokens += s.Tokens
	bs.Requests += s.Requests
	for i, v := range s.PerNode {
		bs.PerNode[i] += v
	}
	if s.First.Before(bt.first) {
		bt.first = s.First
	}
	if s.Last.After(bt.last) {
		bt.last = s.Last
	}
	if s.FirstAnswer.Before(bt.firstAnswer) {
		bt.firstAnswer = s.FirstAnswer
	}
	if s.LastSent.After(bt.lastSent) {
		bt.lastSent = s.LastSent
	}
	bt.maxCost = max(bt.maxCost, cost)
	for _, a := range s.arrivals {
		if a.denier == "" || a.denier == bs.Bucket.Zone {
			bt.arrivals = append(bt.arrivals, a)
		}
	}
}

// finish computes the bucket's bound and what it can reach, and returns
// its stats.
func (bt *bucketTally) finish() *BucketStats {
	bs, b := bt.stats, bt.stats.Bucket
	bs.Elapsed = bt.last.Sub(bt.first).Seconds()
	bs.Bound = float64(b.Burst) + float64(b.Rate)*bt.last.Sub(bt.first).Seconds()/b.Per.Seconds()
	bs.Ratio = float64(bs.Tokens) / bs.Bound
	narrow := float64(b.Burst) + float64(b.Rate)*bt.lastSent.Sub(bt.firstAnswer).Seconds()/b.Per.Seconds()
	c := float64(max(bt.maxCost, 1))
	bs.Reachable = min(c*math.Floor(narrow/c), bt.exact())
	return bs
}

// exact replays the requests the bucket decided, at the times they were
// sent, through an exact token bucket that starts full, and returns the
// tokens it admits: what the fleet could reach given when the requests
// came. A load generator that a busy machine starves for a moment sends
// nothing while the bucket fills past its burst; the narrow window's bound
// counts that refill, this does not.
func (bt *bucketTally) exact() float64 {
	b := bt.stats.Bucket
	list := bt.arrivals
	sort.Slice(list, func(i, j int) bool { return list[i].sent.Before(list[j].sent) })
	perSecond := float64(b.Rate) / b.Per.Seconds()
	tokens, admitted := float64(b.Burst), 0.0
	for i, a := range list {
		if i > 0 {
			tokens = min(float64(b.Burst), tokens+perSecond*a.sent.Sub(list[i-1].sent).Seconds())
		}
		if c := float64(a.cost); tokens >= c {
			tokens -= c
			admitted += c
		}
	}
	return admitted
}

// merge adds s to m, and widens m's windows to s's.
func (m *TargetStats) merge(s *TargetStats) {
	m.Requests += s.Requests
	m.Admitted += s.Admitted
	m.Tokens += s.Tokens
	m.Errors += s.Errors
	m.FailedOpen += s.FailedOpen
	m.Retried += s.Retried
	m.arrivals = append(m.arrivals, s.arrivals...)
	for k, v := range s.DeniedBy {
		m.DeniedBy[k] += v
	}
	for k, v := range s.ErrorKinds {
		m.ErrorKinds[k] += v
	}
	for i, v := range s.PerNode {
		m.PerNode[i] += v
	}
	if m.First.IsZero() || (!s.First.IsZero() && s.First.Before(m.First)) {
		m.First = s.First
	}
	if s.Last.After(m.Last) {
		m.Last = s.Last
	}
	if m.FirstAnswer.IsZero() || (!s.FirstAnswer.IsZero() && s.FirstAnswer.Before(m.FirstAnswer)) {
		m.FirstAnswer = s.FirstAnswer
	}
	if s.LastSent.After(m.LastSent) {
		m.LastSent = s.LastSent
	}
}

// closedIdle reports an error of a request written to a keep-alive
// connection that the server was closing: reset, or closed, unread.
func closedIdle(err error) bool {
	msg := err.Error()
	return strings.Contains(msg, "connection reset by peer") || strings.HasSuffix(msg, ": EOF")
}

// send sends one request and returns its status, whether the response
// carries rate limit fields (a decision was made), and the body.
func send(cl *http.Client, url string, headers []string) (int, bool, string, error) {
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		return 0, false, "", err
	}
	for _, h := range headers {
		k, v, _ := strings.Cut(h, ":")
		req.Header.Set(strings.TrimSpace(k), strings.TrimSpace(v))
	}
	resp, err := cl.Do(req)
	if err != nil {
		return 0, false, "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 4096))
	limited := resp.Header.Get("X-Ratelimit-Remaining") != "" || resp.Header.Get("Ratelimit") != ""
	return resp.StatusCode, limited, string(body), err
}

// Check returns a description of every bucket whose admitted total breaks
// its exact bound: above it at all, or, for a saturated bucket, below its
// Floor (98%) of what it could reach (see BucketStats.Reachable: a request cannot be
// admitted in part, and decisions at the window's edges are in flight).
func (r *Report) Check() []string {
	var bad []string
	for _, bs := range r.Buckets {
		// The bound is in tokens; an admitted total is whole, so only
		// the whole part of the bound can ever be reached.
		if float64(bs.Tokens) > math.Floor(bs.Bound+1e-9) {
			bad = append(bad, fmt.Sprintf("%s/%s admitted %d tokens, above the bound %.2f", bs.Bucket.Zone, bs.Bucket.Key, bs.Tokens, bs.Bound))
		}
		floor := bs.Bucket.Floor
		if floor == 0 {
			floor = 0.98
		}
		if bs.Bucket.Saturated && float64(bs.Tokens) < floor*bs.Reachable {
			bad = append(bad, fmt.Sprintf("%s/%s admitted %d tokens, below %.0f%% of the %.0f it could reach (bound %.2f)", bs.Bucket.Zone, bs.Bucket.Key, bs.Tokens, 100*floor, bs.Reachable, bs.Bound))
		}
	}
	for t, s := range r.Targets {
		if s.Errors > 0 {
			bad = append(bad, fmt.Sprintf("target %s: %d errors: %v", t.Name, s.Errors, s.ErrorKinds))
		}
		if s.FailedOpen > 0 {
			bad = append(bad, fmt.Sprintf("target %s: %d requests passed because the store failed (timeout?): the bound cannot be checked", t.Name, s.FailedOpen))
		}
	}
	sort.Strings(bad)
	return bad
}

// Table renders the buckets as a Markdown table: admitted against the exact
// bound, and what each node admitted.
func (r *Report) Table() string {
	var b strings.Builder
	fmt.Fprintf(&b, "| zone | key | rule | requests | admitted tokens | bound | ratio | reachable |")
	for i := range r.Nodes {
		fmt.Fprintf(&b, " node %d |", i+1)
	}
	b.WriteString("\n|---|---|---|---:|---:|---:|---:|---:|")
	for range r.Nodes {
		b.WriteString("---:|")
	}
	b.WriteString("\n")
	for _, bs := range r.Buckets {
		k := bs.Bucket
		reach := "-"
		if k.Saturated {
			reach = fmt.Sprintf("%.0f", bs.Reachable)
		}
		fmt.Fprintf(&b, "| %s | %s | %d/%s burst %d | %d | %d | %.2f | %.4f | %s |", k.Zone, k.Key, k.Rate, k.Per, k.Burst, bs.Requests, bs.Tokens, bs.Bound, bs.Ratio, reach)
		for _, v := range bs.PerNode {
			fmt.Fprintf(&b, " %d |", v)
		}
		b.WriteString("\n")
	}
	return b.String()
}

// DeniedTable renders, per target, how many requests each zone denied.
func (r *Report) DeniedTable(targets []*Target) string {
	var b strings.Builder
	b.WriteString("| target | requests | admitted | denied by zone | failed open | retried | errors |\n|---|---:|---:|---|---:|---:|---:|\n")
	for _, t := range targets {
		s := r.Targets[t]
		if s == nil {
			continue
		}
		zones := make([]string, 0, len(s.DeniedBy))
		for z, n := range s.DeniedBy {
			zones = append(zones, fmt.Sprintf("%s: %d", z, n))
		}
		sort.Strings(zones)
		fmt.Fprintf(&b, "| %s | %d | %d | %s | %d | %d | %d |\n", t.Name, s.Requests, s.Admitted, strings.Join(zones, ", "), s.FailedOpen, s.Retried, s.Errors)
	}
	return b.String()
}
