package chaos

import (
	"fmt"
	"math"
	"sort"
	"strings"
	"time"
	"unicode"
)

// observed is everything a run saw, for the checks.
type observed struct {
	requests []*request
	rlsCalls []*request             // the RLS client's calls
	seen     map[string]seenRequest // the upstream's, by request id
	peaks    []peak
	windows  []window // the faults injected
	skipped  []string // the faults skipped, and why
	bans     []banSeen
	resets   []resetDone // the key resets
	// settleLost are the tokens each cost_header zone's settlements lost,
	// by the nodes' metrics.
	settleLost map[string]float64
}

// checker checks one run's observations against the scenario's model.
type checker struct {
	s   *Scenario
	o   *observed
	out []Violation
	// tightest is the bucket span that came closest to its bound, and
	// rlsTightest the closest of the buckets the RLS client shares.
	tightest, rlsTightest Tightness
	// figures are what the later checks saw, for the result.
	figures []string
}

func (c *checker) fail(inv, format string, args ...any) {
	c.out = append(c.out, Violation{Invariant: inv, Detail: fmt.Sprintf(format, args...)})
}

// inFault reports whether the span [from, to] meets a fault window of a
// kind for which match is true (up to when the fleet is back on Redis,
// window.until), widened by before and after.
func (c *checker) inFault(from, to time.Time, before, after time.Duration, match func(kind string) bool) bool {
	for _, w := range c.o.windows {
		if match(w.kind) && !to.Before(w.start.Add(-before)) && !from.After(w.until().Add(after)) {
			return true
		}
	}
	return false
}

// redisDown matches the faults that keep Redis from deciding; none does
// on the memory store, which never fails.
func (c *checker) redisDown(kind string) bool {
	return c.s.Topology != Memory && redisFault(kind)
}

// bucket is one zone's bucket of one key, and the requests that drew on it.
type bucket struct {
	zone     int
	key      string
	client   *Client
	requests []*request
	rls      bool // the RLS client's calls spend it too
}

// buckets groups the requests by zone and bucket key.
func (c *checker) buckets() []*bucket {
	idx := map[string]*bucket{}
	var out []*bucket
	for _, q := range c.o.requests {
		if exemptClient(q.client) {
			continue // charged to no bucket (checkExempt)
		}
		for _, zi := range c.s.Targets[q.target].Zones {
			z := c.s.Zones[zi]
			key := "all"
			if !z.Global {
				key = bucketKey(q.key)
			}
			id := z.Name + "|" + key
			b := idx[id]
			if b == nil {
				b = &bucket{zone: zi, key: key, client: q.client}
				idx[id] = b
				out = append(out, b)
			}
			b.requests = append(b.requests, q)
		}
	}
	if c.s.RLS == nil {
		return out
	}
	for _, q := range c.o.rlsCalls {
		for _, zi := range c.s.RLS.Zones {
			id := c.s.Zones[zi].Name + "|" + bucketKey(q.key)
			b := idx[id]
			if b == nil {
				b = &bucket{zone: zi, key: bucketKey(q.key), client: q.client}
				idx[id] = b
				out = append(out, b)
			}
			b.requests = append(b.requests, q)
			b.rls = true
		}
	}
	return out
}

// checkBounds checks every bucket's admitted tokens against its exact bound
// plus the named allowances.
func (c *checker) checkBounds() int {
	checked := 0
	for _, b := range c.buckets() {
		z := c.s.Zones[b.zone]
		if z.DryRun || z.Algorithm == Concurrency {
			continue
		}
		rate, burst := c.s.rule(z, b.client)
		rule := bucketRule{zone: z, rate: rate, burst: burst, per: z.Per, reserve: c.s.reserveOf(z, b.client), nodes: c.s.Nodes}
		if z.Global || b.rls {
			rule.reserve = 0 // clients of several reserves share it; an RLS call keeps none
		}
		// A reset key's bound starts again at each reset.
		spanned := false
		for _, sp := range c.spans(b) {
			spanned = c.checkSpan(b, z, rule, sp) || spanned
		}
		if spanned {
			checked++
		}
	}
	return checked
}

