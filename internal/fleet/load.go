package fleet

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
	// Zone and Key name the bucket.
	Zone, Key string
	// Rate tokens per Per, at most Burst at once: the zone's rule.
	Rate  int64
	Per   time.Duration
	Burst int64
	// Saturated means demand exceeds supply throughout the run, so the
	// fleet must admit at least 98% of the bound (no over-denial).
	Saturated bool
}

// Target is one kind of request the load sends: a path and headers, its
// cost, and the buckets it draws from (every zone that applies to it).
type Target struct {
	// Name labels the target in reports.
	Name string
	// Path is the request path; Headers are "Name: value" pairs.
	Path    string
	Headers []string
	// Cost is the tokens an admitted request takes from each bucket.
	Cost int64
	// Buckets are the buckets the request draws from.
	Buckets []*Bucket
}

// Load is a run: connections spread evenly over the nodes, each sending the
// targets in turn as fast as answers come back, for Duration.
type Load struct {
	Nodes       []*Node
	Targets     []*Target
	Connections int
	Duration    time.Duration
	// During, if set, is called every 100ms with the time since the start;
	// it lets a test act (reload, pause Redis) during the load.
	During func(elapsed time.Duration)
}

// TargetStats is what happened to one target's requests.
type TargetStats struct {
	Requests int64
	Admitted int64 // admitted requests
	Tokens   int64 // tokens of admitted requests
	// DeniedBy counts 429s by the zone that denied (from the body).
	DeniedBy map[string]int64
	// FailedOpen counts requests that passed because the store failed
	// (200 without rate limit fields); they are not in Admitted.
	FailedOpen int64
	// Retried counts requests sent again because the node reset an idle
	// keep-alive connection as they went out.
	Retried int64
	// Errors counts anything but 200 and 429, and transport errors.
	Errors     int64
	ErrorKinds map[string]int64
	// PerNode is the tokens admitted through each node.
	PerNode []int64
	// First is when the first request was sent, Last when the last answer
	// came back: a window that contains every decision. FirstAnswer and
	// LastSent bound a window that every decision's window contains.
	First, Last           time.Time
	FirstAnswer, LastSent time.Time
}

// BucketStats is a bucket's admitted total against its exact bound.
type BucketStats struct {
	Bucket  *Bucket
	Tokens  int64   // tokens admitted from this bucket
	Elapsed float64 // seconds from the first request to the last answer
	Bound   float64 // Burst + Rate x Elapsed / Per
	Ratio   float64 // Tokens / Bound
	// Reachable is what a fleet without any over-denial must at least
	// admit: the bound over the narrow window (first answer to last
	// request sent), in whole requests of the bucket's largest cost.
	Reachable float64
	PerNode   []int64
	Requests  int64
}

// Report is the result of a run.
type Report struct {
	Nodes    int
	Duration time.Duration
	Targets  map[*Target]*TargetStats
	Buckets  []*BucketStats
}

