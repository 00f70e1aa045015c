package chaos

import (
	"fmt"
	"math"
	"math/rand/v2"
	"sort"
	"strings"
	"time"
)

// Quotas by the calendar in the scenarios: in half of them one zone also
// has `quota <n> per day|week|month tz <zone>`, small enough that its
// clients spend it within the load, and the checker holds each key to it.

// InvQuota names the quota's invariant: what a key was admitted in a
// calendar period is at most its quota, plus the named allowances.
const InvQuota = "quota"

// quotaZones are the time zones a quota is drawn in.
var quotaZones = []string{"UTC", "Europe/Berlin", "America/New_York", "Asia/Kolkata", "Australia/Lord_Howe"}

// drawQuota gives, in half the scenarios, one zone a quota (from its own
// stream: see drawFeatures). The victim's zones get none: the victim stays
// within its rate, not within a quota its whole load would spend.
func (s *Scenario) drawQuota(r *rand.Rand) {
	if r.IntN(2) == 0 {
		return
	}
	var can []*Zone
	for i, z := range s.Zones {
		if z.Algorithm != Concurrency && !s.onVictimTarget(i) {
			can = append(can, z)
		}
	}
	if len(can) == 0 {
		return
	}
	z := can[r.IntN(len(can))]
	z.Quota = 20 + r.Int64N(100)
	z.QuotaPer = pick(r, "day", "week", "month")
	z.QuotaTZ = quotaZones[r.IntN(len(quotaZones))]
}

// quotaLine is the zone's quota subdirective, "" for none.
func (z *Zone) quotaLine() string {
	if z.Quota == 0 {
		return ""
	}
	return fmt.Sprintf("quota %d per %s tz %s", z.Quota, z.QuotaPer, z.QuotaTZ)
}

// periodStart returns the first instant of the calendar period (day, week
// from Monday, month) that holds t in loc. (The zones drawn have no
// daylight-saving change at midnight.)
func periodStart(t time.Time, per string, loc *time.Location) time.Time {
	y, m, d := t.In(loc).Date()
	switch per {
	case "week":
		d -= (int(t.In(loc).Weekday()) + 6) % 7
	case "month":
		d = 1
	}
	return time.Date(y, m, d, 0, 0, 0, 0, loc)
}

// nextPeriod returns the first instant of the period after the one that
// starts at p.
func nextPeriod(p time.Time, per string, loc *time.Location) time.Time {
	y, m, d := p.In(loc).Date()
	switch per {
	case "week":
		d += 7
	case "month":
		m++
	default:
		d++
	}
	return time.Date(y, m, d, 0, 0, 0, 0, loc)
}

// periodsTouched counts the calendar periods that [from, to] meets.
func periodsTouched(from, to time.Time, per string, loc *time.Location) int {
	n := 1
	for next := nextPeriod(periodStart(from, per, loc), per, loc); !next.After(to) && n < 1000; next = nextPeriod(next, per, loc) {
		n++
	}
	return n
}

// The bound of a quota across an outage (docs/policies.md): each node
// remembers the count Redis last gave it of each key; while Redis cannot
// decide, a zone with on_error local counts the key on a local quota of
// quota/N per node (at least 1), starting from the node's share of that
// count (rounded up), and charges what it admitted to Redis when Redis
// returns; every node's charge carries the count it heard (the seed), and
// Redis raises the key's count to the highest seed before it adds the
// charges: a Redis that restarted empty starts from it, not from zero.
// The nodes decide locally until every node's charges are in.
//
// So, per fault window that stops Redis for every node, the fleet admits
// beyond the quota at most the count when Redis stopped plus what the
// local quotas could give out, less the quota; and, with the count lost,
// at least what the best informed node had not heard (its in-flight
// requests among them): "stale counts". The checker does not know what
// each node heard: it takes, for node i, the tokens whose requests were
// answered before node i's last request before the fault was sent (a lower
// bound of its count), against every token of a request sent before the
// fault (an upper bound of the count). A node's memory is empty after a
// reload or a restart, a node restarted lately knows no fleet and divides
// by 1 (fleetLearn), and a request that met an earlier fault window may
// have been decided locally: it tells its node no count.
//
// A CLIENT KILL, a CPU stress or a Cluster's fault leaves Redis deciding
// for some nodes while the others count locally: the allowance is then
// what the local quotas could give out (and what no node heard of a count
// lost), "local quotas". A zone that fails open or closed counts
// nothing locally, but its count is lost with a Redis that restarted
// empty: the seeds restore it, less what the stalest node did not hear (a
// node back first decides from its own seed until a higher one comes in),
// and less the first request of each node that finds Redis back (the
// breaker's probe, decided before its seed goes in): "data loss".

// everyNodeStops reports whether a fault of kind keeps Redis from deciding
// for every node at once (paused, asleep, killed): not a CLIENT KILL nor
// a CPU stress, which fail some nodes' calls while Redis goes on deciding
// the others'.
func everyNodeStops(kind string) bool {
	switch kind {
	case FaultPause, FaultKill, FaultDebugSleep, FaultFailover:
		return true
	}
	return false
}