// checkSpan checks the admitted tokens of a span of a bucket's requests
// against its exact bound plus the named allowances, and reports whether
// any token was admitted.
func (c *checker) checkSpan(b *bucket, z *Zone, rule bucketRule, sp span) bool {
	first := sp.from
	var last time.Time
	var tokens, failOpen float64
	openOutside := 0 // requests that failed open outside any Redis fault
	for _, q := range sp.requests {
		if sp.from.IsZero() && (first.IsZero() || q.sent.Before(first)) {
			first = q.sent
		}
		at, cost, ok := c.admission(z, q)
		if !ok {
			continue
		}
		if at.After(last) {
			last = at
		}
		if z.OnError == "allow" && c.inFault(q.sent, at, 0, 0, c.redisDown) {
			failOpen += cost // the allowance named "on_error allow"
			continue
		}
		if z.OnError == "allow" && failedOpen(q) {
			openOutside++ // counted: no Redis fault excuses it
		}
		tokens += cost
	}
	if tokens == 0 {
		return false
	}
	bound := rule.exact(last.Sub(first))
	allow := rule.evictionShare()
	var named []string
	if sp.spares > 0 {
		allow += sp.spares
		named = append(named, fmt.Sprintf("spares at the reset %.0f", sp.spares))
	}
	if share := c.costHeaderShare(z, sp.requests); share > 0 {
		allow += share
		named = append(named, fmt.Sprintf("cost_header in flight %.0f", share))
	}
	if share := c.settleLostShare(z); share > 0 {
		allow += share
		named = append(named, fmt.Sprintf("settlements lost %.0f", share))
	}
	if !sp.from.IsZero() {
		named = append(named, "since a key reset at "+sp.from.Format("15:04:05.000"))
	}
	if z.OnError == "local" {
		for _, w := range c.o.windows {
			if c.redisDown(w.kind) && !w.until().Before(first) && !w.start.After(last) {
				share := rule.fallbackShare(w.until().Sub(w.start))
				allow += share
				named = append(named, fmt.Sprintf("fallback %s %.0f", w.kind, share))
			}
		}
	}
	if c.s.Topology != Memory {
		for _, w := range c.o.windows {
			if dataLoss(w.kind) && !w.end.Before(first) && !w.start.After(last) {
				allow += rule.dataLossShare()
				named = append(named, fmt.Sprintf("data loss %s %.0f", w.kind, rule.dataLossShare()))
			}
		}
	}
	tight := Tightness{Use: tokens / (bound + allow), Zone: z.Name, Key: b.key, Tokens: tokens, Bound: bound, Allow: allow}
	if tight.Use > c.tightest.Use {
		c.tightest = tight
	}
	if b.rls && tight.Use > c.rlsTightest.Use {
		c.rlsTightest = tight
	}
	if tokens > math.Floor(bound+allow+1e-9) {
		c.failAt(InvBound, first, ofKey(b.key), "zone %s (%s) key %s: admitted %.0f tokens in %.2fs, above the exact bound %.2f + allowances %.2f [%s]; %d requests, %.0f tokens failed open during a Redis fault, %d requests failed open outside any",
			z.Name, z.Algorithm, printable(b.key), tokens, last.Sub(first).Seconds(), bound, allow, strings.Join(named, ", "), len(sp.requests), failOpen, openOutside)
	}
	return true
}

// failedOpen reports whether a request was answered admitted without rate
// limit fields: a zone with on_error allow passed it without a decision
// (docs/operations.md: "with no rate limit fields"). A request that got no
// answer (a node killed under it) says nothing.
func failedOpen(q *request) bool {
	return !q.rls && q.status != 0 && !q.fields
}

// admission returns, for a request that zone z admitted and counted, when
// it was seen admitted and the tokens it spent: a request the upstream saw
// with a status z counts, at its cost (settled, for cost_header); an RLS
// call answered OK, at its hits, when its answer came.
func (c *checker) admission(z *Zone, q *request) (at time.Time, cost float64, ok bool) {
	if q.rls {
		return q.done, float64(q.cost), q.status == 200
	}
	up, ok := c.o.seen[q.id]
	if !ok || !counted(z.CountStatus, up.status) {
		return time.Time{}, 0, false
	}
	upfront := q.cost
	if z.Cost > 0 {
		upfront = z.Cost
	}
	return up.at, c.settledCost(z, q, upfront), true
}

// checkInFlight checks the upstream's counts of requests in flight per
// concurrency zone and key against the zone's limit, with the fallback's
// allowance during a fault.
func (c *checker) checkInFlight() {
	zones := map[string]*Zone{}
	for _, z := range c.s.Zones {
		zones[z.Name] = z
	}
	worst := map[string]peak{}
	for _, p := range c.o.peaks {
		z := zones[p.zone]
		if z.DryRun {
			continue
		}
		if c.inFault(p.at, p.at, redisTimeout, 0, c.redisDown) {
			switch z.OnError {
			case "allow":
				continue
			case "local":
				if p.n <= z.Limit+concurrencyShare(z.Limit, c.s.Nodes) {
					continue
				}
			}
		}
		k := p.zone + "|" + p.key
		if p.n > worst[k].n {
			worst[k] = p
		}
	}
	for _, p := range worst {
		c.fail(InvInFlight, "zone %s key %s: %d requests in flight at once at the upstream, limit %d", p.zone, printable(p.key), p.n, zones[p.zone].Limit)
	}
}

