package chaos

import (
	"strings"
	"testing"
)

// TestSoftShedDraw: soft shedding goes to token bucket zones only, never
// to those of the victim's or the exempt client's target, with 50 to 99%,
// and the site writes it.
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
			if z.Algorithm != TokenBucket || s.onVictimTarget(zi) || s.onExemptTarget(zi) || z.SoftShed < 50 || z.SoftShed > 99 {
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
