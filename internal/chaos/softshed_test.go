package chaos

import (
	"strings"
	"testing"
)

// TestSoftShedDraw: soft shedding goes to token bucket zones only, never
// to those of the victim's or the exempt client's target, with 50 to 99%
// (10 to 49% for the soft shed's room zone, which has a room), and the
// site writes it.
func TestSoftShedDraw(t *testing.T) {
	t.Parallel()
	shed := 0
	for seed := range uint64(40) {
		s := Draw(seed, Options{})
		site := s.Site("", "127.0.0.1:1", 0)
		for zi, z := range s.Zones {
			if z.SoftShed == 0 {
				continue
			}
			shed++
			low, high := int64(50), int64(99)
			if z.MaxWaiting > 0 {
				low, high = 10, 49
			}
			if z.Algorithm != TokenBucket || s.onVictimTarget(zi) || s.onExemptTarget(zi) || z.SoftShed < low || z.SoftShed > high {
				t.Errorf("seed %d: zone %s (%s) sheds %d%%", seed, z.Name, z.Algorithm, z.SoftShed)
			}
			if !strings.Contains(site, "soft_shed ") {
				t.Errorf("seed %d: the site writes no soft_shed:\n%s", seed, site)
			}
		}
	}
	if shed == 0 {
		t.Error("40 seeds drew no soft shed")
	}
}