// checkBans checks that no request of a banned key passed a zone that
// banned it while the ban held, by the bans the admin API listed.
func (c *checker) checkBans() {
	const margin = 50 * time.Millisecond // Redis' clock and this one: the same machine
	zoneIdx := map[string]int{}
	for i, z := range c.s.Zones {
		zoneIdx[z.Name] = i
	}
	for _, ban := range c.o.bans {
		zi, ok := zoneIdx[ban.Zone]
		if !ok || c.s.Zones[zi].DryRun {
			continue
		}
		// The allowance named "bans lost with Redis' data": a Redis
		// restarted empty, or a replica promoted, may have lost the ban.
		for _, w := range c.o.windows {
			if c.s.Topology != Memory && dataLoss(w.kind) && w.start.After(ban.Start) && w.start.Before(ban.End) {
				ban.End = w.start
			}
		}
		n := 0
		var example *request
		for _, q := range c.o.requests {
			if q.key == "" || !banNames(ban.Key, q.key) || !hasZone(c.s.Targets[q.target], zi) {
				continue
			}
			up, ok := c.o.seen[q.id]
			if !ok || q.sent.Before(ban.Start.Add(margin)) || up.at.After(ban.End.Add(-margin)) {
				continue
			}
			n++
			if example == nil {
				example = q
			}
		}
		if n > 0 {
			during := ""
			if c.inFault(example.sent, c.o.seen[example.id].at, 0, 0, c.redisDown) {
				during = " (during a Redis fault)"
			}
			c.failAt(InvBan, example.sent, ofKey(example.key), "zone %s key %s banned %s to %s: %d requests admitted while banned, e.g. %s sent %s through node %d%s",
				ban.Zone, printable(ban.Key), ban.Start.Format("15:04:05.000"), ban.End.Format("15:04:05.000"), n,
				c.s.Targets[example.target].Path, example.sent.Format("15:04:05.000"), example.node, during)
		}
	}
}

// banNames reports whether a ban's key (as the admin API lists it) names a
// client's key: the key itself, or the key after a prefix that namespaces
// it.
func banNames(banKey, key string) bool {
	if banKey == key {
		return true
	}
	if !strings.HasSuffix(banKey, key) {
		return false
	}
	r := rune(banKey[len(banKey)-len(key)-1])
	return !unicode.IsLetter(r) && !unicode.IsDigit(r) && r != '-'
}

func hasZone(t *Target, zi int) bool {
	for _, z := range t.Zones {
		if z == zi {
			return true
		}
	}
	return false
}

// quietAfter is how long after the fleet is back on Redis (window.until)
// the checks of denials (isolation, count_status refunds) still excuse
// one: the fallback's buckets were a share of the limit.
const quietAfter = time.Second

// checkIsolation checks that the victim, which stays far within its own
// limit, is never denied outside faults: a denial means another client
// (the spoofer, whose key is the victim's address) spent its bucket or
// banned it.
func (c *checker) checkIsolation() {
	n := 0
	var example *request
	for _, q := range c.o.requests {
		if q.client.Kind != KindVictim || q.status != 429 {
			continue
		}
		if c.inFault(q.sent, q.done, 200*time.Millisecond, quietAfter, func(string) bool { return true }) {
			continue
		}
		n++
		if example == nil {
			example = q
		}
	}
	if n > 0 {
		c.failAt(InvIsolation, example.sent, ofClient(example.client), "the victim (no key: its address 127.0.0.1), at a quarter of its limit on %s, was denied %d times, first by zone %s at %s: another client's key spent its bucket",
			c.s.Targets[example.target].Path, n, example.denier, example.sent.Format("15:04:05.000"))
	}
}

// checkRefunds checks count_status: the refunded client's every response
// is one its zone does not count, so its zone never denies it.
func (c *checker) checkRefunds() {
	for _, q := range c.o.requests {
		if q.client.Kind != KindRefunded || q.status != 429 {
			continue
		}
		for _, zi := range c.s.Targets[q.target].Zones {
			z := c.s.Zones[zi]
			// A global zone is every client's: the others' counted
			// responses spend it.
			if z.Name != q.denier || len(z.CountStatus) == 0 || z.Global || counted(z.CountStatus, q.client.Status) {
				continue
			}
			// The allowance named "refunds dropped in a fault": a refund
			// that fails leaves its charge (strict), and the client, whose
			// charges are all given back, regains it only by the refill:
			// the whole capacity's refill time after the fault.
			rate, _ := c.s.rule(z, q.client)
			refill := time.Duration(c.s.capacity(z)) * z.Per / time.Duration(rate)
			if c.inFault(q.sent, q.done, 200*time.Millisecond, quietAfter+refill, func(string) bool { return true }) {
				continue
			}
			c.failAt(InvCountExact, q.sent, ofKey(q.key), "zone %s (count_status %s) denied key %s at %s, whose every response (%d) it does not count: an uncounted response kept its charge%s",
				z.Name, strings.Join(z.CountStatus, " "), q.key, q.sent.Format("15:04:05.000"), q.client.Status, c.sinceFault(q.sent, func(string) bool { return true }))
			return
		}
	}
}

