package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"sort"
	"time"

	"github.com/fleetlimit/caddy-fleetlimit/internal/localfleet"
)

// Key resets mid-run, through one node's admin API: from a reset on, the
// key's bound in the zone starts again, and every other bucket keeps its
// own (docs/design.md, "Key resets").

// KeyReset is a reset of a client's key in one zone during the load.
type KeyReset struct {
	// At is when the DELETE is sent, from the start of the load.
	At time.Duration
	// Node is the node whose admin API is asked.
	Node int
	// Zone is the index of the zone.
	Zone int
	// Client is the ID of the steady client whose key is reset.
	Client int
}

// drawResets draws up to two resets of steady clients' keys, in zones that
// are per key and whose bound is checked, from r (a stream of its own:
// see drawFeatures).
func (s *Scenario) drawResets(r *rand.Rand) {
	type pair struct{ client, zone int }
	var pairs []pair
	for _, c := range s.Clients {
		if c.Kind != KindSteady || c.Key == "" {
			continue
		}
		for _, ti := range c.Targets {
			for _, zi := range s.Targets[ti].Zones {
				z := s.Zones[zi]
				if !z.Global && !z.DryRun && z.Algorithm != Concurrency {
					pairs = append(pairs, pair{c.ID, zi})
				}
			}
		}
	}
	if len(pairs) == 0 {
		return
	}
	for range r.IntN(3) {
		p := pairs[r.IntN(len(pairs))]
		at := s.Load/5 + time.Duration(r.Int64N(int64(s.Load*3/5)))
		s.Resets = append(s.Resets, KeyReset{At: at, Node: r.IntN(s.Nodes), Zone: p.zone, Client: p.client})
	}
	sort.Slice(s.Resets, func(i, j int) bool { return s.Resets[i].At < s.Resets[j].At })
}

// resetDone is a reset as it happened: its bucket, and when the DELETE was
// sent and answered; err says why it did not reset the key.
type resetDone struct {
	zone       int
	key        string // the bucket key (bucketKey)
	sent, done time.Time
	err        string
}

// injectResets sends the scenario's resets at their times from start, and
// returns what happened. It runs until the last one is done.
func (s *Scenario) injectResets(ctx context.Context, nodes []*localfleet.Node, start time.Time) []resetDone {
	cl := &http.Client{Timeout: 5 * time.Second}
	var out []resetDone
	for _, kr := range s.Resets {
		select {
		case <-ctx.Done():
			return out
		case <-time.After(time.Until(start.Add(kr.At))):
		}
		z, key := s.Zones[kr.Zone], s.Clients[kr.Client].Key
		d := resetDone{zone: kr.Zone, key: bucketKey(key)}
		// Through the drawn node, or, if a fault killed it, the next
		// one: a reset through any node resets the fleet's bucket.
		for i := range nodes {
			n := nodes[(kr.Node+i)%len(nodes)]
			u := "http://" + n.Admin + "/rate_limit/keys/" + z.Name + "/" + url.PathEscape(key)
			d.sent = time.Now()
			d.err = deleteKey(cl, u)
			d.done = time.Now()
			if d.err == "" {
				break
			}
		}
		out = append(out, d)
	}
	return out
}

// deleteKey sends a key reset's DELETE to u, and returns why it did not
// reset the key ("" when it did).
func deleteKey(cl *http.Client, u string) string {
	req, _ := http.NewRequest(http.MethodDelete, u, nil)
	resp, err := cl.Do(req)
	if err != nil {
		return err.Error()
	}
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	resp.Body.Close()
	var answer struct {
		Reset []json.RawMessage `json:"reset"`
	}
	if resp.StatusCode != http.StatusOK || json.Unmarshal(body, &answer) != nil || len(answer.Reset) == 0 {
		return fmt.Sprintf("%d %s", resp.StatusCode, body)
	}
	return ""
}

// span is a part of a bucket's requests whose bound is checked on its own:
// those decided surely after a reset (from its sending on) and before the
// next, or before the first reset (from the first request on).
type span struct {
	requests []*request
	// from is when the bucket was last full for sure: the reset's
	// sending; zero for the span before the first reset (its first
	// request's sending then).
	from time.Time
	// spares is the allowance named "spares at the reset", in tokens.
	spares float64
}

// spans splits a bucket's requests at the resets of its key in its zone;
// a bucket never reset is one span of all its requests.
func (c *checker) spans(b *bucket) []span {
	var resets []resetDone
	for _, r := range c.o.resets {
		if r.err == "" && r.zone == b.zone && r.key == b.key {
			resets = append(resets, r)
		}
	}
	if len(resets) == 0 {
		return []span{{requests: b.requests}}
	}
	z := c.s.Zones[b.zone]
	out := make([]span, len(resets)+1)
	for i := 1; i < len(out); i++ {
		out[i].from = resets[i-1].sent
		out[i].spares = float64(z.Prefetch * int64(c.s.Nodes))
	}
	for _, q := range b.requests {
		up, ok := c.o.seen[q.id]
		at := q.done
		if ok {
			at = up.at
		}
		// The span whose reset was surely before the decision, if no
		// later reset may have been after it.
		i := 0
		for j, r := range resets {
			if q.sent.After(r.done) {
				i = j + 1
			}
		}
		if i < len(resets) && !at.Before(resets[i].sent) {
			continue // on either side of reset i
		}
		out[i].requests = append(out[i].requests, q)
	}
	return out
}

// resetsSummary counts the scenario's resets, for its summary.
func (s *Scenario) resetsSummary() string {
	if len(s.Resets) == 0 {
		return ""
	}
	return fmt.Sprintf(", %d key resets", len(s.Resets))
}
