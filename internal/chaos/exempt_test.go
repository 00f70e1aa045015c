package chaos

import (
	"net/netip"
	"strings"
	"testing"
)

// TestDrawExempt checks the exemptions seeds draw: some do, some do not;
// the exempt client and its twin share a key and a target whose zones key
// by client and count no slots; the exempt network holds the client's
// address and no other client's (127.0.0.1); and the site writes it.
func TestDrawExempt(t *testing.T) {
	t.Parallel()
	with, handler, zones := 0, 0, 0
	for seed := uint64(1); seed <= 60; seed++ {
		s := Draw(seed, Options{})
		e := s.Exempt
		if e == nil {
			continue
		}
		with++
		p, err := netip.ParsePrefix(e.Network)
		if err != nil {
			p = netip.PrefixFrom(netip.MustParseAddr(e.Network), 32)
		}
		if !p.Contains(netip.MustParseAddr(e.Source)) || p.Contains(netip.MustParseAddr("127.0.0.1")) {
			t.Errorf("seed %d: exempt %s, source %s", seed, e.Network, e.Source)
		}
		for _, zi := range s.Targets[e.Target].Zones {
			if z := s.Zones[zi]; z.Global || z.Algorithm == Concurrency {
				t.Errorf("seed %d: the exempt target has zone %s (%s, global %v)", seed, z.Name, z.Algorithm, z.Global)
			}
		}
		var kinds []string
		for _, c := range s.Clients {
			if c.Kind == KindExempt || c.Kind == KindExemptTwin {
				kinds = append(kinds, c.Kind)
				if c.Targets[0] != e.Target || !strings.HasPrefix(c.Key, "exempt-") {
					t.Errorf("seed %d: %s client targets %v, key %q", seed, c.Kind, c.Targets, c.Key)
				}
			}
		}
		if len(kinds) != 2 {
			t.Errorf("seed %d: exempt clients %v", seed, kinds)
		}
		site := s.Site("", "127.0.0.1:1", 0)
		if n := strings.Count(site, "exempt "+e.Network+"\n"); len(e.Zones) == 0 && n != 1 || len(e.Zones) > 0 && n != len(e.Zones) {
			t.Errorf("seed %d: the site has %d exempt lines, want the handler's or one per zone of %v:\n%s", seed, n, e.Zones, site)
		}
		if len(e.Zones) == 0 {
			handler++
		} else {
			zones++
		}
	}
	if with < 10 || with > 50 || handler == 0 || zones == 0 {
		t.Errorf("of 60 seeds %d drew an exemption (%d on the handler, %d in zones)", with, handler, zones)
	}
}