// quotaTokens returns the tokens a request counted in a quota zone (by its
// count_status, as settled), and when the upstream saw it; ok is false for
// a request that counted nothing.
func (c *checker) quotaTokens(z *Zone, q *request) (tokens float64, at time.Time, ok bool) {
	up, seen := c.o.seen[q.id]
	if !seen || !counted(z.CountStatus, up.status) {
		return 0, time.Time{}, false
	}
	cost := q.cost
	if z.Cost > 0 {
		cost = z.Cost
	}
	return c.settledQuota(z, q, cost), up.at, true
}

// fleetLearn is how long a node restarted (kill -9) takes at most to hear
// the fleet's size again (its fleet view reads Redis once a second): an
// outage sooner finds it dividing its local quotas by 1.
const fleetLearn = 3 * time.Second

// nodeMemories returns, for each node, when its memory last started empty
// (a reload or a restart) before fault window w ends, and the divisor of
// its local quotas in w: the fleet's size, or 1 for a node restarted too
// lately to know the fleet (fleetLearn).
func (c *checker) nodeMemories(w window) (forgot []time.Time, divisor []int64) {
	nodes := c.s.Nodes
	forgot = make([]time.Time, nodes)
	divisor = make([]int64, nodes)
	for i := range divisor {
		divisor[i] = int64(nodes)
	}
	for j, x := range c.o.windows {
		if (x.kind != FaultReload && x.kind != FaultNodeKill) || !x.start.Before(w.until()) {
			continue
		}
		for i := range nodes {
			if j < len(c.s.Faults) && c.s.Faults[j].Node != i {
				continue
			}
			if x.end.After(forgot[i]) {
				forgot[i] = x.end
			}
			if x.kind == FaultNodeKill && x.end.After(w.start.Add(-fleetLearn)) {
				divisor[i] = 1
			}
		}
	}
	return forgot, divisor
}

// quotaHeard returns, for a key's quota (its requests reqs) before fault
// window w, in the calendar period that starts at period: high, every
// token of a request sent before the fault (an upper bound of the count),
// and seen[i], the tokens answered before node i's last request that told
// it a count was sent (a lower bound of what node i heard; forgot[i] is
// when its memory last started empty).
func (c *checker) quotaHeard(z *Zone, reqs []*request, w window, period time.Time, forgot []time.Time) (high float64, seen []float64) {
	nodes := c.s.Nodes
	last := make([]time.Time, nodes)
	for _, q := range reqs {
		if q.node >= nodes || !q.sent.Before(w.start) {
			continue
		}
		if t, at, ok := c.quotaTokens(z, q); ok && !at.Before(period) {
			high += t
		}
		if q.status == 0 || !q.done.Before(w.start) || q.sent.Before(forgot[q.node]) || q.sent.Before(period) ||
			c.inFault(q.sent, q.done, 0, 0, c.redisDown) {
			continue
		}
		if q.sent.After(last[q.node]) {
			last[q.node] = q.sent
		}
	}
	seen = make([]float64, nodes)
	for _, q := range reqs {
		t, at, ok := c.quotaTokens(z, q)
		if !ok || at.Before(period) {
			continue
		}
		for i := range nodes {
			if !last[i].IsZero() && q.done.Before(last[i]) {
				seen[i] += t
			}
		}
	}
	return high, seen
}

// quotaOutageShare is the allowance of a key's quota (its requests reqs)
// for fault window w: see above. It returns the allowance and its name,
// or 0 and "" when the window takes none.
func (c *checker) quotaOutageShare(z *Zone, reqs []*request, w window, loc *time.Location) (float64, string) {
	if !c.redisDown(w.kind) || z.OnError != "local" && !dataLoss(w.kind) {
		return 0, ""
	}
	nodes := c.s.Nodes
	period := periodStart(w.start, z.QuotaPer, loc)
	forgot, divisor := c.nodeMemories(w)
	high, seen := c.quotaHeard(z, reqs, w, period, forgot)
	// local is what the local quotas could give out: each node's share
	// (the quota over its divisor, at least 1) less its share of the
	// count it heard, rounded up.
	var local, most, least float64
	least = high
	for i := range nodes {
		share := max(1, z.Quota/divisor[i])
		local += float64(max(0, share-ceilDiv(int64(seen[i]), divisor[i])))
		most = max(most, high-seen[i])
		least = min(least, high-seen[i])
	}
	switch {
	case z.OnError != "local":
		var probe int64 // the largest cost a node's probe can take
		for _, q := range reqs {
			probe = max(probe, q.cost, z.Cost)
		}
		return most + float64(int64(nodes)*min(probe, z.Quota)), "data loss " + w.kind
	case !everyNodeStops(w.kind) || c.s.Topology == Cluster:
		// A Cluster's fault stops one master: the nodes' breakers open
		// apart, and Redis goes on deciding the other masters' keys for
		// some nodes meanwhile.
		if dataLoss(w.kind) {
			local += least
		}
		return local, "local quotas " + w.kind
	}
	// Every node counted locally from what it heard, then charged Redis:
	// beyond the quota by the count before the fault and the local
	// admissions, or, with the count lost, by what no node heard.
	share := max(0, high+local-float64(z.Quota))
	if dataLoss(w.kind) {
		share = max(share, least)
	}
	return share, "stale counts " + w.kind
}