// Run drives the load and returns what the fleet admitted.
func Run(ctx context.Context, l Load) *Report {
	type local struct{ stats map[*Target]*TargetStats }
	ctx, cancel := context.WithTimeout(ctx, l.Duration)
	defer cancel()
	start := time.Now()
	locals := make([]local, l.Connections)
	var wg sync.WaitGroup
	for c := range l.Connections {
		wg.Add(1)
		go func() {
			defer wg.Done()
			nodeIdx := c % len(l.Nodes)
			node := l.Nodes[nodeIdx]
			tr := &http.Transport{MaxIdleConnsPerHost: 1, MaxConnsPerHost: 1, DisableCompression: true}
			defer tr.CloseIdleConnections()
			cl := &http.Client{Transport: tr, Timeout: 10 * time.Second}
			st := map[*Target]*TargetStats{}
			locals[c] = local{stats: st}
			for i := c; ctx.Err() == nil; i++ {
				t := l.Targets[i%len(l.Targets)]
				s := st[t]
				if s == nil {
					s = &TargetStats{DeniedBy: map[string]int64{}, ErrorKinds: map[string]int64{}, PerNode: make([]int64, len(l.Nodes))}
					st[t] = s
				}
				sent := time.Now()
				status, limited, body, err := send(cl, node.URL+t.Path, t.Headers)
				if err != nil && closedIdle(err) {
					// The node closed this keep-alive connection just as
					// the request went out (a reload shuts the old server's
					// idle connections, and a request already in flight on
					// one is reset unread). Like browsers, retry a GET once
					// on a fresh connection, and count it.
					s.Retried++
					status, limited, body, err = send(cl, node.URL+t.Path, t.Headers)
				}
				if ctx.Err() != nil && err != nil {
					break // the run ended while this request was in flight
				}
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
				case err != nil:
					s.Errors++
					s.ErrorKinds[err.Error()]++
				case status == http.StatusOK && !limited:
					s.FailedOpen++
				case status == http.StatusOK:
					s.Admitted++
					s.Tokens += t.Cost
					s.PerNode[nodeIdx] += t.Cost
				case status == http.StatusTooManyRequests:
					s.DeniedBy[strings.TrimSpace(body)]++
				default:
					s.Errors++
					s.ErrorKinds["status "+strconv.Itoa(status)]++
				}
			}
		}()
	}
	if l.During != nil {
		tick := time.NewTicker(100 * time.Millisecond)
	loop:
		for {
			select {
			case <-ctx.Done():
				break loop
			case <-tick.C:
				l.During(time.Since(start))
			}
		}
		tick.Stop()
	}
	wg.Wait()

	rep := &Report{Nodes: len(l.Nodes), Duration: time.Since(start), Targets: map[*Target]*TargetStats{}}
	for _, loc := range locals {
		for t, s := range loc.stats {
			m := rep.Targets[t]
			if m == nil {
				m = &TargetStats{DeniedBy: map[string]int64{}, ErrorKinds: map[string]int64{}, PerNode: make([]int64, len(l.Nodes))}
				rep.Targets[t] = m
			}
			m.merge(s)
		}
	}
	seen := map[*Bucket]*BucketStats{}
	first, last := map[*Bucket]time.Time{}, map[*Bucket]time.Time{}
	firstAnswer, lastSent := map[*Bucket]time.Time{}, map[*Bucket]time.Time{}
	maxCost := map[*Bucket]int64{}
	for _, t := range l.Targets {
		s := rep.Targets[t]
		if s == nil {
			continue
		}
		for _, b := range t.Buckets {
			bs := seen[b]
			if bs == nil {
				bs = &BucketStats{Bucket: b, PerNode: make([]int64, len(l.Nodes))}
				seen[b] = bs
				rep.Buckets = append(rep.Buckets, bs)
			}
			bs.Tokens += s.Tokens
			bs.Requests += s.Requests
			for i, v := range s.PerNode {
				bs.PerNode[i] += v
			}
			if f, ok := first[b]; !ok || s.First.Before(f) {
				first[b] = s.First
			}
			if s.Last.After(last[b]) {
				last[b] = s.Last
			}
			if f, ok := firstAnswer[b]; !ok || s.FirstAnswer.Before(f) {
				firstAnswer[b] = s.FirstAnswer
			}
			if s.LastSent.After(lastSent[b]) {
				lastSent[b] = s.LastSent
			}
			maxCost[b] = max(maxCost[b], t.Cost)
		}
	}
	for _, bs := range rep.Buckets {
		b := bs.Bucket
		bs.Elapsed = last[b].Sub(first[b]).Seconds()
		bs.Bound = float64(b.Burst) + float64(b.Rate)*last[b].Sub(first[b]).Seconds()/b.Per.Seconds()
		bs.Ratio = float64(bs.Tokens) / bs.Bound
		narrow := float64(b.Burst) + float64(b.Rate)*lastSent[b].Sub(firstAnswer[b]).Seconds()/b.Per.Seconds()
		c := float64(max(maxCost[b], 1))
		bs.Reachable = c * math.Floor(narrow/c)
	}
	return rep
}

func (m *TargetStats) merge(s *TargetStats) {
	m.Requests += s.Requests
	m.Admitted += s.Admitted
	m.Tokens += s.Tokens
	m.Errors += s.Errors
	m.FailedOpen += s.FailedOpen
	m.Retried += s.Retried
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
// its exact bound: above it at all, or, for a saturated bucket, below 98%
// of what it could reach (see BucketStats.Reachable: a request cannot be
// admitted in part, and decisions at the window's edges are in flight).
func (r *Report) Check() []string {
	var bad []string
	for _, bs := range r.Buckets {
		// The bound is in tokens; an admitted total is whole, so only
		// the whole part of the bound can ever be reached.
		if float64(bs.Tokens) > math.Floor(bs.Bound+1e-9) {
			bad = append(bad, fmt.Sprintf("%s/%s admitted %d tokens, above the bound %.2f", bs.Bucket.Zone, bs.Bucket.Key, bs.Tokens, bs.Bound))
		}
		if bs.Bucket.Saturated && float64(bs.Tokens) < 0.98*bs.Reachable {
			bad = append(bad, fmt.Sprintf("%s/%s admitted %d tokens, below 98%% of the %.0f it could reach (bound %.2f)", bs.Bucket.Zone, bs.Bucket.Key, bs.Tokens, bs.Reachable, bs.Bound))
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