// checkDryRun checks that no dry-run zone denied a request.
func (c *checker) checkDryRun() {
	denied := map[string]int{}
	for _, q := range c.o.requests {
		for _, z := range c.s.Zones {
			if z.DryRun && q.denier == z.Name {
				denied[z.Name]++
			}
		}
	}
	for z, n := range denied {
		c.fail(InvDryRun, "dry-run zone %s denied %d requests", z, n)
	}
}

// checkStatus checks that no 5xx came back but the upstream's own 500s and,
// during a fault, the 503 of a zone with on_error deny. An on_error deny's
// 503 outside any fault is reported with the first one: when and through
// which node it came, and how long it took (a decision that timed out took
// about redisTimeout; one of an open breaker, next to nothing), and its
// trace holds that node's requests around it.
func (c *checker) checkStatus() {
	kinds, first := map[string]int{}, map[string]*request{}
	for _, q := range c.o.requests {
		if q.status < 500 {
			continue
		}
		if q.fromApp && q.status == q.client.Status {
			continue
		}
		if q.status == 503 && c.denyZone(q.target) && c.inFault(q.sent, q.done, redisTimeout, 0, c.redisDown) {
			continue
		}
		k := fmt.Sprintf("%d on %s", q.status, c.s.Targets[q.target].Path)
		if q.status == 503 && c.denyZone(q.target) {
			k += " (on_error deny outside any fault"
			if _, ok := first[k]; !ok {
				first[k] = q
			}
		}
		kinds[k]++
	}
	for k, n := range kinds {
		q, ok := first[k]
		if !ok {
			c.fail(InvStatus, "%d responses %s", n, k)
			continue
		}
		c.failAt(InvStatus, q.sent, ofNode(q.node), "%d responses %s; the first sent %s through node %d, answered in %s%s)",
			n, k, q.sent.Format("15:04:05.000"), q.node, q.done.Sub(q.sent).Round(time.Millisecond), c.sinceFault(q.sent, func(string) bool { return true }))
	}
}

// sinceFault says how long after the end of the last fault before at (of
// a kind for which match is true) it was, and that fault's margin (see
// window.until, zero for a fault that does not keep Redis from deciding),
// or "" when there was none.
func (c *checker) sinceFault(at time.Time, match func(kind string) bool) string {
	var last *window
	for i, w := range c.o.windows {
		if match(w.kind) && w.end.Before(at) && (last == nil || w.end.After(last.end)) {
			last = &c.o.windows[i]
		}
	}
	if last == nil {
		return ""
	}
	margin := time.Duration(0)
	if c.redisDown(last.kind) {
		margin = last.until().Sub(last.end)
	}
	return fmt.Sprintf("; one %.1fs after %s ended, its margin %.1fs", at.Sub(last.end).Seconds(), last.kind, margin.Seconds())
}

func (c *checker) denyZone(t int) bool {
	for _, zi := range c.s.Targets[t].Zones {
		if c.s.Zones[zi].OnError == "deny" {
			return true
		}
	}
	return false
}

// printable shortens a key for a report line and quotes it.
func printable(k string) string {
	if len(k) > 40 {
		k = k[:20] + "..." + k[len(k)-8:]
	}
	return fmt.Sprintf("%q", k)
}

// maxPerInvariant bounds the violations a run reports per invariant: a
// broken bound breaks it for every rotated key at once.
const maxPerInvariant = 5

// summarize orders violations by invariant, then detail, and keeps at most
// maxPerInvariant of each invariant, the last one kept saying how many
// more there were.
func summarize(v []Violation) []Violation {
	sort.SliceStable(v, func(i, j int) bool {
		if v[i].Invariant != v[j].Invariant {
			return v[i].Invariant < v[j].Invariant
		}
		return v[i].Detail < v[j].Detail
	})
	var out []Violation
	n := map[string]int{}
	for _, x := range v {
		n[x.Invariant]++
	}
	kept := map[string]int{}
	for _, x := range v {
		if kept[x.Invariant] == maxPerInvariant {
			continue
		}
		kept[x.Invariant]++
		if kept[x.Invariant] == maxPerInvariant && n[x.Invariant] > maxPerInvariant {
			x.Detail += fmt.Sprintf(" (and %d more %s violations)", n[x.Invariant]-maxPerInvariant, x.Invariant)
		}
		out = append(out, x)
	}
	return out
}
