package chaos

import (
	"math/rand/v2"
	"net/http"
	"strconv"
	"time"
)

// Soft shedding: token bucket zones that delay, rather than deny, a key
// past a share of its burst. The bound is the zone's as ever (the bound
// invariant checks it unchanged: a delay never admits more), and no
// request waits longer than the soft shed's max delay: the delay a
// response reports (X-RateLimit-Delay) is at most it, the time the
// request took is at most it plus the upstream's sleep and a margin, and
// a dry-run zone's soft shed delays nothing.

// InvSoftShed names the invariant: no request is held longer than its
// soft shed's max delay, and a dry run's soft shed holds none.
const InvSoftShed = "soft_shed"

// shedMargin is what a delayed request may take beyond its delay and the
// upstream's sleep outside faults, on a machine that also runs the load,
// Redis and every node.
const shedMargin = 2 * time.Second

// drawSoftShed gives, from its own stream, half the token
// bucket zones a soft shed: 50 to 99% of the burst, with a max delay of
// 50ms to 1s. Zones on the victim's target and on the exempt client's
// keep none: their polite clients must never be delayed (a soft shed
// whose threshold the polite client's cost crosses would delay it).
func (s *Scenario) drawSoftShed(r *rand.Rand) {
	for zi, z := range s.Zones {
		if z.Algorithm != TokenBucket || s.onVictimTarget(zi) || s.onExemptTarget(zi) || r.IntN(2) == 0 {
			continue
		}
		z.SoftShed = 50 + r.Int64N(50)
		z.SoftShedMaxDelay = []time.Duration{50 * time.Millisecond, 200 * time.Millisecond, 500 * time.Millisecond, time.Second}[r.IntN(4)]
	}
}

// onExemptTarget reports whether zone zi applies to the exempt client's
// target.
func (s *Scenario) onExemptTarget(zi int) bool {
	if s.Exempt == nil {
		return false
	}
	for _, z := range s.Targets[s.Exempt.Target].Zones {
		if z == zi {
			return true
		}
	}
	return false
}

// delayField returns the delay a response reports (X-RateLimit-Delay, in
// milliseconds), 0 for none.
func delayField(h http.Header) time.Duration {
	ms, err := strconv.ParseInt(h.Get("X-Ratelimit-Delay"), 10, 64)
	if err != nil || ms <= 0 {
		return 0
	}
	return time.Duration(ms) * time.Millisecond
}

// shedBound returns, for target t, the longest delay its zones may ask:
// the largest max delay of its enforced soft-shedding zones, and whether
// the check applies (no leaky bucket delays its requests, and some zone
// sheds softly, a dry run's included).
func (s *Scenario) shedBound(t int) (time.Duration, bool) {
	var bound time.Duration
	sheds := false
	for _, zi := range s.Targets[t].Zones {
		z := s.Zones[zi]
		switch {
		case z.Algorithm == LeakyBucket:
			return 0, false
		case z.SoftShed > 0:
			sheds = true
			if !z.DryRun {
				bound = max(bound, z.SoftShedMaxDelay)
			}
		}
	}
	return bound, sheds
}

// checkSoftShed checks that no request of a soft-shedding target was
// delayed longer than the target's soft sheds allow: by the delay it was
// told (X-RateLimit-Delay, rounded up to milliseconds), and, outside
// faults, by the time it took beyond the upstream's sleep.
func (c *checker) checkSoftShed() {
	var told, took int
	var first *request
	var firstBound time.Duration
	for _, q := range c.o.requests {
		bound, ok := c.s.shedBound(q.target)
		if !ok || q.status == 0 {
			continue
		}
		over := q.delay > bound.Round(time.Millisecond)+time.Millisecond
		if over {
			told++
		}
		if q.delay > 0 && !over && q.done.Sub(q.sent) > bound+q.client.answerTime()+shedMargin &&
			!c.inFault(q.sent, q.done, 200*time.Millisecond, quietAfter, func(string) bool { return true }) {
			over = true
			took++
		}
		if over && first == nil {
			first, firstBound = q, bound
		}
	}
	if first != nil {
		c.failAt(InvSoftShed, first.sent, ofClient(first.client),
			"%d requests told a delay beyond their target's soft shed max delay, %d held beyond it (and the upstream's sleep, and %s); first on %s: told %s, took %s, max delay %s (0: only dry-run soft sheds), at %s",
			told, took, shedMargin, c.s.Targets[first.target].Path, first.delay, first.done.Sub(first.sent).Round(time.Millisecond),
			firstBound, first.sent.Format("15:04:05.000"))
	}
}

// shedSummary describes a zone's soft shed for Summary: "" for none.
func shedSummary(z *Zone) string {
	if z.SoftShed == 0 {
		return ""
	}
	if z.MaxWaiting > 0 {
		return "+soft_shed" + strconv.FormatInt(z.SoftShed, 10) + "/room" + strconv.FormatInt(z.MaxWaiting, 10)
	}
	return "+soft_shed" + strconv.FormatInt(z.SoftShed, 10)
}