// checkQuotas checks every key of a zone with a quota: the tokens it was
// admitted (counted by the zone's count_status) are at most the quota per
// calendar period the requests touched, plus the allowances named "stale
// counts" (what the nodes' counts were stale by when a fault kept Redis
// from deciding, see quotaOutageShare), "local quotas" (a CLIENT KILL),
// "data loss" (a zone without the local policy whose Redis restarted
// empty) and "on_error allow" (requests passed unlimited in a fault). It
// returns the figures of the (at most five) keys admitted most.
func (c *checker) checkQuotas() []string {
	type figure struct {
		tokens float64
		text   string
	}
	var figures []figure
	for _, b := range c.buckets() {
		z := c.s.Zones[b.zone]
		if z.Quota == 0 || z.DryRun {
			continue
		}
		loc, err := time.LoadLocation(z.QuotaTZ)
		if err != nil {
			c.fail(InvHarness, "zone %s: quota time zone %s: %v", z.Name, z.QuotaTZ, err)
			return nil
		}
		adm := c.quotaAdmitted(z, b.requests)
		if adm.tokens == 0 {
			continue
		}
		periods := periodsTouched(adm.first, adm.last, z.QuotaPer, loc)
		bound := float64(z.Quota) * float64(periods)
		allow, named := c.quotaAllowances(z, b.requests, adm, loc)
		figures = append(figures, figure{adm.tokens, fmt.Sprintf("zone %s key %s: %.0f admitted of a quota of %d per %s (%s), %d period(s), allowances %.0f",
			z.Name, printable(b.key), adm.tokens, z.Quota, z.QuotaPer, z.QuotaTZ, periods, allow)})
		if adm.tokens > math.Floor(bound*boundFactor+allow+1e-9) {
			c.failAt(InvQuota, adm.pastQuota(z.Quota), ofKey(b.key), "zone %s (quota %d per %s, %s) key %s: admitted %.0f tokens in %d period(s) (%.2fs), above %.0f + allowances %.0f [%s]; %d requests",
				z.Name, z.Quota, z.QuotaPer, z.QuotaTZ, printable(b.key), adm.tokens, periods, adm.last.Sub(adm.first).Seconds(), bound, allow, strings.Join(named, ", "), len(b.requests))
		}
	}
	sort.SliceStable(figures, func(i, j int) bool { return figures[i].tokens > figures[j].tokens })
	var out []string
	for i, f := range figures {
		if i == 5 {
			out = append(out, fmt.Sprintf("and %d more keys", len(figures)-5))
			break
		}
		out = append(out, f.text)
	}
	return out
}

// quotaAdmission is what a key's requests were admitted in a quota zone:
// the tokens counted, from the first request sent to the last the
// upstream saw, and when the upstream saw each token (for the trace).
type quotaAdmission struct {
	tokens      float64
	first, last time.Time
	upAt        []time.Time
}

// quotaAdmitted returns what a key's requests reqs were admitted in quota
// zone z, less what passed unlimited in a fault (the allowance named
// "on_error allow").
func (c *checker) quotaAdmitted(z *Zone, reqs []*request) quotaAdmission {
	var a quotaAdmission
	for _, q := range reqs {
		t, at, ok := c.quotaTokens(z, q)
		if !ok {
			continue
		}
		if z.OnError == "allow" && c.inFault(q.sent, at, 0, 0, c.redisDown) {
			continue
		}
		if a.first.IsZero() || q.sent.Before(a.first) {
			a.first = q.sent
		}
		if at.After(a.last) {
			a.last = at
		}
		a.tokens += t
		for range min(int64(t), z.Quota+1) {
			a.upAt = append(a.upAt, at)
		}
	}
	return a
}

// pastQuota returns when the key went past its quota, where a trace of a
// violation is centred: when the upstream saw the token beyond quota, or
// the first request.
func (a *quotaAdmission) pastQuota(quota int64) time.Time {
	sort.Slice(a.upAt, func(i, j int) bool { return a.upAt[i].Before(a.upAt[j]) })
	if int64(len(a.upAt)) > quota {
		return a.upAt[quota]
	}
	return a.first
}

// quotaAllowances returns what a key's quota may be exceeded by, in all
// and by name: the settlements of cost_header, and each fault window
// between the key's first and last admission (quotaOutageShare).
func (c *checker) quotaAllowances(z *Zone, reqs []*request, adm quotaAdmission, loc *time.Location) (float64, []string) {
	var allow float64
	var named []string
	if share := c.quotaSettleShare(z, reqs); share > 0 {
		allow += share
		named = append(named, fmt.Sprintf("cost_header %.0f", share))
	}
	for _, w := range c.o.windows {
		if w.until().Before(adm.first) || w.start.After(adm.last) {
			continue
		}
		if share, name := c.quotaOutageShare(z, reqs, w, loc); name != "" {
			allow += share
			named = append(named, fmt.Sprintf("%s %.0f", name, share))
		}
	}
	return allow, named
}
