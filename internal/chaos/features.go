package chaos

import "math/rand/v2"

// Features that joined the checker after its first scenarios draw from
// streams of their own, after everything else, so that a seed keeps the
// scenario it had (its zones, clients and faults) when a feature joins:
// a seed quoted in a closing note or a test still reproduces what it
// found. Each feature takes the next stream number.
const (
	streamMaxWaiting = 0xfea7_0001 + iota
	streamExempt
	streamQuota
	streamKeyResets
	streamSoftShed
	streamCostHeader
	streamShedRoom
	streamCostReport
	streamHangUp
	streamRLS
)

// featureRand returns the random stream of one later feature for a seed.
func featureRand(seed uint64, stream uint64) *rand.Rand {
	return rand.New(rand.NewPCG(seed, stream))
}

// drawFeatures draws the later features, each from its own stream.
func (s *Scenario) drawFeatures() {
	s.drawMaxWaiting(featureRand(s.Seed, streamMaxWaiting))
	s.drawExempt(featureRand(s.Seed, streamExempt))
	s.drawQuota(featureRand(s.Seed, streamQuota))
	s.drawResets(featureRand(s.Seed, streamKeyResets))
	s.drawSoftShed(featureRand(s.Seed, streamSoftShed))
	s.drawCostHeader(featureRand(s.Seed, streamCostHeader))
	s.drawShedRoom(featureRand(s.Seed, streamShedRoom))
	s.drawCostReport(featureRand(s.Seed, streamCostReport))
	s.drawHangUp(featureRand(s.Seed, streamHangUp))
	s.drawRLS(featureRand(s.Seed, streamRLS))
}

// drawMaxWaiting gives half the leaky bucket zones a small waiting room
// (max_waiting 1 to 3 on each node), so that the room fills under the
// load: those requests are answered 429 and charged nothing. The room is
// the node's, shared by the zone's keys (a bound on connections held, not
// a limit of one client's), so a zone on the victim's target keeps the
// default room, and the isolation invariant stays what it was.
func (s *Scenario) drawMaxWaiting(r *rand.Rand) {
	for zi, z := range s.Zones {
		if z.Algorithm != LeakyBucket || s.onVictimTarget(zi) || r.IntN(2) == 0 {
			continue
		}
		z.MaxWaiting = 1 + r.Int64N(3)
	}
}

// onVictimTarget reports whether zone zi applies to the victim's target.
func (s *Scenario) onVictimTarget(zi int) bool {
	if s.VictimTarget < 0 {
		return false
	}
	for _, z := range s.Targets[s.VictimTarget].Zones {
		if z == zi {
			return true
		}
	}
	return false
}
