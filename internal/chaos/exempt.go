package chaos

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"strings"
	"time"
)

// Exemptions: a client that sends from an exempt loopback address (all of
// 127.0.0.0/8 reaches the loopback interface on Linux, and Caddy sees the
// source address as {client_ip}), as fast as it can, on the key of a twin
// that sends from 127.0.0.1 well within its limit. Its target's zones all
// exempt it, so no zone decides its requests, faults or not: none is
// denied, delayed, or answered with rate limit fields. And it is charged to
// no bucket: its twin, which shares the key, is never denied or delayed
// outside faults.

// The kinds of the exempt client and its twin.
const (
	KindExempt     = "exempt"      // from an exempt address, as fast as it can
	KindExemptTwin = "exempt-twin" // the exempt client's key from 127.0.0.1, well within its limit
)

// InvExempt names the invariant: an exempt client is never denied, and
// is charged to nobody's bucket.
const InvExempt = "exempt"

// Exemption is the scenario's `exempt`.
type Exemption struct {
	// Network is the exempt entry: the client's address, or a network
	// around it that holds no other client's.
	Network string
	// Source is the loopback address the exempt client sends from.
	Source string
	// Zones are the indexes of the zones whose own `exempt` holds
	// Network; empty: the handler's `exempt` does.
	Zones []int
	// Target is the index of the target the exempt client and its twin
	// share: its zones key by client, and none is a concurrency zone
	// (whose in-flight count the upstream takes by key).
	Target int
}

// drawExempt draws, from its own stream, whether the
// scenario has an exempt client, and if so its address, where the
// exemption is written, its target and the two clients. The target's zones
// key by client, count no slots, and keep the default waiting room of a
// leaky bucket: a small room, shared by the zone's keys, may turn the twin
// away for other clients' sake.
func (s *Scenario) drawExempt(r *rand.Rand) {
	if r.IntN(2) == 0 {
		return
	}
	var own []int
	for i, z := range s.Zones {
		if !z.Global && z.Algorithm != Concurrency && z.MaxWaiting == 0 {
			own = append(own, i)
		}
	}
	if len(own) == 0 {
		return
	}
	t := &Target{Path: "/x"}
	for _, zi := range r.Perm(len(own))[:1+r.IntN(min(2, len(own)))] {
		t.Zones = append(t.Zones, own[zi])
	}
	e := &Exemption{Target: len(s.Targets)}
	s.Targets = append(s.Targets, t)
	n := 4 + r.IntN(240) // 127.0.0.4 to .243: a /30 around it holds neither .1 nor .2/.3
	e.Source = fmt.Sprintf("127.0.0.%d", n)
	switch r.IntN(3) {
	case 0:
		e.Network = e.Source
	case 1:
		e.Network = e.Source + "/32"
	default:
		e.Network = fmt.Sprintf("127.0.0.%d/30", n&^3)
	}
	if r.IntN(2) == 0 {
		e.Zones = t.Zones
	}
	s.Exempt = e
	key := fmt.Sprintf("exempt-%x", s.Seed%0xfff)
	add := func(kind string) *Client {
		c := &Client{ID: len(s.Clients), Kind: kind, Key: key, Tier: "default", Cost: 1, Status: 200, Workers: 1, Targets: []int{e.Target}}
		s.Clients = append(s.Clients, c)
		return c
	}
	ex := add(KindExempt)
	ex.Source, ex.Workers = e.Source, 2
	twin := add(KindExemptTwin)
	twin.Pace = s.politePace(t, twin)
}

// writeExempt writes the handler's `exempt` line, if the handler has it.
func (s *Scenario) writeExempt(b *strings.Builder) {
	if s.Exempt != nil && len(s.Exempt.Zones) == 0 {
		fmt.Fprintf(b, "\t\texempt %s\n", s.Exempt.Network)
	}
}

// zoneExempt returns the `exempt` line of zone zi, or "".
func (s *Scenario) zoneExempt(zi int) string {
	if s.Exempt == nil {
		return ""
	}
	for _, z := range s.Exempt.Zones {
		if z == zi {
			return "exempt " + s.Exempt.Network
		}
	}
	return ""
}

