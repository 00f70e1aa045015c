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
// stream: see features.go). The victim's zones get none: the victim stays
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

// quotaShare is the allowance named "on_error local fallback" of a quota:
// while Redis cannot decide, each of the N nodes counts the key on a local
// quota of its own, ceil(quota/N) per period, which is not charged to Redis
// when it returns. A node's local count lasts the period, so one share per
// fault window (a node killed and restarted starts again) bounds it.
func quotaShare(quota int64, nodes int) float64 {
	n := int64(nodes)
	return float64(n * ceilDiv(quota, n))
}

// checkQuotas checks every key of a zone with a quota: the tokens it was
// admitted (counted by the zone's count_status) are at most the quota per
// calendar period the requests touched, plus the allowances named "on_error
// local fallback" (quotaShare per fault window that kept Redis from
// deciding), "Redis restarted empty" (the count lost: one quota per such
// fault) and "on_error allow" (requests passed unlimited in a fault). It
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
		var first, last time.Time
		var tokens float64
		for _, q := range b.requests {
			up, ok := c.o.seen[q.id]
			if !ok || !counted(z.CountStatus, up.status) {
				continue
			}
			if z.OnError == "allow" && c.inFault(q.sent, up.at, 0, 0, c.redisDown) {
				continue // the allowance named "on_error allow"
			}
			if first.IsZero() || q.sent.Before(first) {
				first = q.sent
			}
			if up.at.After(last) {
				last = up.at
			}
			cost := q.cost
			if z.Cost > 0 {
				cost = z.Cost
			}
			tokens += c.settledQuota(z, q, cost) // costheader.go
		}
		if tokens == 0 {
			continue
		}
		periods := periodsTouched(first, last, z.QuotaPer, loc)
		bound := float64(z.Quota) * float64(periods)
		var allow float64
		var named []string
		if share := c.quotaSettleShare(z, b.requests); share > 0 {
			allow += share
			named = append(named, fmt.Sprintf("cost_header %.0f", share))
		}
		for _, w := range c.o.windows {
			if w.until().Before(first) || w.start.After(last) {
				continue
			}
			if z.OnError == "local" && c.redisDown(w.kind) {
				allow += quotaShare(z.Quota, c.s.Nodes)
				named = append(named, fmt.Sprintf("fallback %s %.0f", w.kind, quotaShare(z.Quota, c.s.Nodes)))
			}
			if c.s.Topology != Memory && dataLoss(w.kind) {
				allow += float64(z.Quota)
				named = append(named, fmt.Sprintf("data loss %s %d", w.kind, z.Quota))
			}
		}
		figures = append(figures, figure{tokens, fmt.Sprintf("zone %s key %s: %.0f admitted of a quota of %d per %s (%s), %d period(s), allowances %.0f",
			z.Name, printable(b.key), tokens, z.Quota, z.QuotaPer, z.QuotaTZ, periods, allow)})
		if tokens > math.Floor(bound*boundFactor+allow+1e-9) {
			c.fail(InvQuota, "zone %s (quota %d per %s, %s) key %s: admitted %.0f tokens in %d period(s) (%.2fs), above %.0f + allowances %.0f [%s]; %d requests",
				z.Name, z.Quota, z.QuotaPer, z.QuotaTZ, printable(b.key), tokens, periods, last.Sub(first).Seconds(), bound, allow, strings.Join(named, ", "), len(b.requests))
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
