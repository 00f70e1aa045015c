package chaos

import (
	"math"
	"testing"
)

// TestCostHeaderDraws checks that cost_header zones are drawn (token
// buckets only, none that the victim, the exempt client's twin or a
// refunded client relies on), that the scenario's site writes them, and
// that the reported costs cover refunds, charges and hostile values.
func TestCostHeaderDraws(t *testing.T) {
	t.Parallel()
	drawn, seeds := 0, []uint64{}
	for seed := uint64(1); seed <= 300; seed++ {
		s := Draw(seed, Options{})
		for zi, z := range s.Zones {
			if !z.CostHeader {
				continue
			}
			drawn++
			if len(seeds) < 5 && (len(seeds) == 0 || seeds[len(seeds)-1] != seed) {
				seeds = append(seeds, seed)
			}
			if z.Algorithm != TokenBucket || s.onVictimTarget(zi) || s.onExemptTarget(zi) || s.onRefundedTarget(zi) {
				t.Errorf("seed %d: zone %s (%s) has cost_header where it must not", seed, z.Name, z.Algorithm)
			}
		}
	}
	t.Logf("cost_header zones in seeds 1 to 300: %d; the first seeds with one: %v", drawn, seeds)
	if drawn == 0 {
		t.Fatal("no seed drew a cost_header zone")
	}
	var zero, more, huge, trailers int
	for i := range 1000 {
		c, tr := reportedCost(string(rune('a'+i%26)) + string(rune(i)))
		switch {
		case c == math.MaxInt64:
			huge++
		case c > 7:
			more++
		case c == 0:
			zero++
		}
		if tr {
			trailers++
		}
	}
	if zero == 0 || more == 0 || huge == 0 || trailers == 0 || trailers == 1000 {
		t.Errorf("reported costs: %d zero, %d above 7, %d huge, %d in trailers of 1000", zero, more, huge, trailers)
	}
}