// exemptClient reports whether c sends from an exempt address: its
// requests are charged to no bucket.
func exemptClient(c *Client) bool { return c.Kind == KindExempt }

// bindSource makes tr dial from c's source address, when it has one.
func bindSource(tr *http.Transport, c *Client) {
	if c.Source == "" {
		return
	}
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(c.Source)}, Timeout: 5 * time.Second}
	tr.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		return d.DialContext(ctx, network, addr)
	}
}

// rateLimitFields reports whether a response carries rate limit fields,
// and whether a leaky bucket delayed it.
func rateLimitFields(h http.Header) (fields, delayed bool) {
	for _, f := range []string{"RateLimit-Policy", "RateLimit", "X-Ratelimit-Limit", "X-Ratelimit-Remaining", "Retry-After"} {
		fields = fields || h.Get(f) != ""
	}
	delayed = h.Get("X-Ratelimit-Delay") != ""
	return fields || delayed, delayed
}

// checkExempt checks that no zone decided a request of the exempt client:
// none was denied (429, or the 503 of a zone failing closed: no store call
// decides it, so no fault excuses one), delayed, or answered with rate
// limit fields; and that its twin, which shares its key well within the
// limit, was neither denied nor delayed outside faults: either means the
// exempt client's requests were charged to the key's bucket.
func (c *checker) checkExempt() {
	if c.s.Exempt == nil {
		return
	}
	var denied, twin int
	var first, firstTwin *request
	for _, q := range c.o.requests {
		switch q.client.Kind {
		case KindExempt:
			if q.status == http.StatusTooManyRequests || (q.status == http.StatusServiceUnavailable && !q.fromApp) || q.fields {
				denied++
				if first == nil {
					first = q
				}
			}
		case KindExemptTwin:
			if (q.status != http.StatusTooManyRequests && !q.delayed) || c.inFault(q.sent, q.done, 200*time.Millisecond, quietAfter, func(string) bool { return true }) {
				continue
			}
			if c.twinSpentQuota(q) {
				continue // the twin's own requests spent the quota
			}
			twin++
			if firstTwin == nil {
				firstTwin = q
			}
		}
	}
	e := c.s.Exempt
	where := "the handler"
	if len(e.Zones) > 0 {
		where = "its zones"
	}
	if denied > 0 {
		c.failAt(InvExempt, first.sent, ofClient(first.client), "the exempt client (from %s, exempt %s on %s) was limited %d times (denied, delayed or given rate limit fields), first %d (fields %v, delayed %v, denier %q) at %s",
			e.Source, e.Network, where, denied, first.status, first.fields, first.delayed, first.denier, first.sent.Format("15:04:05.000"))
	}
	if twin > 0 {
		c.failAt(InvExempt, firstTwin.sent, ofKey(firstTwin.key), "the exempt client's twin (its key from 127.0.0.1, at a quarter of the limit on %s) was denied or delayed %d times, first %d (denier %q) at %s: the exempt client's requests were charged to the key",
			c.s.Targets[e.Target].Path, twin, firstTwin.status, firstTwin.denier, firstTwin.sent.Format("15:04:05.000"))
	}
}

// twinSpentQuota reports whether the twin's request q was denied by a
// zone's quota that the twin's own admitted requests before it had spent:
// a quota is small next to the rate (it counts per day, week or month),
// so a twin well within the rate may spend it alone.
func (c *checker) twinSpentQuota(q *request) bool {
	for _, zi := range c.s.Targets[q.target].Zones {
		z := c.s.Zones[zi]
		if z.Quota == 0 || (q.denier != z.Name && q.denier != z.Name+".quota") {
			continue
		}
		cost := c.s.costOf(z, q.client)
		var spent int64
		for _, p := range c.o.requests {
			if p.client == q.client && p.sent.Before(q.sent) {
				if _, ok := c.o.seen[p.id]; ok {
					spent += cost
				}
			}
		}
		return spent+cost > z.Quota
	}
	return false
}
